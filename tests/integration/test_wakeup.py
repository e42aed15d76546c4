"""The blocking wait that carries a pop (tidings.worker.wakeup), against a real Redis.

A wake-up must deliver reserved jobs in the same reply; a wait ended by ``interrupt``
must still hand back what its pop reserved (never leave it to sit out a lease); a
cancelled wait must leave no half-read connection behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.support.topology import client_for_url
from tidings.moves.consume import Broker, PopResult, pop_result
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts
from tidings.redis.clients import async_client
from tidings.worker.wakeup import Waiter, make_waiter

from .test_lua_scripts import envelope

T = TypeVar("T")


@pytest.fixture
def rq(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    queue = RedisQueue(redis_url, prefix)
    queue.client.script_load(scripts.POP.source)  # a worker's first pop loads it
    try:
        yield queue
    finally:
        queue.close()


def run(rq: RedisQueue, fn: Callable[[Broker, Waiter], Awaitable[T]]) -> T:
    async def main() -> T:
        client = async_client(rq.url)
        blocking = async_client(rq.url, socket_timeout_s=40.0)
        waiter = make_waiter(blocking, [rq.keys("default")], 40.0)  # on Cluster: its slot
        assert isinstance(waiter, Waiter)
        try:
            return await fn(Broker(client, retry_after_s=30.0, max_bytes=1 << 20), waiter)
        finally:
            await waiter.close()
            await blocking.aclose()
            await client.aclose()

    return asyncio.run(main())


async def wait_pop(rq: RedisQueue, b: Broker, w: Waiter, timeout_s: float) -> PopResult | None:
    k = rq.keys("default")
    keys, args = b.pop_command(k, 10)
    raw = await w.wait([k.notify], timeout_s, scripts.POP, keys, args)
    return None if raw is None else pop_result(k, raw)


def reserved_ids(rq: RedisQueue) -> list[str]:
    # Not the skiplist mark (score +inf, no job: lua/lib/reserved_skiplist.lua).
    raw = rq.client.zrangebyscore(rq.keys("default").reserved, "-inf", "(+inf")
    return [i.decode() for i in raw]


def test_a_push_during_the_wait_comes_back_reserved_in_the_same_reply(rq: RedisQueue) -> None:
    job_id, env = envelope(n=1)

    async def go(b: Broker, w: Waiter) -> tuple[PopResult | None, float]:
        t0 = time.monotonic()
        waiting = asyncio.ensure_future(wait_pop(rq, b, w, 20.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await asyncio.to_thread(rq.push, "default", [(job_id, env)])
        res = await waiting
        return res, time.monotonic() - t0

    res, took = run(rq, go)
    assert res is not None
    assert [(j.id, j.attempts, j.envelope) for j in res.jobs] == [(job_id, 1, env)]
    assert took < 10.0  # woken by the push, not by the 20 s timeout
    assert reserved_ids(rq) == [job_id]
    assert res.wait_s is not None  # the ready list is empty; the lease is next due


def test_a_wait_that_times_out_still_pops_and_says_nothing_is_scheduled(
    rq: RedisQueue,
) -> None:
    res = run(rq, lambda b, w: wait_pop(rq, b, w, 0.2))
    assert res is not None and res.jobs == [] and res.wait_s is None


def test_interrupt_ends_the_wait_and_hands_back_what_the_pop_reserved(
    rq: RedisQueue,
) -> None:
    job_id, env = envelope(n=2)
    k = rq.keys("default")

    async def go(b: Broker, w: Waiter) -> tuple[PopResult | None, bool, float]:
        waiting = asyncio.ensure_future(wait_pop(rq, b, w, 30.0))
        await asyncio.sleep(0.2)
        # A job in the ready list without a wake-up token: the BLPOP goes on blocking.
        client = client_for_url(rq.url)
        client.hset(k.jobs, job_id, env)
        client.rpush(k.ready, job_id)
        client.close()
        t0 = time.monotonic()
        ended = await w.interrupt()
        res = await waiting
        return res, ended, time.monotonic() - t0

    res, ended, took = run(rq, go)
    assert ended is True
    assert took < 10.0
    assert res is not None and [j.id for j in res.jobs] == [job_id]
    assert reserved_ids(rq) == [job_id]


def test_interrupt_with_no_wait_in_progress_does_nothing(rq: RedisQueue) -> None:
    async def go(b: Broker, w: Waiter) -> bool:
        return await w.interrupt()

    assert run(rq, go) is False


def test_a_cancelled_wait_drops_its_connection_and_the_next_wait_works(
    rq: RedisQueue,
) -> None:
    job_id, env = envelope(n=3)

    async def go(b: Broker, w: Waiter) -> tuple[Any, PopResult | None]:
        waiting = asyncio.ensure_future(wait_pop(rq, b, w, 30.0))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        closed = w._conn
        await asyncio.to_thread(rq.push, "default", [(job_id, env)])
        return closed, await wait_pop(rq, b, w, 5.0)

    closed, res = run(rq, go)
    assert closed is None
    assert res is not None and [j.id for j in res.jobs] == [job_id]


def test_an_unknown_script_returns_none_so_the_caller_pops_the_ordinary_way(
    rq: RedisQueue,
) -> None:
    job_id, env = envelope(n=4)
    rq.push("default", [(job_id, env)])
    rq.client.script_flush()
    assert run(rq, lambda b, w: wait_pop(rq, b, w, 1.0)) is None
    assert reserved_ids(rq) == []  # nothing reserved behind our back
    res = run(rq, lambda b, w: b.pop(rq.keys("default"), 10))  # EVAL loads it again
    assert [j.id for j in res.jobs] == [job_id]
