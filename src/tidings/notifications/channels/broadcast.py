"""The ``broadcast`` channel: ``to_broadcast(notifiable)`` -> BroadcastMessage, published
to the notifiable's channels (see tidings.broadcasting).

The channels are the message's own (``BroadcastMessage.on``), else the notifiable's
``route_notification_for_broadcast`` (a name or a list), else
``private-<Class>.<id>``. The data gets ``id`` (the delivery id) and ``type`` (the
notification class) as Laravel's does; the delivery id is also the message id, so a
retried send publishes once.
"""

from __future__ import annotations

from typing import Any

from tidings.broadcasting.messages import BroadcastMessage
from tidings.errors import ConfigurationError
from tidings.hosts import AppHost
from tidings.notifications.channels.base import DeliveryResult, message_for


def channels_for(notifiable: Any, notification: Any, message: BroadcastMessage) -> list[str]:
    """Where a broadcast notification goes (see the module doc)."""
    if message.channels:
        return list(message.channels)
    route = notifiable.route_notification_for("broadcast", notification)
    if route:
        return [route] if isinstance(route, str) else [str(r) for r in route]
    ident = getattr(notifiable, "id", None)
    if ident is None:
        raise ConfigurationError(
            f"{type(notifiable).__qualname__} has no broadcast channel: give it an id, "
            "route_notification_for_broadcast(), or use BroadcastMessage(...).on(channel)"
        )
    return [f"private-{type(notifiable).__name__}.{ident}"]


class BroadcastChannel:
    """Publishes the notification's BroadcastMessage (one XADD per channel, once)."""

    def __init__(self, app: AppHost) -> None:
        self.app = app

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> DeliveryResult:
        message = message_for(notification, "broadcast", notifiable)
        name = type(notification).__qualname__
        if isinstance(message, dict):
            message = BroadcastMessage(message)
        if not isinstance(message, BroadcastMessage):
            raise ConfigurationError(
                f"{name}.to_broadcast() must return a BroadcastMessage or a dict"
            )
        channels = channels_for(notifiable, notification, message)
        data = {**message.data, "id": delivery_id, "type": type(notification).__name__}
        broadcasting: Any = getattr(self.app, "broadcasting")  # noqa: B009
        ids = await broadcasting.apublish(
            channels, message.event or "notification", data,
            message_id=delivery_id, where=f"{name}.to_broadcast()",
        )  # fmt: skip
        return DeliveryResult("broadcast", delivery_id, " ".join(ids))
