"""F10: Redis stalls (``CLIENT PAUSE``) or the network to it partitions (proxy blackhole)
for longer than the lease (retry_after 3 s) while a job runs.

Expected: no worker crashes (their socket timeout, 10 s, is above the stall); the lease
may expire meanwhile and the job run a second time elsewhere (at least once: executions
<= 2, never 0); the worker whose lease ran out logs "reservation lost".
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import RETRY_AFTER, Rig, exited, figure
from tests.faults.fault_app import Work
from tests.support import FaultProxy, RedisServer, wait_for

pytestmark = pytest.mark.timeout(60)


def test_f10_client_pause_longer_than_the_lease(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url)
    a, b = rig.worker(name="a"), rig.worker(name="b")
    Work("warm", 0).dispatch()
    rig.wait_executed(["warm"], 15)
    Work("paused", 2.0).dispatch()
    wait_for(lambda: rig.count("started", "paused") == 1, 10, 0.02, message="job started")
    admin = redis_server.client()
    t0 = time.monotonic()
    admin.execute_command("CLIENT", "PAUSE", "5000", "ALL")
    wait_for(lambda: rig.count("exec", "paused") >= 1, 20, 0.05, message="first run done")
    wait_for(rig.drained, 20, 0.1, message="queue drained after the pause")
    took = time.monotonic() - t0
    time.sleep(RETRY_AFTER / 3 + 1)  # one more lease renewal round: nothing is left over
    # A second run (the lease ran out during the pause) may still be inside its 2 s job:
    # the first run's late ack deleted the job, so the queue looks drained meanwhile.
    wait_for(
        lambda: rig.count("exec", "paused") >= rig.count("started", "paused"),
        10,
        0.05,
        message="every run that started has finished",
    )
    runs, starts = rig.count("exec", "paused"), rig.count("started", "paused")
    lost_lines = rig.logs().count("reservation lost")
    figure(
        f"F10 CLIENT PAUSE 5000 ALL (lease {RETRY_AFTER:g}s): executions {runs} "
        f"(starts {starts}), lost 0, 'reservation lost' lines {lost_lines}, "
        f"drained {took:.2f}s after the pause began"
    )
    assert 1 <= runs <= 2 and starts == runs
    if runs == 2:
        assert lost_lines >= 1
    assert a.alive() and b.alive()
    assert rig.count("exec", "warm") == 1


def test_f10_partition_longer_than_the_lease_redelivers_and_counts_the_loss(
    redis_server: RedisServer,
    make_rig: Callable[..., Rig],
    fault_proxy_factory: Callable[[str, int], FaultProxy],
) -> None:
    """Worker A reaches Redis through a proxy that blackholes for 6 s while A runs a 2 s
    job; worker B (direct) takes the job over when A's lease expires. A's ack, delivered
    when the partition heals, finds the reservation gone and says so."""
    proxy = fault_proxy_factory(redis_server.host, redis_server.port)
    direct = make_rig(redis_server.url)
    via_proxy = make_rig(proxy.url())
    a = via_proxy.worker(name="a")
    Work("part", 2.0).dispatch()
    wait_for(lambda: direct.count("started", "part") == 1, 15, 0.02, message="A started it")
    assert direct.count("pid", "part") == a.pid
    proxy.mode = "blackhole"
    t0 = time.monotonic()
    b = direct.worker(name="b")
    wait_for(lambda: direct.count("started", "part") == 2, 15, 0.02, message="B took over")
    took_over = time.monotonic() - t0
    assert direct.count("pid", "part") == b.pid
    time.sleep(max(0.0, 6.0 - (time.monotonic() - t0)))
    proxy.mode = "pass"
    wait_for(lambda: "reservation lost" in a.output(), 15, 0.1, message="A reports the loss")
    wait_for(direct.drained, 10, message="drained")
    runs = direct.count("exec", "part")
    figure(
        f"F10 6 s partition of worker A (lease {RETRY_AFTER:g}s): B took over {took_over:.2f}s "
        f"after the partition began; executions {runs}; lost 0; A logged "
        f"{a.output().count('reservation lost')} 'reservation lost' line(s)"
    )
    assert runs == 2
    assert a.output().count("reservation lost") == 1  # one affected job, counted once
    assert a.alive() and b.alive()
    a.terminate()
    assert exited(a, 10) == 0


def test_f9_connection_reset_while_a_job_runs_the_ack_goes_through(
    redis_server: RedisServer,
    make_rig: Callable[..., Rig],
    fault_proxy_factory: Callable[[str, int], FaultProxy],
) -> None:
    """Every connection of the worker is reset (RST) while its job runs: the ack, sent on
    a fresh connection, lands; the job is not run again and nothing stays reserved."""
    proxy = fault_proxy_factory(redis_server.host, redis_server.port)
    rig = make_rig(proxy.url())
    direct = make_rig(redis_server.url)
    w = rig.worker(name="reset")
    Work("rst", 1.0).dispatch()
    wait_for(lambda: rig.count("started", "rst") == 1, 15, 0.02, message="started")
    proxy.mode = "reset"
    t0 = time.monotonic()
    time.sleep(0.2)
    proxy.mode = "pass"
    wait_for(direct.drained, 10, 0.02, message="acked")
    took = time.monotonic() - t0
    Work("after", 0).dispatch()
    rig.wait_executed(["after"], 10)
    time.sleep(RETRY_AFTER + 1)  # a lost ack would show up as a second run by now
    figure(
        f"F9 proxy reset mid-job: acked {took:.2f}s after the reset, executions "
        f"{rig.count('exec', 'rst')}, {proxy.connections_reset} connections reset"
    )
    assert rig.count("exec", "rst") == 1 and rig.count("started", "rst") == 1
    assert took <= 2.0 + 1.0
    assert w.alive() and "reservation lost" not in w.output()


def test_f13_a_job_longer_than_the_lease_runs_once_while_its_worker_lives(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """The worker renews its leases every third of retry_after (3 s), so an 8 s job is
    never handed to the second worker."""
    rig = make_rig(redis_server.url)
    a, b = rig.worker(name="a"), rig.worker(name="b")
    Work("long", 8.0).dispatch()
    rig.wait_executed(["long"], 20)
    wait_for(rig.drained, 5, message="drained")
    figure(
        f"F13 8 s job, lease {RETRY_AFTER:g}s, 2 workers: starts {rig.count('started', 'long')}, "
        f"executions {rig.count('exec', 'long')}"
    )
    assert rig.count("started", "long") == 1 and rig.count("exec", "long") == 1
    assert "reservation lost" not in rig.logs()
    assert a.alive() and b.alive()
