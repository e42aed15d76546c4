"""One reader per web process: ``XREAD BLOCK`` over every subscribed channel's stream,
fanned out in memory to the connected browsers.

A channel is read from the position it had when its first subscriber arrived (the
stream's last id then); every later subscriber is offered exactly the entries read after
it registered, so with a replay of ``(Last-Event-ID, start]`` it misses nothing and gets
nothing twice. Adding a channel interrupts the blocked read (``CLIENT UNBLOCK``) so the
new channel is read at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from tidings.redis.clients import async_client
from tidings.redis.keys import broadcast_stream_key

log = logging.getLogger("tidings.broadcasting")

#: Connections a web process uses for positions, replays and wake-ups (beside its reader).
CONTROL_CONNECTIONS = 8

#: One entry as a subscriber gets it: channel, stream id, event name, JSON data.
Entry = tuple[str, str, bytes, bytes]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def entry_of(channel: str, sid: Any, fields: Any) -> Entry:
    """A subscriber's entry from one XREAD/XRANGE item (fields as a dict, or as the flat
    list a raw reply has)."""
    if isinstance(fields, list):
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    return (
        channel,
        _text(sid),
        fields.get(b"e", b"message"),
        fields.get(b"d", b"null"),
    )


class Subscriber:
    """One connected browser: the entries offered to it, and a wake-up."""

    __slots__ = ("buffer", "channels", "closed", "limit", "overflowed", "start", "wake")

    def __init__(self, channels: list[str], limit: int) -> None:
        self.channels = channels
        self.start: dict[str, str] = {}
        self.buffer: collections.deque[Entry] = collections.deque()
        self.wake = asyncio.Event()
        self.limit = limit
        self.overflowed = False
        self.closed = False

    def offer(self, entry: Entry) -> None:
        if len(self.buffer) >= self.limit:
            self.overflowed = True  # the endpoint closes; the browser replays from its id
        else:
            self.buffer.append(entry)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


@dataclass
class _Channel:
    last_id: str
    key: bytes = b""
    subscribers: set[Subscriber] = field(default_factory=set)


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class Hub:
    """The reader of one web process (per Redis URL and key prefix)."""

    def __init__(self, url: str, prefix: str, *, block_ms: int = 1000) -> None:
        self.url = url
        self.prefix = prefix
        self.block_ms = block_ms
        self._channels: dict[str, _Channel] = {}
        self._key_to_channel: dict[bytes, str] = {}
        self._control: redis.asyncio.Redis | None = None
        self._reader: Any = None  # a raw connection (or, on Redis Cluster, a client)
        self._head: tuple[bytes, list[_Channel]] | None = None  # packed XREAD up to the ids
        self._reader_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._has_channels = asyncio.Event()
        # Short commands share a few pooled connections: a thousand browsers arriving at
        # once wait their turn instead of exhausting the pool.
        self._gate = asyncio.Semaphore(CONTROL_CONNECTIONS)
        self.reads = 0  # XREAD calls made (tests, benchmarks)

    @property
    def control(self) -> redis.asyncio.Redis:
        """The client for short commands (positions, replays, CLIENT UNBLOCK)."""
        if self._control is None:
            self._control = async_client(self.url)
        return self._control

    def key(self, channel: str) -> str:
        return broadcast_stream_key(self.prefix, channel)

    @property
    def channel_count(self) -> int:
        return len(self._channels)

    # -- subscribing ---------------------------------------------------------------------

    async def subscribe(self, channels: list[str], limit: int = 1000) -> Subscriber:
        """Register a subscriber; ``sub.start[c]`` is where its live feed begins."""
        sub = Subscriber(channels, limit)
        new = [c for c in channels if c not in self._channels]
        if new:
            async with self._gate, self.control.pipeline(transaction=False) as pipe:
                for c in new:
                    pipe.xrevrange(self.key(c), count=1)
                tails = await pipe.execute()
            for c, tail in zip(new, tails, strict=True):
                if c not in self._channels:  # another subscriber may have won the await
                    key = self.key(c).encode()
                    self._channels[c] = _Channel(_text(tail[0][0]) if tail else "0-0", key)
                    self._key_to_channel[key] = c
                    self._head = None
        for c in channels:
            state = self._channels[c]
            state.subscribers.add(sub)
            sub.start[c] = state.last_id
        if new:
            self._has_channels.set()
            self._ensure_reader()
            await self._interrupt()
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Drop a subscriber; a channel nobody listens to is no longer read."""
        sub.close()
        for c in sub.channels:
            state = self._channels.get(c)
            if state is None:
                continue
            state.subscribers.discard(sub)
            if not state.subscribers:
                del self._channels[c]
                self._key_to_channel.pop(state.key, None)
                self._head = None
        if not self._channels:
            self._has_channels.clear()

    async def trimmed_after(self, channel: str, after: str) -> bool:
        """Whether ``MAXLEN`` trimming dropped entries newer than ``after``.

        The oldest entry kept carries its predecessor's id (``p``, written by the publish
        script): when that predecessor is ``after`` itself (the browser's last message
        was the last one trimmed), or ``after`` is still in the stream, nothing newer is
        gone. Entries written before ``p`` existed fall back to ``XINFO STREAM`` (Redis
        7's ``entries-added``), which errs on one side: True when the last entry trimmed
        was ``after``."""
        key = self.key(channel)
        try:
            async with self._gate:
                head: Any = await self.control.xrange(key, count=1)
        except RedisError:
            return False
        if not head:
            return False  # an empty (or no) stream: nothing newer than ``after`` was kept
        first, fields = head[0]
        if _id_tuple(_text(first)) <= _id_tuple(after):
            return False  # ``after`` (or something older) is still in the window
        prev = fields.get(b"p")
        if prev is not None:
            # the entry before the oldest kept one: trimmed unless it is ``after``
            return _id_tuple(_text(prev)) > _id_tuple(after)
        return await self._trimmed_by_counts(key, after)

    async def _trimmed_by_counts(self, key: str, after: str) -> bool:
        try:
            async with self._gate:
                info: Any = await self.control.xinfo_stream(key)
        except RedisError:
            return False  # no such stream: nothing was trimmed
        added, length = info.get("entries-added"), info.get("length")
        first = info.get("recorded-first-entry-id")
        if added is None or length is None or first is None or int(added) <= int(length):
            return False
        return _id_tuple(_text(first)) > _id_tuple(after)

    async def replay(self, channel: str, after: str, upto: str) -> list[Entry]:
        """Entries of ``channel`` after ``after`` up to ``upto`` (both stream ids)."""
        if not _is_stream_id(after) or _id_tuple(after) >= _id_tuple(upto):
            return []
        async with self._gate:
            items: Any = await self.control.xrange(self.key(channel), min="(" + after, max=upto)
        return [entry_of(channel, sid, fields) for sid, fields in items or []]

    # -- reading -------------------------------------------------------------------------

    def _ensure_reader(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tidings-sse")

    async def _interrupt(self) -> None:
        """Wake a blocked XREAD so it reads the new channel too."""
        if self._reader_id is None:
            return
        with contextlib.suppress(RedisError, OSError):
            async with self._gate:
                await self.control.client_unblock(self._reader_id)

    async def _connect_reader(self) -> Any:
        """A connection of its own for the blocking read (its CLIENT ID is what
        ``CLIENT UNBLOCK`` wakes); a Redis Cluster client has no pool to take one from
        and reads through a single-connection client instead."""
        if self._reader is None:
            pool = getattr(self.control, "connection_pool", None)
            if pool is None:
                self._reader = async_client(self.url, socket_timeout_s=None)
                return self._reader
            conn = pool.make_connection()
            await conn.connect()
            await conn.send_command("CLIENT", "ID")
            self._reader_id = int(await conn.read_response())
            self._reader = conn
        return self._reader

    async def _drop_reader(self) -> None:
        reader, self._reader, self._reader_id = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(Exception):
                if hasattr(reader, "aclose"):  # a (Cluster) client
                    await reader.aclose()
                else:
                    await reader.disconnect()

    def _packed(self) -> bytes:
        """XREAD COUNT 1000 BLOCK <ms> STREAMS <keys> <ids>, packed once per channel set
        (with a thousand channels, redis-py packing the keys on every read costs more
        than the read)."""
        if self._head is None:
            order = list(self._channels.values())
            words = [b"XREAD", b"COUNT", b"1000", b"BLOCK", str(self.block_ms).encode(),
                     b"STREAMS", *(c.key for c in order)]  # fmt: skip
            head = b"*%d\r\n" % (len(words) + len(order)) + b"".join(map(_bulk, words))
            self._head = (head, order)
        head, order = self._head
        return head + b"".join(_bulk(c.last_id.encode()) for c in order)

    async def _read(self) -> Any:
        reader = await self._connect_reader()
        self.reads += 1
        if not hasattr(reader, "send_packed_command"):  # a (Cluster) client, not a connection
            streams: dict[Any, Any] = {c.key: c.last_id for c in self._channels.values()}
            return await reader.xread(streams, count=1000, block=self.block_ms)
        await reader.send_packed_command(self._packed(), check_health=False)
        return await reader.read_response(timeout=self.block_ms / 1000 + 10)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            if not self._channels:
                await self._has_channels.wait()
                continue
            try:
                reply = await self._read()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("broadcast reader: %s (retrying in %.2fs)", type(exc).__name__, backoff)
                await self._drop_reader()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except Exception:  # a bug must not stop every browser's feed for good
                log.exception("broadcast reader failed (retrying in %.2fs)", backoff)
                await self._drop_reader()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            try:
                self._deliver(reply or [])
            except Exception:
                log.exception("broadcast reader: a reply could not be delivered")

    def _deliver(self, reply: Any) -> None:
        pairs: Iterable[Any] = reply.items() if isinstance(reply, dict) else reply  # RESP3/2
        for key, items in pairs:
            channel = self._key_to_channel.get(key if isinstance(key, bytes) else key.encode())
            state = self._channels.get(channel) if channel is not None else None
            if channel is None or state is None:
                continue
            for sid, fields in items:
                entry = entry_of(channel, sid, fields)
                state.last_id = entry[1]
                for sub in state.subscribers:
                    sub.offer(entry)

    async def close(self) -> None:
        """Stop reading and close the connections."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drop_reader()
        if self._control is not None:
            with contextlib.suppress(Exception):
                await self._control.aclose()
            self._control = None


def _is_stream_id(value: str) -> bool:
    left, _, right = value.partition("-")
    return left.isdigit() and (right == "" or right.isdigit()) and len(value) <= 41


def _id_tuple(value: str) -> tuple[int, int]:
    left, _, right = value.partition("-")
    return int(left), int(right or 0)
