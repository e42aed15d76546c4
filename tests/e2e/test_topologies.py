"""The README's worker command on each topology: plain Redis, Redis Cluster, Sentinel.

``notify-worker --queue high,default`` must keep its priority order and must not poll on
every topology. On Redis Cluster the two queues' keys live in different slots (one hash
tag per queue, so a cluster shares the load), which made the single BLPOP over both
wake-up lists fail with CROSSSLOT: the worker ran the ready jobs, then exited 1 at its
first idle wait. These tests run once per topology (marker ``topologies``).

Issue 23's controls on each topology too: a kept result and ``app.result``'s wake-up,
progress, cancelling a waiting and a running job, and priority order within a queue.
Cancels and result wake-ups use pub/sub on all three (redis-py's cluster pub/sub on
Cluster); a cancel whose message was missed reaches the job at its worker's next lease
renewal (within ``retry_after / 3``): see docs/control.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.e2e.jobs_app import Answer, Crawler, Ordered, UniqueOrdered
from tests.e2e.test_notify_worker import (
    KEY,
    MODULE,
    RETRY_AFTER,
    Env,
    Spawn,
    exited,
    figure,
)
from tests.support import wait_for
from tidings import App, JobCancelled
from tidings.errors import QueueUnavailable

pytestmark = pytest.mark.topologies


@pytest.fixture
def e(redis_url: str, prefix: str, spawn_proc: Spawn) -> Iterator[Env]:
    env = Env(redis_url, prefix, spawn_proc)
    try:
        yield env
    finally:
        env.close()


def _order(e: Env) -> list[str]:
    return [x.decode() for x in e.r.lrange(f"{e.prefix}:test:order", 0, -1)]


def test_multi_queue_worker_keeps_priority_order(e: Env, redis_topology: str) -> None:
    # Queued before the worker starts: with one job in flight, every high job must run
    # before any default job.
    e.app.dispatch_many([Ordered(f"d{i}").on_queue("default") for i in range(20)])
    e.app.dispatch_many([Ordered(f"h{i}").on_queue("high") for i in range(20)])
    w = e.worker("--queue", "high,default", "--concurrency", "1", name="prio")
    wait_for(lambda: len(_order(e)) == 40, 30, message="40 jobs ran")
    order = _order(e)
    assert order[:20] == [f"h{i}" for i in range(20)], order
    assert sorted(order[20:]) == sorted(f"d{i}" for i in range(20))
    assert w.alive(), w.tail()
    w.terminate()
    assert exited(w, 10) == 0


def test_idle_multi_queue_worker_wakes_for_every_queue_without_polling(
    e: Env, redis_topology: str
) -> None:
    w = e.worker("--queue", "high,default", "--sleep", "30", name="idle-multi")
    Ordered("warm").on_queue("high").dispatch()
    wait_for(lambda: _order(e) == ["warm"], 15)
    took: dict[str, float] = {}
    for queue in ("default", "high", "default"):
        time.sleep(0.5)  # idle: every wait is in flight again
        n = len(_order(e))
        t0 = time.monotonic()
        Ordered(f"{queue}-{n}").on_queue(queue).dispatch()
        wait_for(lambda want=n + 1: len(_order(e)) == want, 10, 0.005, message=f"woken {queue}")
        took[f"{queue}-{n}"] = time.monotonic() - t0
    figure(f"{redis_topology}: idle worker of 2 queues (--sleep 30) woken in {took}")
    # --sleep 30: only a wake-up (not a poll or the wait's timeout) explains these.
    assert max(took.values()) < 5.0
    assert w.alive(), w.tail()
    assert "CROSSSLOT" not in w.output() and "Traceback" not in w.output()
    w.terminate()
    t0 = time.monotonic()
    assert exited(w, 10) == 0
    took_s = time.monotonic() - t0
    figure(f"{redis_topology}: idle worker of 2 queues stopped {took_s:.2f}s after SIGTERM")


def test_wait_replicas_after_a_dispatch(e: Env, redis_topology: str) -> None:
    """``RedisQueue.wait_replicas``: WAIT on the primary that holds the queue (on Cluster,
    the queue's slot's primary), on the connection that pushed."""
    Ordered("w").on_queue("high").dispatch()
    got = e.app.queue_for(None).wait_replicas("high", 1, 200)
    # plain Redis has no replica: 0 after the timeout; the groups have one per primary.
    assert got == (0 if redis_topology == "plain" else 1)


def test_wait_replicas_setting_confirms_every_push(e: Env, redis_topology: str) -> None:
    """``TIDINGS_WAIT_REPLICAS=1``: every push (sync and async, immediate and delayed,
    unique, many at once) is followed by ``WAIT 1`` on the connection that pushed, and a
    push no replica confirmed raises QueueUnavailable naming the setting (plain Redis has
    no replica). Confirmed pushes are on the replica when ``dispatch()`` returns."""
    app = App(
        env=False,
        redis_url=e.url,
        key=KEY,
        prefix=e.prefix,
        allowed_modules=MODULE,
        wait_replicas=1,
        wait_replicas_timeout=0.2,
    )
    pushes: list[Callable[[], object]] = [
        lambda: Ordered("a").on_queue("high").dispatch(),
        lambda: Ordered("b").on_queue("high").delay(30).dispatch(),
        lambda: UniqueOrdered("u").on_queue("high").dispatch(),
        lambda: app.dispatch_many([Ordered("c").on_queue("high"), Ordered("d").on_queue("high")]),
        lambda: asyncio.run(Ordered("e").on_queue("high").dispatch_async()),
        lambda: asyncio.run(UniqueOrdered("v").on_queue("high").dispatch_async()),
    ]
    try:
        for push in pushes:
            if redis_topology == "plain":
                with pytest.raises(QueueUnavailable, match="TIDINGS_WAIT_REPLICAS"):
                    push()
            else:
                assert push()
        sizes = app.queue_for(None).sizes(["high"])["high"]
        # Raised or not, every push happened (a QueueUnavailable here means "not confirmed").
        assert sizes["ready"] + sizes["delayed"] == 7
        if redis_topology == "plain":
            return
        primary = _primary_of(app, "high")
        port = int(primary.info("replication")["slave0"]["port"])
        primary.close()
        replica = redis.Redis(port=port, socket_timeout=2.0)
        try:
            if redis_topology == "cluster":
                replica.execute_command("READONLY")  # reads on a cluster replica
            k = app.queue_for(None).keys("high")
            # WAIT returned 1 for each push: the replica has all 7, no waiting needed.
            assert replica.llen(k.ready) == 6
            assert replica.zcard(k.delayed) == 1
        finally:
            replica.close()
    finally:
        app.close()


def _primary_of(app: App, queue: str) -> redis.Redis:
    """A plain client of the primary holding ``queue`` (its slot's, on a cluster)."""
    client: Any = app.queue_for(None).client
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(app.queue_for(None).keys(queue).ready)
        return redis.Redis(host=node.host, port=node.port, socket_timeout=2.0)
    host, port = client.connection_pool.get_master_address()
    return redis.Redis(host=host, port=port, socket_timeout=2.0)


# -- issue 23: results, progress, cancel, priorities ---------------------------------------


def _hget(e: Env, what: str, job_id: str) -> str | None:
    raw = e.r.hget(f"{e.prefix}:test:{what}", job_id)
    return raw.decode() if raw is not None else None


def test_results_and_their_wake_up(e: Env, redis_topology: str) -> None:
    """A kept result comes back through the serializer (sync and async readers), and a
    reader waiting before the job finished wakes when it did (pub/sub on the job's
    result channel; on Cluster through the sync client's cluster pub/sub)."""
    import datetime as dt

    w = e.worker("--queue", "default", "--concurrency", "4", name="results")
    quick = Answer("quick").dispatch()
    assert e.app.result(quick, timeout_s=30) == {
        "id": "quick", "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}  # fmt: skip
    assert asyncio.run(e.app.aresult(quick, timeout_s=30))["id"] == "quick"
    woke: dict[str, float] = {}
    for reader in ("sync", "async"):
        job_id = Answer(f"slow-{reader}", seconds=1.5).dispatch()
        if reader == "sync":
            got = e.app.result(job_id, timeout_s=30)
        else:
            got = asyncio.run(e.app.aresult(job_id, timeout_s=30))
        back = time.time()
        assert got["id"] == f"slow-{reader}"
        answered = float(_hget(e, "answered", f"slow-{reader}") or "nan")
        woke[reader] = back - answered
    figure(f"{redis_topology}: app.result woke {woke} (s) after the handler returned")
    # Not a speed assert: the wait re-looks once a second without a message, so only a
    # lost wake-up and a lost re-look together could exceed this.
    assert max(woke.values()) < 5.0
    with pytest.raises(TimeoutError):
        e.app.result(Answer("late", seconds=30).delay(60).dispatch(), timeout_s=0.5)
    assert w.alive(), w.tail()
    assert "Traceback" not in w.output()
    w.terminate()
    assert exited(w, 15) == 0


def test_progress_and_cancel_of_a_running_and_a_waiting_job(e: Env, redis_topology: str) -> None:
    w = e.worker("--queue", "default", "--concurrency", "4", name="cancels")
    job_id = Crawler("run").dispatch()

    def progressed(n: float) -> bool:
        p = getattr(e.app.job_status(job_id), "progress", None)
        return p is not None and p.done >= n and p.total == 100_000 and p.note is not None

    wait_for(lambda: progressed(10), 30, message="the job reports progress")
    assert e.app.job_status(job_id) == "reserved"
    t0 = time.time()
    said = e.app.cancel(job_id)
    assert said == "cancelling" and said.changed
    wait_for(lambda: _hget(e, "crawl", "run") == "cancelled", 15,
             message="the handler saw CancelledError")  # fmt: skip
    took = float(_hget(e, "crawl-at", "run") or "nan") - t0
    wait_for(lambda: e.app.job_status(job_id) == "cancelled", 15, message="status cancelled")
    figure(f"{redis_topology}: cancel of a running async job reached it in {took:.3f}s")
    if redis_topology == "cluster":
        # No pub/sub on the asyncio cluster client: the next lease renewal carries it.
        assert took < RETRY_AFTER / 3 + 3.0
    else:
        assert took < 3.0  # the cancel channel: milliseconds (slack for a busy machine)
    again = e.app.cancel(job_id)
    assert again == "cancelled already" and not again.changed
    assert _hget(e, "crawl-failed", "run") is None  # failed() not called
    assert _hget(e, "started", "run") == "1"  # not retried

    # waiting: delayed, and ready on a queue no worker serves yet
    delayed = Crawler("delayed", steps=1).delay(300).dispatch()
    parked = Crawler("parked", steps=1).on_queue("parked").dispatch()
    for waiting in (delayed, parked):
        out = e.app.cancel(waiting)
        assert out == "cancelled" and out.changed
        # "cancelling" for the moment a worker holds it to settle it unrun
        wait_for(lambda w=waiting: e.app.job_status(w) == "cancelled", 15,  # type: ignore[misc]
                 message="status cancelled")  # fmt: skip
    with pytest.raises(JobCancelled):
        e.app.result(delayed, timeout_s=5)
    w2 = e.worker("--queue", "parked,default", name="parked")
    wait_for(lambda: e.app.queue_for(None).sizes(["parked"])["parked"]["ready"] == 0, 15,
             message="the worker settled the cancelled job")  # fmt: skip
    wait_for(lambda: e.r.zscore(e.app.queue_for(None).keys("parked").cancelled, parked)
             is not None, 15, message="recorded cancelled")  # fmt: skip
    assert _hget(e, "started", "parked") is None and _hget(e, "started", "delayed") is None
    assert e.app.job_status(parked) == "cancelled"
    for proc in (w, w2):
        assert proc.alive(), proc.tail()
        assert "Traceback" not in proc.output() and "CROSSSLOT" not in proc.output()
        proc.terminate()
        assert exited(proc, 15) == 0


def test_priorities_within_a_queue(e: Env, redis_topology: str) -> None:
    """Queued before the worker starts, one job at a time: higher priority first, FIFO
    among equals; a delayed job keeps its priority when it becomes ready."""
    plan = [("a", 0), ("b", 50), ("c", -20), ("d", 50), ("e", 100), ("f", 0), ("g", -20),
            ("h", 7)]  # fmt: skip
    for name, priority in plan:
        Ordered(name).on_queue("urgent").with_priority(priority).dispatch()
    Ordered("late").on_queue("urgent").with_priority(90).delay(0.5).dispatch()
    time.sleep(1.0)  # the delayed one is due before the worker starts
    w = e.worker("--queue", "urgent", "--concurrency", "1", name="priorities")
    wait_for(lambda: len(_order(e)) == len(plan) + 1, 30, message="every job ran")
    assert _order(e) == ["e", "late", "b", "d", "h", "a", "f", "c", "g"]
    assert w.alive(), w.tail()
    assert "CROSSSLOT" not in w.output()
    w.terminate()
    assert exited(w, 10) == 0


def test_a_cancel_whose_message_was_missed_reaches_the_job_at_its_next_renewal(
    e: Env, redis_topology: str
) -> None:
    """The cancel script run with its message sent to no one (as when the worker was
    reconnecting, or with a redis-py whose asyncio cluster client has no pub/sub): the
    worker's next lease renewal (every ``retry_after / 3``) reports the mark and the
    handler is cancelled."""
    from tidings.moves.control import _cancel_move
    from tidings.redis import scripts

    w = e.worker("--queue", "default", name="missed")
    job_id = Crawler("missed").dispatch()
    wait_for(lambda: _hget(e, "started", "missed") == "1", 30, message="the job started")
    rq = e.app.queue_for(None)
    keys, _args = _cancel_move(rq, rq.keys("default"), job_id)
    t0 = time.time()
    assert scripts.CANCEL.call(rq.client, keys, [job_id, f"{e.prefix}:nobody"]) == b"running"
    wait_for(lambda: _hget(e, "crawl", "missed") == "cancelled", 15,
             message="the renewal carried the cancel")  # fmt: skip
    took = float(_hget(e, "crawl-at", "missed") or "nan") - t0
    figure(f"{redis_topology}: a missed cancel reached the job in {took:.3f}s "
           f"(renewals every {RETRY_AFTER / 3:.2f}s)")  # fmt: skip
    assert took < RETRY_AFTER / 3 + 3.0  # the bound, with slack for a busy machine
    wait_for(lambda: e.app.job_status(job_id) == "cancelled", 15, message="status cancelled")
    assert _hget(e, "crawl-failed", "missed") is None and _hget(e, "started", "missed") == "1"
    assert w.alive(), w.tail()
    w.terminate()
    assert exited(w, 15) == 0
