"""Queued notifications retry transient channel errors by default (issue 22, item 4).

A notification that sets no ``tries`` gets the App's ``notification_tries`` (5) with
exponential backoff and jitter; transient errors (an SMTP 4xx, the server gone) are
retried, permanent ones (550) and errors that are not the channel's fail at once; the
notification's own ``tries``, and the settings, override the default. Real Redis, real
worker, aiosmtpd on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tests.integration.notify_support import failed_store, work
from tests.support.smtp import Recorder, SmtpServer
from tidings import App, ShouldQueue
from tidings.jobs.compose import build_body
from tidings.notifications import MailMessage, Notification, route
from tidings.notifications.queued import SendQueuedNotification

AppFactory = Callable[..., App]


@dataclass
class Hello(Notification, ShouldQueue):
    """Sets neither ``tries`` nor ``backoff``: the defaults apply."""

    name: str

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Hello {self.name}").line("Hi")


@dataclass
class Broken(Hello):
    """A bug in ``to_mail``: not a channel error, so no retry."""

    def to_mail(self, notifiable: Any) -> MailMessage:
        raise ValueError("bug in to_mail")


@dataclass
class OwnTries(Hello):
    tries: ClassVar[int | None] = 2
    backoff: ClassVar[Any] = 0.1


def _app(app_factory: AppFactory, smtp: SmtpServer, **kw: Any) -> App:
    return app_factory(mail_url=f"smtp://127.0.0.1:{smtp.port}?tls=off", **kw)


def test_the_payload_carries_the_default_tries_and_exponential_backoff(
    app_factory: AppFactory,
) -> None:
    app = app_factory(notification_tries=7, notification_backoff=0.5)
    job = SendQueuedNotification(route("mail", "a@example.org"), Hello("a"), "mail", "d1")
    body = build_body(job, "id1")
    assert body["maxTries"] == 7
    assert body["backoff"] == {"exp": 0.5, "f": 2.0, "max": 60.0, "j": True}
    own = SendQueuedNotification(route("mail", "a@example.org"), OwnTries("a"), "mail", "d2")
    assert build_body(own, "id2")["maxTries"] == 2 and build_body(own, "id2")["backoff"] == [0.1]
    assert app.settings.notification_tries == 7


def test_a_two_second_smtp_outage_is_retried_with_default_settings(
    app_factory: AppFactory,
) -> None:
    recorder = Recorder(rcpt_replies={"ada@example.org": "451 4.3.0 try again later"})
    with SmtpServer(recorder) as smtp:
        app = _app(app_factory, smtp)
        route("mail", "ada@example.org").notify(Hello("Ada"))
        # The mailbox answers 451 for 2 s, then accepts.
        timer = threading.Timer(2.0, recorder.rcpt_replies.clear)
        timer.start()
        t0 = time.monotonic()
        try:
            work(app)
        finally:
            timer.cancel()
        assert [m.rcpt_tos for m in recorder.messages] == [["ada@example.org"]]
        assert failed_store(app) == []
        assert recorder.rcpts_seen.count("ada@example.org") >= 2  # retried
        assert time.monotonic() - t0 < 20


def test_permanent_and_non_channel_errors_still_fail_at_once(app_factory: AppFactory) -> None:
    recorder = Recorder(rcpt_replies={"gone@example.org": "550 5.1.1 no such user"})
    with SmtpServer(recorder) as smtp:
        app = _app(app_factory, smtp)
        route("mail", "gone@example.org").notify(Hello("Gone"))
        route("mail", "bug@example.org").notify(Broken("Bug"))
        t0 = time.monotonic()
        work(app)
        records = {r.name: r for r in failed_store(app)}
        assert set(records) == {"Hello (mail)", "Broken (mail)"}
        assert all(r.attempts == 1 for r in records.values()), records
        assert "550" in records["Hello (mail)"].exception
        assert "bug in to_mail" in records["Broken (mail)"].exception
        assert recorder.rcpts_seen.count("gone@example.org") == 1
        assert time.monotonic() - t0 < 10


def test_the_notification_and_the_settings_override_the_default(
    app_factory: AppFactory,
) -> None:
    recorder = Recorder(rcpt_replies={"busy@example.org": "451 4.3.0 try again later"})
    with SmtpServer(recorder) as smtp:
        app = _app(app_factory, smtp, notification_tries=1)
        route("mail", "busy@example.org").notify(Hello("once"))
        work(app)
        assert [r.attempts for r in failed_store(app)] == [1]  # settings: no retry
        app.queue_for(None).flush()
        route("mail", "busy@example.org").notify(OwnTries("twice"))
        work(app)
        assert [r.attempts for r in failed_store(app)] == [2]  # its own tries win
        assert recorder.rcpts_seen.count("busy@example.org") == 3
