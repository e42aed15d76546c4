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
    # Both workers are up (each has written its heartbeat) before anything is queued, so
    # both pop from the start: on a busy machine a late second worker found the queue
    # drained by the first, and nothing was shown across processes.
    workers = [e.worker("--concurrency", "8", name=f"w{n}") for n in range(2)]
    wait_for(lambda: e.r.zcard(f"{e.prefix}:workers") >= 2, 60, message="both workers up")
    # 20 jobs of 0.4 s two at a time: ~4 s.
    jobs = [GroupSlot(f"c{i}", "capped", 0.4) for i in range(20)]
    jobs += [GroupSlot(f"o{i}", f"other-{i % 4}", 0.05) for i in range(16)]
    e.app.dispatch_many(jobs)
    wait_for(lambda: sum(e.executions().values()) >= 36, 90, message="all 36 ran")
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert exited(w, 60) == 0, w.tail()
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


def test_the_groups_cli_sets_limits_pauses_resumes_and_lists_escaped(e: Env) -> None:
    for i in range(3):
        GroupSlot(f"a{i}", "acme", 0.0).dispatch()
    GroupSlot("b0", "beta", 0.0).dispatch()
    e.cli("groups", "limit", "acme", "--concurrency", "2", "--rate", "120/min")
    e.cli("groups", "pause", "beta")
    shown = e.cli("groups", "show", "acme").stdout
    assert "ready:       3" in shown and "concurrency: 2" in shown and "120/min" in shown
    # A limit not named keeps its value; --no-rate / --no-concurrency remove one.
    said = e.cli("groups", "limit", "acme", "--concurrency", "3").stdout
    assert "concurrency 3" in said and "120/min" in said
    e.cli("groups", "limit", "acme", "--no-rate")
    shown = e.cli("groups", "show", "acme").stdout
    assert "concurrency: 3" in shown and "rate:        -" in shown
    e.cli("groups", "limit", "acme", "--rate", "60/min")
    shown = e.cli("groups", "show", "acme").stdout
    assert "concurrency: 3" in shown and "60/min" in shown
    assert e.cli("groups", "limit", "acme", "--burst", "3", check=False).returncode != 0
    listed = e.cli("groups", "list").stdout
    assert listed.index("acme") < listed.index("beta")  # the bigger backlog first
    assert "paused" in listed
    # A group key written by hand with control characters never reaches the terminal raw.
    hostile = "evil\x1b[2J\x07"
    e.r.rpush(f"{e.prefix}:queue:{{default}}:g:{hostile}", "0" * 32)
    out = e.cli("groups", "list", "--json").stdout + e.cli("groups", "list").stdout
    assert "\x1b" not in out and "\x07" not in out and "evil" in out
    bad = e.cli("groups", "pause", "bad\nname", check=False)
    assert bad.returncode != 0 and "control character" in bad.stderr
    e.cli("groups", "resume", "beta")
    assert e.app.groups.show("beta").in_turn
