"""Blocking waits that deliver the work: the pop rides behind the BLPOP.

An idle worker blocks on its queues' wake-up lists. A wake-up used to cost two round
trips, the BLPOP reply and then the pop script. Here both commands are written at once
on a connection of the waiter's own: Redis keeps the pop in that client's buffer while
the BLPOP blocks and runs it the moment the BLPOP returns, so the reply to the wake-up
carries the reserved jobs. A wait that times out runs the pop too (it is cheap, and its
reply says when the next delayed job is due).

Stopping must not cut that connection while a pop may run behind the wait: the jobs it
reserved would sit out their lease. :meth:`Waiter.interrupt` asks Redis to end the wait
(``CLIENT UNBLOCK``); the pop then runs and its jobs come back to the worker, which gives
them back. Only if that does not work is the read cancelled.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio
from redis.exceptions import NoScriptError

from tidings.queue.scripts import Arg, LuaScript


class Waiter:
    """Blocking waits on a dedicated connection made by ``client``'s pool."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._pool: Any = getattr(client, "connection_pool", None)
        self._conn: Any = None
        self._id: int | None = None
        self._blocked = False

    @property
    def pipelines(self) -> bool:
        """Whether waits can carry a pop (not on Cluster clients: no single pool)."""
        return self._pool is not None

    async def _connection(self) -> Any:
        if self._conn is None:
            conn = self._pool.make_connection()
            try:
                await conn.connect()
                await conn.send_command("CLIENT", "ID")
                self._id = int(await conn.read_response())
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
                raise
            self._conn = conn
        return self._conn

    async def wait(
        self,
        notify: list[str],
        timeout_s: float,
        script: LuaScript,
        keys: list[str],
        args: list[Arg],
    ) -> list[Any] | None:
        """BLPOP ``notify`` for up to ``timeout_s``, then run ``script``; returns the
        script's reply, or None when the server does not know the script yet (the caller
        then pops the ordinary way, which loads it)."""
        conn = await self._connection()
        commands = [
            ("BLPOP", *notify, f"{max(timeout_s, 0.001):.3f}"),
            ("EVALSHA", script.sha, len(keys), *keys, *args),
        ]
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            self._blocked = True
            await conn.read_response()  # a token, or None: timed out or unblocked
            self._blocked = False
            try:
                reply: list[Any] = await conn.read_response()
            except NoScriptError:
                return None
            return reply
        except BaseException:
            # Cancelled or failed mid-exchange: the connection's state is unknown.
            self._blocked = False
            await self.close()
            raise

    async def interrupt(self) -> bool:
        """End a blocking wait now; True when Redis ended one."""
        if self._id is None or not self._blocked:
            return False
        return bool(await self._client.client_unblock(self._id))

    async def close(self) -> None:
        """Drop the connection (a new one is made by the next wait)."""
        conn, self._conn, self._id = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
