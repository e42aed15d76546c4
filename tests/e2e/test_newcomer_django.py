"""A newcomer's walk-through of a fresh Django project, driven by the documented commands.

``django-admin startproject``, one app, a queued mail notification sent after commit,
Django's ``EMAIL_*`` settings (no ``mail_url`` anywhere), then the worker, ``monitor``
and ``failed list`` / ``failed retry`` run from the project directory and from another
one. The SMTP sink (aiosmtpd on loopback) is stopped for 2 s while a mail is due: with
default settings the mail still arrives once it is back. Redis is the session's real
redis-server; every process started here is stopped by pid.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import Proc, free_port
from tests.support.smtp import Recorder, SmtpServer, _Controller, wait_until

pytest.importorskip("django")

NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
KEY = "walk-through-signing-key-0123456789abcdef"

NOTIFICATIONS = """
from dataclasses import dataclass

from tidings import ShouldQueue
from tidings.notifications import MailMessage, Notification


@dataclass
class Welcome(Notification, ShouldQueue):
    name: str
    after_commit = True

    def via(self, notifiable):
        return ["mail"]

    def to_mail(self, notifiable):
        return MailMessage().subject(f"Welcome, {self.name}!").line("Glad you are here.")
"""

SIGNUP = """
import os
from django.contrib.auth.models import User
from django.db import transaction
from tidings.notifications import route
from accounts.notifications import Welcome

name, email, commit = os.environ["SIGNUP"].split()
commit = commit == "commit"
try:
    with transaction.atomic():
        user = User.objects.create(username=name, email=email)
        ids = route("mail", user.email).notify(Welcome(name))
        print("queued", ids)
        if not commit:
            raise RuntimeError("rolled back")
except RuntimeError:
    print("rolled back")
"""


class SmtpSink(SmtpServer):
    """aiosmtpd on a fixed loopback port, so it can be stopped and started again."""

    def __init__(self, port: int, recorder: Recorder) -> None:
        super().__init__(recorder)
        self.port = port

    def start(self) -> SmtpSink:
        controller = _Controller(self.recorder, hostname="127.0.0.1", port=self.port,
                                 server_hostname="mx.test")  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                controller.start()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._controller = controller
        return self


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TIDINGS_", "DJANGO_")) and k not in ("REDIS_URL", "PYTHONPATH")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # fmt: skip
    return done


def _ok(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = _run(args, cwd, env)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _new_project(root: Path, redis_url: str, prefix: str, smtp_port: int) -> Path:
    """startproject + startapp, as the Django tutorial of tidings says."""
    _ok([sys.executable, "-m", "django", "startproject", "mysite", str(root)], root, _env())
    _ok([sys.executable, "manage.py", "startapp", "accounts"], root, _env())
    (root / "accounts" / "notifications.py").write_text(NOTIFICATIONS)
    (root / "signup.py").write_text(SIGNUP)
    settings = root / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text()
        + f"""
INSTALLED_APPS += ["accounts", "tidings.contrib.django"]
TIDINGS = {{
    "redis_url": {redis_url!r},
    "key": {KEY!r},
    "prefix": {prefix!r},
    "mail_allow_test_domains": True,
}}
# Django's own mail settings: tidings sends with them (no mail_url given).
EMAIL_HOST = "127.0.0.1"
EMAIL_PORT = {smtp_port}
DEFAULT_FROM_EMAIL = "Mysite <noreply@mysite.test>"
"""
    )
    _ok([sys.executable, "manage.py", "migrate", "-v", "0"], root, _env())
    return root


def _signup(project: Path, name: str, email: str, *, commit: bool = True) -> str:
    """A signup in ``manage.py shell``: a user created and a mail queued in atomic()."""
    signup = f"{name} {email} {'commit' if commit else 'rollback'}"
    env = _env(DJANGO_SETTINGS_MODULE="mysite.settings", SIGNUP=signup)
    code = "exec(open('signup.py').read())"
    return _ok([sys.executable, "manage.py", "shell", "-c", code], project, env)


def _subjects(recorder: Recorder) -> list[str]:
    out = []
    for m in list(recorder.messages):
        found = re.search(rb"^Subject: (.*)$", m.data, re.M)
        out.append(found.group(1).decode().strip() if found else "")
    return out


def test_a_newcomer_walks_through_a_fresh_django_project(
    tmp_path: Path, redis_url: str, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    project = tmp_path / "mysite"
    project.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recorder = Recorder(rcpt_replies={"bounce@mysite.test": "550 5.1.1 no such user"})
    sink = SmtpSink(free_port(), recorder).start()
    try:
        _new_project(project, redis_url, prefix, sink.port)
        here = _env(DJANGO_SETTINGS_MODULE="mysite.settings")
        there = _env(DJANGO_SETTINGS_MODULE="mysite.settings", PYTHONPATH=str(project))

        # A rolled-back signup queues nothing; a committed one queues one mail.
        assert "rolled back" in _signup(project, "ghost", "ghost@mysite.test", commit=False)
        assert "queued" in _signup(project, "ada", "ada@mysite.test")

        # The worker, from the project directory, as docs/tutorials/django.md says.
        worker = spawn_proc([NOTIFY_WORKER], name="worker", env=here, cwd=project)
        assert wait_until(lambda: len(recorder.messages) == 1, 30), worker.tail()
        first = recorder.messages[0]
        assert first.rcpt_tos == ["ada@mysite.test"]
        assert first.mail_from == "noreply@mysite.test"  # DEFAULT_FROM_EMAIL
        assert "Welcome, ghost!" not in _subjects(recorder)

        # The SMTP server goes away for 2 s while a mail is due: with default settings
        # (no tries, no backoff set anywhere) the mail is retried and arrives.
        sink.stop()
        assert "queued" in _signup(project, "grace", "grace@mysite.test")
        time.sleep(2.0)
        sink.start()
        assert wait_until(lambda: "Welcome, grace!" in _subjects(recorder), 30), worker.tail()
        assert "Released" in worker.output() and "TIDINGS_MAIL_URL" not in worker.output()

        # A permanent refusal fails at once and shows in `failed list`, from the project
        # directory and from another one; `failed retry` from elsewhere sends it again.
        assert "queued" in _signup(project, "bounce", "bounce@mysite.test")
        for cwd, env in ((project, here), (elsewhere, there)):
            assert wait_until(
                lambda cwd=cwd, env=env: "Welcome (mail)" in _run(
                    [NOTIFY_WORKER, "failed", "list"], cwd, env).stdout, 20,
            ), worker.tail()  # fmt: skip
            listed = _ok([NOTIFY_WORKER, "failed", "list"], cwd, env)
            assert f"Redis: {redis_url}" in listed and "550" in listed
            shown = _ok([NOTIFY_WORKER, "monitor"], cwd, env)
            assert f"Redis: {redis_url}" in shown and re.search(r"^default\s+\d+", shown, re.M)
        recorder.rcpt_replies.clear()  # the mailbox exists now
        retried = _ok([NOTIFY_WORKER, "failed", "retry", "--all"], elsewhere, there)
        assert "Pushed 1 failed job back" in retried
        assert wait_until(lambda: "Welcome, bounce!" in _subjects(recorder), 30), worker.tail()
        assert "No failed jobs." in _ok([NOTIFY_WORKER, "failed", "list"], elsewhere, there)

        # Without DJANGO_SETTINGS_MODULE an operator command refuses to guess (it would
        # read an empty embedded Redis) and names what to set.
        lost = _run([NOTIFY_WORKER, "failed", "list"], elsewhere, _env())
        assert lost.returncode == 78, lost
        for name in ("-A", "TIDINGS_APP", "TIDINGS_REDIS_URL", "DJANGO_SETTINGS_MODULE"):
            assert name in lost.stderr
        assert not (elsewhere / ".tidings").exists() and not (project / ".tidings").exists()

        assert worker.stop(10) == 0
        assert "worker stopping" in worker.output()
        assert sorted(_subjects(recorder)) == sorted(
            ["Welcome, ada!", "Welcome, grace!", "Welcome, bounce!"]
        )
    finally:
        sink.stop()
