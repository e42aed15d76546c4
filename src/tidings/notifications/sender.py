"""NotificationSender: fans a notification out per notifiable and channel.

Queued notifications (``ShouldQueue``) become one :class:`SendQueuedNotification` job
per notifiable per channel; the others are delivered at once. Before either, the
delivery rules (:mod:`tidings.notifications.rules`: preferences, ``once_per``,
digests, quiet hours) decide which channels go, wait or join a digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import CoroutineType
from typing import Any

from tidings.events.listener import ShouldQueue
from tidings.hosts import AppHost
from tidings.jobs.job import PendingDispatch, delay_seconds
from tidings.notifications.channels.manager import ChannelManager
from tidings.notifications.events import NotificationFailed, NotificationSending, NotificationSent
from tidings.notifications.notification import Notification
from tidings.notifications.queued import SendQueuedNotification
from tidings.notifications.rules.plan import Backend, DeliveryRules, Plan, Send
from tidings.notifications.rules.preferences import Preferences
from tidings.observability import tracing

log = logging.getLogger("tidings.notifications")

_ALWAYS = Notification.should_send


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
        self.rules = DeliveryRules(app)

    # -- queueing ----------------------------------------------------------------------

    @property
    def preferences(self) -> Preferences:
        """The preference source (``use_database()`` / ``use(callback)``; off by default)."""
        return self.rules.preferences

    def plan(
        self, targets: Sequence[Any], notification: Notification, backend: Backend | None = None
    ) -> Plan:
        """Apply the delivery rules (preferences, once_per, digests, quiet hours): what to
        queue or send, per notifiable and channel. A malformed route raises
        ValidationError here, before anything is stored or pushed."""
        queued = isinstance(notification, ShouldQueue)

        def delays(notifiable: Any) -> dict[str, float]:
            own = notification.with_delay(notifiable) if queued else None
            return {ch: delay_seconds(v) for ch, v in (own or {}).items()}

        return self.rules.plan(
            targets,
            notification,
            check_route=self.channels.check_route,
            delays=delays,
            backend=backend,
        )

    def _jobs(self, sends: Iterable[Send], notification: Notification) -> list[PendingDispatch]:
        """One job per planned (notifiable, channel)."""
        nid = uuid.uuid4().hex
        queues = notification.via_queues() or {}
        jobs: list[PendingDispatch] = []
        for s in sends:
            job = SendQueuedNotification(
                s.notifiable, notification, s.channel, delivery_id(nid, s.index, s.channel)
            )
            pending = PendingDispatch(job, queue=queues.get(s.channel))
            if s.delay_s is not None:
                pending.delay_s = s.delay_s
            jobs.append(pending)
        return jobs

    def send(self, notifiables: Any, notification: Notification) -> list[str]:
        """Queue (ShouldQueue) or send now; returns the queued job ids. A channel held by
        quiet hours is queued with a delay even when the notification is not queued."""
        queued = isinstance(notification, ShouldQueue)
        if not queued:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:  # before anything is decided, stored or pushed
                raise RuntimeError(
                    "notify() of a notification that is not queued was called inside an "
                    "event loop: await notify_async() instead"
                )
        plan = self.plan(_as_list(notifiables), notification)
        self._announce_plan(plan)
        if queued:
            return list(self.app.dispatch_many(self._jobs(plan.sends, notification)))
        later = [s for s in plan.sends if s.delay_s]
        ids = list(self.app.dispatch_many(self._jobs(later, notification))) if later else []
        now = [s for s in plan.sends if not s.delay_s]
        if now:
            asyncio.run(self._closing(self._deliver_sends(now, notification)))
        return ids

    async def send_async(self, notifiables: Any, notification: Notification) -> list[str]:
        """Async twin of :meth:`send` (rules that read a database or Redis are applied in
        a thread)."""
        targets = _as_list(notifiables)
        if self.rules.needs_io(notification):
            plan = await asyncio.to_thread(self.plan, targets, notification)
        else:
            plan = self.plan(targets, notification)
        for event in plan.events:
            await self._announce_safely(event)
        if isinstance(notification, ShouldQueue):
            jobs = self._jobs(plan.sends, notification)
            return list(await self.app.dispatch_many_async(jobs))
        later = [s for s in plan.sends if s.delay_s]
        ids = []
        if later:
            ids = list(await self.app.dispatch_many_async(self._jobs(later, notification)))
        await self._deliver_sends([s for s in plan.sends if not s.delay_s], notification)
        return ids

    def _announce_plan(self, plan: Plan) -> None:
        """Announce what the rules decided (``app.emit``: a raising listener is logged;
        async listeners run on the running loop, if any)."""
        for event in plan.events:
            self.app.emit(event)

    async def _deliver_sends(self, sends: Sequence[Send], notification: Notification) -> None:
        nid = uuid.uuid4().hex
        for s in sends:
            did = delivery_id(nid, s.index, s.channel)
            await self.deliver(s.notifiable, notification, s.channel, did)

    async def _closing(self, work: Awaitable[Any]) -> Any:
        try:
            return await work
        finally:
            await self.channels.close_loop()

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
        if type(notification).should_send is not _ALWAYS and not notification.should_send(
            notifiable, channel
        ):  # (the base class's should_send, always True, is not called)
            return None
        events = self.app.events
        if events.has_listeners(NotificationSending):  # no event built for nobody
            sending = NotificationSending(notifiable, notification, channel, delivery)
            if await events.dispatch_async(sending, halt=True) is False:
                return None
        try:
            if tracing.ENABLED and tracing.recording():  # no span to open otherwise
                attrs = {"tidings.channel": channel, "tidings.delivery_id": delivery,
                         "tidings.notification": type(notification).__name__}  # fmt: skip
                with tracing.span(f"notify {channel}", attrs, kind="CLIENT"):
                    response = await self.channels.send(channel, notifiable, notification, delivery)
            else:  # one coroutine fewer than channels.send on the common path
                send, takes_id = self.channels.send_of(channel)
                if takes_id:
                    response = send(notifiable, notification, delivery)
                else:
                    response = send(notifiable, notification)
                if type(response) is CoroutineType or inspect.isawaitable(response):
                    response = await response
        except Exception as exc:
            await self._announce_safely(
                NotificationFailed(notifiable, notification, channel, delivery, exc)
            )
            raise
        if events.has_listeners(NotificationSent):
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
                getattr(event, "delivery_id", "-"),
            )
