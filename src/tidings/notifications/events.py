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
