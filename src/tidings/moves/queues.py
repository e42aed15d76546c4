"""One Redis connection's queues: the producer's pushes and the operator's commands.

The worker's moves (pop, ack, release, fail, extend) live in :mod:`tidings.moves.consume`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tidings._clock import delay_ms
from tidings.errors import QueueUnavailable
from tidings.moves.batch_members import reopen_failed_members
from tidings.moves.coalesce import AsyncPushCoalescer, PushCoalescer
from tidings.moves.groups import group_names
from tidings.redis import scripts
from tidings.redis.clients import async_client, sync_client
from tidings.redis.errors import REDIS_ERRORS, is_transient, is_wrong_type
from tidings.redis.fastpath import FastLane
from tidings.redis.keys import QueueKeys, queue_pattern, restart_key

log = logging.getLogger(__name__)
_UNAVAILABLE = REDIS_ERRORS
DONE_KEEP_MS = 3600 * 1000
DONE_MAX = 100_000


def _key_text(key: object) -> str:
    # Key names written by hand may not be UTF-8: list them, escaped.
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)


@dataclass(frozen=True, slots=True)
class FailedJob:
    """One record of the failed store."""

    id: str
    queue: str
    name: str
    failed_at: float
    exception: str
    attempts: int
    payload: bytes

    def summary(self) -> dict[str, Any]:
        """The JSON shape of ``failed list --json``."""
        return {
            "id": self.id,
            "queue": self.queue,
            "name": self.name,
            "failed_at": self.failed_at,
            "exception": self.exception,
        }


def _count(raw: Any) -> int:
    """A counter read from Redis as a size: missing, garbage or below 0 (a key written by
    hand) reads 0."""
    try:
        return max(0, int(raw or 0))
    except (TypeError, ValueError):
        return 0


def _translate(exc: BaseException, what: str) -> QueueUnavailable | BaseException:
    # redis-py raises OutOfMemoryError and strips the "OOM" prefix from its message.
    if isinstance(exc, OutOfMemoryError) or (isinstance(exc, ResponseError) and "OOM" in str(exc)):
        return QueueUnavailable(f"{what}: Redis is out of memory (maxmemory reached)")
    if is_transient(exc):
        # Connection trouble, or a failover/resharding in progress (CLUSTERDOWN, MOVED,
        # READONLY, MASTERDOWN...): the push did not happen, a later one may.
        return QueueUnavailable(f"{what}: Redis unavailable ({type(exc).__name__}: {exc})")
    return exc


_GUARDED = (*_UNAVAILABLE, ResponseError)


def _raise_translated(exc: BaseException, what: str) -> NoReturn:
    """Raise ``exc`` as :func:`_translate` has it: ``QueueUnavailable`` or itself."""
    translated = _translate(exc, what)
    if translated is exc:
        raise exc
    raise translated from exc


@contextmanager
def _guard(what: str) -> Iterator[None]:
    """Turn a transient Redis error inside the block into ``QueueUnavailable``."""
    try:
        yield
    except _GUARDED as exc:
        _raise_translated(exc, what)


@asynccontextmanager
async def _aguard(what: str) -> AsyncIterator[None]:
    """Async twin of :func:`_guard`."""
    try:
        yield
    except _GUARDED as exc:
        _raise_translated(exc, what)


unavailable_guard = _guard
unavailable_aguard = _aguard


@contextmanager
def _skipping_wrong_types(queue: str, what: str) -> Iterator[None]:
    """Log and swallow a ``WRONGTYPE`` error while reading ``queue``'s keys.

    A Redis writer (or a careless operator) may replace a queue's keys with values of
    another type; the commands that read every queue (``job_status``, ``monitor``,
    ``failed list``) then skip that queue with an ERROR naming it and answer for the
    others, instead of failing with redis-py's ``ResponseError``.
    """
    try:
        yield
    except ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        # %r: the queue name comes from Redis keys and may carry control characters (so
        # does the error text, which names the key: left out).
        log.error("%s: skipped queue %r: one of its keys has the wrong type (WRONGTYPE)",
                  what, queue)  # fmt: skip


class _Plain:
    """The ordinary client path, with the FastLane's interface (Redis Cluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def call(self, script: scripts.LuaScript, keys: list[str], args: list[scripts.Arg]) -> Any:
        return script.call(self.client, keys, args)

    def close(self) -> None:
        pass


def _pair_commands(
    script: scripts.LuaScript, keys: list[str], args: list[scripts.Arg], wait: list[int]
) -> list[tuple[scripts.Arg, ...]]:
    """A confirmed push's two commands: the script by SHA, then ``WAIT``."""
    return [("EVALSHA", script.sha, len(keys), *keys, *args), ("WAIT", *wait)]


def _still_unknown(script: scripts.LuaScript) -> NoScriptError:
    return NoScriptError(f"{script.name}: loaded, and still unknown to the server")


def _replies(raw: list[Any]) -> tuple[Any, Any] | None:
    """The (script, ``WAIT``) replies of a confirmed push; None when the server must load
    the script first. An error is raised as Redis sent it: redis-py's pipeline error
    would quote the command, and a push's arguments are job data."""
    if isinstance(raw[0], NoScriptError):
        return None
    for r in raw:
        if isinstance(r, BaseException):
            raise r
    return raw[0], raw[1]


def _pipelined(
    target: Any,
    script: scripts.LuaScript,
    keys: list[str],
    args: list[scripts.Arg],
    wait: list[int],
) -> tuple[Any, Any]:
    """``script`` then ``WAIT`` in one pipeline on one connection of ``target`` (a plain
    client of the server holding ``keys``); returns both replies."""
    for _ in (0, 1):
        pipe = target.pipeline(transaction=False)
        for command in _pair_commands(script, keys, args, wait):
            pipe.execute_command(*command)
        replies = _replies(pipe.execute(raise_on_error=False))
        if replies is not None:
            return replies
        target.script_load(script.source)  # then again: every push is safe to re-run
    raise _still_unknown(script)


async def _apipelined(
    target: Any,
    script: scripts.LuaScript,
    keys: list[str],
    args: list[scripts.Arg],
    wait: list[int],
) -> tuple[Any, Any]:
    """Async twin of :func:`_pipelined`."""
    for _ in (0, 1):
        pipe = target.pipeline(transaction=False)
        for command in _pair_commands(script, keys, args, wait):
            pipe.execute_command(*command)
        replies = _replies(await pipe.execute(raise_on_error=False))
        if replies is not None:
            return replies
        await target.script_load(script.source)
    raise _still_unknown(script)


_MOVED_OR_GONE = (AskError, RedisConnectionError, RedisTimeoutError, ClusterDownError, OSError)
"""Errors of a push sent past the cluster client's routing (``AskError`` covers
``MovedError``): the client's slot map is ours to reload."""


def _cluster_confirmed(
    client: Any,
    script: scripts.LuaScript,
    keys: list[str],
    args: list[scripts.Arg],
    wait: list[int],
) -> tuple[Any, Any]:
    """A confirmed push on Redis Cluster: the pipeline to the primary of ``keys``' slot.
    A ``MOVED`` (the slot has another primary now: a failover, a resharding) reloads the
    slot map and tries once more; a dead node reloads it for the next push."""
    try:
        return _pipelined(
            client.get_node_from_key(keys[0]).redis_connection, script, keys, args, wait
        )
    except _MOVED_OR_GONE as exc:
        with contextlib.suppress(Exception):  # nodes may be down: the next push retries
            client.nodes_manager.initialize()
        if not isinstance(exc, AskError):
            raise
    return _pipelined(client.get_node_from_key(keys[0]).redis_connection, script, keys, args, wait)


async def _acluster_pair(
    client: Any,
    script: scripts.LuaScript,
    keys: list[str],
    args: list[scripts.Arg],
    wait: list[int],
) -> Any:
    """``script`` then ``WAIT`` on one connection to the primary of ``keys``' slot (the
    asyncio cluster client has no per-node pipeline)."""
    if client._initialize:
        await client.initialize()
    try:
        return await _acluster_attempt(client, script, keys, args, wait)
    except _MOVED_OR_GONE as exc:  # as in _cluster_confirmed
        with contextlib.suppress(Exception):
            await client.nodes_manager.initialize()
        if not isinstance(exc, AskError):
            raise
    return await _acluster_attempt(client, script, keys, args, wait)


async def _acluster_attempt(
    client: Any,
    script: scripts.LuaScript,
    keys: list[str],
    args: list[scripts.Arg],
    wait: list[int],
) -> tuple[Any, Any]:
    """One try of :func:`_acluster_pair` (loading the script if the node lacks it)."""
    for _ in (0, 1):
        node = client.get_node_from_key(keys[0])
        conn = node.acquire_connection()
        replies: list[Any] = []
        try:
            if not conn.is_connected:
                await conn.connect()
            commands = _pair_commands(script, keys, args, wait)
            await conn.send_packed_command(conn.pack_commands(commands))
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:  # read the WAIT's reply too
                    replies.append(exc)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            node.release(conn)
        pair = _replies(replies)
        if pair is not None:
            return pair
        await client.script_load(script.source)
    raise _still_unknown(script)


class RedisQueue:
    """The queues behind one Redis URL and key prefix.

    ``wait_replicas`` (``TIDINGS_WAIT_REPLICAS``): every producer push is followed, on
    the same connection, by ``WAIT wait_replicas wait_timeout_ms``, and a push that fewer
    replicas confirmed raises :class:`QueueUnavailable` instead of returning. A returned
    dispatch then survives the failover of its primary (docs/guarantees.md, Topologies).
    """

    def __init__(
        self, url: str, prefix: str, *, wait_replicas: int = 0, wait_timeout_ms: int = 100
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.confirm_replicas = wait_replicas
        self.confirm_timeout_ms = wait_timeout_ms
        self._keys: dict[str, QueueKeys] = {}
        self._sync: redis.Redis | None = None
        self._fast: Any = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis]
        self._async = weakref.WeakKeyDictionary()
        self.coalesce = True
        """Concurrent plain pushes share one script call (:mod:`tidings.moves.coalesce`)."""
        self._coalescer = PushCoalescer(self._push_many)
        self._acoalescer = AsyncPushCoalescer(self._apush_many)

    def keys(self, queue: str) -> QueueKeys:
        """Key names of ``queue`` (cached)."""
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = QueueKeys.build(self.prefix, queue)
        return k

    @property
    def client(self) -> redis.Redis:
        """The sync client (created on first use)."""
        if self._sync is None:
            self._sync = sync_client(self.url)
        return self._sync

    def aclient(self) -> redis.asyncio.Redis:
        """The asyncio client of the running event loop (one per loop)."""
        loop = asyncio.get_running_loop()
        c = self._async.get(loop)
        if c is None:
            c = self._async[loop] = async_client(self.url)
        return c

    def close(self) -> None:
        """Close the sync client's connections."""
        if self._fast is not None:
            self._fast.close()
            self._fast = None
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    # -- producing -------------------------------------------------------------------

    def _push_move(
        self,
        queue: str,
        items: Sequence[tuple[str, bytes]],
        delay_s: float,
        priority: int | Sequence[int] = 0,
        group: str | None = None,
    ) -> tuple[scripts.LuaScript, list[str], list[scripts.Arg]]:
        """The script, keys and arguments of a push: ``push_group`` for a fair group,
        ``later`` when delayed, ``push_priority`` when a job has a priority other than 0
        (``priority`` is one for every item, or one per item), else ``push`` (the fast
        path). A grouped push takes one priority for all its items (callers group by it)."""
        k = self.keys(queue)
        args: list[scripts.Arg] = []
        if group is not None:  # fair groups (tidings.moves.groups)
            if isinstance(priority, int):
                one = priority
            else:
                one = priority[0] if priority else 0
                if any(p != one for p in priority):
                    raise ValueError("a grouped push takes one priority for all its jobs")
            for job_id, envelope in items:
                args += (job_id, envelope)
            keys = [k.jobs, k.done, k.failed, k.attempts, k.notify, k.delayed]
            keys += [k.gon, k.gring, k.gcfg, k.pseq]
            return scripts.PUSH_GROUP, keys, [group, delay_ms(delay_s), one, *args]
        if isinstance(priority, int):
            if not priority and delay_s <= 0:
                for job_id, envelope in items:
                    args += (job_id, envelope)
                return scripts.PUSH, [k.ready, k.notify, k.jobs, k.done, k.failed], args
            priorities: Sequence[int] = [priority] * len(items)
        else:
            priorities = priority
            if len(priorities) != len(items):
                raise ValueError(f"{len(priorities)} priorities for {len(items)} jobs")
        if delay_s > 0:
            for (job_id, envelope), p in zip(items, priorities, strict=True):
                args += (job_id, p, envelope)
            return (
                scripts.LATER,
                [k.delayed, k.notify, k.jobs, k.done, k.failed, k.attempts, k.pseq],
                [delay_ms(delay_s), *args],
            )
        if not any(priorities):
            for job_id, envelope in items:
                args += (job_id, envelope)
            return scripts.PUSH, [k.ready, k.notify, k.jobs, k.done, k.failed], args
        for (job_id, envelope), p in zip(items, priorities, strict=True):
            args += (job_id, p, envelope)
        keys = [k.ready, k.notify, k.jobs, k.done, k.failed, k.attempts, k.prio, k.pseq]
        return scripts.PUSH_PRIORITY, keys, args

    def _wait(self) -> list[int]:
        """The arguments of a confirmed push's ``WAIT``."""
        return [self.confirm_replicas, self.confirm_timeout_ms]

    def push(
        self,
        queue: str,
        items: Sequence[tuple[str, bytes]],
        delay_s: float = 0.0,
        priority: int | Sequence[int] = 0,
        group: str | None = None,
    ) -> None:
        """Push ``(id, envelope)`` items in one round trip, at ``priority`` (-100..100;
        one for all, or one per item: a batch of mixed priorities is still one call).

        Raises:
            QueueUnavailable: Redis could not be reached; nothing was written.
        """
        if self._coalesced(items, delay_s, priority, group):
            self._coalescer.push(queue, items[0])
            return
        self._push_many(queue, items, delay_s, priority, group)

    def _coalesced(
        self,
        items: Sequence[tuple[str, bytes]],
        delay_s: float,
        priority: int | Sequence[int],
        group: str | None,
    ) -> bool:
        """Whether a push goes through the coalescer: one job, not delayed, priority 0,
        no fair group (the others take their own scripts, directly)."""
        return (
            self.coalesce
            and len(items) == 1
            and delay_s <= 0
            and group is None
            and (priority == 0 if isinstance(priority, int) else not any(priority))
        )

    def _push_many(
        self,
        queue: str,
        items: Sequence[tuple[str, bytes]],
        delay_s: float = 0.0,
        priority: int | Sequence[int] = 0,
        group: str | None = None,
    ) -> None:
        script, keys, args = self._push_move(queue, items, delay_s, priority, group)
        try:  # _guard, inline: no generator and no message built for a push that lands
            self.produce(queue, script, keys, args)
        except _GUARDED as exc:
            _raise_translated(exc, f"push to {queue!r}")

    async def _apush_many(
        self,
        queue: str,
        items: Sequence[tuple[str, bytes]],
        delay_s: float = 0.0,
        priority: int | Sequence[int] = 0,
        group: str | None = None,
    ) -> None:
        script, keys, args = self._push_move(queue, items, delay_s, priority, group)
        try:  # _aguard, inline (as in _push_many)
            await self.aproduce(queue, script, keys, args)
        except _GUARDED as exc:
            _raise_translated(exc, f"push to {queue!r}")

    def produce(
        self, queue: str, script: scripts.LuaScript, keys: list[str], args: list[scripts.Arg]
    ) -> Any:
        """Run a producer's script (a push) on the fast lane; with ``wait_replicas``,
        confirmed by ``WAIT`` on the same connection.

        Raises:
            QueueUnavailable: fewer replicas than ``wait_replicas`` confirmed the push
                (other Redis errors propagate: callers wrap this in their guard).
        """
        if not self.confirm_replicas:
            return self._lane().call(script, keys, args)
        wait = self._wait()
        lane = self._lane()
        if isinstance(lane, FastLane):
            reply = lane.call(script, keys, args)
            acked = lane.command("WAIT", *wait)
        else:
            client: Any = self.client
            if hasattr(client, "get_node_from_key"):  # Redis Cluster: the slot's primary
                reply, acked = _cluster_confirmed(client, script, keys, args, wait)
            else:
                reply, acked = _pipelined(client, script, keys, args, wait)
        self._confirmed(queue, int(acked))
        return reply

    async def aproduce(
        self, queue: str, script: scripts.LuaScript, keys: list[str], args: list[scripts.Arg]
    ) -> Any:
        """Async twin of :meth:`produce`."""
        client: Any = self.aclient()
        if not self.confirm_replicas:
            return await script.acall(client, keys, args)
        wait = self._wait()
        if isinstance(client, AsyncRedisCluster):
            reply, acked = await _acluster_pair(client, script, keys, args, wait)
        else:
            reply, acked = await _apipelined(client, script, keys, args, wait)
        self._confirmed(queue, int(acked))
        return reply

    def _confirmed(self, queue: str, acked: int) -> None:
        if acked < self.confirm_replicas:
            raise QueueUnavailable(
                f"push to {queue!r}: {acked} of {self.confirm_replicas} replicas confirmed it "
                f"within {self.confirm_timeout_ms} ms (TIDINGS_WAIT_REPLICAS, "
                "TIDINGS_WAIT_REPLICAS_TIMEOUT); it may still run, and dispatching it again "
                "may run it twice"
            )

    def _lane(self) -> Any:
        """The fast lane for script calls (the ordinary client for Redis Cluster)."""
        if self._fast is None:
            client = self.client
            pool = getattr(client, "connection_pool", None)
            # Plain pools only: a Sentinel pool resolves the primary per connection.
            if type(pool) in (redis.ConnectionPool, redis.BlockingConnectionPool):
                self._fast = FastLane(client)
            else:
                self._fast = _Plain(client)
        return self._fast

    async def push_async(
        self,
        queue: str,
        items: Sequence[tuple[str, bytes]],
        delay_s: float = 0.0,
        priority: int | Sequence[int] = 0,
        group: str | None = None,
    ) -> None:
        """Async twin of :meth:`push`."""
        if self._coalesced(items, delay_s, priority, group):
            await self._acoalescer.push(queue, items[0])
            return
        await self._apush_many(queue, items, delay_s, priority, group)

    def wait_replicas(self, queue: str, replicas: int = 1, timeout_ms: int = 100) -> int:
        """Block until ``replicas`` replicas of the primary holding ``queue`` have every
        write made so far on this client's connection to it (Redis ``WAIT``), or until
        ``timeout_ms``; returns how many have.

        Redis replicates asynchronously: a push acknowledged by a primary that dies
        before sending it on is lost with it. Call this after a dispatch that must
        survive a failover (returns >= 1: it will). It costs a round trip to the replica:
        a dispatch took ~1.8x as long on loopback (docs/guarantees.md, Topologies).

        Raises:
            QueueUnavailable: Redis could not be reached.
        """
        client: Any = self.client
        with _guard(f"WAIT for replicas of {queue!r}"):
            if hasattr(client, "get_node_from_key"):  # Redis Cluster: the queue's primary
                node = client.get_node_from_key(self.keys(queue).ready)
                return int(client.execute_command("WAIT", replicas, timeout_ms, target_nodes=node))
            lane = self._lane()
            if isinstance(lane, FastLane):
                return int(lane.command("WAIT", replicas, timeout_ms))
            return int(client.execute_command("WAIT", replicas, timeout_ms))

    # -- operating -------------------------------------------------------------------

    def queue_names(self) -> list[str]:
        """Every queue that has held a job, by scanning key names."""
        names: set[str] = set()
        pattern = queue_pattern(self.prefix)
        start = len(f"{self.prefix}:queue:{{")
        for key in self.client.scan_iter(match=pattern, count=500):
            text = _key_text(key)
            names.add(text[start : text.rindex("}")])
        for suffix in ("failed", "delayed", "done"):
            for key in self.client.scan_iter(match=f"{self.prefix}:queue:{{*}}:{suffix}"):
                text = _key_text(key)
                names.add(text[start : text.rindex("}")])
        return sorted(names)

    def sizes(self, queues: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """``{queue: {ready, delayed, reserved, failed}}`` for ``monitor``; a queue whose
        keys have the wrong type is left out (logged at ERROR).

        ``ready`` counts the ungrouped ready jobs and those of every fair group (paused
        groups too) from one counter the group scripts keep (``{Q}:gready``), so the cost
        does not grow with the number of groups."""
        names = list(queues) if queues else self.queue_names()
        out: dict[str, dict[str, int]] = {}
        with _guard("monitor"):
            for name in names:
                k = self.keys(name)
                with _skipping_wrong_types(name, "monitor"):
                    pipe = self.client.pipeline(transaction=False)
                    pipe.llen(k.ready)
                    pipe.zcard(k.delayed)
                    # Not ZCARD: the reserved zset's skiplist mark (score +inf, no job:
                    # lua/lib/reserved_skiplist.lua) is left out.
                    pipe.zcount(k.reserved, "-inf", "(+inf")
                    pipe.zcard(k.failed)
                    pipe.zcard(k.prio)
                    pipe.get(k.gready)
                    ready, delayed, reserved, failed, prio, grouped = pipe.execute()
                    out[name] = {
                        "ready": ready + prio + _count(grouped),
                        "delayed": delayed,
                        "reserved": reserved,
                        "failed": failed,
                    }
        return out

    def status(self, job_id: str, queues: Sequence[str]) -> str | None:
        """pending / delayed / reserved / done / failed / cancelled (or cancelling: a
        running job ``cancel`` was asked for), or None when no record is left.

        A queue whose keys have the wrong type is skipped (logged at ERROR).
        """
        with _guard("job_status"):
            for name in queues:
                k = self.keys(name)
                replies: list[Any] | None = None
                with _skipping_wrong_types(name, "job_status"):
                    pipe = self.client.pipeline(transaction=False)
                    pipe.zscore(k.reserved, job_id)
                    pipe.zscore(k.delayed, job_id)
                    pipe.hexists(k.jobs, job_id)
                    pipe.zscore(k.failed, job_id)
                    pipe.zscore(k.done, job_id)
                    pipe.zscore(k.cancelled, job_id)
                    pipe.hexists(k.attempts, f"{job_id}:c")
                    replies = pipe.execute()
                if replies is None:
                    continue
                reserved, delayed, exists, failed, done, cancelled, marked = replies
                if reserved == math.inf:  # the reserved zset's skiplist mark, not a job
                    reserved = None
                if cancelled is not None or (marked and reserved is None and exists):
                    return "cancelled"
                if reserved is not None:
                    return "cancelling" if marked else "reserved"
                if delayed is not None:
                    return "delayed"
                if exists:
                    return "pending"
                if failed is not None:
                    return "failed"
                if done is not None:
                    return "done"
        return None

    def clear(self, queue: str) -> int:
        """Delete every waiting job of ``queue`` (ready and delayed); returns the count."""
        k = self.keys(queue)
        total = 0
        while True:
            n = int(
                scripts.CLEAR.call(
                    self.client, [k.ready, k.delayed, k.jobs, k.attempts, k.prio], [1000]
                )
            )
            total += n
            if n == 0:
                return total + self._clear_groups(k)

    def _clear_groups(self, k: QueueKeys) -> int:
        """Delete the waiting jobs of every fair group of the queue (ready, group by
        group); delayed grouped jobs went with the delayed zset above."""
        total = 0
        for g in group_names(self.client, k):
            keys = [k.gring, k.jobs, k.attempts, k.group("g", g), k.group("gp", g), k.gstat]
            keys.append(k.group("gr", g))
            while True:
                n = int(scripts.GROUP_CLEAR.call(self.client, keys, [g, 1000]))
                total += n
                if n == 0:
                    break
        return total

    def restart(self) -> None:
        """Ask every worker to exit after its current jobs."""
        t = self.client.time()
        self.client.set(restart_key(self.prefix), f"{t[0]}.{t[1]:06d}")

    def restart_requested_at(self) -> float:
        """When ``restart`` was last asked for (Redis time), 0 if never."""
        raw = self.client.get(restart_key(self.prefix))
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            value = 0.0
        # Written by hand (garbage, nan, inf): no restart was asked for.
        return value if math.isfinite(value) else 0.0

    # -- the failed store ------------------------------------------------------------

    def failed(self, queues: Sequence[str] | None = None) -> list[FailedJob]:
        """Every failed record, oldest first; a queue whose keys have the wrong type is
        skipped (logged at ERROR)."""
        records: list[FailedJob] = []
        for name in list(queues) if queues else self.queue_names():
            k = self.keys(name)
            client: Any = self.client  # redis-py's sync return types are loose unions
            with _skipping_wrong_types(name, "failed list"):
                found = []
                for raw_id, score in client.zrange(k.failed, 0, -1, withscores=True):
                    record = self._failed_record(name, raw_id, score)
                    if record is not None:
                        found.append(record)
                records.extend(found)
        records.sort(key=lambda r: r.failed_at)
        return records

    def _failed_record(self, queue: str, job_id: str | bytes, score: float) -> FailedJob | None:
        k = self.keys(queue)
        client: Any = self.client
        info_raw, body = client.hget(k.failed_info, job_id), client.hget(k.failed_body, job_id)
        try:
            info = orjson.loads(info_raw) if info_raw else {}
        except orjson.JSONDecodeError:
            info = None
        if not isinstance(info, dict):
            # Valid JSON that is not an object is as unreadable as non-JSON.
            info = {"exception": "(unreadable failure record)"}
        attempts = info.get("attempts")
        if not isinstance(attempts, int) or isinstance(attempts, bool):
            attempts = 0
        if isinstance(job_id, bytes):
            # Ids written by hand may not be UTF-8: show the bytes, escaped.
            job_id = job_id.decode("utf-8", "backslashreplace")
        return FailedJob(
            id=job_id,
            queue=queue,
            name=str(info.get("name", "?")),
            failed_at=score / 1000.0,
            exception=str(info.get("exception", "")),
            attempts=attempts,
            payload=body if isinstance(body, bytes) else b"",
        )

    def find_failed(self, job_id: str) -> FailedJob | None:
        """The failed record with ``job_id``, in any queue (skipping, with an ERROR, a
        queue whose keys have the wrong type)."""
        for name in self.queue_names():
            with _skipping_wrong_types(name, "failed show"):
                score: Any = self.client.zscore(self.keys(name).failed, job_id)
                if score is not None:
                    return self._failed_record(name, job_id, score)
        return None

    def retry(self, ids: Sequence[str] | None = None) -> int:
        """Move failed jobs (all when ``ids`` is None) back to their queues."""
        moved = 0
        for name in self.queue_names():
            k = self.keys(name)
            client: Any = self.client
            wanted = (
                [i.decode() for i in client.zrange(k.failed, 0, -1)] if ids is None else list(ids)
            )
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                keys = [
                    k.ready,
                    k.notify,
                    k.jobs,
                    k.attempts,
                    k.failed,
                    k.failed_info,
                    k.failed_body,
                    k.prio,
                    k.pseq,
                ]
                self._reopen_batch_members(k, chunk)
                moved += int(scripts.RETRY.call(self.client, keys, list(chunk)))
        return moved

    def _reopen_batch_members(self, k: QueueKeys, ids: list[str]) -> None:
        """Batch members among ``ids`` are counted pending again before they move (else
        the batch gate would skip them as counted already; see ``batch_retry.lua``)."""
        if ids:
            envelopes: Any = self.client.hmget(k.failed_body, ids)
            reopen_failed_members(self.client, self.prefix, ids, list(envelopes))

    def forget(self, ids: Sequence[str]) -> int:
        """Delete failed records by id."""
        n = 0
        for name in self.queue_names():
            k = self.keys(name)
            n += int(
                scripts.FORGET.call(
                    self.client, [k.failed, k.failed_info, k.failed_body], ["ids", *ids]
                )
            )
        return n

    def prune(self, older_than_s: float) -> int:
        """Delete failed records older than ``older_than_s`` seconds (Redis time)."""
        t = self.client.time()
        cutoff = int((t[0] + t[1] / 1e6 - older_than_s) * 1000)
        n = 0
        for name in self.queue_names():
            k = self.keys(name)
            while True:
                got = int(
                    scripts.FORGET.call(
                        self.client,
                        [k.failed, k.failed_info, k.failed_body],
                        ["prune", cutoff, 1000],
                    )
                )
                n += got
                if got == 0:
                    break
        return n

    def flush(self) -> int:
        """Delete every failed record."""
        return self.prune(-(10**9))
