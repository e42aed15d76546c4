"""F22: clocks that disagree. Every lease and every delay is measured on Redis ``TIME``
inside the scripts, so a worker or producer whose clock is minutes off changes nothing.

Worker B runs under ``faketime -f '+120s'`` beside a normal worker A: with a worker-clock
design B would see A's leases (3 s) as long expired and run A's jobs again (Horizon
#315). A producer under ``faketime -f '-300s'`` dispatches delayed jobs: with a
producer-clock design they would be due 300 s ago and start at once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.faults.conftest import ROOT, Rig, figure
from tests.faults.fault_app import Work
from tests.support import RedisServer, wait_for

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime not installed"),
]

AHEAD = ["faketime", "-f", "+120s"]
BEHIND = ["faketime", "-f", "-300s"]


def test_f22_a_worker_two_minutes_ahead_runs_nothing_twice(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    a = rig.worker("--concurrency", "3", name="a-normal")
    b = rig.worker("--concurrency", "3", name="b-ahead", prefix_cmd=AHEAD)
    _wait_blocking(redis_server, 2)
    names = [f"s{i}" for i in range(20)]
    rig.app.dispatch_many([Work(n, 1.0) for n in names])
    rig.wait_executed(names, 30)
    wait_for(rig.drained, 10, message="drained")
    pids = rig.hash("pid")
    counts = rig.hash("exec")
    starts = rig.hash("started")
    by_a = sum(1 for n in names if pids.get(n) == a.pid)
    by_b = len(names) - by_a  # faketime forks: B's pid is not b.pid
    figure(
        f"F22 worker +120s beside a normal one: executions {sum(counts.values())} of 20 jobs "
        f"(starts {sum(starts.values())}), A ran {by_a}, B (ahead) ran {by_b}"
    )
    assert counts == {n: 1 for n in names}
    assert starts == {n: 1 for n in names}
    assert by_a > 0 and by_b > 0 and len(set(pids.values())) == 2  # both took part
    assert a.alive() and b.alive()


def _wait_blocking(server: RedisServer, n: int) -> None:
    """Until ``n`` workers are idle in BLPOP (both ready before jobs arrive)."""
    r = server.client()
    wait_for(
        lambda: sum(1 for c in r.client_list() if c.get("cmd") == "blpop") >= n,
        20,
        message=f"{n} workers waiting",
    )


PRODUCER = """
import sys, time
from tests.faults.fault_app import app, Timed
r = app.queue_for(None).client
k = app.queue_for(None).keys("default")
print("LOCAL", time.time())
for i in range(5):
    s, us = r.time()
    before = int(s) * 1000 + int(us) // 1000
    job_id = Timed(f"d{i}").delay(3).dispatch()
    print("DUE", f"d{i}", before, int(r.zscore(k.delayed, job_id)))
"""


def test_f22_delays_from_a_producer_five_minutes_behind_use_redis_time(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    rig.worker(name="a-normal")
    rig.worker(name="b-ahead", prefix_cmd=AHEAD)
    _wait_blocking(redis_server, 2)
    done = subprocess.run(
        [*BEHIND, sys.executable, "-c", PRODUCER],
        env=rig.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    lines = [ln.split() for ln in done.stdout.splitlines()]
    skew = float(next(ln[1] for ln in lines if ln[0] == "LOCAL")) - redis_server.client().time()[0]
    due = {ln[1]: (int(ln[2]), int(ln[3])) for ln in lines if ln[0] == "DUE"}
    assert len(due) == 5
    rig.wait_executed(due, 15)
    starts = rig.hash("start_ms")
    offsets = {n: (starts[n] - before) / 1000 for n, (before, _) in due.items()}
    lateness = {n: (starts[n] - d) / 1000 for n, (_, d) in due.items()}
    figure(
        f"F22 producer clock {skew:+.0f}s: delay 3 s jobs started "
        f"{min(offsets.values()):.3f}-{max(offsets.values()):.3f}s after dispatch on Redis "
        f"time; lateness {min(lateness.values()):.3f}-{max(lateness.values()):.3f}s"
    )
    assert skew < -250  # the producer's clock really was behind
    for before, d in due.values():
        assert 3000 <= d - before <= 3100  # due = Redis TIME at dispatch + 3 s
    assert all(0 <= late <= 2.0 for late in lateness.values())
    assert all(3.0 <= off <= 5.0 for off in offsets.values())
