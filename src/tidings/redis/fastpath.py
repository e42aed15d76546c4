"""A producer fast path: one raw redis-py connection per thread for script calls.

``Job.dispatch()`` is one EVALSHA. Through ``redis.Redis`` each call also checks a
connection out of the pool and back (a lock each way), wraps the call in the retry
helper and in two argument filters: about as much Python time as the round trip
itself. The producer's push needs none of that: a connection owned by the calling
thread, one immediate reconnect when it was closed under us (a restarted Redis), and
the same errors as the client (translated to QueueUnavailable by the caller). The
command is packed here: the ``EVALSHA sha numkeys keys...`` head of each script and key
set is packed once, so a push packs only its id and body.
Cluster clients keep the ordinary path.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tidings import _forks
from tidings.redis.scripts import Arg, LuaScript


def _bulk(value: Arg) -> bytes:
    # The same encoding as redis-py's Encoder: text as UTF-8, numbers by repr.
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bool):  # redis-py refuses these too
        raise TypeError("bool is not a Redis argument; use 0/1")
    else:
        data = repr(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack(head: bytes, head_len: int, args: Sequence[Arg]) -> bytes:
    """A RESP command: ``head`` (``head_len`` packed arguments) followed by ``args``."""
    return b"".join([b"*%d\r\n" % (head_len + len(args)), head, *map(_bulk, args)])


class FastLane:
    """Script calls on a per-thread connection made by ``client``'s pool."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._local = threading.local()
        self._heads: dict[tuple[str, tuple[str, ...]], bytes] = {}

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.generation != _forks.generation:
            # A forked child must not share its parent's socket.
            # Made outside the pool's count: ``make_connection`` counts every connection
            # ever made against ``max_connections`` (100) and these are never released to
            # it, so the 101st thread that ever pushed would fail. A thread's connection
            # closes with its thread-local (``Connection.__del__``).
            pool = self._pool
            conn = self._local.conn = pool.connection_class(**pool.connection_kwargs)
            self._local.generation = _forks.generation
        return conn

    def _roundtrip(self, packed: bytes) -> Any:
        conn = self._connection()
        try:
            conn.send_packed_command([packed], check_health=False)
            return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # The socket may have been closed by a Redis restart: reconnect once.
            conn.disconnect()
            conn.send_packed_command([packed], check_health=False)
            return conn.read_response()

    def call(self, script: LuaScript, keys: list[str], args: list[Arg]) -> Any:
        """EVALSHA ``script``, loading it with EVAL when the server does not know it."""
        key = (script.sha, tuple(keys))
        head = self._heads.get(key)
        if head is None:
            parts: list[Arg] = ["EVALSHA", script.sha, len(keys), *keys]
            head = b"".join(map(_bulk, parts))
            if len(self._heads) < 1024:
                self._heads[key] = head
        try:
            return self._roundtrip(pack(head, 3 + len(keys), args))
        except NoScriptError:
            return self._roundtrip(pack(b"", 0, ["EVAL", script.source, len(keys), *keys, *args]))

    def command(self, *args: Arg) -> Any:
        """One plain command on this thread's connection (e.g. ``WAIT`` after a push)."""
        return self._roundtrip(pack(b"", 0, list(args)))

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.disconnect()
            self._local.conn = None
