"""Fair groups (issue 25) with real ``notify-worker`` processes: a group's concurrency
holds across processes (counted by the jobs themselves), and the slot of a worker killed
with SIGKILL comes back when its lease ends.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests.e2e.jobs_app import GroupSlot
from tests.e2e.test_notify_worker import Env, Spawn, exited
from tests.support.procs import wait_for


@pytest.fixture
def e(redis_url: str, prefix: str, spawn_proc: Spawn) -> Iterator[Env]:
    env = Env(redis_url, prefix, spawn_proc)
    try:
        yield env
    finally:
        env.close()


def seen(e: Env, group: str) -> list[int]:
    return [int(v) for v in e.r.lrange(f"{e.prefix}:test:seen:{group}", 0, -1)]


def test_a_groups_concurrency_holds_across_two_worker_processes(e: Env) -> None:
    e.app.groups.limit("capped", concurrency=2)
    # 20 jobs of 0.4 s two at a time: ~4 s, long enough for both workers to start.
    jobs = [GroupSlot(f"c{i}", "capped", 0.4) for i in range(20)]
    jobs += [GroupSlot(f"o{i}", f"other-{i % 4}", 0.05) for i in range(16)]
    e.app.dispatch_many(jobs)
    workers = [
        e.worker("--concurrency", "8", "--stop-when-empty", name=f"w{n}") for n in range(2)
    ]
    for w in workers:
        assert exited(w, 90) == 0, w.tail()
    assert len(e.executions()) == 36
    capped = seen(e, "capped")
    assert len(capped) == 20
    # Never more than two at once, and the limit was reached (both workers took part).
    assert max(capped) == 2, capped
    pids = {e.r.hget(f"{e.prefix}:test:pid", f"c{i}") for i in range(20)}
    others = {e.r.hget(f"{e.prefix}:test:pid", f"o{i}") for i in range(16)}
    assert len(pids | others) == 2, (pids, others)
    # Nothing left behind but the setting.
    assert [(i.name, i.ready, i.running) for i in e.app.groups.list()] == [("capped", 0, 0)]
    assert not list(e.r.scan_iter(match=f"{e.prefix}:queue:{{default}}:g[:pr]*"))


def test_the_slot_of_a_sigkilled_worker_comes_back_when_its_lease_ends(e: Env) -> None:
    e.app.groups.limit("solo", concurrency=1)
    GroupSlot("first", "solo", 60.0, first_only=True).dispatch()
    GroupSlot("second", "solo", 0.0).dispatch()
    doomed = e.worker("--concurrency", "4", name="doomed")
    wait_for(lambda: e.count("started", "first") == 1, 60, message="first started")
    time.sleep(0.5)
    assert e.count("started", "second") == 0  # the one slot is held
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    killed_at = time.monotonic()
    survivor = e.worker("--concurrency", "4", "--stop-when-empty", name="survivor")
    assert exited(survivor, 90) == 0, survivor.tail()
    assert e.executions() == {"first": 1, "second": 1}
    # The slot came back after the lease (RETRY_AFTER 2 s), never two at once.
    assert max(seen(e, "solo")) <= 2  # the killed run never decremented its count
    assert time.monotonic() - killed_at < 60
    info = e.app.groups.show("solo")
    assert (info.ready, info.running) == (0, 0)
    assert not list(e.r.scan_iter(match=f"{e.prefix}:queue:{{default}}:g[:pr]*"))
