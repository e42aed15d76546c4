"""Channels by name: the built-in mail, sms, webhook, database and slack, and the app's own.

A channel is any object with ``async send(notifiable, notification)`` (built-ins also
take the delivery id). Built-ins wrap a transport that holds connections bound to an
event loop, so instances are kept per loop: a worker's SMTP sessions (up to the mail
URL's ``?pool=``, default 4) are reused mail after mail.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jinja2

from tidings.errors import ConfigurationError, ValidationError
from tidings.hosts import AppHost
from tidings.notifications.channels.base import message_for
from tidings.notifications.messages import WebhookEndpoint
from tidings.notifications.net import check_url
from tidings.notifications.validation import validate_e164, validate_email

Factory = Callable[..., Any]


def _route(notifiable: Any, channel: str, notification: Any) -> Any:
    value = notifiable.route_notification_for(channel, notification)
    if value in (None, "", []):
        raise ValidationError(
            f"{type(notifiable).__qualname__} has no route for {channel}", field=channel
        )
    return value


class MailChannel:
    """Renders MailMessage through jinja2 and sends it with the mail transport."""

    def __init__(self, app: AppHost) -> None:
        from tidings.notifications.channels.mail import mail_transport_from_url
        from tidings.notifications.messages import make_environment

        s = app.settings
        self.mail_from = s.mail_from
        self.app_name = getattr(app, "name", None)
        self.transport = mail_transport_from_url(s.mail_url, mail_from=s.mail_from)
        self.env: jinja2.Environment = make_environment(Path(s.templates) if s.templates else None)

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> Any:
        to = _route(notifiable, "mail", notification)
        message = message_for(notification, "mail", notifiable)
        email = message.to_email(
            to=to,
            mail_from=self.mail_from,
            delivery_id=delivery_id,
            env=self.env,
            app_name=self.app_name,
        )
        return await self.transport.send(email, delivery_id)

    async def close(self) -> None:
        await self.transport.close()


class SmsChannel:
    """Sends SmsMessage through the configured provider."""

    def __init__(self, app: AppHost) -> None:
        from tidings.notifications.channels.sms import sms_transport_from_url

        self.transport = sms_transport_from_url(app.settings.sms_url)

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> Any:
        to = _route(notifiable, "sms", notification)
        return await self.transport.send(
            str(to), message_for(notification, "sms", notifiable), delivery_id
        )

    async def close(self) -> None:
        await self.transport.close()


class WebhookChannel:
    """POSTs WebhookMessage, signed per Standard Webhooks."""

    def __init__(self, app: AppHost) -> None:
        from tidings.notifications.channels.webhook import WebhookTransport

        s = app.settings
        self.transport = WebhookTransport(
            secret=s.webhook_secret, allow_private=s.webhook_allow_private
        )

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> Any:
        message = message_for(notification, "webhook", notifiable)
        url = getattr(message, "url", None) or _route(notifiable, "webhook", notification)
        # Per-endpoint secrets: the message's, else the route's, else the app's.
        secret = getattr(message, "secret", None)
        if isinstance(url, WebhookEndpoint):
            secret = secret or url.secret
            url = url.url
        return await self.transport.send(str(url), message, delivery_id, secret=secret)

    async def close(self) -> None:
        await self.transport.close()


def _database_channel(app: AppHost) -> Any:
    from tidings.notifications.channels.database import DatabaseChannel

    return DatabaseChannel(app)


def _slack_channel(app: AppHost) -> Any:
    from tidings.notifications.channels.slack import SlackChannel

    return SlackChannel(app)


def _broadcast_channel(app: AppHost) -> Any:
    from tidings.notifications.channels.broadcast import BroadcastChannel

    return BroadcastChannel(app)


BUILTIN: dict[str, Factory] = {
    "mail": MailChannel,
    "sms": SmsChannel,
    "webhook": WebhookChannel,
    "database": _database_channel,
    "slack": _slack_channel,
    "broadcast": _broadcast_channel,
}


_ARITY: dict[Any, bool] = {}
"""A channel's ``send`` function -> whether it takes the delivery id (``inspect`` costs
~50 us a call: once per class, not per message)."""


def _takes_delivery_id(send: Any) -> bool:
    key = getattr(send, "__func__", send)
    known = _ARITY.get(key)
    if known is None:
        known = _ARITY[key] = len(inspect.signature(send).parameters) >= 3
    return known


Caller = Callable[[Any, Any, str], Any]
"""``call(notifiable, notification, delivery_id)``: one channel's ``send``, its arity
settled."""


ChannelSend = tuple[Callable[..., Any], bool]
"""A channel's bound ``send`` and whether it takes the delivery id (its third argument)."""


class _Channels(dict[str, Any]):
    """One loop's channels by name, and their callers and sends (built once per channel,
    not worked out again on every send)."""

    __slots__ = ("callers", "sends")

    def __init__(self) -> None:
        super().__init__()
        self.callers: dict[str, Caller] = {}
        self.sends: dict[str, ChannelSend] = {}


def _send_of(channel: Any, builtin: bool) -> ChannelSend:
    send = channel.send
    return send, builtin or _takes_delivery_id(send)


def _caller(send: ChannelSend) -> Caller:
    fn, takes_id = send
    if takes_id:
        return cast(Caller, fn)

    def call(notifiable: Any, notification: Any, delivery_id: str) -> Any:
        return fn(notifiable, notification)

    return call


class ChannelManager:
    """Creates channels lazily, one set per event loop."""

    def __init__(self, app: AppHost) -> None:
        self.app = app
        self.factories: dict[str, Factory] = dict(BUILTIN)
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Channels]
        self._by_loop = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Channels] | None = None
        """The last loop's channels: one weak call a send instead of a lookup by weak key
        (the largest notification-only line in a cProfile of a drain)."""

    def extend(self, name: str, factory: Factory) -> None:
        """Register channel ``name``: a class or callable taking no args or the app."""
        self.factories[name] = factory
        for channels in self._by_loop.values():
            channels.pop(name, None)
            channels.callers.pop(name, None)
            channels.sends.pop(name, None)

    def _loop_channels(self) -> _Channels:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:  # the loop of the previous send
            return last[1]
        got = self._by_loop.get(loop)
        channels = self._by_loop[loop] = _Channels() if got is None else got
        self._last = (weakref.ref(loop), channels)
        return channels

    def get(self, name: str) -> Any:
        """The channel ``name`` of the running loop."""
        channels = self._loop_channels()
        channel = channels.get(name)
        if channel is None:
            factory = self.factories.get(name)
            if factory is None:
                raise ConfigurationError(f"unknown notification channel {name!r}")
            try:
                takes_app = bool(inspect.signature(factory).parameters)
            except (TypeError, ValueError):
                takes_app = False
            channel = channels[name] = factory(self.app) if takes_app else factory()
        return channel

    def check_route(self, name: str, notifiable: Any, notification: Any) -> None:
        """Vet the route a built-in channel would use, without any I/O (at notify time).

        Mail addresses, E.164 numbers and webhook URLs (the SSRF rules) are checked
        as the channel will check them again at send time. A missing route is left to
        send time: a WebhookMessage may carry its own URL.

        Raises:
            ValidationError: the route is malformed or forbidden.
        """
        if name not in BUILTIN or self.factories.get(name) is not BUILTIN[name]:
            return
        value = notifiable.route_notification_for(name, notification)
        if value in (None, "", []):
            return
        if name == "mail":
            for address in [value] if isinstance(value, str) else list(value):
                validate_email(address, "to")
        elif name == "sms":
            validate_e164(str(value), "to")
        elif name == "webhook" or (
            name == "slack" and str(value).lower().startswith(("http://", "https://"))
        ):
            url = getattr(value, "url", value)  # a WebhookEndpoint carries its secret too
            check_url(str(url), self.app.settings.webhook_allow_private)
        elif name == "broadcast":
            from tidings.broadcasting.messages import check_channel

            for channel in [value] if isinstance(value, str) else list(value):
                check_channel(channel, "route_notification_for_broadcast()")

    def caller(self, name: str) -> Caller:
        """``call(notifiable, notification, delivery_id)`` sending on channel ``name`` of
        the running loop (its result may be awaitable); built-ins get the delivery id, and
        so does an app's channel whose ``send`` takes a third argument."""
        call = self._loop_channels().callers.get(name)
        if call is None:
            call = self._loop_channels().callers[name] = _caller(self.send_of(name))
        return call

    def send_of(self, name: str) -> ChannelSend:
        """Channel ``name``'s bound ``send`` on the running loop and whether it takes the
        delivery id (built-ins do, and so does an app's ``send`` with a third argument):
        what :meth:`caller` calls, without a wrapper's call per message."""
        last = self._last
        if last is not None and last[0]() is asyncio.get_running_loop():
            send = last[1].sends.get(name)  # the common case: the previous send's loop
            if send is not None:
                return send
        channels = self._loop_channels()
        send = channels.sends.get(name)
        if send is None:
            channel = self.get(name)
            builtin = name in BUILTIN and self.factories[name] is BUILTIN[name]
            send = channels.sends[name] = _send_of(channel, builtin)
        return send

    async def send(self, name: str, notifiable: Any, notification: Any, delivery_id: str) -> Any:
        """Send on channel ``name`` (see :meth:`caller`)."""
        result = self.caller(name)(notifiable, notification, delivery_id)
        return await result if inspect.isawaitable(result) else result

    async def close_loop(self) -> None:
        """Close the running loop's channels (sync ``notify_now`` calls end their loop)."""
        self._last = None
        channels = self._by_loop.pop(asyncio.get_running_loop(), _Channels())
        for channel in channels.values():
            close = getattr(channel, "close", None)
            if close is not None:
                out = close()
                if inspect.isawaitable(out):
                    await out
