"""A producer fast path: one raw redis-py connection per thread for script calls.

``Job.dispatch()`` is one EVALSHA. Through ``redis.Redis`` each call also checks a
connection out of the pool and back (a lock each way), wraps the call in the retry
helper and in two argument filters: about as much Python time as the round trip
itself. The producer's push needs none of that: a connection owned by the calling
thread, one immediate reconnect when it was closed under us (a restarted Redis), and
the same errors as the client (translated to QueueUnavailable by the caller).
Cluster clients keep the ordinary path.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tidings.queue.scripts import Arg, LuaScript


class FastLane:
    """Script calls on a per-thread connection made by ``client``'s pool."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool: Any = client.connection_pool
        self._local = threading.local()

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            # A forked child must not share its parent's socket.
            conn = self._local.conn = self._pool.make_connection()
            self._local.pid = os.getpid()
        return conn

    def _roundtrip(self, *command: Arg) -> Any:
        conn = self._connection()
        try:
            conn.send_command(*command)
            return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # The socket may have been closed by a Redis restart: reconnect once.
            conn.disconnect()
            conn.send_command(*command)
            return conn.read_response()

    def call(self, script: LuaScript, keys: list[str], args: list[Arg]) -> Any:
        """EVALSHA ``script``, loading it with EVAL when the server does not know it."""
        try:
            return self._roundtrip("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return self._roundtrip("EVAL", script.source, len(keys), *keys, *args)

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.disconnect()
            self._local.conn = None
