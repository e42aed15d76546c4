"""The decision of one ``notify()``, per notifiable and channel, before any job is queued.

In order: preferences drop opted-out channels (``mandatory`` notifications skip this);
a notifiable with no channel left gets nothing. ``once_per`` then drops the whole
notification when one went out within the period. Each remaining channel is either
added to its digest window (``digest``), or queued with a delay to the end of the
notifiable's quiet hours (an ``interruptive`` channel inside them), or queued as usual.
Every drop, digest and delay is announced (NotificationSkipped / Digested / Delayed).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from tidings.notifications.events import (
    NotificationDelayed,
    NotificationDigested,
    NotificationSkipped,
)
from tidings.notifications.rules import digests, throttling
from tidings.notifications.rules.preferences import Preferences
from tidings.notifications.rules.quiet_hours import interruptive_channels, quiet_until

__all__ = ["Backend", "DeliveryRules", "MemoryBackend", "Plan", "RedisBackend", "Send"]


@dataclass(slots=True)
class Send:
    """One channel of one notifiable to queue (or send now), maybe delayed."""

    index: int
    notifiable: Any
    channel: str
    delay_s: float | None = None


@dataclass(slots=True)
class Plan:
    """What :meth:`DeliveryRules.plan` decided."""

    sends: list[Send] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)


class Backend(Protocol):
    """Where throttle markers and digest items go: Redis, or memory in fakes."""

    def once(self, notifiable: Any, notification: Any, period_s: float, token: str) -> bool: ...

    def digest(
        self, notifiable: Any, notification: Any, channel: str, window_s: float, item_id: str
    ) -> tuple[str, bool]: ...


class RedisBackend:
    """The real one: ``notify_once_per.lua`` and ``digest_add.lua`` on the App's Redis."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def once(self, notifiable: Any, notification: Any, period_s: float, token: str) -> bool:
        return throttling.try_once(self.app, notifiable, notification, period_s, token)

    def digest(
        self, notifiable: Any, notification: Any, channel: str, window_s: float, item_id: str
    ) -> tuple[str, bool]:
        added = digests.add(self.app, notifiable, notification, channel, window_s, item_id)
        return added.window_id, added.opened


class MemoryBackend:
    """For ``fake_notifications``: the same rules, kept in this process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.marks: dict[str, float] = {}
        self.windows: dict[str, tuple[str, float]] = {}
        self.items: dict[str, list[Any]] = {}

    def once(self, notifiable: Any, notification: Any, period_s: float, token: str) -> bool:
        name = throttling.throttle_name(notifiable, notification)
        now = self.clock()
        if self.marks.get(name, -1.0) > now:
            return False
        self.marks[name] = now + period_s
        return True

    def digest(
        self, notifiable: Any, notification: Any, channel: str, window_s: float, item_id: str
    ) -> tuple[str, bool]:
        name = digests.digest_name(notifiable, notification, channel)
        now = self.clock()
        current = self.windows.get(name)
        opened = current is None or current[1] <= now
        if opened:
            current = self.windows[name] = (uuid.uuid4().hex, now + window_s)
        assert current is not None
        self.items.setdefault(current[0], []).append(notification)
        return current[0], opened


def _item_id(nid: str, index: int, channel: str) -> str:
    return hashlib.sha256(f"{nid}:{index}:{channel}:digest".encode()).hexdigest()[:32]


class DeliveryRules:
    """Preferences, throttling, digests and quiet hours of one App."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.preferences = Preferences(app)
        self.backend: Backend = RedisBackend(app)

    def needs_io(self, notification: Any) -> bool:
        """Whether planning ``notification`` reads a database or Redis (async callers
        then plan in a thread)."""
        return (
            self.preferences.enabled
            or getattr(notification, "once_per", None) is not None
            or getattr(notification, "digest", None) is not None
        )

    def plan(
        self,
        notifiables: Sequence[Any],
        notification: Any,
        *,
        check_route: Callable[[str, Any, Any], None] | None = None,
        delays: Callable[[Any], dict[str, float]] | None = None,
        backend: Backend | None = None,
        now: datetime | None = None,
    ) -> Plan:
        """Decide every (notifiable, channel) of one ``notify()``.

        Args:
            check_route: vets a route (raises ValidationError) before anything is stored.
            delays: the notification's own delay per channel (``with_delay``), seconds.
            backend: where throttle marks and digest items go (default Redis).
            now: the time quiet hours are judged at (default now).

        Raises:
            ValidationError: a malformed route; nothing was stored for any notifiable.
            ConfigurationError: a bad ``digest`` / ``once_per`` / quiet hours setting.
        """
        backend = backend or self.backend
        out = Plan()
        allowed = self.preferences.allowed(notifiables, notification)
        kept: list[list[str]] = []
        for index, notifiable in enumerate(notifiables):
            channels = []
            for channel in notification.via(notifiable):
                if allowed(index, channel):
                    channels.append(channel)
                else:
                    out.events.append(
                        NotificationSkipped(notifiable, notification, channel, "opted_out")
                    )
            for channel in channels:
                if check_route is not None:
                    check_route(channel, notifiable, notification)
                digests.digest_window_s(notification, channel)  # a bad setting raises here
            kept.append(channels)
        period = throttling.once_per_s(notification)
        nid = uuid.uuid4().hex
        moment = now or datetime.now(UTC)
        for index, notifiable in enumerate(notifiables):
            channels = kept[index]
            if not channels:
                continue
            if period is not None and not backend.once(
                notifiable, notification, period, f"{nid}:{index}"
            ):
                out.events.append(NotificationSkipped(notifiable, notification, "*", "throttled"))
                continue
            own = delays(notifiable) if delays is not None else {}
            loud = interruptive_channels(notification, notifiable)
            for channel in channels:
                window = digests.digest_window_s(notification, channel)
                if window is not None:
                    item = _item_id(nid, index, channel)
                    wid, opened = backend.digest(notifiable, notification, channel, window, item)
                    out.events.append(
                        NotificationDigested(notifiable, notification, channel, wid, item, opened)
                    )
                    continue
                delay = own.get(channel)
                if channel in loud:
                    at = moment + timedelta(seconds=delay or 0.0)
                    until = quiet_until(notifiable, at)
                    if until is not None:
                        delay = (until - moment).total_seconds()
                        out.events.append(
                            NotificationDelayed(notifiable, notification, channel, delay, until)
                        )
                out.sends.append(Send(index, notifiable, channel, delay))
        return out
