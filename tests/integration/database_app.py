"""Notifications and notifiables of the database-channel tests (a worker resolves them by
``module:QualName``), and an App for ``notify-worker -A tests.integration.database_app:app``
built from ``TIDINGS_*`` variables on first access."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from tidings import App, ShouldQueue
from tidings.notifications import Notifiable, Notification

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            allowed = os.environ.get("TIDINGS_ALLOWED_MODULES") or "tests"
            _app = App.from_env(allowed_modules=allowed)
        return _app
    raise AttributeError(name)


@dataclass
class Member(Notifiable):
    id: int
    name: str = "member"


@dataclass
class Team(Notifiable):
    """A notifiable with its own type name and route."""

    slug: str
    notifiable_type: ClassVar[str] = "team"

    def route_notification_for_database(self, notification: Any) -> str:
        return self.slug


@dataclass
class InvoicePaid(Notification, ShouldQueue):
    invoice: int
    amount: str = "12.50"
    tries: ClassVar[int | None] = 3
    backoff: ClassVar[Any] = 0

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"invoice": self.invoice, "amount": self.amount, "to": notifiable.name}


@dataclass
class Mentioned(Notification, ShouldQueue):
    """Only ``to_dict``: the database channel falls back to it; a custom type name."""

    by: str

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_dict(self, notifiable: Any) -> dict[str, Any]:
        return {"by": self.by}

    def database_type(self, notifiable: Any) -> str:
        return "mention"


@dataclass
class NotJson(Notification, ShouldQueue):
    tries: ClassVar[int | None] = 3

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"when": object()}


@dataclass
class NoData(Notification, ShouldQueue):
    def via(self, notifiable: Any) -> list[str]:
        return ["database"]


@dataclass
class Greeting(Notification, ShouldQueue):
    """Non-ASCII text and 4-byte emoji (MySQL's ``utf8`` is 3 bytes: only ``utf8mb4``
    stores them) in the data and in the notifiable's id."""

    text: str

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"text": self.text, "nested": {"tags": ["café", "🎉", "日本語"]}, "n": 1.5}
