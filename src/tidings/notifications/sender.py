"""NotificationSender: fans a notification out per notifiable and channel.

Queued notifications (``ShouldQueue``) become one :class:`SendQueuedNotification` job
per notifiable per channel; the others are delivered at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from tidings.events.listener import ShouldQueue
from tidings.hosts import AppHost
from tidings.jobs.job import PendingDispatch, delay_seconds
from tidings.notifications.channels.manager import ChannelManager
from tidings.notifications.events import NotificationFailed, NotificationSending, NotificationSent
from tidings.notifications.notification import Notification
from tidings.notifications.queued import SendQueuedNotification
from tidings.observability import tracing

log = logging.getLogger("tidings.notifications")


def delivery_id(notification_id: str, index: int, channel: str) -> str:
    """A stable id for one (notification, notifiable, channel): 32 hex chars."""
    return hashlib.sha256(f"{notification_id}:{index}:{channel}".encode()).hexdigest()[:32]


def _as_list(notifiables: Any) -> list[Any]:
    """One notifiable, or any iterable of them (a list, a generator, an ORM queryset)."""
    if isinstance(notifiables, (list, tuple, set, frozenset)):
        return list(notifiables)
    single = hasattr(notifiables, "route_notification_for")
    if single or isinstance(notifiables, (str, bytes, Mapping)):
        return [notifiables]
    if isinstance(notifiables, Iterable):
        return list(notifiables)
    return [notifiables]


class NotificationSender:
    """Sends and queues notifications for one App."""

    def __init__(self, app: AppHost) -> None:
        self.app = app
        self.channels = ChannelManager(app)

    # -- queueing ----------------------------------------------------------------------

    def _jobs(
        self, notifiables: Iterable[Any], notification: Notification
    ) -> list[PendingDispatch]:
        """One job per notifiable per channel; a malformed route raises ValidationError
        here, before anything is pushed."""
        nid = uuid.uuid4().hex
        queues = notification.via_queues() or {}
        jobs: list[PendingDispatch] = []
        for index, notifiable in enumerate(notifiables):
            delays = notification.with_delay(notifiable) or {}
            for channel in notification.via(notifiable):
                self.channels.check_route(channel, notifiable, notification)
                job = SendQueuedNotification(
                    notifiable, notification, channel, delivery_id(nid, index, channel)
                )
                pending = PendingDispatch(job, queue=queues.get(channel))
                if channel in delays:
                    pending.delay_s = delay_seconds(delays[channel])
                jobs.append(pending)
        return jobs

    def send(self, notifiables: Any, notification: Notification) -> list[str]:
        """Queue (ShouldQueue) or send now; returns the queued job ids."""
        targets = _as_list(notifiables)
        if isinstance(notification, ShouldQueue):
            return list(self.app.dispatch_many(self._jobs(targets, notification)))
        self.send_now(targets, notification)
        return []

    async def send_async(self, notifiables: Any, notification: Notification) -> list[str]:
        """Async twin of :meth:`send`."""
        targets = _as_list(notifiables)
        if isinstance(notification, ShouldQueue):
            return list(await self.app.dispatch_many_async(self._jobs(targets, notification)))
        await self.send_now_async(targets, notification)
        return []

    # -- sending now -------------------------------------------------------------------

    def send_now(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        """Deliver now from sync code; returns each channel's response."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._send_now_closing(notifiables, notification, channels))
        raise RuntimeError(
            "send_now() called inside an event loop: await notify_now_async() instead"
        )

    async def _send_now_closing(
        self, notifiables: Any, notification: Notification, channels: list[str] | None
    ) -> list[Any]:
        try:
            return await self.send_now_async(notifiables, notification, channels)
        finally:
            await self.channels.close_loop()

    async def send_now_async(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        """Deliver now; returns each channel's response (None where skipped)."""
        nid = uuid.uuid4().hex
        results: list[Any] = []
        for index, notifiable in enumerate(_as_list(notifiables)):
            for channel in channels or notification.via(notifiable):
                did = delivery_id(nid, index, channel)
                results.append(await self.deliver(notifiable, notification, channel, did))
        return results

    async def deliver(
        self, notifiable: Any, notification: Notification, channel: str, delivery: str
    ) -> Any:
        """Send one notification on one channel, announcing Sending / Sent / Failed.

        As in Laravel, the first listener of NotificationSending to return something
        other than None decides: ``False`` vetoes the send. Listeners may be async. A
        Sent or Failed listener that raises is logged: it must neither fail a delivered
        notification (a retry would send it again) nor mask the channel's own error
        (whose ``permanent`` / ``retry_after_s`` decide the retry).
        """
        if not notification.should_send(notifiable, channel):
            return None
        sending = NotificationSending(notifiable, notification, channel, delivery)
        if await self._announce(sending, halt=True) is False:
            return None
        try:
            if tracing.ENABLED:
                attrs = {"tidings.channel": channel, "tidings.delivery_id": delivery,
                         "tidings.notification": type(notification).__name__}  # fmt: skip
                with tracing.span(f"notify {channel}", attrs, kind="CLIENT"):
                    response = await self.channels.send(channel, notifiable, notification, delivery)
            else:
                response = await self.channels.send(channel, notifiable, notification, delivery)
        except Exception as exc:
            await self._announce_safely(
                NotificationFailed(notifiable, notification, channel, delivery, exc)
            )
            raise
        await self._announce_safely(
            NotificationSent(notifiable, notification, channel, delivery, response)
        )
        return response

    async def _announce(self, event: object, *, halt: bool = False) -> Any:
        events = self.app.events
        if not events.has_listeners(type(event)):
            return None
        return await events.dispatch_async(event, halt=halt)

    async def _announce_safely(self, event: Any) -> None:
        try:
            await self._announce(event)
        except Exception:
            log.exception(
                "a %s listener raised (%s, %s)",
                type(event).__name__,
                event.channel,
                event.delivery_id,
            )
