"""The Django AppConfig of ``tidings.contrib.django``."""

from __future__ import annotations

from django.apps import AppConfig


class TidingsConfig(AppConfig):
    """Creates the App from ``settings.TIDINGS`` once every app is loaded."""

    name = "tidings.contrib.django"
    label = "tidings"
    verbose_name = "tidings"

    def ready(self) -> None:
        """Create the App, discover listeners, hook transactions and the worker."""
        from tidings.contrib.django.setup import app_from_settings

        app_from_settings()
