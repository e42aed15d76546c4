"""Per-job measurements in Redis: minute buckets, totals, per-job timings, heartbeats.

An in-process Worker (real redis-server) runs jobs that succeed, fail and release;
the test reads back what :mod:`tidings.observability.metrics` wrote and checks every structure it
reads has a TTL (bounded) except the per-class totals, whose size it checks.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from tidings import App, Job
from tidings.observability.lifecycle import JobProcessed, JobProcessing
from tidings.observability.metrics import (
    JOB_TIMING_CAP,
    MAX_CLASSES,
    OTHER,
    Meter,
    WorkerSnapshot,
    job_classes,
    live_workers,
    series,
    summed,
    totals,
)
from tidings.worker.worker import Worker, WorkerOptions

KEY = "metrics-test-key-0123456789abcdef"
MODULE = __name__


@dataclass
class Quick(Job):
    n: int

    async def handle(self) -> None:
        await asyncio.sleep(0.002)


@dataclass
class Broken(Job):
    n: int

    async def handle(self) -> None:
        raise ValueError("broken on purpose")


@dataclass
class Again(Job):
    n: int
    tries = 2

    async def handle(self) -> None:
        if self.attempts == 1:
            self.release(0)


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    try:
        yield a
    finally:
        a.close()


def drain(app: App, **kw: object) -> Worker:
    w = Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.2, **kw))  # type: ignore[arg-type]
    assert asyncio.run(w.run()) == 0
    return w


def test_a_drain_is_counted_per_queue_and_class(app: App, redis_client: redis.Redis) -> None:
    ids = app.dispatch_many([Quick(i) for i in range(30)] + [Broken(i) for i in range(3)])
    again = Again(1).dispatch()
    drain(app)
    prefix = app.settings.prefix
    points = series(redis_client, prefix, "default")
    assert len(points) == 60
    total = summed(points)
    assert (total.processed, total.failed, total.released) == (31, 3, 1)
    assert total.runtime_n == 35 and total.wait_n == 35
    assert sum(total.runtime_hist) == 35 and sum(total.wait_hist) == 35
    assert total.runtime_avg_ms is not None and total.runtime_avg_ms >= 1.0
    names = job_classes(redis_client, prefix, "default")
    assert {"Quick", "Broken", "Again"} <= {n.rsplit(".", 1)[-1] for n in names}
    quick = next(n for n in names if n.endswith("Quick"))
    q = summed(series(redis_client, prefix, "default", quick))
    assert (q.processed, q.failed) == (30, 0)
    tot = totals(redis_client, prefix, ["default"])
    assert tot[("default", quick)].processed == 30
    # job_status carries the measurement, and is still the plain state string
    status = app.job_status(ids[0])
    assert status == "done"
    assert status is not None and status.runtime_s is not None and status.runtime_s >= 0.001
    assert status.wait_s is not None and status.wait_s >= 0
    failed = app.job_status(ids[-1])
    assert failed == "failed" and failed is not None and failed.outcome == "failed"
    assert again is not None
    # every minute structure expires; the totals hash is bounded by the classes
    for key in redis_client.scan_iter(match=f"{prefix}:stats:*"):
        ttl = redis_client.ttl(key)
        if key.decode().endswith(":total"):
            assert redis_client.hlen(key) < 3 * 40
        else:
            assert 0 < ttl <= 7200, key
    # a worker that exited removed its heartbeat
    assert live_workers(redis_client, prefix) == []


def test_metrics_off_writes_nothing(redis_url: str, prefix: str, redis_client: redis.Redis) -> None:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE,
            metrics=False)  # fmt: skip
    try:
        a.dispatch_many([Quick(i) for i in range(5)])
        drain(a)
        assert list(redis_client.scan_iter(match=f"{prefix}:stats:*")) == []
        assert a.job_status(a.dispatch_many([Quick(9)])[0]) == "pending"
    finally:
        a.close()


def test_heartbeat_shows_a_live_worker_and_expires(app: App, redis_client: redis.Redis) -> None:
    prefix = app.settings.prefix
    seen: list[list[dict[str, object]]] = []
    ttls: list[int] = []

    async def main() -> None:
        w = Worker(app, WorkerOptions(queues=["high", "default"], concurrency=7, sleep_s=0.2))
        task = asyncio.create_task(w.run())
        for _ in range(100):
            await asyncio.sleep(0.05)
            beats = live_workers(redis_client, prefix)
            if beats:
                seen.append(beats)
                ttls.append(redis_client.ttl(f"{prefix}:worker:{beats[0]['id']}"))
                break
        w.stop()
        await task

    asyncio.run(main())
    assert seen, "no heartbeat within 5 s"
    beat = seen[0][0]
    assert 0 < ttls[0] <= 15  # a worker that stops beating is gone within 15 s
    assert beat["pid"] == os.getpid()
    assert beat["queues"] == ["high", "default"]
    assert beat["concurrency"] == 7
    assert isinstance(beat["rss_mb"], float) and beat["rss_mb"] > 1
    assert redis_client.ttl(f"{prefix}:worker:{beat['id']}") == -2  # deleted at exit
    assert live_workers(redis_client, prefix) == []


def test_hostile_class_names_are_bounded(redis_client: redis.Redis, prefix: str) -> None:
    m = Meter(prefix)
    for i in range(MAX_CLASSES + 50):
        m.observe(JobProcessing(f"id{i}", "q", f"C{i}", 1, 0.001))
        m.observe(JobProcessed(f"id{i}", "q", f"C{i}", 1, 0.002))
    m.observe(JobProcessed("x", "q", "L" * 10_000, 1, 0.002))

    async def flush() -> None:
        client = redis.asyncio.Redis.from_url(redis_client.connection_pool.connection_kwargs
                                              and _url(redis_client))  # fmt: skip
        try:
            await m.flush(client, beat=False)
        finally:
            await client.aclose()

    asyncio.run(flush())
    names = job_classes(redis_client, prefix, "q")
    assert len(names) == MAX_CLASSES + 1 and OTHER in names
    other = summed(series(redis_client, prefix, "q", OTHER))
    assert other.processed == 51
    assert redis_client.hlen(next(iter(redis_client.scan_iter(match=f"{prefix}:stats:jobs:*")))) \
        <= JOB_TIMING_CAP  # fmt: skip


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_a_lost_lease_counts_as_stalled_for_its_class(
    redis_client: redis.Redis, prefix: str
) -> None:

    from tidings.observability.lifecycle import ReservationLost

    class Held:  # the part of a worker the Meter reads: the names of the jobs it holds
        client = None

        def snapshot(self) -> WorkerSnapshot:
            return WorkerSnapshot()

        def job_name(self, job_id: str) -> str | None:
            return "Mailer" if job_id == "j1" else None

    m = Meter(prefix, worker=Held())
    m.observe(ReservationLost("j1", "mail"))
    m.observe(ReservationLost("gone", "mail"))  # no longer running here: (other)

    async def flush() -> None:
        client = redis.asyncio.Redis.from_url(_url(redis_client))
        try:
            await m.flush(client, beat=False)
        finally:
            await client.aclose()

    asyncio.run(flush())
    assert summed(series(redis_client, prefix, "mail", "Mailer")).stalled == 1
    assert summed(series(redis_client, prefix, "mail", OTHER)).stalled == 1
    assert summed(series(redis_client, prefix, "mail")).stalled == 2


def test_a_cancel_swallowed_inside_a_flush_still_ends_the_task() -> None:
    """redis-py may swallow a cancellation that lands mid-pipeline (seen as a worker that
    never exited after --stop-when-empty). The flushing task must end anyway."""
    from types import SimpleNamespace

    entered = asyncio.Event()

    class SwallowingPipeline:
        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: None

        async def execute(self, **kw: object) -> list[object]:
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return []  # what a library that eats the cancel does
            return []

    fake_client = SimpleNamespace(pipeline=lambda transaction=False: SwallowingPipeline())

    class Running:
        client = fake_client

        def snapshot(self) -> WorkerSnapshot:
            return WorkerSnapshot()

        def job_name(self, job_id: str) -> str | None:
            return None

    async def main() -> None:
        m = Meter("p", worker=Running())  # type: ignore[arg-type]
        task = asyncio.create_task(m.run())
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3)
        assert done, "the metrics task swallowed its cancellation"

    asyncio.run(main())
