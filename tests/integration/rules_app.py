"""Notifications and notifiables of the delivery-rules tests (preferences, once_per,
digests, quiet hours), at module level so a worker resolves them by ``module:QualName``,
and an App for ``notify-worker -A tests.integration.rules_app:app`` built from
``TIDINGS_*`` variables on first access."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from tidings import App, ShouldBeEncrypted, ShouldQueue
from tidings.notifications import MailMessage, Notifiable, Notification, SmsMessage

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            allowed = os.environ.get("TIDINGS_ALLOWED_MODULES") or "tests"
            _app = App.from_env(allowed_modules=allowed)
            _app.extend_channel("ledger", LedgerChannel)
        return _app
    raise AttributeError(name)


@dataclass
class Member(Notifiable):
    id: int
    email: str = ""
    phone: str = ""
    timezone: str | None = None
    quiet_hours: tuple[Any, Any] | None = None

    def __post_init__(self) -> None:
        self.email = self.email or f"member{self.id}@example.org"
        self.phone = self.phone or f"+1555{self.id:07d}"


@dataclass
class Promo(Notification, ShouldQueue):
    """Mail and SMS; members may opt out."""

    text: str = "sale"
    tries: ClassVar[int | None] = 2
    backoff: ClassVar[Any] = 0

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Promo {self.text}").line(self.text)

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Promo {self.text}")


class Billing(Promo):
    """Mandatory: opt-outs do not hold it."""

    mandatory: ClassVar[bool] = True


class DiskAlert(Promo):
    """At most once an hour per member and disk."""

    once_per: ClassVar[Any] = timedelta(hours=1)

    def once_per_key(self, notifiable: Any) -> str:
        return self.text


@dataclass
class Comment(Notification, ShouldQueue):
    """Mail digested over ``WINDOW_S`` (default layout); SMS not digested."""

    text: str
    channels: tuple[str, ...] = ("mail",)
    WINDOW_S: ClassVar[float] = 1.0

    def via(self, notifiable: Any) -> list[str]:
        return list(self.channels)

    @property
    def digest(self) -> dict[str, timedelta]:
        return {"mail": timedelta(seconds=self.WINDOW_S)}

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Comment {self.text}").line(self.text)

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Comment {self.text}")


@dataclass
class Reply(Notification, ShouldQueue):
    """Digested with its own layout: ``to_mail_digest``."""

    text: str
    digest: ClassVar[Any] = timedelta(seconds=1)

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Reply {self.text}")

    def to_mail_digest(self, notifiable: Any, items: list[Reply]) -> MailMessage:
        message = MailMessage().subject(f"{len(items)} replies for member {notifiable.id}")
        for item in items:
            message.line(f"item:{item.text}")
        return message


class SlowReply(Reply):
    """A longer window, for the kill test (the worker must be up before it ends)."""

    digest: ClassVar[Any] = timedelta(seconds=3)


class LedgerChannel:
    """A custom channel that "delivers" by appending a line to the file named by
    ``TIDINGS_TEST_LEDGER`` (fsynced). When ``TIDINGS_TEST_KILL_MARKER`` names a file that
    does not exist yet, it creates it and SIGKILLs its own process right after the first
    delivery: delivered, but the digest's claimed list not yet deleted."""

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> str:
        items = notification.to_ledger(notifiable)
        path = os.environ["TIDINGS_TEST_LEDGER"]
        with open(path, "a") as f:
            f.write(json.dumps({"id": delivery_id, "items": items}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        marker = os.environ.get("TIDINGS_TEST_KILL_MARKER")
        if marker and not Path(marker).exists():
            Path(marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return "ok"


@contextlib.contextmanager
def ledger_env(ledger: Path, marker: Path | None) -> Iterator[None]:
    """Point an in-process worker's LedgerChannel at ``ledger``."""
    saved = {k: os.environ.get(k) for k in ("TIDINGS_TEST_LEDGER", "TIDINGS_TEST_KILL_MARKER")}
    os.environ["TIDINGS_TEST_LEDGER"] = str(ledger)
    os.environ.pop("TIDINGS_TEST_KILL_MARKER", None)
    if marker is not None:
        os.environ["TIDINGS_TEST_KILL_MARKER"] = str(marker)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Tally(Notification, ShouldQueue):
    """Digested on the ledger channel; ``to_ledger_digest`` lists the items' texts."""

    text: str
    digest: ClassVar[Any] = timedelta(seconds=1)

    def via(self, notifiable: Any) -> list[str]:
        return ["ledger"]

    def to_ledger_digest(self, notifiable: Any, items: list[Tally]) -> list[str]:
        return [i.text for i in items]


@dataclass
class Buzz(Notification, ShouldQueue):
    """SMS digested over 1 s (the default SMS layout); SMS is interruptive."""

    text: str
    digest: ClassVar[Any] = {"sms": timedelta(seconds=1)}

    def via(self, notifiable: Any) -> list[str]:
        return ["sms"]

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Buzz {self.text}")


class SecretReply(Reply, ShouldBeEncrypted):
    """Stored encrypted in its digest list."""


@dataclass
class Heads(Notification):
    """Not queued: sent at once by notify(), except what quiet hours hold."""

    text: str

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Heads {self.text}")

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(f"Heads {self.text}")


@dataclass
class Liked(Notification, ShouldQueue):
    """Digested into one database row (the default layout)."""

    by: str
    digest: ClassVar[Any] = timedelta(seconds=1)

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"by": self.by}
