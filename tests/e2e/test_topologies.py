"""The README's worker command on each topology: plain Redis, Redis Cluster, Sentinel.

``notify-worker --queue high,default`` must keep its priority order and must not poll on
every topology. On Redis Cluster the two queues' keys live in different slots (one hash
tag per queue, so a cluster shares the load), which made the single BLPOP over both
wake-up lists fail with CROSSSLOT: the worker ran the ready jobs, then exited 1 at its
first idle wait. These tests run once per topology (marker ``topologies``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.e2e.jobs_app import Ordered, UniqueOrdered
from tests.e2e.test_notify_worker import KEY, MODULE, Env, Spawn, exited, figure
from tests.support import wait_for
from tidings import App
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
