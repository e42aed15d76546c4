"""The App ``notify-worker -A tests.e2e.notify_app:app`` runs in the notification e2e tests.

Built on first access of ``app`` from the environment (``TIDINGS_REDIS_URL``,
``TIDINGS_KEY``, ``TIDINGS_PREFIX``, ``TIDINGS_MAIL_URL``, ``TIDINGS_WEBHOOK_SECRET``,
``TIDINGS_WEBHOOK_ALLOW_PRIVATE`` ...). The test process imports the classes only and
notifies with its own App on the same Redis and prefix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tidings import App, ShouldQueue
from tidings.notifications import MailMessage, Notifiable, Notification, WebhookMessage

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            modules = os.environ.get("TIDINGS_ALLOWED_MODULES") or __name__
            _app = App.from_env(allowed_modules=modules)
        return _app
    raise AttributeError(name)


@dataclass
class Customer(Notifiable):
    id: int
    email: str
    webhook_url: str = ""


@dataclass
class OrderShipped(Notification, ShouldQueue):
    order: str
    channel: str = "mail"
    tries = 3

    def via(self, notifiable: Any) -> list[str]:
        return [self.channel]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(f"Order {self.order} shipped").line("On its way.")

    def to_webhook(self, notifiable: Any) -> WebhookMessage:
        return WebhookMessage({"order": self.order}, type="order.shipped")
