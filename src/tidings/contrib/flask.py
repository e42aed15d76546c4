"""Flask: the ``Tidings`` extension, configured from ``app.config["TIDINGS_*"]``.

::

    from flask import Flask
    from tidings.contrib.flask import Tidings

    tidings = Tidings()

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config["TIDINGS_REDIS_URL"] = "redis://127.0.0.1:6379/0"
        app.config["TIDINGS_KEY"] = "..."
        tidings.init_app(app)          # or Tidings(app)
        return app

Every ``TIDINGS_<NAME>`` key of ``app.config`` becomes the App keyword ``<name>``
(over the environment variables of the same name). The App is made current, kept in
``app.extensions["tidings"]`` and reachable as ``tidings.app``; its sync Redis
connections close when the process exits. The worker loads it with
``notify-worker -A myproject.wsgi:tidings_app`` (any module attribute that holds it),
or through ``Tidings.app`` after ``create_app()`` (see the Flask tutorial).
"""

from __future__ import annotations

import atexit
from typing import Any

from tidings.app import App
from tidings.errors import ConfigurationError

PREFIX = "TIDINGS_"


def options_from_config(config: Any) -> dict[str, Any]:
    """``{"redis_url": ...}`` from the ``TIDINGS_*`` keys of a Flask config."""
    return {
        key[len(PREFIX) :].lower(): value
        for key, value in config.items()
        if key.startswith(PREFIX) and value is not None
    }


class Tidings:
    """The Flask extension: one App per Flask app."""

    def __init__(self, flask_app: Any = None, **overrides: Any) -> None:
        self._app: App | None = None
        self._overrides = overrides
        if flask_app is not None:
            self.init_app(flask_app)

    def init_app(self, flask_app: Any) -> App:
        """Create the App from ``flask_app.config`` and make it current."""
        options = {**options_from_config(flask_app.config), **self._overrides}
        options.setdefault("allowed_modules", _default_allowed(flask_app))
        app = App(**options)  # installs the SQLAlchemy after-commit hooks when loaded
        flask_app.extensions["tidings"] = app
        self._app = app
        atexit.register(app.close)
        return app

    @property
    def app(self) -> App:
        """The App (after :meth:`init_app`).

        Raises:
            ConfigurationError: ``init_app`` has not run.
        """
        if self._app is None:
            raise ConfigurationError("Tidings.init_app(flask_app) has not run")
        return self._app


def _default_allowed(flask_app: Any) -> list[str] | None:
    """The Flask app's own package (its ``import_name``), unless configured."""
    import os

    if os.environ.get("TIDINGS_ALLOWED_MODULES"):
        return None
    name = str(getattr(flask_app, "import_name", "") or "").partition(".")[0]
    return [name] if name and name != "__main__" else None
