"""The current App, as in Celery: the last one created, or the one made current.

Kept apart from ``app.py`` so the ``queue`` package can reach the app without importing
it (dependencies point one way: app -> queue).
"""

from __future__ import annotations

from typing import Any

from tidings.errors import ConfigurationError

_current: Any = None


def set_current(app: Any) -> None:
    """Make ``app`` the current App."""
    global _current
    _current = app


def current() -> Any:
    """The current App.

    Raises:
        ConfigurationError: no App was created yet.
    """
    if _current is None:
        raise ConfigurationError("no tidings App: create one with App(...) or App.from_env()")
    return _current
