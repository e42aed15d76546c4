"""Unique and debounced jobs against real Redis, with producers racing in threads.

Guarantees: while a unique job is pending (waiting, delayed, reserved, retrying) another
dispatch of its id is dropped and ``dispatch()`` returns None; the lock frees when the
holder finishes (or starts, with ``unique_until="processing"``); a debounced burst runs
its last dispatch once, no later than its max wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.integration.workflows_app import Debounced, Unique, UniqueUntilStart, make_app
from tests.integration.workflows_support import execs, start_worker, stop_all, wait_until
from tests.support import Proc
from tidings import App


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _race(app: App, make: Callable[[int, int], Any], per_thread: int) -> list[list[Any]]:
    """Two producer threads dispatch at the same moment; returns what each got back."""
    results: list[list[Any]] = [[], []]
    barrier = threading.Barrier(2)

    def producer(t: int) -> None:
        app.make_current()
        barrier.wait()
        for n in range(per_thread):
            results[t].append(make(t, n).dispatch())

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def test_second_dispatch_dropped_while_pending(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    first = Unique("k", 1).dispatch()
    assert first is not None
    assert Unique("k", 2).dispatch() is None
    assert Unique("k", 3).delay(5).dispatch() is None
    assert Unique("other", 1).dispatch() is not None
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    wait_until(lambda: len(execs(redis_client, prefix)) == 2, 15, "2 ran", w)
    # The lock frees when the holder's record is gone, i.e. once its ack lands, which may
    # come a moment after ``handle`` recorded its run (acks are batched).
    wait_until(lambda: app.job_status(first) == "done", 15, "k:1 acked", w)
    # The holder has finished: the next dispatch takes the lock over.
    again = Unique("k", 4).dispatch()
    assert again is not None
    wait_until(lambda: execs(redis_client, prefix).get("k:4"), 15, "k:4 ran", w)
    assert execs(redis_client, prefix) == {"k:1": 1, "other:1": 1, "k:4": 1}
    stop_all(w)


def test_two_producers_race_one_job_pushed(app: App) -> None:
    results = _race(app, lambda t, n: Unique("race", t * 1000 + n), 200)
    pushed = [r for rs in results for r in rs if r is not None]
    assert len(pushed) == 1
    sizes = app.queue_for(None).sizes(["default"])["default"]
    assert sizes["ready"] == 1


def test_lock_held_while_running_until_completion_not_processing(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    assert Unique("c", 1, sleep=1.0).dispatch() is not None
    assert UniqueUntilStart("p", 1).dispatch() is not None
    started = f"{prefix}:test:started"
    wait_until(lambda: redis_client.get(f"{started}:c:1"), 15, "c:1 started", w)
    wait_until(lambda: redis_client.get(f"{started}:p:1"), 15, "p:1 started", w)
    assert Unique("c", 2).dispatch() is None  # "completion": still held while running
    assert UniqueUntilStart("p", 2).dispatch() is not None  # "processing": freed at start
    wait_until(lambda: len(execs(redis_client, prefix)) == 3, 15, "c:1, p:1, p:2 ran", w)
    assert execs(redis_client, prefix) == {"c:1": 1, "p:1": 1, "p:2": 1}
    stop_all(w)


def test_debounce_two_producers_run_the_last_dispatch_once(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    results = _race(app, lambda t, n: Debounced("d", t * 1000 + n), 60)
    assert all(r is not None for rs in results for r in rs)
    key = next(iter(redis_client.scan_iter(match=f"{prefix}:queue:{{default}}:debounce:*")))
    survivor: Any = redis_client.hget(key, "id")
    assert survivor is not None and survivor.decode() in {r for rs in results for r in rs}
    wait_until(lambda: redis_client.llen(f"{prefix}:test:debounced") >= 1, 10, "ran", w)
    wait_until(lambda: app.job_status(survivor.decode()) == "done", 5, "survivor done", w)
    runs: Any = redis_client.lrange(f"{prefix}:test:debounced", 0, -1)
    assert len(runs) == 1
    stop_all(w)


def test_debounce_max_wait_bounds_the_delay(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """Dispatches every 0.2 s for 4 s (window 0.6 s, max wait 3 s): the first run comes
    no later than 3 s (+ poll slack) after the first dispatch, not after the burst."""
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    sec, usec = redis_client.time()
    t0 = int(sec) * 1000 + int(usec) // 1000
    stop = threading.Event()
    n = 0
    while not stop.wait(0.2) and n < 20:
        Debounced("m", n).dispatch()
        n += 1
    wait_until(lambda: redis_client.llen(f"{prefix}:test:debounced") >= 2, 10, "2 runs", w)
    runs: Any = redis_client.lrange(f"{prefix}:test:debounced", 0, -1)
    first_at = int(runs[0].decode().split("@")[1])
    assert 2800 <= first_at - t0 <= 4500, first_at - t0
    stop_all(w)
