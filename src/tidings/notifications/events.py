"""Lifecycle events of notifications, announced through the app's dispatcher.

A listener of :class:`NotificationSending` that returns ``False`` vetoes the send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NotificationSending:
    """About to send ``notification`` to ``notifiable`` on ``channel``."""

    notifiable: Any
    notification: Any
    channel: str
    delivery_id: str


@dataclass(frozen=True, slots=True)
class NotificationSent:
    """Sent; ``response`` is what the channel returned (SMTP reply, provider id, status)."""

    notifiable: Any
    notification: Any
    channel: str
    delivery_id: str
    response: Any


@dataclass(frozen=True, slots=True)
class NotificationFailed:
    """The channel raised ``exception``; a queued send may still be retried."""

    notifiable: Any
    notification: Any
    channel: str
    delivery_id: str
    exception: BaseException


# -- delivery rules (tidings.notifications.rules): decided at notify(), before any job ----


@dataclass(frozen=True, slots=True)
class NotificationSkipped:
    """Not sent on ``channel`` at all: no job was queued.

    ``reason`` is ``"opted_out"`` (the notifiable's preference) or ``"throttled"``
    (``once_per``: an earlier one within the period); ``channel`` is ``"*"`` when the
    whole notification was dropped.
    """

    notifiable: Any
    notification: Any
    channel: str
    reason: str


@dataclass(frozen=True, slots=True)
class NotificationDigested:
    """Added to the digest window ``window_id`` of (notifiable, type, channel) instead
    of being sent on its own; the window's flush job sends one message for all items."""

    notifiable: Any
    notification: Any
    channel: str
    window_id: str
    item_id: str
    opened: bool
    """Whether this item opened the window (and scheduled its flush)."""


@dataclass(frozen=True, slots=True)
class NotificationDelayed:
    """Queued to run at ``until`` (UTC) because the notifiable's quiet hours hold
    ``channel`` now."""

    notifiable: Any
    notification: Any
    channel: str
    delay_s: float
    until: Any
