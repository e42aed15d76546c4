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

**Redis Cluster.** Every queue has its own hash tag, so the queues of one worker live in
different slots, usually on different nodes, and one BLPOP over all their wake-up lists
is refused (``CROSSSLOT``). A :class:`Waiter` made with a ``key`` connects to the primary
serving that key's slot (found again after any error: a failover moves the slot), so a
one-queue worker keeps the pop riding behind its wait. A worker of several queues uses
:class:`SlotWaits`: one *standing* BLPOP per slot, each on its own connection to that
slot's primary, all in flight at once. The first wake-up returns and the fetch loop pops
every queue in priority order; the other waits stay in flight (a token they take while
the worker is busy is kept and ends the next wait at once), so no wake-up is lost and no
wait is cut and re-sent. This costs one connection per queue per worker and no polling;
a pop no longer rides behind the wait (the fetch loop pops after a wake-up), which is
what a multi-queue worker did on plain Redis anyway.

**Sentinel.** A wait's connection is made by the Sentinel pool, which names the primary
when it connects; before each wait the pool is asked again (at most once a second) and a
connection still on an old primary is replaced, so a worker does not keep waiting (and
popping) on a primary that Sentinel has replaced but not yet demoted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import NoScriptError

from tidings.redis.clients import AsyncFollowingPool
from tidings.redis.keys import QueueKeys
from tidings.redis.scripts import Arg, LuaScript


class Waiter:
    """Blocking waits on a dedicated connection made by ``client``'s pool; on a Cluster
    client, to the primary serving ``key``."""

    def __init__(self, client: redis.asyncio.Redis, key: str | None = None) -> None:
        self._client = client
        self._cluster: Any = client if isinstance(client, AsyncRedisCluster) else None
        self._key = key
        self._pool: Any = getattr(client, "connection_pool", None)
        self._node: Any = None
        self._stale = False
        self._conn: Any = None
        self._id: int | None = None
        self._blocked = False

    @property
    def pipelines(self) -> bool:
        """Whether waits can carry a pop (on Cluster: only for the slot of ``key``)."""
        return self._pool is not None or (self._cluster is not None and self._key is not None)

    async def _make_connection(self) -> Any:
        if self._cluster is None:
            return self._pool.make_connection()
        if self._key is None:
            raise RuntimeError("a Waiter on Redis Cluster needs the key it waits on")
        cluster = self._cluster
        if self._stale:
            # The slot may have moved (failover, resharding): load the map again.
            self._stale = False
            await cluster.nodes_manager.initialize()
        await cluster.initialize()
        node = cluster.get_node_from_key(self._key)
        self._node = node
        return node.connection_class(**node.connection_kwargs)

    async def _connection(self) -> Any:
        if self._conn is not None and isinstance(self._pool, AsyncFollowingPool):
            # Sentinel: a wait must not stay on an old primary after a failover.
            await self._pool.follow()
            if self._pool.stale(self._conn):
                await self.close()
        if self._conn is None:
            conn = await self._make_connection()
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
        script: LuaScript | None,
        keys: list[str],
        args: list[Arg],
    ) -> list[Any] | None:
        """BLPOP ``notify`` for up to ``timeout_s``, then run ``script``; returns the
        script's reply, or None when the server does not know the script yet (the caller
        then pops the ordinary way, which loads it). Without a script: the BLPOP's reply
        (a token, or None)."""
        conn = await self._connection()
        commands: list[tuple[Any, ...]] = [("BLPOP", *notify, f"{max(timeout_s, 0.001):.3f}")]
        if script is not None:
            commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            self._blocked = True
            token: Any = await conn.read_response()  # a token, or None: timed out or unblocked
            self._blocked = False
            if script is None:
                return token  # type: ignore[no-any-return]
            try:
                reply: list[Any] = await conn.read_response()
            except NoScriptError:
                return None
            return reply
        except BaseException:
            # Cancelled or failed mid-exchange (MOVED, UNBLOCKED, a dead node): the
            # connection's state is unknown, and on Cluster the slot may have moved.
            self._blocked = False
            self._stale = self._cluster is not None
            await self.close()
            raise

    async def interrupt(self) -> bool:
        """End a blocking wait now; True when Redis ended one."""
        if self._id is None or not self._blocked:
            return False
        if self._cluster is not None:
            # CLIENT UNBLOCK must reach the node holding the blocked connection.
            raw = await self._cluster.execute_command(
                "CLIENT UNBLOCK", self._id, target_nodes=self._node
            )
            return bool(raw)
        return bool(await self._client.client_unblock(self._id))

    async def close(self) -> None:
        """Drop the connection (a new one is made by the next wait)."""
        conn, self._conn, self._id = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)


class SlotWaits:
    """Standing blocking waits, one per slot, for a multi-queue worker on Redis Cluster
    (see the module docstring)."""

    pipelines = False

    def __init__(self, client: redis.asyncio.Redis, keys: Sequence[QueueKeys], block_s: float):
        groups: dict[int, list[str]] = {}
        cluster: Any = client
        for k in keys:
            groups.setdefault(int(cluster.keyslot(k.notify)), []).append(k.notify)
        self._groups = [(notify, Waiter(client, notify[0])) for notify in groups.values()]
        self._futures: list[asyncio.Future[Any] | None] = [None] * len(self._groups)
        self._block_s = block_s

    async def wait(self, timeout_s: float) -> None:
        """Return at the first wake-up on any queue, or after ``timeout_s``.

        Raises:
            redis.RedisError: a wait failed (the others stay in flight).
        """
        for i, (notify, waiter) in enumerate(self._groups):
            if self._futures[i] is None:
                self._futures[i] = asyncio.ensure_future(
                    waiter.wait(notify, self._block_s, None, [], [])
                )
        pending = [f for f in self._futures if f is not None]
        await asyncio.wait(pending, timeout=max(timeout_s, 0), return_when="FIRST_COMPLETED")
        error: BaseException | None = None
        for i, fut in enumerate(self._futures):
            if fut is not None and fut.done():
                self._futures[i] = None
                if not fut.cancelled() and fut.exception() is not None:
                    error = error or fut.exception()
        if error is not None:
            raise error

    async def interrupt(self) -> bool:
        """End every standing wait now; True when Redis ended one."""
        ended = await asyncio.gather(*(w.interrupt() for _, w in self._groups))
        return any(ended)

    async def close(self) -> None:
        """Cancel the standing waits and drop their connections."""
        for fut in self._futures:
            if fut is not None and not fut.done():
                fut.cancel()
        live = [f for f in self._futures if f is not None]
        if live:
            await asyncio.wait(live, timeout=2.0)
        self._futures = [None] * len(self._groups)
        for _, waiter in self._groups:
            await waiter.close()


def make_waiter(
    client: redis.asyncio.Redis, keys: Sequence[QueueKeys], block_s: float
) -> Waiter | SlotWaits:
    """The waits of a worker on ``keys``: one connection for all queues, except for
    several queues on Redis Cluster (their wake-up lists are in different slots)."""
    if isinstance(client, AsyncRedisCluster):
        if len(keys) > 1:
            return SlotWaits(client, keys, block_s)
        return Waiter(client, keys[0].notify)
    return Waiter(client)
