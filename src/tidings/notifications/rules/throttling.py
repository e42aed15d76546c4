"""Throttling: ``once_per = timedelta(hours=1)`` lets one notification of a type through
per notifiable (and per ``once_per_key(notifiable)``, when the notification defines it)
within the period; repeats are dropped at ``notify()`` with a
:class:`~tidings.notifications.events.NotificationSkipped` (reason ``"throttled"``).

The marker is ``SET NX PX`` in one Lua script (``notify_once_per.lua``) holding the
token of the ``notify()`` call that set it, so a re-sent command (its reply lost) is
still let through, and the period starts at the first notification, not the last.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tidings.moves.queues import unavailable_guard
from tidings.notifications.rules.digests import _seconds, recipient_key
from tidings.notifications.rules.preferences import type_name
from tidings.redis import scripts
from tidings.redis.keys import notify_once_key
from tidings.redis.scripts import Arg

__all__ = ["once_per_s", "throttle_name", "try_once"]


def once_per_s(notification: Any) -> float | None:
    """The ``once_per`` period of ``notification`` (seconds), or None.

    Raises:
        ConfigurationError: not a positive duration.
    """
    value = getattr(notification, "once_per", None)
    return _seconds(value, f"{type(notification).__qualname__}.once_per")


def throttle_name(notifiable: Any, notification: Any) -> str:
    """A hash of (recipient, type, ``once_per_key(notifiable)``)."""
    custom = getattr(notification, "once_per_key", None)
    key = custom(notifiable) if callable(custom) else None
    channels = notification.via(notifiable)
    who = recipient_key(notifiable, channels[0] if channels else "*", notification)
    raw = f"{who}\x00{type_name(notification)}\x00{'' if key is None else key}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def try_once(app: Any, notifiable: Any, notification: Any, period_s: float, token: str) -> bool:
    """Whether this notification may go now (True) or repeats one within the period.

    Raises:
        QueueUnavailable: Redis could not be reached or is out of memory.
    """
    rq = app.queue_for(getattr(notification, "connection", None))
    key = notify_once_key(rq.prefix, throttle_name(notifiable, notification))
    args: list[Arg] = [token, max(1, int(period_s * 1000))]
    with unavailable_guard("once_per"):
        ok = rq.produce("once_per", scripts.NOTIFY_ONCE_PER, [key], args)
    return bool(int(ok))
