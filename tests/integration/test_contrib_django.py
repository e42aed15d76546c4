"""tidings.contrib.django in a Django process of its own (Django is configured once per
process, so each check runs ``python -c`` in a copy of examples/django_app).

Covered here (the end-to-end run is tests/e2e/test_framework_examples.py):
- the App is built from ``TIDINGS`` with the installed apps and the project package as
  allowed modules, and ``accounts.listeners`` is discovered;
- unknown ``TIDINGS`` keys are refused, naming the valid ones;
- a model mixing in Notifiable is stored by primary key; loading it on an event loop
  asks for a thread, and in a thread works (Django's async guard is satisfied);
- the worker's per-thread wrapper closes stale connections after a job (CONN_MAX_AGE=0);
- pushes inside ``atomic()`` wait for ``on_commit`` and vanish on rollback;
- ``notify-worker`` finds the App through ``DJANGO_SETTINGS_MODULE``;
- allowed-module errors name TIDINGS_ALLOWED_MODULES.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    target = tmp_path / "django_app"
    shutil.copytree(ROOT / "examples" / "django_app", target)
    return target


def _run(project: Path, code: str, redis_url: str, prefix: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="djsite.settings",
        TIDINGS_REDIS_URL=redis_url,
        TIDINGS_KEY="d" * 32,
        TIDINGS_PREFIX=prefix,
        PYTHONPATH=str(project),
        **extra,
    )
    script = "import django\ndjango.setup()\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_app_comes_from_settings(project: Path, redis_url: str, prefix: str) -> None:
    out = _run(
        project,
        """
        from tidings.contrib.django import get_app
        from accounts.events import UserRegistered
        from accounts.listeners import SendWelcome
        app = get_app()
        print(app.settings.allowed_modules)
        print(app.settings.after_commit, app.settings.mail_allow_test_domains)
        print(SendWelcome in app.events.listeners_for(UserRegistered))
        from tidings.errors import PayloadRejected
        try:
            app.resolve_class("elsewhere.jobs:Job")
        except PayloadRejected as exc:
            print(exc)
    """,
        redis_url,
        prefix,
    )
    lines = out.splitlines()
    assert lines[0] == (
        "('django.contrib.contenttypes', 'accounts', 'tidings.contrib.django', 'djsite', 'tidings')"
    )
    assert lines[1:3] == ["True True", "True"]
    assert "add its package to TIDINGS_ALLOWED_MODULES" in lines[3]


def test_unknown_settings_keys_are_refused(project: Path, redis_url: str, prefix: str) -> None:
    settings = project / "djsite" / "settings.py"
    settings.write_text(settings.read_text() + '\nTIDINGS["redis"] = "typo"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "settings.TIDINGS has unknown keys ['redis']" in done.stderr
    assert "'redis_url'" in done.stderr


def test_models_load_by_key_in_a_thread(project: Path, redis_url: str, prefix: str) -> None:
    out = _run(
        project,
        """
        import asyncio, threading
        from django.core.management import call_command
        call_command("migrate", verbosity=0)
        from accounts.models import User
        from tidings.contrib.django import get_app
        from tidings.wire import serializer
        app = get_app()
        user = User.objects.create(email="ada@myapp.test", name="Ada")
        data = serializer.encode(user)
        print(data)
        async def on_loop():
            return serializer.decode(data, app.resolve_class)
        try:
            asyncio.run(on_loop())
        except serializer.NeedsThread:
            print("needs thread")
        async def in_thread():
            return await asyncio.to_thread(serializer.decode, data, app.resolve_class)
        again = asyncio.run(in_thread())
        print(type(again).__name__, again.pk == user.pk, again.email)
        # Hand-written hooks on a model (the issue's workaround) load off the loop too.
        User.__queue_dump__ = lambda self: {"id": self.pk}
        User.__queue_load__ = classmethod(lambda cls, d: cls.objects.get(pk=d["id"]))
        hooked = {"__t": "m", "c": "accounts.models:User", "v": {"id": user.pk}}
        async def hooked_on_loop():
            return serializer.decode(hooked, app.resolve_class)
        try:
            asyncio.run(hooked_on_loop())
        except serializer.NeedsThread:
            print("hooks need thread")
        del User.__queue_dump__, User.__queue_load__
        User.objects.filter(pk=user.pk).delete()
        try:
            serializer.decode(data, app.resolve_class)
        except serializer.SerializationError as exc:
            print(type(exc).__name__)
    """,
        redis_url,
        prefix,
    )
    lines = out.splitlines()
    assert lines[0] == "{'__t': 'x', 'x': 'django', 'c': 'accounts.models:User', 'v': {'pk': 1}}"
    assert lines[1:] == [
        "needs thread",
        "User True ada@myapp.test",
        "hooks need thread",
        "ModelNotFound",
    ]


def test_stale_connections_are_closed_around_jobs(
    project: Path, redis_url: str, prefix: str
) -> None:
    out = _run(
        project,
        """
        from django.db import connection
        from django.conf import settings
        from tidings.contrib.django import get_app
        settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
        connection.settings_dict["CONN_MAX_AGE"] = 0
        def job():
            connection.ensure_connection()
            return connection.connection is not None
        print(job(), connection.connection is not None)  # unwrapped: left open
        connection.close()
        wrapped = get_app().wrap_thread_call(job)
        print(wrapped(), connection.connection is None)  # wrapped: closed after the job
    """,
        redis_url,
        prefix,
    )
    assert out.splitlines() == ["True True", "True True"]


def test_pushes_wait_for_on_commit(project: Path, redis_url: str, prefix: str) -> None:
    out = _run(
        project,
        """
        from django.core.management import call_command
        from django.db import transaction
        call_command("migrate", verbosity=0)
        from tidings import event
        from tidings.contrib.django import get_app
        from accounts.events import UserRegistered
        from accounts.models import User
        app = get_app()
        rq = app.queue_for(None)
        ready = lambda: rq.client.llen(rq.keys("default").ready)
        with transaction.atomic():
            event(UserRegistered(User.objects.create(email="a@myapp.test", name="A")))
            print("inside", ready())
        print("committed", ready())
        try:
            with transaction.atomic():
                event(UserRegistered(User.objects.create(email="b@myapp.test", name="B")))
                raise RuntimeError
        except RuntimeError:
            pass
        print("rolled back", ready())
        user = User.objects.get(email="a@myapp.test")
        event(UserRegistered(user))  # autocommit, no atomic block: at once
        print("outside", ready())
    """,
        redis_url,
        prefix,
    )
    assert out.splitlines() == ["inside 0", "committed 1", "rolled back 1", "outside 2"]


def test_notify_worker_finds_the_django_app(project: Path, redis_url: str, prefix: str) -> None:
    out = _run(
        project,
        """
        from tidings.cli.main import load_app
        from tidings.contrib.django import get_app
        print(load_app(None) is get_app())
    """,
        redis_url,
        prefix,
    )
    assert out.strip() == "True"


def test_async_jobs_close_stale_connections_in_the_orm_thread(
    project: Path, redis_url: str, prefix: str
) -> None:
    out = _run(
        project,
        """
        import asyncio
        from asgiref.sync import sync_to_async
        from django.db import connections
        from tidings.contrib.django import get_app
        from tidings.contrib.django.setup import CloseOldConnections
        assert any(isinstance(m, CloseOldConnections) for m in get_app().job_middleware)
        class AsyncJob:
            def runs_async(self):
                return True
        def open_conn():
            connections["default"].ensure_connection()
            return connections["default"].connection is not None
        def is_open():
            return connections["default"].connection is not None
        def close():
            connections["default"].close()
        async def job():
            return await sync_to_async(open_conn, thread_sensitive=True)()
        async def main():
            unwrapped = await job()
            print(unwrapped, await sync_to_async(is_open, thread_sensitive=True)())
            await sync_to_async(close, thread_sensitive=True)()
            wrapped = await CloseOldConnections().handle(AsyncJob(), job)
            print(wrapped, await sync_to_async(is_open, thread_sensitive=True)())
        asyncio.run(main())
    """,
        redis_url,
        prefix,
    )
    assert out.splitlines() == ["True True", "True False"]


def test_without_the_app_the_worker_says_what_to_add(
    project: Path, redis_url: str, prefix: str
) -> None:
    settings = project / "djsite" / "settings.py"
    settings.write_text(settings.read_text().replace('"tidings.contrib.django",', ""))
    out = _run(
        project,
        """
        from tidings.cli.main import load_app
        from tidings.errors import ConfigurationError
        try:
            load_app(None)
        except ConfigurationError as exc:
            print(exc)
    """,
        redis_url,
        prefix,
    )
    assert "add 'tidings.contrib.django' to INSTALLED_APPS" in out
    assert "notify-worker -A" in out
