"""The Server-Sent Events endpoint: an ASGI app to mount in FastAPI, Starlette or Django.

::

    GET <mount>/?channel=orders&channel=private-orders.42      (text/event-stream)

Each message arrives as ``id: <stream id>``, ``event: <name>`` and
``data: {"channel": ..., "data": ...}``. A connection opens with an ``id:`` line
holding its start position, so a browser that reconnects (``EventSource`` sends
``Last-Event-ID``) replays what it missed within each stream's window. With several
channels the id is the comma-joined stream ids in the order the channels were asked
for. When trimming dropped messages newer than a reconnecting browser's position, it
first gets ``event: tidings.gap`` (``data: {"channel": ...}``): some messages are gone
and the page should reload its state. Idle connections get a comment line every
``heartbeat_s``. A private channel the app's callback refuses gets ``403`` with an empty
body; nothing else is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import weakref
from importlib import resources
from typing import Any

from tidings.broadcasting.hub import Entry, Hub, Subscriber
from tidings.broadcasting.messages import CHANNEL_RE

log = logging.getLogger("tidings.broadcasting")

Scope = dict[str, Any]
MAX_CHANNELS = 50
JS_NAME = "tidings-broadcast.js"


def _js() -> bytes:
    return resources.files("tidings.broadcasting").joinpath(f"static/{JS_NAME}").read_bytes()


def _format(entry: Entry, event_id: str) -> bytes:
    channel, _sid, event, data = entry
    return b"".join((
        b"id: ", event_id.encode(), b"\nevent: ", event,
        b'\ndata: {"channel":"', channel.encode(), b'","data":', data, b"}\n\n",
    ))  # fmt: skip


async def _plain(send: Any, status: int, body: bytes = b"", ctype: bytes = b"text/plain") -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", ctype + b"; charset=utf-8"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _positions(channels: list[str], last_event_id: str | None) -> dict[str, str] | None:
    """Per-channel ids of a ``Last-Event-ID`` (one id, or one per channel)."""
    if not last_event_id:
        return None
    parts = [p.strip() for p in last_event_id.split(",")]
    if len(parts) == len(channels):
        return dict(zip(channels, parts, strict=True))
    if len(parts) == 1:
        return dict.fromkeys(channels, parts[0])
    return None


class BroadcastEndpoint:
    """The ASGI app (see the module doc). One reader per event loop (per web process).

    Args:
        app: the tidings App (its Redis, prefix and ``app.broadcasting`` callbacks).
        token: when set, every request must carry it (``Authorization: Bearer``, or
            ``?token=`` for ``EventSource``, which cannot set headers: a token in a URL
            may be logged by proxies on the way); else 401.
    """

    def __init__(self, app: Any, *, token: str | None = None) -> None:
        self.app = app
        self.broadcasting = app.broadcasting
        self.token = token or None
        self._hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub]
        self._hubs = weakref.WeakKeyDictionary()
        self.connected = 0

    def hub(self) -> Hub:
        """The reader of the running loop."""
        loop = asyncio.get_running_loop()
        hub = self._hubs.get(loop)
        if hub is None:
            rq = self.app.queue_for(None)
            hub = self._hubs[loop] = Hub(rq.url, rq.prefix, block_ms=self.broadcasting.block_ms)
        return hub

    async def aclose(self) -> None:
        """Stop the running loop's reader."""
        hub = self._hubs.pop(asyncio.get_running_loop(), None)
        if hub is not None:
            await hub.close()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _plain(send, 405, b"GET only\n")
            return
        if str(scope.get("path", "")).endswith("/" + JS_NAME):
            await _plain(send, 200, _js(), b"text/javascript")
            return
        from starlette.requests import Request

        request = Request(scope, receive)
        if self.token is not None:
            given = request.query_params.get("token") or ""
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                await _plain(
                    send,
                    401,
                    b"a valid token is required: the header "
                    b"Authorization: Bearer <token>, or ?token= for EventSource\n",
                )
                return
        channels: list[str] = []
        for value in request.query_params.getlist("channel") + request.query_params.getlist(
            "channels"
        ):
            for name in value.split(" "):
                if name and name not in channels:
                    channels.append(name)
        bad = [c for c in channels if not CHANNEL_RE.match(c)]
        if not channels or bad or len(channels) > MAX_CHANNELS:
            await _plain(send, 400, (
                f"ask for 1 to {MAX_CHANNELS} channels: ?channel=NAME (repeat); names are "
                "letters, digits and _ - . = @ ,\n"
            ).encode())  # fmt: skip
            return
        try:
            user = await self.broadcasting.user_of(request)
            for c in channels:
                if not await self.broadcasting.authorize(user, c):
                    await _plain(send, 403)
                    return
        except Exception:
            log.exception("broadcast authorisation callback raised (refused)")
            await _plain(send, 403)
            return
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        await self._stream(scope, receive, send, channels, _positions(channels, last))

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _stream(
        self,
        scope: Scope,
        receive: Any,
        send: Any,
        channels: list[str],
        since: dict[str, str] | None,
    ) -> None:
        hub = self.hub()
        try:
            sub = await hub.subscribe(channels, self.broadcasting.client_buffer)
        except Exception as exc:  # Redis down: the browser retries by itself
            log.warning("broadcast subscribe failed: %s", type(exc).__name__)
            await _plain(send, 503, b"broadcast unavailable, retry\n")
            return
        self.connected += 1
        watcher: asyncio.Task[None] | None = None
        try:
            backlog: list[Entry] = []
            gaps: list[str] = []
            pos = dict(sub.start)
            for c in channels:
                after = (since or {}).get(c, "")
                if _is_id(after):
                    pos[c] = after  # the live feed's dedupe keeps ids after it only
                    if await hub.trimmed_after(c, after):
                        gaps.append(c)
                    backlog += await hub.replay(c, after, sub.start[c])
            await send({
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache, no-transform"),
                    (b"x-accel-buffering", b"no"),
                ],
            })  # fmt: skip
            opening = b"retry: 2000\nid: " + self._id(channels, pos).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": opening, "more_body": True})
            if scope.get("method") == "HEAD":
                await send({"type": "http.response.body", "body": b""})
                return
            watcher = asyncio.get_running_loop().create_task(self._watch(receive, sub))
            if gaps:  # older messages left the window: the page should reload its state
                await send({"type": "http.response.body", "more_body": True, "body": b"".join(
                    b'event: tidings.gap\ndata: {"channel":"' + c.encode() + b'"}\n\n'
                    for c in gaps
                )})  # fmt: skip
            if backlog:
                await self._send(send, channels, pos, backlog)
            await self._pump(send, sub, channels, pos)
        except OSError:
            pass  # the browser went away mid-write
        finally:
            hub.unsubscribe(sub)
            self.connected -= 1
            if watcher is not None:
                watcher.cancel()

    @staticmethod
    async def _watch(receive: Any, sub: Subscriber) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                sub.close()
                return

    @staticmethod
    def _id(channels: list[str], pos: dict[str, str]) -> str:
        return ",".join(pos[c] for c in channels)

    async def _send(
        self, send: Any, channels: list[str], pos: dict[str, str], entries: list[Entry]
    ) -> None:
        parts = []
        for entry in entries:
            if _id_key(entry[1]) <= _id_key(pos[entry[0]]):
                continue  # delivered already (a replay overlapping the live feed)
            pos[entry[0]] = entry[1]
            parts.append(_format(entry, self._id(channels, pos)))
        if parts:
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})

    async def _pump(
        self, send: Any, sub: Subscriber, channels: list[str], pos: dict[str, str]
    ) -> None:
        heartbeat = self.broadcasting.heartbeat_s
        while not sub.closed:
            if not sub.buffer:
                sub.wake.clear()
                try:
                    await asyncio.wait_for(sub.wake.wait(), heartbeat)
                except TimeoutError:
                    await send({"type": "http.response.body", "body": b": hb\n\n",
                                "more_body": True})  # fmt: skip
                    continue
            if sub.buffer:
                batch = list(sub.buffer)
                sub.buffer.clear()
                await self._send(send, channels, pos, batch)
            if sub.overflowed:
                log.warning("a browser fell %d messages behind: closed (it replays)", sub.limit)
                break
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b""})


def _is_id(value: str) -> bool:
    left, _, right = value.partition("-")
    return 0 < len(value) <= 41 and left.isdigit() and (right == "" or right.isdigit())


def _id_key(value: str) -> tuple[int, int]:
    left, _, right = value.partition("-")
    try:
        return int(left), int(right or 0)
    except ValueError:
        return (0, 0)


def broadcast_app(app: Any = None, *, token: str | None = None) -> BroadcastEndpoint:
    """The SSE endpoint of ``app`` (default: the current App), to mount at a path."""
    if app is None:
        from tidings import _current

        app = _current.current()
    return BroadcastEndpoint(app, token=token)


def mount(asgi_app: Any, endpoint: Any, path: str = "/broadcast") -> Any:
    """An ASGI app sending requests under ``path`` to ``endpoint``, the rest to
    ``asgi_app`` (for Django's ``get_asgi_application()``, which mounts nothing)."""
    path = path.rstrip("/")

    async def routed(scope: Scope, receive: Any, send: Any) -> None:
        p = str(scope.get("path", ""))
        if scope["type"] == "http" and (p == path or p.startswith(path + "/")):
            await endpoint(dict(scope, root_path=scope.get("root_path", "") + path), receive, send)
            return
        await asgi_app(scope, receive, send)

    return routed
