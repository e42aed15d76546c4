"""Group commit of concurrent plain pushes (tidings.moves.coalesce), against a real Redis.

Producers arriving while a push is in flight share the next script call; each returns
once its own job has landed or raises its own copy of the batch's error; one producer's
jobs keep their order; a dead Redis fails every waiting producer and leaves nothing stuck.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.redis_server import RedisServer
from tidings.errors import QueueUnavailable
from tidings.moves.queues import RedisQueue

from .test_lua_scripts import envelope

WAIT_S = 30.0


def env(tag: str) -> bytes:
    """A real signed envelope's bytes (its own id inside does not matter to push.lua)."""
    return envelope(tag=tag)[1]


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def rq(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    queue = RedisQueue(redis_url, prefix)
    try:
        yield queue
    finally:
        queue.close()


class Gated:
    """Wraps a queue's send: records each batch; the first send waits for ``gate``."""

    def __init__(self, rq: RedisQueue) -> None:
        self.rq = rq
        self.gate = threading.Event()
        self.batches: list[list[str]] = []
        self._inner = rq._coalescer._send
        rq._coalescer._send = self.send

    def send(self, queue: str, items: list[tuple[str, bytes]]) -> None:
        self.batches.append([i for i, _ in items])
        if len(self.batches) == 1:
            assert self.gate.wait(WAIT_S)
        self._inner(queue, items)

    def waiting(self, queue: str) -> int:
        lane = self.rq._coalescer._lanes.get(queue)
        return sum(len(b.items) for b in lane.waiting) if lane else 0


def ready_ids(rq: RedisQueue, queue: str) -> list[str]:
    return [x.decode() for x in rq.client.lrange(rq.keys(queue).ready, 0, -1)]


def test_threads_arriving_during_a_flight_share_one_call(rq: RedisQueue) -> None:
    gated = Gated(rq)
    errors: list[BaseException] = []

    def produce(job_id: str) -> None:
        try:
            rq.push("q", [(job_id, env(job_id))])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    first = threading.Thread(target=produce, args=("j0",))
    first.start()
    wait_until(lambda: len(gated.batches) == 1, "the first push to be in flight")
    others = [threading.Thread(target=produce, args=(f"j{n}",)) for n in range(1, 8)]
    for t in others:
        t.start()
    wait_until(lambda: gated.waiting("q") == 7, "7 producers to join the next batch")
    gated.gate.set()
    for t in [first, *others]:
        t.join(WAIT_S)
    assert not errors
    assert gated.batches[0] == ["j0"]  # the first producer was not held back
    assert len(gated.batches) == 2 and sorted(gated.batches[1]) == [f"j{n}" for n in range(1, 8)]
    assert sorted(ready_ids(rq, "q")) == sorted(f"j{n}" for n in range(8))
    assert rq.client.llen(rq.keys("q").notify) == 8  # one wake-up token per job, as before


def test_one_producers_jobs_keep_their_order_among_many(rq: RedisQueue) -> None:
    def produce(tag: str, n: int) -> None:
        for i in range(n):
            rq.push("q", [(f"{tag}-{i:04d}", env(f"{tag}-{i}"))])

    threads = [threading.Thread(target=produce, args=(f"p{t}", 150)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 4)
    ids = ready_ids(rq, "q")
    assert len(ids) == 8 * 150 and len(set(ids)) == len(ids)
    for t in range(8):
        mine = [i for i in ids if i.startswith(f"p{t}-")]
        assert mine == sorted(mine)


def test_a_failed_batch_fails_each_caller_with_its_own_error(rq: RedisQueue) -> None:
    gated = Gated(rq)
    ready = rq.keys("q").ready
    caught: dict[str, BaseException] = {}

    def produce(job_id: str) -> None:
        try:
            rq.push("q", [(job_id, env(job_id))])
        except BaseException as exc:
            caught[job_id] = exc

    first = threading.Thread(target=produce, args=("ok",))
    first.start()
    wait_until(lambda: len(gated.batches) == 1, "the first push to be in flight")
    others = [threading.Thread(target=produce, args=(f"bad{n}",)) for n in range(4)]
    for t in others:
        t.start()
    wait_until(lambda: gated.waiting("q") == 4, "4 producers to join the next batch")
    gated._inner("q", [("ok-first", env("x"))])  # lands before the gate opens
    rq.client.delete(ready)
    rq.client.set(ready, "not a list")  # the next batch's RPUSH now fails: WRONGTYPE
    gated.gate.set()
    for t in [first, *others]:
        t.join(WAIT_S)
    assert "ok" in caught  # the first flight failed too (its RPUSH met the string)
    bad = [caught[f"bad{n}"] for n in range(4)]
    assert all("WRONGTYPE" in str(e) for e in bad)
    assert len({id(e) for e in bad}) == 4  # each caller raised its own exception object
    rq.client.delete(ready)
    rq.push("q", [("after", env("after"))])  # nothing left stuck in flight
    assert ready_ids(rq, "q") == ["after"]


def test_redis_down_fails_every_producer_and_recovers(
    redis_server_factory: Callable[..., RedisServer], prefix: str
) -> None:
    server = redis_server_factory()
    rq = RedisQueue(server.url, prefix)
    try:
        rq.push("q", [("before", env("before"))])
        server.stop()
        caught: list[BaseException] = []
        lock = threading.Lock()

        def produce(n: int) -> None:
            for i in range(5):
                try:
                    rq.push("q", [(f"down{n}-{i}", env("d"))])
                except BaseException as exc:
                    with lock:
                        caught.append(exc)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S * 2)
        assert not any(t.is_alive() for t in threads)
        assert len(caught) == 40
        assert all(isinstance(e, QueueUnavailable) for e in caught)
        server.start()
        rq.push("q", [("after", env("after"))])
        assert ready_ids(rq, "q")[-1] == "after"
    finally:
        rq.close()


def test_asyncio_tasks_share_calls_keep_order_and_get_errors(rq: RedisQueue) -> None:
    calls: list[int] = []
    inner: Any = rq._acoalescer._send

    async def counting(queue: str, items: list[tuple[str, bytes]]) -> None:
        calls.append(len(items))
        await inner(queue, items)

    rq._acoalescer._send = counting

    async def main() -> None:
        async def produce(t: int) -> None:
            for i in range(20):
                await rq.push_async("q", [(f"a{t:02d}-{i:03d}", env("a"))])

        await asyncio.gather(*(produce(t) for t in range(64)))
        ids = ready_ids(rq, "q")
        assert len(ids) == 64 * 20 and len(set(ids)) == len(ids)
        for t in range(64):
            mine = [i for i in ids if i.startswith(f"a{t:02d}-")]
            assert mine == sorted(mine)
        assert len(calls) < 64 * 20 / 4  # tasks arriving together shared calls
        # A failing batch: each task raises its own copy of the error.
        ready = rq.keys("q").ready
        rq.client.delete(ready)
        rq.client.set(ready, "not a list")
        results = await asyncio.gather(
            *(rq.push_async("q", [(f"e{n}", env("e"))]) for n in range(16)),
            return_exceptions=True,
        )
        assert all(isinstance(r, Exception) and "WRONGTYPE" in str(r) for r in results)
        assert len({id(r) for r in results}) == 16
        rq.client.delete(ready)
        await rq.push_async("q", [("after", env("after"))])
        assert ready_ids(rq, "q") == ["after"]

    asyncio.run(main())


def test_delayed_and_priority_pushes_take_the_direct_path(rq: RedisQueue) -> None:
    gated = Gated(rq)
    gated.gate.set()
    rq.push("q", [("later", env("l"))], delay_s=60.0)
    rq.push("q", [("urgent", env("u"))], priority=5)
    rq.push("q", [("b1", env("b")), ("b2", env("b"))])
    assert gated.batches == []
    assert ready_ids(rq, "q") == ["b1", "b2"]


def test_many_short_lived_producer_threads_keep_pushing(rq: RedisQueue) -> None:
    """A thread-per-request server: every push from a new thread. The per-thread
    connections must not count against the pool's max_connections (100), or the 101st
    thread's push fails with "Too many connections"."""
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            rq.push("q", [(f"t{n:03d}", env("t"))])
        except BaseException as exc:
            errors.append(exc)

    for n in range(160):
        t = threading.Thread(target=produce, args=(n,))
        t.start()
        t.join(WAIT_S)
    assert not errors, errors[:1]
    assert len(ready_ids(rq, "q")) == 160


def test_a_forked_child_does_not_wait_on_its_parents_flight(rq: RedisQueue) -> None:
    gated = Gated(rq)
    parent = threading.Thread(target=lambda: rq.push("q", [("parent", env("p"))]))
    parent.start()
    try:
        wait_until(lambda: len(gated.batches) == 1, "the parent's push to be in flight")
        pid = os.fork()
        if pid == 0:  # the child: the lane it inherited is busy with a flight not its own
            code = 1
            try:
                rq.push("q", [("child", env("c"))])
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + WAIT_S
        status = None
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the child's push waited on its parent's flight")
            else:
                time.sleep(0.01)
        assert status == 0
    finally:
        gated.gate.set()
        parent.join(WAIT_S)
    assert sorted(ready_ids(rq, "q")) == ["child", "parent"]


def test_a_forked_child_pushes_on_a_connection_of_its_own(rq: RedisQueue) -> None:
    """The fast lane's per-thread connection is not inherited by a forked child (the
    fork counter of tidings._forks replaced a getpid() system call per push)."""
    rq.push("q", [("parent-1", env("p"))])  # this thread's connection exists now
    parent_conn = rq._fast._local.conn
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rq.push("q", [("child", env("c"))])
            code = 0 if rq._fast._local.conn is not parent_conn else 2
        finally:
            os._exit(code)
    _, raw = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(raw) == 0
    rq.push("q", [("parent-2", env("p"))])  # the parent's socket was left alone
    assert rq._fast._local.conn is parent_conn
    assert ready_ids(rq, "q") == ["parent-1", "child", "parent-2"]


def test_a_task_cancelled_while_its_batch_waits_leaves_the_others_landing(
    rq: RedisQueue,
) -> None:
    release = asyncio.Event()
    inner: Any = rq._acoalescer._send
    calls: list[list[str]] = []

    async def held(queue: str, items: list[tuple[str, bytes]]) -> None:
        calls.append([i for i, _ in items])
        if len(calls) == 1:
            await release.wait()
        await inner(queue, items)

    rq._acoalescer._send = held

    async def main() -> None:
        first = asyncio.create_task(rq.push_async("q", [("first", env("f"))]))
        while not calls:
            await asyncio.sleep(0)
        waiting = [asyncio.create_task(rq.push_async("q", [(f"w{n}", env("w"))])) for n in range(4)]
        await asyncio.sleep(0)  # all four joined the next batch
        waiting[1].cancel()
        release.set()
        await first
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert [r for n, r in enumerate(results) if n != 1] == [None, None, None]
        assert calls[1] == ["w0", "w1", "w2", "w3"]  # its job was in the batch already

    asyncio.run(main())
    assert ready_ids(rq, "q") == ["first", "w0", "w1", "w2", "w3"]
