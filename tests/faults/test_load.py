"""L1-L4 at CI size: 20,000 jobs, 4 ``notify-worker`` processes, accounting per job id.

Every job does ``HINCRBY exec <id> 1`` on the accounting Redis (see fault_app.py); "lost"
is an id dispatched and never executed, "extra" is the sum of (count - 1). The full-size
versions (100k jobs, 10 workers, random SIGKILLs, RSS growth) are in benchmarks/soak.py:

    .venv/bin/python benchmarks/soak.py            # prints lost, extra, duration, RSS

Figures are printed as FIGURE lines (``pytest -s``).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import Rig, Sampler, figure
from tests.faults.fault_app import Timed
from tests.support import RedisServer, wait_for

N = 20_000
WORKERS = 4
CONCURRENCY = 16

pytestmark = pytest.mark.timeout(120)


def _start(rig: Rig, n: int = WORKERS, tag: str = "w") -> None:
    for i in range(n):
        rig.worker("--concurrency", str(CONCURRENCY), name=f"{tag}{i}")


def _run_time(sampler: Sampler, total: int) -> tuple[float, float]:
    """(seconds from the first to the last execution, jobs/s over that span)."""
    t_first = sampler.first_time_at_least(1)
    t_last = sampler.first_time_at_least(total)
    assert t_first is not None and t_last is not None
    span = max(t_last - t_first, 1e-6)
    return span, total / span


def test_l1_20k_jobs_4_workers_exactly_once(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    t0 = time.monotonic()
    names = rig.dispatch_records(N)
    enqueue_s = time.monotonic() - t0
    with Sampler(rig, 0.05) as sampler:
        _start(rig)
        rig.wait_executed(names, 90)
        time.sleep(0.1)
    wait_for(rig.drained, 10, message="drained")
    span, rate = _run_time(sampler, N)
    lost, extra = rig.figures(names)
    figure(
        f"L1 {N} jobs, {WORKERS} workers: enqueued in {enqueue_s:.2f}s, processed in "
        f"{span:.2f}s ({rate:.0f} jobs/s), lost {lost}, extra {extra}"
    )
    assert (lost, extra) == (0, 0)
    assert set(rig.hash("exec").values()) == {1}
    assert enqueue_s < 10


def test_l2_workers_sigkilled_mid_run_and_replaced(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    names = rig.dispatch_records(N)
    killed = 2
    with Sampler(rig, 0.05) as sampler:
        _start(rig)
        wait_for(lambda: rig.executed() >= N // 4, 60, 0.02, message="1/4 executed")
        in_flight = rig.sizes()["reserved"]
        victims = rig.workers[:killed]
        for w in victims:
            w.signal(signal.SIGKILL)
        for w in victims:
            w.wait(10)
        t_kill = time.monotonic()
        _start(rig, killed, tag="replacement")
        rig.wait_executed(names, 90)
        time.sleep(0.1)
    wait_for(rig.drained, 15, message="drained")
    span, rate = _run_time(sampler, N)
    lost, extra = rig.figures(names)
    figure(
        f"L2 {N} jobs, {killed} of {WORKERS} workers SIGKILLed at 25 % ({in_flight} reserved "
        f"then) and replaced: lost {lost}, extra {extra} (bound {killed * CONCURRENCY}), "
        f"{span:.2f}s ({rate:.0f} jobs/s), done {time.monotonic() - t_kill:.2f}s after the kill"
    )
    assert lost == 0
    assert extra <= killed * CONCURRENCY
    assert all(w.alive() for w in rig.workers[killed:])


def test_l3_redis_restart_at_half_way(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    names = rig.dispatch_records(N)
    with Sampler(rig, 0.05) as sampler:
        _start(rig)
        wait_for(lambda: rig.executed() >= N // 2, 60, 0.02, message="1/2 executed")
        in_flight = rig.sizes()["reserved"]
        t_down = time.monotonic()
        redis_server.stop()
        time.sleep(2.0)
        redis_server.start()
        t_back = time.monotonic()
        rig.wait_executed(names, 90)
        time.sleep(0.1)
    wait_for(rig.drained, 15, message="drained")
    span, rate = _run_time(sampler, N)
    lost, extra = rig.figures(names)
    t_first = sampler.first_time_at_least(1) or t_down
    baseline = sampler.rate(t_first + 0.2, t_down)
    recovery = sampler.recovery(t_back, baseline, 0.5)
    figure(
        f"L3 {N} jobs, Redis SHUTDOWN at 50 % ({in_flight} reserved), back after 2 s: lost "
        f"{lost}, extra {extra}, {span:.2f}s overall ({rate:.0f} jobs/s incl. the outage), "
        f"pre-restart {baseline:.0f} jobs/s, >= 50 % again "
        f"{recovery if recovery is None else round(recovery, 2)}s after Redis was back"
    )
    assert lost == 0
    assert extra <= WORKERS * CONCURRENCY
    assert recovery is not None and recovery <= 10
    assert all(w.alive() for w in rig.workers)


def test_l4_delayed_and_released_jobs_never_start_early(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    _start(rig, 2)
    r = redis_server.client()
    wait_for(
        lambda: sum(1 for c in r.client_list() if c.get("cmd") == "blpop") >= 2,
        20,
        message="workers waiting",
    )
    k = rig.app.queue_for(None).keys("default")
    rng = random.Random(4)
    due: dict[str, int] = {}
    exact = 0
    n, n_released = 2000, 200
    for i in range(n):
        name = f"d{i}"
        delay = rng.uniform(0, 3)
        s, us = r.time()
        before = int(s) * 1000 + int(us) // 1000
        job_id = Timed(name, release_once=i < n_released).delay(delay).dispatch()
        score = r.zscore(k.delayed, job_id)
        if score is not None:  # still waiting: its exact due time (Redis TIME + delay)
            due[name] = int(score)
            exact += 1
        else:  # already taken: the due time is at least this
            due[name] = before + int(delay * 1000)
    rig.wait_executed(due, 30)
    wait_for(rig.drained, 10, message="drained")
    starts = rig.hash("start_ms")
    released = rig.hash("released")
    counts = rig.hash("exec")
    early = [x for x in due if starts[x] < due[x]]
    early_released = [x for x in released if starts[x] < released[x] + 1000]
    lateness = sorted(
        [(starts[x] - due[x]) / 1000 for x in due if x not in released]
        + [(starts[x] - released[x] - 1000) / 1000 for x in released]
    )
    p50 = lateness[len(lateness) // 2]
    p99 = lateness[int(len(lateness) * 0.99)]
    figure(
        f"L4 {n} delayed jobs (0-3 s; {exact} with exact due times), {len(released)} released "
        f"once with release(1): early starts {len(early) + len(early_released)}, lost "
        f"{n - len(counts)}, lateness p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"max {lateness[-1] * 1000:.0f} ms"
    )
    assert counts == {x: 1 for x in due}
    assert len(released) == n_released
    assert early == [] and early_released == []
    assert p99 <= 1.5
