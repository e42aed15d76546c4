"""SendQueuedNotification: one job per notifiable per channel, so a channel retries alone.

Retries: a notification that sets no ``tries`` gets the App's ``notification_tries``
(default 5) with exponential backoff (``notification_backoff`` seconds, doubled per
attempt with jitter, capped at ``notification_backoff_max``), for transient errors only:
a channel that could not deliver *now* (:class:`~tidings.errors.TransientChannelError`,
a timeout, a refused connection). Anything else (a permanent channel error, an invalid
address, a bug in ``to_mail``) fails at once, as Celery's ``autoretry_for`` would. A
notification that sets ``tries`` itself gets Laravel's rule: every exception counts.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from tidings import _current
from tidings.errors import ChannelError
from tidings.jobs.backoff import Exponential
from tidings.jobs.job import Job, option
from tidings.jobs.limits import channel_limits
from tidings.notifications.notification import Notification

_NO_MIDDLEWARE = Notification.middleware


def is_transient(exc: BaseException) -> bool:
    """Whether a later attempt may deliver: a channel error not marked permanent, a
    timeout, a refused or dropped connection."""
    if isinstance(exc, ChannelError):
        return not exc.permanent
    return isinstance(exc, TimeoutError | ConnectionError)


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

    def group_args(self) -> tuple[Any, ...]:
        """A notification's ``group`` hook gets the notifiable (e.g. to return its tenant)."""
        return (self.notifiable,)

    def option_defaults(self) -> dict[str, Any]:
        """The App's retry defaults for notifications (see the module docstring)."""
        try:
            s = _current.current().settings
        except Exception:  # no App: the worker's defaults
            return {}
        backoff = Exponential(
            base_s=s.notification_backoff, factor=2.0, max_s=s.notification_backoff_max
        )
        return {"tries": s.notification_tries, "backoff": backoff}

    def display_name(self) -> str:
        """``InvoicePaid (mail)``."""
        return f"{type(self.notification).__qualname__} ({self.channel})"

    def middleware(self) -> list[Any]:
        """The channel's rate limit (``app.rate_limit``), then the notification's middleware."""
        notification = self.notification
        if type(notification).middleware is _NO_MIDDLEWARE:  # the base's: none, not called
            own: list[Any] = []
        else:
            own = notification.middleware()
        if not getattr(_current.current(), "channel_limits", None):
            return own  # no app.rate_limit at all (the common case): nothing to look up
        return [*channel_limits(self.channel), *own]

    async def handle(self) -> Any:
        """Send through the app's channel."""
        sender = _current.current().notifications
        try:
            return await sender.deliver(
                self.notifiable, self.notification, self.channel, self.delivery_id
            )
        except Exception as exc:
            defaulted = option(self.notification, "tries") is None
            if defaulted and self.job_id is not None and not is_transient(exc):
                self.fail(exc)  # default retries are for transient errors only
                return None
            raise

    async def failed(self, exc: BaseException) -> None:
        """Call ``notification.failed(notifiable, channel, exc)`` when defined."""
        hook = getattr(self.notification, "failed", None)
        if hook is not None:
            out = hook(self.notifiable, self.channel, exc)
            if inspect.isawaitable(out):
                await out
