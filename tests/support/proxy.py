"""A TCP fault proxy for tests (a small Toxiproxy): pass, latency, blackhole, reset, close_after.

The proxy runs its own asyncio loop in a daemon thread, so sync and async tests alike can
flip ``mode`` while clients talk through it. A mode change is applied inside the loop
before the setter returns, so after ``proxy.mode = "reset"`` every connection is gone.

Modes:
    pass         forward both ways.
    latency      delay every chunk, each direction, by ``latency_s``.
    blackhole    accept connections but forward nothing, like a network partition: bytes
                 stay queued (new connections are not dialled upstream) and flow again,
                 in order, when the mode changes back (a client may have timed out by then).
    reset        abort every current and new client connection with a TCP RST
                 (SO_LINGER 0 + ``transport.abort()``); the upstream side is aborted too.
    close_after  forward ``close_after_bytes`` more bytes per connection (both directions
                 together, counted from the moment the mode is set or the connection
                 opens), then close both sides with FIN.

Independently of the mode, :meth:`FaultProxy.drop_replies` arms "the command ran, its
reply was lost": a client chunk holding a marker (e.g. a Lua script's SHA, so
``EVALSHA <sha>``) is forwarded to Redis, and the next reply bytes on that connection
are thrown away and the connection aborted (RST), as when a network drops the answer.
Redis answers only after it ran every command of a chunk it read, so the command did
run. ``drops`` counts the replies dropped per marker name.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from types import TracebackType
from typing import Literal, cast, get_args

__all__ = ["FaultProxy", "ProxyMode"]

ProxyMode = Literal["pass", "latency", "blackhole", "reset", "close_after"]
_MODES: tuple[str, ...] = get_args(ProxyMode)
_CHUNK = 65536


class _Link:
    """One proxied connection: client side, upstream side, byte budget, handler task."""

    def __init__(self, client: asyncio.StreamWriter, budget: int) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.budget = budget
        self.closed = False
        self.drop_pending: str | None = None
        self.task: asyncio.Task[None] | None = asyncio.current_task()


class FaultProxy:
    """Listen on 127.0.0.1 and forward to ``target_host:target_port``, with injectable faults."""

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = "127.0.0.1"
        self.port = listen_port
        self.latency_s = 0.0
        self.close_after_bytes = 0
        self.connections_total = 0
        self.connections_reset = 0
        self.upstream_failures = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._mode: ProxyMode = "pass"
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._drop_markers: dict[str, bytes] = {}
        self._drop_left: dict[str, int] = {}
        self._drop_rate = 0.0
        self._drop_rng = random.Random(0)
        self.drops: dict[str, int] = {}

    # -- control (any thread) -------------------------------------------------------------

    @property
    def mode(self) -> ProxyMode:
        return self._mode

    @mode.setter
    def mode(self, mode: ProxyMode) -> None:
        self.set_mode(mode)

    def set_mode(
        self,
        mode: ProxyMode,
        *,
        latency_s: float | None = None,
        close_after_bytes: int | None = None,
    ) -> None:
        """Switch mode (optionally setting its parameter); applied before this returns."""
        if mode not in _MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; expected one of {_MODES}")
        if latency_s is not None:
            self.latency_s = latency_s
        if close_after_bytes is not None:
            self.close_after_bytes = close_after_bytes
        if self._loop is None:
            self._mode = mode
            return
        asyncio.run_coroutine_threadsafe(self._apply(mode), self._loop).result(timeout=5)

    def drop_replies(
        self,
        markers: dict[str, bytes],
        *,
        count: int = 0,
        rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        """Drop the reply of commands whose chunk holds one of ``markers`` (name ->
        bytes): the next ``count`` such commands of each name, or each with probability
        ``rate`` (seeded); ``markers={}`` stops dropping."""
        self._drop_markers = dict(markers)
        self._drop_left = {name: count for name in markers}
        self._drop_rate = rate
        self._drop_rng = random.Random(seed)

    def _arm(self, link: _Link, data: bytes) -> None:
        if link.drop_pending is not None or not self._drop_markers:
            return
        for name, marker in self._drop_markers.items():
            if marker not in data:
                continue
            if self._drop_left.get(name, 0) > 0:
                self._drop_left[name] -= 1
            elif not (self._drop_rate and self._drop_rng.random() < self._drop_rate):
                continue
            link.drop_pending = name
            return

    @property
    def connections_active(self) -> int:
        return sum(1 for link in self._links if not link.closed)

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen_host, self.port)

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        """E.g. ``redis://127.0.0.1:PORT/0`` pointing at the proxy."""
        return f"{scheme}://{self.listen_host}:{self.port}{path}"

    def start(self) -> int:
        """Start listening on 127.0.0.1 and return the port."""
        if self._loop is not None:
            raise RuntimeError("FaultProxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="FaultProxy", daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), loop).result(timeout=5)
        return self.port

    def stop(self) -> None:
        """Close the listener and every connection, then stop the loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- loop side ----------------------------------------------------------------------

    async def _serve(self) -> int:
        self._flowing = asyncio.Event()
        if self._mode != "blackhole":
            self._flowing.set()
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.port)
        return cast(int, self._server.sockets[0].getsockname()[1])

    async def _apply(self, mode: ProxyMode) -> None:
        assert self._flowing is not None
        self._mode = mode
        if mode == "blackhole":
            self._flowing.clear()
        else:
            self._flowing.set()
        for link in list(self._links):
            link.budget = self.close_after_bytes
            if mode == "reset":
                self._abort(link)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [link.task for link in self._links if link.task is not None]
        for link in list(self._links):
            self._close(link)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        link = _Link(writer, self.close_after_bytes)
        self._links.add(link)
        self.connections_total += 1
        try:
            if self._mode == "reset":
                self._abort(link)
                return
            await self._flowing.wait()
            if link.closed:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                self.upstream_failures += 1
                return
            link.upstream = up_writer
            if link.closed:  # reset while we were dialling
                self._abort(link)
                return
            pumps = [
                asyncio.create_task(self._pump(link, reader, up_writer, upstream=True)),
                asyncio.create_task(self._pump(link, up_reader, writer, upstream=False)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except asyncio.CancelledError:
            # stop() cancels the connections' handlers: end quietly. (On 3.11 a handler
            # task left cancelled is logged by asyncio's stream callback as an error.)
            pass
        finally:
            self._close(link)
            self._links.discard(link)

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        assert self._flowing is not None
        try:
            while not link.closed:
                await self._flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._flowing.wait()  # read at the edge of a blackhole: hold until healed
                if self._mode == "latency" and self.latency_s > 0:
                    await asyncio.sleep(self.latency_s)
                last = False
                if self._mode == "close_after":
                    last = len(data) >= link.budget
                    data = data[: link.budget]
                    link.budget -= len(data)
                if not upstream and link.drop_pending is not None and data:
                    # The command ran (Redis answers a chunk after running all of it):
                    # lose its answer and the connection, as a broken network would.
                    name, link.drop_pending = link.drop_pending, None
                    self.drops[name] = self.drops.get(name, 0) + 1
                    self._abort(link)
                    return
                if upstream and data:
                    self._arm(link, data)
                if data and not link.closed:
                    # Count first: the peer may observe the bytes before drain() returns.
                    if upstream:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
                    writer.write(data)
                    await writer.drain()
                if last:
                    return
        except (OSError, asyncio.IncompleteReadError):
            return

    def _abort(self, link: _Link) -> None:
        """Drop the link with RST on the client side (and abort the upstream side)."""
        if link.closed:
            return
        link.closed = True
        self.connections_reset += 1
        for writer in (link.client, link.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    def _close(self, link: _Link) -> None:
        link.closed = True
        for writer in (link.client, link.upstream):
            if writer is not None and not writer.is_closing():
                writer.close()
