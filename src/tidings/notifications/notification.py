"""Notification, Notifiable and on-demand routes: what users subclass and call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tidings import _current
from tidings.notifications.channels.database import HasDatabaseNotifications
from tidings.notifications.rules.preferences import HasNotificationPreferences

DEFAULT_ROUTE_ATTRS = {
    "mail": "email",
    "sms": "phone",
    "webhook": "webhook_url",
    "database": "id",
    "slack": "slack_channel",
}


class Notification:
    """Base of notifications. Inherit ``ShouldQueue`` too to send through the queue.

    Define ``via(notifiable) -> list[str]`` and one ``to_<channel>(notifiable)`` per
    channel. Queue options are class attributes as on jobs (``queue``, ``connection``,
    ``delay``, ``tries``, ``backoff``, ``timeout``, ``retry_until``, ``max_exceptions``).
    Optional: ``via_queues() -> {channel: queue}``, ``with_delay(notifiable) ->
    {channel: seconds}``, ``should_send(notifiable, channel) -> bool`` (asked at send
    time, in the worker for queued ones), ``failed(notifiable, channel, exc)``.
    """

    __tidings_serializable__: ClassVar[bool] = True
    connection: ClassVar[str | None] = None
    queue: ClassVar[str | None] = None
    delay: ClassVar[Any] = None
    tries: ClassVar[int | None] = None
    backoff: ClassVar[Any] = None
    timeout: ClassVar[float | None] = None
    retry_until: ClassVar[Any] = None
    max_exceptions: ClassVar[int | None] = None

    def via(self, notifiable: Any) -> list[str]:
        """The channels to send on for ``notifiable``."""
        raise NotImplementedError(f"{type(self).__qualname__} must define via(notifiable)")

    def via_queues(self) -> dict[str, str] | None:
        """A queue per channel, overriding ``queue``."""
        return None

    def with_delay(self, notifiable: Any) -> dict[str, Any] | None:
        """A delay per channel (seconds or timedelta)."""
        return None

    def should_send(self, notifiable: Any, channel: str) -> bool:
        """Last word before sending on ``channel``."""
        return True

    def middleware(self) -> list[Any]:
        """Job middleware for the queued sends."""
        return []


class Notifiable(HasDatabaseNotifications, HasNotificationPreferences):
    """Mixin for things that receive notifications (users, teams ...).

    Routes default to the attributes ``email`` (mail), ``phone`` (sms),
    ``webhook_url`` (webhook), ``id`` (database) and ``slack_channel`` (slack); define
    ``route_notification_for_<channel>(notification)`` or override
    :meth:`route_notification_for` to change them. The database channel's API
    (``notifications()``, ``unread_notifications()``, ``mark_as_read()`` ...) comes from
    :class:`~tidings.notifications.channels.database.HasDatabaseNotifications`;
    preferences (``opt_out()``, ``opt_in()``, ``notification_preferences()``) from
    :class:`~tidings.notifications.rules.preferences.HasNotificationPreferences`.
    """

    __tidings_serializable__: ClassVar[bool] = True

    def route_notification_for(self, channel: str, notification: Notification | None = None) -> Any:
        """Where ``channel`` delivers for this notifiable (address, number, URL)."""
        custom = getattr(self, f"route_notification_for_{channel}", None)
        if callable(custom):
            return custom(notification)
        attr = DEFAULT_ROUTE_ATTRS.get(channel, channel)
        return getattr(self, attr, None)

    def notify(self, notification: Notification) -> list[str]:
        """Send (or queue, for ShouldQueue notifications); returns queued job ids."""
        ids: list[str] = _current.current().notify(self, notification)
        return ids

    async def notify_async(self, notification: Notification) -> list[str]:
        """Async twin of :meth:`notify`."""
        ids: list[str] = await _current.current().notify_async(self, notification)
        return ids

    def notify_now(
        self, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        """Send now, in this process, even if the notification is queued."""
        out: list[Any] = _current.current().notifications.send_now([self], notification, channels)
        return out

    async def notify_now_async(
        self, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        """Async twin of :meth:`notify_now`."""
        sender = _current.current().notifications
        out: list[Any] = await sender.send_now_async([self], notification, channels)
        return out


@dataclass
class AnonymousNotifiable(Notifiable):
    """An on-demand recipient: routes given per channel, no model behind them."""

    routes: dict[str, Any] = field(default_factory=dict)

    def route(self, channel: str, value: Any) -> AnonymousNotifiable:
        """Add a route for ``channel``."""
        self.routes[channel] = value
        return self

    def route_notification_for(self, channel: str, notification: Notification | None = None) -> Any:
        """The route given for ``channel``."""
        return self.routes.get(channel)


def route(channel: str, value: Any) -> AnonymousNotifiable:
    """Start an on-demand notification: ``route("mail", "a@x.io").notify(n)``."""
    return AnonymousNotifiable().route(channel, value)
