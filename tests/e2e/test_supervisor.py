"""``notify-worker --processes N`` against real Redis.

Guarantees: a dead child is restarted; a child stuck on a sync job exits 13 and is
restarted; SIGTERM is forwarded and a child that does not exit within the grace period
is SIGKILLed; a poison job that SIGKILLs its worker every time ends in the failed store
after its tries while 50 other jobs complete (RELIABILITY row F3).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.workflows_app import Block, BlockLoop, Poison, Record, make_app
from tests.integration.workflows_support import execs, start_worker, wait_until
from tests.support import Proc
from tidings import App


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def children_of(pid: int) -> set[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def _supervisor(spawn_proc: Callable[..., Proc], app: App, prefix: str, *args: str) -> Proc:
    return start_worker(
        spawn_proc, app.settings.redis_url, prefix, "--processes", "2", *args, name="sup"
    )


def test_dead_child_is_restarted_and_sigterm_is_forwarded(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    sup = _supervisor(spawn_proc, app, prefix)
    first = wait_until(
        lambda: len(children_of(sup.pid)) == 2 and children_of(sup.pid), 10, "2 children", sup
    )
    victim = min(first)
    os.kill(victim, signal.SIGKILL)  # a child of the supervisor this test started
    wait_until(lambda: len(children_of(sup.pid) - {victim}) == 2, 10, "a replacement", sup)
    app.dispatch_many([Record(f"r{i}") for i in range(20)])
    wait_until(lambda: len(execs(redis_client, prefix)) == 20, 15, "20 ran", sup)
    sup.terminate()
    assert sup.wait(15) == 0
    assert children_of(sup.pid) == set()
    assert f"worker {victim} exited with -9" in sup.output()


def test_child_with_stuck_sync_job_exits_13_and_is_restarted(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    sup = _supervisor(spawn_proc, app, prefix, "--timeout", "1", "--grace", "2")
    wait_until(lambda: len(children_of(sup.pid)) == 2, 10, "2 children", sup)
    Block("stuck", 60).dispatch()
    wait_until(lambda: "exited with 13" in sup.output(), 15, "a child exited 13", sup)
    wait_until(lambda: len(children_of(sup.pid)) == 2, 10, "restarted", sup)
    Record("after").dispatch()
    wait_until(lambda: execs(redis_client, prefix).get("after"), 10, "jobs still flow", sup)
    sup.terminate()
    assert sup.wait(20) == 0


def test_child_not_exiting_within_grace_is_killed(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    sup = _supervisor(spawn_proc, app, prefix, "--timeout", "0", "--grace", "1")
    wait_until(lambda: len(children_of(sup.pid)) == 2, 10, "2 children", sup)
    BlockLoop("long", 60).dispatch()  # its worker cannot even handle SIGTERM
    wait_until(lambda: execs(redis_client, prefix).get("long"), 10, "long job started", sup)
    t0 = time.monotonic()
    sup.terminate()
    assert sup.wait(20) == 0
    took = time.monotonic() - t0
    assert "did not exit within the grace period" in sup.output()
    assert took < 1 + 5 + 3, took


def test_poison_job_fails_after_its_tries_while_others_flow(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """RELIABILITY F3: 1 poison + 50 normal jobs, 2 supervised workers, retry_after 2 s."""
    poison = Poison("poison").dispatch()
    app.dispatch_many([Record(f"n{i}") for i in range(50)])
    t0 = time.monotonic()
    # One job per child at a time: a job reserved beside the poison dies with its worker
    # and is re-delivered with it, so with --concurrency > 1 it could use up its tries too.
    # A worker killed by its job is a stall, not an attempt: the poison runs
    # 1 + --max-stalls times, then fails unrun as "stalled 3 times".
    sup = _supervisor(
        spawn_proc, app, prefix, "--tries", "3", "--max-stalls", "2", "--concurrency", "1"
    )
    failed = wait_until(lambda: app.queue_for(None).failed(["default"]), 28, "poison failed", sup)
    took = time.monotonic() - t0
    wait_until(
        lambda: sum(1 for k in execs(redis_client, prefix) if k.startswith("n")) == 50,
        10,
        "50 normal jobs",
        sup,
    )
    runs = execs(redis_client, prefix)["poison"]
    print(f"\nF3: poison ran {runs} times, failed after {took:.1f}s: {failed[0].exception[:80]}")
    assert [f.id for f in failed] == [poison]
    assert runs == 3
    assert "stalled 3 times" in failed[0].exception
    assert took <= 3 * (2 + 1) + 10
    sup.terminate()
    assert sup.wait(20) == 0


def test_child_whose_event_loop_is_blocked_is_killed_and_replaced(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """An async job blocking the loop past its timeout (1 s) silences the heartbeat: the
    supervisor SIGKILLs that child after timeout + 10 s and starts another."""
    sup = _supervisor(
        spawn_proc, app, prefix, "--timeout", "1", "--tries", "1", "--max-stalls", "0"
    )
    wait_until(lambda: len(children_of(sup.pid)) == 2, 10, "2 children", sup)
    BlockLoop("hog", 60).dispatch()
    wait_until(lambda: execs(redis_client, prefix).get("hog"), 10, "hog started", sup)
    wait_until(lambda: "event loop silent" in sup.output(), 20, "watchdog kill", sup)
    wait_until(lambda: len(children_of(sup.pid)) == 2, 10, "replaced", sup)
    # The hog's lease expires: a stall, and with --max-stalls 0 it fails unrun.
    failed = wait_until(lambda: app.queue_for(None).failed(["default"]), 10, "hog failed", sup)
    assert execs(redis_client, prefix)["hog"] == 1
    assert "stalled 1 time " in failed[0].exception
    sup.terminate()
    assert sup.wait(20) == 0
