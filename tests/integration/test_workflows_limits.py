"""Job middleware against real Redis and ``notify-worker`` subprocesses.

Guarantees: a RateLimited key holds across worker processes (counted from Redis-time
records, never wall-clock speed); WithoutOverlapping never lets two run at once;
ThrottlesExceptions rests a failing job; Skip skips; none of these holds-back uses up an
attempt (every job here has ``tries = 1`` and must still run).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.integration.workflows_app import (
    Exclusive,
    Flaky,
    Limited,
    Skippable,
    make_app,
)
from tests.integration.workflows_support import execs, order, start_worker, stop_all, wait_until
from tests.support import Proc
from tidings import App, Listener
from tidings.events.call_queued import CallQueuedListener
from tidings.jobs.limits import RateLimited, Skip
from tidings.notifications import Notification
from tidings.notifications.queued import SendQueuedNotification

RATE = 10.0
JOBS = 60


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _max_in_window(times_ms: list[int], window_ms: int) -> int:
    times = sorted(times_ms)
    return max(bisect.bisect_left(times, t + window_ms) - i for i, t in enumerate(times))


def test_rate_limit_holds_across_three_workers(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    url = app.settings.redis_url
    app.dispatch_many([Limited(f"j{i}") for i in range(JOBS)])
    env = {"WF_RATE": str(RATE)}
    workers = [
        start_worker(spawn_proc, url, prefix, "--concurrency", "8", name=f"w{i}", env=env)
        for i in range(3)
    ]
    wait_until(lambda: redis_client.zcard(f"{prefix}:test:starts") == JOBS, 25, "all ran", *workers)
    raw: Any = redis_client.zrange(f"{prefix}:test:starts", 0, -1, withscores=True)
    times = [int(score) for _, score in raw]
    span_s = (max(times) - min(times)) / 1000
    achieved = (JOBS - 1) / span_s
    worst_1s = _max_in_window(times, 1000)
    worst_3s = _max_in_window(times, 3000)
    print(
        f"\nrate limit {RATE}/s over 3 workers: achieved {achieved:.2f}/s, "
        f"max {worst_1s} in any 1 s, {worst_3s} in any 3 s"
    )
    # GCRA bound: W * rate + burst (1), plus slack for the gap between the limiter's
    # decision and the job's record.
    assert worst_1s <= RATE * 1 + 1 + 2
    assert worst_3s <= RATE * 3 + 1 + 2
    assert achieved <= RATE * 1.15
    assert set(execs(redis_client, prefix).values()) == {1}  # tries=1: releases were free
    assert app.queue_for(None).failed(["default"]) == []
    stop_all(*workers)


def test_without_overlapping_runs_one_at_a_time(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    url = app.settings.redis_url
    app.dispatch_many([Exclusive(f"x{i}") for i in range(30)])
    workers = [start_worker(spawn_proc, url, prefix, name=f"w{i}") for i in range(2)]
    wait_until(lambda: len(execs(redis_client, prefix)) == 30, 25, "all ran", *workers)
    seen: Any = redis_client.lrange(f"{prefix}:test:concurrency", 0, -1)
    assert max(int(x) for x in seen) == 1
    assert set(execs(redis_client, prefix).values()) == {1}
    assert app.queue_for(None).failed(["default"]) == []
    stop_all(*workers)


def test_throttles_exceptions_rests_the_job(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    redis_client.set(f"{prefix}:test:down", 1)
    Flaky("f").dispatch()
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    attempts = f"{prefix}:test:attempt-times"
    wait_until(lambda: redis_client.llen(attempts) >= 2, 15, "2 failed attempts", w)
    redis_client.delete(f"{prefix}:test:down")
    wait_until(lambda: execs(redis_client, prefix).get("f"), 15, "succeeded", w)
    raw: Any = redis_client.lrange(attempts, 0, -1)
    times = [int(x) for x in raw]
    # Two exceptions fill the window (max 2, decay 1.5 s): the next try waits it out.
    assert len(times) == 3
    assert times[2] - times[0] >= 1400
    stop_all(w)


def test_skip_counts_as_done(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    skipped = Skippable("skip-me").dispatch()
    Skippable("run-me").dispatch()
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    wait_until(lambda: order(redis_client, prefix) == ["run-me"], 15, "run-me ran", w)
    assert skipped is not None
    wait_until(lambda: app.job_status(skipped) == "done", 5, "skipped job acked", w)
    stop_all(w)


@dataclass
class Note(Notification):
    text: str

    def via(self, notifiable: Any) -> list[str]:
        return ["sms"]

    def middleware(self) -> list[Any]:
        return [Skip(if_=False)]


class Audit(Listener):
    def middleware(self) -> list[Any]:
        return [RateLimited("audit", per_minute=30)]

    def handle(self, event: Any) -> None:
        pass


def test_channel_limits_and_listener_middleware(app: App) -> None:
    app.rate_limit("sms", per_second=5)
    sms = SendQueuedNotification(None, Note("hi"), "sms", "d1").middleware()
    assert [type(m) for m in sms] == [RateLimited, Skip]
    assert sms[0].key == "channel:sms" and sms[0].rate == 5
    mail = SendQueuedNotification(None, Note("hi"), "mail", "d2").middleware()
    assert [type(m) for m in mail] == [Skip]
    listener = CallQueuedListener.for_target(Audit, ("e",)).middleware()
    assert [type(m) for m in listener] == [RateLimited] and listener[0].rate == 0.5
