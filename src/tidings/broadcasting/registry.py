"""``app.broadcasting``: options, the private-channel authorisation callbacks, publishing."""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tidings.broadcasting import publish as _publish
from tidings.broadcasting.messages import (
    EVENT_RE,
    PRIVATE_PREFIX,
    check_channel,
    encode_data,
    is_private,
)
from tidings.errors import ValidationError

Authorizer = Callable[..., bool | Awaitable[bool]]
UserResolver = Callable[[Any], Any]


def _pattern(pattern: str) -> re.Pattern[str]:
    """``orders.{order_id}`` -> a regex with one named group per ``{param}``."""
    out, pos = [], 0
    for m in re.finditer(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>[^.]+)")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("^" + "".join(out) + "$")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _default_user(request: Any) -> Any:
    """The user an authentication middleware put in the ASGI scope (Starlette's
    ``AuthenticationMiddleware``, Django Channels' ``AuthMiddlewareStack``)."""
    scope = getattr(request, "scope", None)
    return scope.get("user") if isinstance(scope, dict) else None


class Broadcasting:
    """Broadcast settings and callbacks of one App (``app.broadcasting``).

    Attributes:
        max_len: bound of each channel's stream (``XADD MAXLEN ~``): how far back a
            reconnecting browser's ``Last-Event-ID`` can replay. Default 1000.
        receipt_ttl_s: how long a channel's recent message ids outlive its last publish.
            A re-sent or retried publish adds nothing while its id is among the
            channel's last ``max_len`` (kept per channel, trimmed with the stream: memory
            is O(max_len) per channel, never a key per message). Default one day.
        heartbeat_s: seconds between SSE comment lines on an idle connection (proxies
            close silent ones). Default 15.
        block_ms: longest ``XREAD BLOCK`` of a web process's reader. Default 1000.
        client_buffer: messages a slow browser may lag behind before its connection is
            closed (it reconnects and replays with ``Last-Event-ID``). Default 1000.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.max_len = _publish.DEFAULT_MAX_LEN
        self.receipt_ttl_s = _publish.DEFAULT_RECEIPT_TTL_S
        self.heartbeat_s = 15.0
        self.block_ms = 1000
        self.client_buffer = 1000
        self._channels: list[tuple[str, re.Pattern[str], Authorizer]] = []
        self._user: UserResolver = _default_user

    # -- authorisation -----------------------------------------------------------------

    def channel(self, pattern: str) -> Callable[[Authorizer], Authorizer]:
        """Register who may subscribe to ``private-<pattern>``.

        ``pattern`` is the name after ``private-`` with ``{param}`` parts matching one
        dot-free segment; the callback gets the user and the parameters as keywords and
        returns (or awaits to) True to allow::

            @app.broadcasting.channel("orders.{order_id}")
            def order(user, order_id): return user is not None and owns(user, order_id)
        """
        if pattern.startswith(PRIVATE_PREFIX):
            pattern = pattern[len(PRIVATE_PREFIX) :]
        compiled = _pattern(pattern)

        def register(fn: Authorizer) -> Authorizer:
            self._channels.append((pattern, compiled, fn))
            return fn

        return register

    def user_resolver(self, fn: UserResolver) -> UserResolver:
        """Register how a request's user is found: ``fn(request)`` (may be async), the
        request being a Starlette ``Request``. Default: ``scope["user"]``."""
        self._user = fn
        return fn

    @property
    def has_authorizers(self) -> bool:
        """Whether any private-channel callback is registered."""
        return bool(self._channels)

    async def user_of(self, request: Any) -> Any:
        """The user of ``request`` by the registered resolver."""
        return await _maybe_await(self._user(request))

    async def authorize(self, user: Any, channel: str) -> bool:
        """Whether ``user`` may subscribe to ``channel``: public ones always; a private
        one when the first callback whose pattern matches returns True (no matching
        callback: refused)."""
        if not is_private(channel):
            return True
        name = channel[len(PRIVATE_PREFIX) :]
        for _, compiled, fn in self._channels:
            m = compiled.match(name)
            if m is not None:
                return (await _maybe_await(fn(user, **m.groupdict()))) is True
        return False

    # -- publishing --------------------------------------------------------------------

    def _prepared(
        self, channels: str | Sequence[str], event: str, data: Any, where: str
    ) -> tuple[list[str], bytes]:
        names = [channels] if isinstance(channels, str) else list(channels)
        if not names:
            raise ValueError(f"{where}: no channel to broadcast on")
        if not isinstance(event, str) or not EVENT_RE.match(event):
            raise ValidationError(
                f"{where}: event name {event!r} is not letters, digits and _ . : - "
                "(1 to 100 characters)",
                field="event",
            )
        return [check_channel(c, where) for c in names], encode_data(data, where)

    def publish(
        self,
        channels: str | Sequence[str],
        event: str,
        data: Any,
        *,
        message_id: str | None = None,
        where: str = "broadcast",
    ) -> list[str]:
        """Write one message to each channel's stream now; returns the stream ids.

        ``message_id`` (default: a fresh one) makes a repeated publish add nothing.
        """
        names, body = self._prepared(channels, event, data, where)
        rq = self.app.queue_for(None)
        return _publish.publish(
            rq.client, rq.prefix, names, message_id or uuid.uuid4().hex, event, body,
            max_len=self.max_len, receipt_ttl_s=self.receipt_ttl_s,
        )  # fmt: skip

    async def apublish(
        self,
        channels: str | Sequence[str],
        event: str,
        data: Any,
        *,
        message_id: str | None = None,
        where: str = "broadcast",
    ) -> list[str]:
        """Async twin of :meth:`publish`."""
        names, body = self._prepared(channels, event, data, where)
        rq = self.app.queue_for(None)
        return await _publish.apublish(
            rq.aclient(), rq.prefix, names, message_id or uuid.uuid4().hex, event, body,
            max_len=self.max_len, receipt_ttl_s=self.receipt_ttl_s,
        )  # fmt: skip
