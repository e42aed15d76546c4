"""SendQueuedNotification: one job per notifiable per channel, so a channel retries alone."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from tidings import _current
from tidings.jobs.job import Job
from tidings.notifications.notification import Notification


@dataclass
class SendQueuedNotification(Job):
    """Deliver ``notification`` to ``notifiable`` on ``channel``.

    Attributes:
        delivery_id: fixed at dispatch and reused by every attempt: the Message-ID,
            the ``webhook-id`` and the SMS idempotency key, so a re-run after a crash
            can be recognised downstream.
    """

    notifiable: Any
    notification: Notification
    channel: str
    delivery_id: str

    def option_source(self) -> Any:
        """Options come from the notification."""
        return self.notification

    def display_name(self) -> str:
        """``InvoicePaid (mail)``."""
        return f"{type(self.notification).__qualname__} ({self.channel})"

    def middleware(self) -> list[Any]:
        """The channel's rate limit (``app.rate_limit``), then the notification's middleware."""
        from tidings.jobs.limits import channel_limits

        return [*channel_limits(self.channel), *self.notification.middleware()]

    async def handle(self) -> Any:
        """Send through the app's channel."""
        sender = _current.current().notifications
        return await sender.deliver(
            self.notifiable, self.notification, self.channel, self.delivery_id
        )

    async def failed(self, exc: BaseException) -> None:
        """Call ``notification.failed(notifiable, channel, exc)`` when defined."""
        hook = getattr(self.notification, "failed", None)
        if hook is not None:
            out = hook(self.notifiable, self.channel, exc)
            if inspect.isawaitable(out):
                await out
