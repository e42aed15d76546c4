"""NotificationSender: fans a notification out per notifiable and channel.

Queued notifications (``ShouldQueue``) become one :class:`SendQueuedNotification` job
per notifiable per channel; the others are delivered at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterable
from typing import Any

from tidings.events.listener import ShouldQueue
from tidings.notifications.channels.manager import ChannelManager
from tidings.notifications.events import NotificationFailed, NotificationSending, NotificationSent
from tidings.notifications.notification import Notification
from tidings.notifications.queued import SendQueuedNotification
from tidings.queue.job import PendingDispatch, delay_seconds


def delivery_id(notification_id: str, index: int, channel: str) -> str:
    """A stable id for one (notification, notifiable, channel): 32 hex chars."""
    return hashlib.sha256(f"{notification_id}:{index}:{channel}".encode()).hexdigest()[:32]


def _as_list(notifiables: Any) -> list[Any]:
    if isinstance(notifiables, (list, tuple, set)):
        return list(notifiables)
    return [notifiables]


class NotificationSender:
    """Sends and queues notifications for one App."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.channels = ChannelManager(app)

    # -- queueing ----------------------------------------------------------------------

    def _jobs(
        self, notifiables: Iterable[Any], notification: Notification
    ) -> list[PendingDispatch]:
        nid = uuid.uuid4().hex
        queues = notification.via_queues() or {}
        jobs: list[PendingDispatch] = []
        for index, notifiable in enumerate(notifiables):
            delays = notification.with_delay(notifiable) or {}
            for channel in notification.via(notifiable):
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
        """Send one notification on one channel, announcing Sending / Sent / Failed."""
        if not notification.should_send(notifiable, channel):
            return None
        events = self.app.events
        sending = NotificationSending(notifiable, notification, channel, delivery)
        if events.has_listeners(NotificationSending) and False in events.dispatch(sending):
            return None
        try:
            response = await self.channels.send(channel, notifiable, notification, delivery)
        except Exception as exc:
            self.app.emit(NotificationFailed(notifiable, notification, channel, delivery, exc))
            raise
        self.app.emit(NotificationSent(notifiable, notification, channel, delivery, response))
        return response
