"""Building the App of a Django project from its settings."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidings import after_commit
from tidings.app import App
from tidings.config import Settings
from tidings.errors import ConfigurationError

_app: App | None = None
_EXTRA_KEYWORDS = {"connections", "home", "env"}
DJANGO_MAIL = "Django's EMAIL_* settings"
_EMAIL_SETTINGS = (
    "EMAIL_BACKEND", "EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD",
    "EMAIL_USE_TLS", "EMAIL_USE_SSL", "EMAIL_FILE_PATH",
)  # fmt: skip


def _keywords() -> set[str]:
    internal = {"embedded", "sources"}
    return {f.name for f in dataclasses.fields(Settings)} - internal | _EXTRA_KEYWORDS


def mail_from_django() -> dict[str, str]:
    """``mail_url`` and ``mail_from`` from Django's email settings, when the project set any.

    ``EMAIL_BACKEND`` SMTP (Django's default): ``smtps://`` with ``EMAIL_USE_SSL``, else
    ``smtp://`` with STARTTLS required by ``EMAIL_USE_TLS`` (else used when offered),
    ``EMAIL_HOST``, ``EMAIL_PORT``, ``EMAIL_HOST_USER``, ``EMAIL_HOST_PASSWORD``; the
    console backend is ``log://``, the file backend ``file://EMAIL_FILE_PATH``, the
    in-memory and dummy backends ``log://``. ``DEFAULT_FROM_EMAIL`` is the sender. A
    project that sets none of them keeps the tidings default (the outbox directory), as
    Django's own default (an SMTP server on localhost:25) is rarely one that runs.
    """
    from django.conf import settings

    out: dict[str, str] = {}
    if settings.is_overridden("DEFAULT_FROM_EMAIL"):
        out["mail_from"] = str(settings.DEFAULT_FROM_EMAIL)
    if not any(settings.is_overridden(name) for name in _EMAIL_SETTINGS):
        return out
    backend = str(settings.EMAIL_BACKEND).rsplit(".", 2)[-2]
    if backend in ("console", "locmem", "dummy"):
        out["mail_url"] = "log://"
        return out
    if backend == "filebased":
        out["mail_url"] = f"file://{os.path.abspath(str(settings.EMAIL_FILE_PATH))}"
        return out
    if backend != "smtp":
        return out  # another backend: tidings cannot send through it; keep its default
    quote = urllib.parse.quote
    user = str(settings.EMAIL_HOST_USER or "")
    password = str(settings.EMAIL_HOST_PASSWORD or "")
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user else ""
    host = str(settings.EMAIL_HOST)
    host = f"[{host}]" if ":" in host else host
    scheme = "smtps" if settings.EMAIL_USE_SSL else "smtp"
    query = "?tls=required" if settings.EMAIL_USE_TLS and not settings.EMAIL_USE_SSL else ""
    out["mail_url"] = f"{scheme}://{auth}{host}:{int(settings.EMAIL_PORT)}{query}"
    return out


def default_allowed_modules() -> list[str]:
    """Every installed app's package, and the project package (of the settings module)."""
    from django.apps import apps

    names = [config.name for config in apps.get_app_configs()]
    project = os.environ.get("DJANGO_SETTINGS_MODULE", "").partition(".")[0]
    if project:
        names.append(project)
    return list(dict.fromkeys(names))


def _options() -> dict[str, Any]:
    from django.conf import settings

    raw = getattr(settings, "TIDINGS", None) or {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError("settings.TIDINGS must be a dict of App(...) keywords")
    unknown = sorted(set(raw) - _keywords())
    if unknown:
        raise ConfigurationError(
            f"settings.TIDINGS has unknown keys {unknown}; the keys are the App(...) "
            f"keywords: {sorted(_keywords())}"
        )
    options = {str(k).lower(): v for k, v in raw.items()}
    if options.get("allowed_modules") is None and not os.environ.get("TIDINGS_ALLOWED_MODULES"):
        options["allowed_modules"] = default_allowed_modules()
    labels: dict[str, str] = {}
    for name, value in mail_from_django().items():
        if options.get(name) is None and not os.environ.get(f"TIDINGS_{name.upper()}"):
            options[name] = value
            labels[name] = DJANGO_MAIL
    options["labels"] = labels
    options["given_in"] = "settings.TIDINGS"
    if options.get("home") is None:
        base = getattr(settings, "BASE_DIR", None)
        options["anchor"] = str(base) if base else os.getcwd()
    return options


def _in_atomic_block() -> after_commit.Deferrer | None:
    """Defer to ``on_commit`` of the database whose ``atomic()`` block is open (the
    default database first, then the others already connected in this thread)."""
    from django.db import DEFAULT_DB_ALIAS, connections, transaction

    aliases = [DEFAULT_DB_ALIAS] + [
        c.alias for c in connections.all(initialized_only=True) if c.alias != DEFAULT_DB_ALIAS
    ]
    for alias in aliases:
        if connections[alias].in_atomic_block:

            def defer(callback: after_commit.Callback, using: str = alias) -> None:
                transaction.on_commit(callback, using=using)

            return defer
    return None


def _close_old_connections(fn: Callable[..., Any]) -> Callable[..., Any]:
    from django.db import close_old_connections

    def run(*args: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args)
        finally:
            close_old_connections()

    return run


class CloseOldConnections:
    """Job middleware: ``close_old_connections()`` around an ``async def handle``, in
    the thread Django's ``sync_to_async`` runs ORM calls in (sync handlers and model
    loads are wrapped in their own thread by :func:`_close_old_connections`)."""

    async def handle(self, job: Any, nxt: Callable[[], Awaitable[Any]]) -> Any:
        """Close stale connections before and after an async job."""
        if not job.runs_async():
            return await nxt()
        from asgiref.sync import sync_to_async
        from django.db import close_old_connections

        close = sync_to_async(close_old_connections, thread_sensitive=True)
        await close()
        try:
            return await nxt()
        finally:
            await close()


def discover_listeners(app: App) -> list[str]:
    """Import each installed app's ``listeners`` module; returns the ones found."""
    from django.apps import apps

    found = []
    for config in apps.get_app_configs():
        name = f"{config.name}.listeners"
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        app.discover(name)
        found.append(name)
    return found


def app_from_settings() -> App:
    """Create (once) and return the App of this Django project; makes it current."""
    global _app
    if _app is not None:
        return _app.make_current()
    app = App(**_options())
    after_commit.register_hook(_in_atomic_block)
    app.thread_call_wrappers.append(_close_old_connections)
    app.job_middleware.append(CloseOldConnections())
    _app = app
    discover_listeners(app)
    _listen_for_task_cancels(app)
    return app


def _listen_for_task_cancels(app: App) -> None:
    """Record cancelled Django tasks when ``TASKS`` names the tidings backend."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None) or {}
    if any(
        str(c.get("BACKEND", "")).startswith("tidings.contrib.django.tasks")
        for c in tasks.values()
        if isinstance(c, dict)
    ):
        from tidings.contrib.django.tasks import listen_for_cancels

        listen_for_cancels(app)


def get_app() -> App:
    """The App of this Django project (``django.setup()`` must have run).

    Raises:
        ConfigurationError: ``tidings.contrib.django`` is not in ``INSTALLED_APPS``.
    """
    if _app is None:
        raise ConfigurationError(
            "no tidings App: add 'tidings.contrib.django' to INSTALLED_APPS (and run "
            "django.setup() outside manage.py), or name your App with notify-worker -A "
            "module:attribute / TIDINGS_APP"
        )
    return _app


def worker_app() -> App:
    """``django.setup()`` (for ``DJANGO_SETTINGS_MODULE``), then :func:`get_app`."""
    import sys

    import django

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    django.setup()
    return get_app()
