"""The sign-up example: an event, a queued listener, and a Welcome notification.

UserRegistered ──▶ SendWelcome (queued listener) ──▶ user.notify(Welcome)
                                                     ├─ mail    → .eml in ./.tidings/outbox
                                                     ├─ sms     → the worker's log
                                                     └─ webhook → a local receiver

Runs on the embedded defaults (no Redis to install). ``run.py`` beside this file
starts a worker and a webhook receiver and prints what was delivered.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field

from tidings import App, Listener, ShouldQueue
from tidings.notifications import MailMessage, Notifiable, Notification, SmsMessage, WebhookMessage

log = logging.getLogger("signup")

app = App.from_env(
    # The demo's receiver listens on 127.0.0.1, which webhooks refuse by default (SSRF guard).
    webhook_allow_private=True,
    webhook_secret=os.environ.get(
        "TIDINGS_WEBHOOK_SECRET", "whsec_ZGVtby1zZWNyZXQtZm9yLXRoZS1zaWdudXAtZXhhbXBsZQ=="
    ),
)


@dataclass
class User(Notifiable):
    id: int
    name: str
    email: str
    phone: str
    webhook_url: str | None = None
    joined: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


@dataclass
class UserRegistered:
    user: User


class Welcome(Notification, ShouldQueue):
    tries = 3
    backoff = [1, 5, 10]

    def __init__(self, plan: str) -> None:
        self.plan = plan

    def via(self, notifiable: User) -> list[str]:
        return ["mail", "sms", "webhook"] if notifiable.webhook_url else ["mail", "sms"]

    def to_mail(self, notifiable: User) -> MailMessage:
        return (
            MailMessage()
            .subject(f"Welcome aboard, {notifiable.name}!")
            .greeting(f"Hello {notifiable.name},")
            .line(f"Your {self.plan} plan is ready.")
            .action("Open your dashboard", "https://example.org/dashboard")
            .line("Thanks for joining.")
        )

    def to_sms(self, notifiable: User) -> SmsMessage:
        return SmsMessage(f"Welcome {notifiable.name}! Your {self.plan} plan is ready.")

    def to_webhook(self, notifiable: User) -> WebhookMessage:
        return WebhookMessage({"user_id": notifiable.id, "plan": self.plan}, type="user.welcomed")


class SendWelcome(Listener, ShouldQueue):
    """Queued: runs in the worker, and sends the (queued) Welcome notification."""

    queue = "default"
    tries = 3

    def handle(self, event: UserRegistered) -> None:
        log.info("sending welcome to %s", event.user.email)
        event.user.notify(Welcome("starter"))


def audit(event: UserRegistered) -> None:
    """A sync listener: runs at dispatch time, in the web process."""
    print(f"[app] audit: user {event.user.id} registered at {event.user.joined:%H:%M:%S}")


app.listen(UserRegistered, [audit, SendWelcome])
