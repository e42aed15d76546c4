"""What the notification integration tests share: notifiables, notifications, servers, a worker.

Notifications and notifiables live here at module level so an in-process worker can
resolve them by ``module:QualName`` (the test Apps allow ``tests``). The servers are the
real ones from :mod:`tests.support`: aiosmtpd (``SmtpServer``), a Twilio-shaped SMS stub
and a Standard Webhooks receiver (both ``HttpServer``), each recording what it got with
the time it got it.
"""

from __future__ import annotations

import asyncio
import base64
import email
import email.message
import email.policy
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.http import Hit, HttpServer, Reply
from tests.support.smtp import Received, SmtpServer
from tidings import App, ShouldQueue
from tidings.notifications import (
    MailMessage,
    Notifiable,
    Notification,
    SmsMessage,
    WebhookMessage,
)
from tidings.worker.worker import Worker, WorkerOptions

KEY = "notify-test-key-0123456789abcdef-xyz"
SECRET = "whsec_" + base64.b64encode(b"tidings-notify-secret-32-bytes!!").decode()
SID, TOKEN = "ACnotify0123456789", "tok_notify_very_secret_42"
SMS_FROM = "+15550001111"
RETRY_AFTER = 3.0

# What in-process test channels and hooks saw (reset per test by the ``servers`` fixture).
SLACK: list[tuple[Any, ...]] = []
HOOKS: list[tuple[Any, ...]] = []
GATE: dict[str, bool] = {}


# -- notifiables ----------------------------------------------------------------------------


@dataclass
class User(Notifiable):
    id: int
    name: str
    email: str
    phone: str
    webhook_url: str = ""
    slack_channel: str = ""

    def route_notification_for_slack(self, notification: Any) -> str:
        return self.slack_channel or f"#user-{self.id}"


# -- notifications --------------------------------------------------------------------------


@dataclass
class InvoicePaid(Notification, ShouldQueue):
    """Mail, SMS and webhook by default; ``channels`` narrows it."""

    invoice: str
    channels: tuple[str, ...] = ("mail", "sms", "webhook")

    tries: ClassVar[int | None] = 3
    backoff: ClassVar[Any] = 0.2

    def via(self, notifiable: Any) -> list[str]:
        return list(self.channels)

    def to_mail(self, notifiable: Any) -> MailMessage:
        return (
            MailMessage()
            .subject(f"Invoice {self.invoice} paid")
            .greeting(f"Hi {getattr(notifiable, 'name', 'there')}")
            .line("We received your payment.")
            .action("View invoice", f"https://example.org/invoices/{self.invoice}")
            .line("Thank you for your business.")
        )

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Invoice {self.invoice} paid")

    def to_webhook(self, notifiable: Any) -> WebhookMessage:
        return WebhookMessage(
            {"invoice": self.invoice, "user": getattr(notifiable, "id", None)},
            type="invoice.paid",
        )

    def failed(self, notifiable: Any, channel: str, exc: BaseException) -> None:
        HOOKS.append(("failed", channel, type(exc).__name__, str(exc)))


@dataclass
class InvoicePaidNow(Notification):
    """Not queued: ``notify`` sends at once."""

    invoice: str

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Invoice {self.invoice} paid").line("Thanks")

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Invoice {self.invoice} paid")


@dataclass
class OneTry(InvoicePaid):
    tries = 1


@dataclass
class TwoTries(InvoicePaid):
    tries = 2
    backoff = 0.1


@dataclass
class SlowBackoff(InvoicePaid):
    """F14: three tries, 1 s then 2 s apart."""

    tries = 3
    backoff = [1.0, 2.0]


@dataclass
class Gated(InvoicePaid):
    """``should_send`` reads ``GATE`` when the job runs, not when it is queued."""

    def should_send(self, notifiable: Any, channel: str) -> bool:
        HOOKS.append(("should_send", channel))
        return GATE.get(channel, True)


@dataclass
class Routed(InvoicePaid):
    """Per-channel queues and delays."""

    def via_queues(self) -> dict[str, str]:
        return {"mail": "mail", "sms": "sms"}

    def with_delay(self, notifiable: Any) -> dict[str, Any]:
        return {"sms": 2}


@dataclass
class Templated(InvoicePaid):
    """Mail through an app template (``view``) with the given context."""

    template: str = "invoice.html.j2"
    context: dict[str, Any] = field(default_factory=dict)

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject("Templated").view(self.template, **self.context)


@dataclass
class Hostile(InvoicePaid):
    """Data that looks like template code and markup, put through the default layout."""

    payload: str = ""

    def to_mail(self, notifiable: Any) -> MailMessage:
        return (
            MailMessage()
            .subject(f"About {self.payload}")
            .greeting(self.payload)
            .line(self.payload)
            .line("{{ ''.__class__.__mro__ }}")
        )


@dataclass
class RawSubject(InvoicePaid):
    """A subject taken verbatim from data (CR/LF included)."""

    subject: str = ""

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(self.subject).line("hi")


@dataclass
class ToSlack(Notification, ShouldQueue):
    text: str
    tries = 1

    def via(self, notifiable: Any) -> list[str]:
        return ["slack", "mail"]

    def to_slack(self, notifiable: Any) -> dict[str, str]:
        return {"channel": notifiable.route_notification_for("slack", self), "text": self.text}

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(self.text).line(self.text)


class SlackChannel:
    """A custom channel: ``async send(notifiable, notification)`` using ``to_slack``."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def send(self, notifiable: Any, notification: Any) -> str:
        message = notification.to_slack(notifiable)
        await asyncio.sleep(0)
        SLACK.append((message["channel"], message["text"]))
        return f"slack ok {message['channel']}"


# -- servers --------------------------------------------------------------------------------


@dataclass
class Stamped:
    hit: Hit
    at: float  # time.monotonic() when the request arrived


class SmsStub:
    """Twilio-shaped: ``POST /2010-04-01/Accounts/{SID}/Messages.json`` answers 201 + sid.

    ``fail_once`` numbers get ``500`` on their first request; ``always`` maps a number to
    a fixed reply (e.g. 401).
    """

    def __init__(self) -> None:
        self.fail_once: set[str] = set()
        self.always: dict[str, Reply | Callable[[Hit], Reply]] = {}
        self.stamped: list[Stamped] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.server = HttpServer(self._reply)

    def _reply(self, hit: Hit) -> Reply:
        to = form(hit).get("To", "")
        with self._lock:
            self.stamped.append(Stamped(hit, time.monotonic()))
            self._seen[to] = self._seen.get(to, 0) + 1
            first = self._seen[to] == 1
            sid = f"SM{next(self._ids):08d}"
        if to in self.always:
            fixed = self.always[to]
            return fixed(hit) if callable(fixed) else fixed
        if to in self.fail_once and first:
            return Reply(500, b'{"message": "internal error", "code": 20500}')
        return Reply(201, json.dumps({"sid": sid, "status": "queued", "to": to}).encode())

    @property
    def hits(self) -> list[Hit]:
        return self.server.hits

    @property
    def url(self) -> str:
        return self.server.url


class WebhookReceiver:
    """Answers 200, or what ``script`` says per hit (index, hit) -> Reply."""

    def __init__(self) -> None:
        self.script: Callable[[int, Hit], Reply] | None = None
        self.stamped: list[Stamped] = []
        self._lock = threading.Lock()
        self.server = HttpServer(self._reply)

    def _reply(self, hit: Hit) -> Reply:
        with self._lock:
            self.stamped.append(Stamped(hit, time.monotonic()))
            index = len(self.stamped) - 1
        if self.script is not None:
            return self.script(index, hit)
        return Reply(200, b'{"ok": true}')

    @property
    def hits(self) -> list[Hit]:
        return self.server.hits

    @property
    def url(self) -> str:
        return self.server.url


@dataclass
class Servers:
    smtp: SmtpServer
    sms: SmsStub
    hooks: WebhookReceiver

    def user(self, i: int, **kw: Any) -> User:
        values: dict[str, Any] = {
            "id": i,
            "name": f"User {i}",
            "email": f"user{i}@example.org",
            "phone": f"+1555{i:07d}",
            "webhook_url": f"{self.hooks.url}/hooks/{i}",
        }
        values.update(kw)
        return User(**values)


@pytest.fixture
def servers() -> Iterator[Servers]:
    SLACK.clear()
    HOOKS.clear()
    GATE.clear()
    sms, hooks = SmsStub(), WebhookReceiver()
    with SmtpServer() as smtp, sms.server, hooks.server:
        yield Servers(smtp, sms, hooks)


def sms_url(base: str) -> str:
    return (
        f"twilio://{SID}:{TOKEN}@default?from=%2B{SMS_FROM[1:]}"
        f"&base_url={urllib.parse.quote(base, safe='')}"
    )


def make_app(redis_url: str, prefix: str, s: Servers | None = None, **overrides: Any) -> App:
    options: dict[str, Any] = {
        "redis_url": redis_url,
        "key": KEY,
        "prefix": prefix,
        "mail_from": "Acme Billing <billing@example.org>",
        "webhook_secret": SECRET,
        "webhook_allow_private": True,
        "allowed_modules": "tests",
        "retry_after": RETRY_AFTER,
    }
    if s is not None:
        options["mail_url"] = f"smtp://127.0.0.1:{s.smtp.port}?tls=off"
        options["sms_url"] = sms_url(s.sms.url)
    options.update(overrides)
    return App(env=False, **options)


@pytest.fixture
def app_factory(redis_url: str, prefix: str) -> Iterator[Callable[..., App]]:
    made: list[App] = []

    def make(s: Servers | None = None, **overrides: Any) -> App:
        app = make_app(redis_url, prefix, s, **overrides)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def options(**kw: Any) -> WorkerOptions:
    values: dict[str, Any] = {"stop_when_empty": True, "sleep_s": 0.5, "timeout_s": 15.0}
    values.update(kw)
    return WorkerOptions(**values)


def work(app: App, **kw: Any) -> Worker:
    """Run an in-process worker until the queues are empty (delayed jobs included)."""
    app.make_current()
    worker = Worker(app, options(**kw))
    code = asyncio.run(worker.run())
    assert code == 0
    return worker


# -- reading what arrived -------------------------------------------------------------------


def form(hit: Hit) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(hit.body.decode()))


def parse(received: Received) -> email.message.EmailMessage:
    msg = email.message_from_bytes(received.data, policy=email.policy.default)
    assert isinstance(msg, email.message.EmailMessage)
    return msg


def parts(msg: email.message.EmailMessage) -> dict[str, str]:
    """``{"text/plain": ..., "text/html": ...}`` of a multipart/alternative message."""
    out: dict[str, str] = {}
    for part in msg.walk():
        if part.get_content_maintype() == "text":
            assert isinstance(part, email.message.EmailMessage)
            out[part.get_content_type()] = str(part.get_content())
    return out


def failed_store(app: App) -> list[Any]:
    return app.queue_for(None).failed()


def templates_dir(tmp: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (tmp / name).write_text(text)
    return str(tmp)
