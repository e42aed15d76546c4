"""``notify-worker supervise``: pools balanced by measured wait, on real Redis with real
processes.

Guarantees: a burst on one pool grows it and it shrinks back to its minimum after, with
every job run exactly once (scale-down is a graceful SIGTERM); two supervisors sharing a
pool's ``max_processes_total`` never run more than it, and when one is SIGKILLed the
other takes over its share within about one lease; a supervisor whose Redis stops keeps
its children and balances again once Redis is back. ``notify-worker workers --json``
names each process's pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from tests.e2e.pools_app import Noop, Slow, make_app
from tests.integration.workflows_support import wait_until
from tests.support import Proc, python_cmd
from tidings import App

ROOT = Path(__file__).resolve().parents[2]

BURST = {
    "pools": [
        {"name": "fast", "queues": ["fast"], "min_processes": 1, "max_processes": 2,
         "concurrency": 16, "target_wait_s": 1.0},
        {"name": "slow", "queues": ["slow"], "min_processes": 1, "max_processes": 4,
         "concurrency": 4, "target_wait_s": 0.5},
    ],
    "max_processes": 5, "cooldown_s": 1.0, "max_shift": 2, "lease_s": 3.0,
}  # fmt: skip


def pool_children(sup_pid: int | None = None, session: int | None = None) -> dict[str, list[int]]:
    """Live worker processes per pool: children of ``sup_pid``, or members of ``session``
    (children of a SIGKILLed supervisor keep its session), from /proc."""
    out: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        if sup_pid is not None and int(fields[1]) != sup_pid:
            continue
        if session is not None and int(fields[3]) != session:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(b"TIDINGS_POOL="):
                out.setdefault(var.split(b"=", 1)[1].decode(), []).append(int(entry.name))
    return out


def counts(children: dict[str, list[int]]) -> dict[str, int]:
    return {k: len(v) for k, v in children.items()}


def supervise(spawn_proc: Callable[..., Proc], url: str, prefix: str, config: dict[str, Any],
              name: str = "sup") -> Proc:  # fmt: skip
    env = {"POOLS_REDIS_URL": url, "POOLS_PREFIX": prefix,
           "POOLS_CONFIG": orjson.dumps(config).decode(), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    cmd = python_cmd("-m", "tidings.cli", "supervise", "-A", "tests.e2e.pools_app:app",
                     "--grace", "5", "--interval", "0.5")  # fmt: skip
    return spawn_proc(cmd, name=name, extra_env=env, cwd=ROOT)


def execs(r: redis.Redis, prefix: str) -> dict[str, int]:
    raw: Any = r.hgetall(f"{prefix}:test:exec")
    return {k.decode(): int(v) for k, v in raw.items()}


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix, BURST)
    try:
        yield a
    finally:
        a.close()


def test_burst_grows_the_pool_then_it_shrinks_back_and_no_job_is_lost(
    app: App, redis_client: redis.Redis, redis_url: str, prefix: str,
    spawn_proc: Callable[..., Proc],
) -> None:  # fmt: skip
    sup = supervise(spawn_proc, redis_url, prefix, BURST)
    try:
        wait_until(lambda: counts(pool_children(sup.pid)) == {"fast": 1, "slow": 1}, 30,
                   "one process per pool", sup)  # fmt: skip

        # `workers --json` names each process's pool.
        def pools_seen() -> set[str]:
            out = subprocess.run(
                [sys.executable, "-m", "tidings.cli", "-A", "tests.e2e.pools_app:app",
                 "workers", "--json"], cwd=ROOT,
                env={**os.environ, "POOLS_REDIS_URL": redis_url, "POOLS_PREFIX": prefix},
                capture_output=True, timeout=30,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr.decode()
            return {b["pool"] for b in orjson.loads(out.stdout)}

        wait_until(lambda: pools_seen() == {"fast", "slow"}, 30, "workers --json pools", sup)
        n = 1500
        app.dispatch_many([Slow(f"s{i}", 50) for i in range(n)])
        app.dispatch_many([Noop(f"f{i}") for i in range(50)])
        peak = wait_until(lambda: (c := counts(pool_children(sup.pid))).get("slow", 0) >= 3 and c,
                          60, "the slow pool to grow", sup)  # fmt: skip
        assert peak["slow"] <= 4 and sum(peak.values()) <= 5
        wait_until(lambda: len(execs(redis_client, prefix)) == n + 50, 120, "every job", sup)
        wait_until(lambda: counts(pool_children(sup.pid)) == {"fast": 1, "slow": 1}, 60,
                   "both pools back to their minimum", sup)  # fmt: skip
        done = execs(redis_client, prefix)
        assert set(done.values()) == {1}, "a job ran twice or not at all"
        assert "retiring worker" in sup.output()
        logged = redis_client.lrange(f"{prefix}:{{pools}}:decisions", 0, -1)
        decisions = [orjson.loads(d) for d in logged]
        assert any("slow: " in r and "+" in r for d in decisions for r in d["reasons"])
    finally:
        sup.terminate()
        assert sup.wait(30) == 0
    assert pool_children(sup.pid) == {}


SHARED = {
    "pools": [{"name": "slow", "queues": ["slow"], "min_processes": 1, "max_processes": 4,
               "concurrency": 4, "target_wait_s": 0.5, "max_processes_total": 5}],
    "cooldown_s": 1.0, "max_shift": 2, "lease_s": 3.0,
}  # fmt: skip


class Sampler:
    """Counts the pool processes of some sessions every 0.1 s in a thread."""

    def __init__(self, sessions: list[int]) -> None:
        import threading

        self.sessions = sessions
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            now = {s: sum(counts(pool_children(session=s)).values()) for s in self.sessions}
            self.samples.append((time.monotonic(), now))

    def last(self) -> dict[int, int]:
        return self.samples[-1][1] if self.samples else {}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_two_supervisors_share_max_processes_total_and_one_takes_over_a_killed_ones_share(
    redis_client: redis.Redis, redis_url: str, prefix: str, spawn_proc: Callable[..., Proc],
) -> None:  # fmt: skip
    app = make_app(redis_url, prefix, SHARED)
    a = supervise(spawn_proc, redis_url, prefix, {**SHARED, "max_processes": 4}, name="sup-a")
    b = supervise(spawn_proc, redis_url, prefix, {**SHARED, "max_processes": 3}, name="sup-b")
    sampler = Sampler([a.pid, b.pid])
    try:
        wait_until(lambda: sampler.last().get(a.pid) == 1 and sampler.last().get(b.pid) == 1,
                   30, "one process on each host", a, b)  # fmt: skip
        app.dispatch_many([Slow(f"s{i}", 50) for i in range(6000)])
        wait_until(lambda: sum(sampler.last().values()) == 5, 60, "the pool at its total", a, b)
        before = dict(sampler.last())
        # Kill the host running more (3 of 5, or 4): the other then has room to take over
        # up to its own max_processes (a: 4, b: 3).
        dead, alive = (a, b) if before[a.pid] >= before[b.pid] else (b, a)
        full = 4 if alive is a else 3
        assert before[alive.pid] < full, "the survivor was already at its maximum"
        dead.kill()  # SIGKILL the supervisor only: its children get SIGTERM (they die with it)
        killed = time.monotonic()
        wait_until(lambda: sampler.last().get(alive.pid) == full
                   and sampler.last().get(dead.pid) == 0,
                   60, "the other host to take over", a, b)  # fmt: skip
        took = time.monotonic() - killed
        print(f"takeover after SIGKILL: {took:.1f} s (lease 3 s)")
    finally:
        sampler.stop()
        for p in (a, b):
            if p.popen.poll() is None:
                p.terminate()
                assert p.wait(30) == 0
        app.close()
    worst = max(sum(s.values()) for _, s in sampler.samples)
    assert worst <= 5, "the two hosts ran more than max_processes_total"
    assert pool_children(session=a.pid) == {} and pool_children(session=b.pid) == {}


def test_a_supervisor_that_loses_redis_keeps_its_processes_and_balances_again_after(
    redis_server: Any, prefix: str, spawn_proc: Callable[..., Proc],
) -> None:  # fmt: skip
    url = redis_server.url
    sup = supervise(spawn_proc, url, prefix, BURST)
    app = make_app(url, prefix, BURST)
    try:
        wait_until(lambda: counts(pool_children(sup.pid)) == {"fast": 1, "slow": 1}, 30,
                   "one process per pool", sup)  # fmt: skip
        app.dispatch_many([Slow(f"s{i}", 50) for i in range(1500)])
        wait_until(lambda: counts(pool_children(sup.pid)).get("slow", 0) >= 3, 60,
                   "the slow pool to grow", sup)  # fmt: skip
        before = pool_children(sup.pid)
        redis_server.stop()
        wait_until(lambda: "Redis unavailable" in sup.output(), 30, "the outage noticed", sup)
        # Through the outage (longer than a lease and several cooldowns) nothing is
        # started or retired: the same processes run.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert pool_children(sup.pid) == before
            time.sleep(0.25)
        redis_server.restart()
        wait_until(lambda: "balancing again" in sup.output(), 30, "Redis back", sup)
        # Balancing resumes: the backlog done, the slow pool shrinks to its minimum.
        wait_until(lambda: counts(pool_children(sup.pid)) == {"fast": 1, "slow": 1}, 120,
                   "the pools back to their minimum", sup)  # fmt: skip
    finally:
        sup.terminate()
        assert sup.wait(30) == 0
        app.close()
