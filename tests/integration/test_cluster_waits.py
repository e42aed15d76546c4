"""Blocking waits on a real Redis Cluster (tidings.worker.wakeup): one per slot.

The queues of a worker live in different slots (one hash tag per queue); a single BLPOP
over their wake-up lists is refused with CROSSSLOT. A one-queue Waiter connects to the
primary of its slot and keeps the pop riding behind the wait; SlotWaits keeps one
standing BLPOP per slot, so a wake-up taken while the worker is busy is not lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException, ResponseError

from tests.support.topology import ClusterGroup
from tidings.moves.consume import Broker, pop_result
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts
from tidings.redis.clients import async_client
from tidings.redis.errors import is_transient
from tidings.worker.wakeup import SlotWaits, Waiter, make_waiter

from .test_lua_scripts import envelope

T = TypeVar("T")


def run(url: str, fn: Callable[[Any], Awaitable[T]]) -> T:
    async def main() -> T:
        blocking = async_client(url, socket_timeout_s=40.0)
        try:
            return await fn(blocking)
        finally:
            await blocking.aclose()

    return asyncio.run(main())


def test_queues_of_one_worker_are_in_different_slots_and_one_blpop_is_refused(
    redis_cluster: ClusterGroup, prefix: str
) -> None:
    rq = RedisQueue(redis_cluster.url, prefix)
    try:
        high, default = rq.keys("high"), rq.keys("default")

        async def go(blocking: Any) -> None:
            assert isinstance(blocking, AsyncRedisCluster)
            assert blocking.keyslot(high.notify) != blocking.keyslot(default.notify)
            with pytest.raises((ResponseError, RedisClusterException)):  # the old wait
                await blocking.blpop([high.notify, default.notify], timeout=0.1)
            try:
                await blocking.blpop([high.notify, default.notify], timeout=0.1)
            except (ResponseError, RedisClusterException) as exc:
                assert not is_transient(exc)  # a worker must not retry this for ever

        run(rq.url, go)
    finally:
        rq.close()


def test_slot_waits_wake_for_any_queue_and_keep_a_token_taken_while_busy(
    redis_cluster: ClusterGroup, prefix: str
) -> None:
    rq = RedisQueue(redis_cluster.url, prefix)
    keys = [rq.keys("high"), rq.keys("default")]
    job_id, env = envelope(n=1)

    async def go(blocking: Any) -> dict[str, float]:
        waits = make_waiter(blocking, keys, 20.0)
        assert isinstance(waits, SlotWaits)
        took: dict[str, float] = {}
        try:
            # 1. Idle on both: a push to the second queue ends the wait at once.
            t0 = time.monotonic()
            waiting = asyncio.ensure_future(waits.wait(20.0))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await asyncio.to_thread(rq.push, "default", [(job_id, env)])
            await waiting
            took["wake"] = time.monotonic() - t0
            # 2. "Busy" (not in wait): a push to high is taken by the standing wait...
            await asyncio.to_thread(rq.push, "high", [(job_id + "h", env)])
            await asyncio.sleep(0.3)
            # ...and ends the next wait at once.
            t0 = time.monotonic()
            await waits.wait(20.0)
            took["kept"] = time.monotonic() - t0
            # 3. Nothing pending: the local timeout ends the wait; interrupt ends the rest.
            t0 = time.monotonic()
            await waits.wait(0.3)
            took["timeout"] = time.monotonic() - t0
            assert await waits.interrupt()
        finally:
            await waits.close()
        return took

    try:
        took = run(rq.url, go)
    finally:
        rq.close()
    assert took["wake"] < 10.0  # woken by the push, not by the 20 s block
    assert took["kept"] < 1.0
    assert 0.25 <= took["timeout"] < 5.0


def test_one_queue_waiter_on_cluster_carries_the_pop(
    redis_cluster: ClusterGroup, prefix: str
) -> None:
    rq = RedisQueue(redis_cluster.url, prefix)
    k = rq.keys("default")
    job_id, env = envelope(n=1)

    async def go(blocking: Any) -> list[str]:
        client = async_client(rq.url)
        waiter = make_waiter(blocking, [k], 20.0)
        assert isinstance(waiter, Waiter) and waiter.pipelines
        try:
            broker = Broker(client, retry_after_s=30.0, max_bytes=1 << 20)
            await broker.pop(k, 1)  # loads the pop script on the slot's primary
            keys, args = broker.pop_command(k, 10)
            waiting = asyncio.ensure_future(waiter.wait([k.notify], 20.0, scripts.POP, keys, args))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(rq.push, "default", [(job_id, env)])
            raw = await waiting
            assert raw is not None
            return [j.id for j in pop_result(k, raw).jobs]
        finally:
            await waiter.close()
            await client.aclose()

    try:
        assert run(rq.url, go) == [job_id]
    finally:
        rq.close()
