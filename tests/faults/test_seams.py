"""Real ``notify-worker`` processes at the seams: killed right after a pop or in
the middle of a job, frozen (SIGSTOP) past their lease while another worker takes the
job over, and a poison job that kills every worker running it.

The jobs use the worker's defaults (tries 1, max_stalls 3): a lease that expires is a
stall, so the job runs again instead of going to the failed store as
MaxAttemptsExceeded, and a stale holder's moves are refused ("reservation lost").
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import Rig, figure
from tests.faults.fault_app import Plain, Poison, Rec
from tests.support import RedisServer, wait_for
from tidings import chain

pytestmark = pytest.mark.timeout(90)
LEASE = 1.0


def failed_ids(rig: Rig) -> dict[str, str]:
    return {f.id: f.exception for f in rig.app.queue_for(None).failed()}


def test_a_worker_killed_right_after_the_pop_leaves_the_job_to_run_again(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url, retry_after=LEASE)
    job_id = Plain("popped").dispatch()
    dead = rig.worker(name="dies", extra_env={"TIDINGS_FAULT_POINT": "after_pop"})
    wait_for(lambda: not dead.alive(), 15, 0.05, message="worker killed after its pop")
    assert rig.count("started", "popped") == 0  # it never ran
    rig.worker(name="second")
    rig.wait_executed(["popped"], 20)
    wait_for(rig.drained, 10, 0.05, message="acked")
    assert rig.app.job_status(str(job_id)) == "done"
    assert failed_ids(rig) == {}
    assert rig.count("exec", "popped") == 1


def test_a_worker_killed_mid_job_runs_it_again_within_retry_after(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(redis_server.url, retry_after=LEASE)
    job_id = Plain("mid", 0.5).dispatch()
    a = rig.worker(name="a")
    wait_for(lambda: rig.count("started", "mid") == 1, 15, 0.02, message="started")
    a.kill()
    t0 = time.monotonic()
    rig.worker(name="b")
    rig.wait_executed(["mid"], 20)
    took = time.monotonic() - t0
    wait_for(rig.drained, 10, 0.05, message="acked")
    figure(f"SIGKILL mid-job (lease {LEASE:g}s): ran again and finished {took:.2f}s later")
    assert rig.app.job_status(str(job_id)) == "done"
    assert failed_ids(rig) == {}
    assert (rig.count("started", "mid"), rig.count("exec", "mid")) == (2, 1)


@pytest.mark.parametrize("b_fails", [False, True], ids=["b-succeeds", "b-fails"])
def test_a_frozen_holder_cannot_touch_the_new_holders_reservation(
    redis_server: RedisServer, make_rig: Callable[..., Rig], b_fails: bool
) -> None:
    """A freezes (SIGSTOP) mid-job past its lease; B takes the job over. A wakes while B
    runs: A's ack is refused ("reservation lost") and B's reservation stays; B then
    finishes (or fails, keeping the whole payload), and the status is B's outcome only."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    job_id = str(Plain("stale", 1.5, fail_after_first=b_fails).dispatch())
    k = rig.app.queue_for(None).keys("default")
    direct = redis_server.client()
    envelope = direct.hget(k.jobs, job_id)
    a = rig.worker(name="a")
    wait_for(lambda: rig.count("started", "stale") == 1, 15, 0.02, message="A started")
    a.signal(signal.SIGSTOP)
    try:
        b = rig.worker(name="b")
        wait_for(lambda: rig.count("started", "stale") == 2, 15, 0.02, message="B took over")
        b_pid = rig.count("pid", "stale")
        assert b_pid == b.pid
        if not b_fails:
            time.sleep(0.3)  # A's 1.5 s sleep is long over: it finishes on SIGCONT
    finally:
        a.signal(signal.SIGCONT)
    if not b_fails:
        wait_for(lambda: "reservation lost" in a.output(), 10, 0.05, message="A refused")
        assert direct.zscore(k.reserved, job_id) is not None  # B's reservation is intact
        assert direct.hget(k.jobs, job_id) == envelope
        wait_for(lambda: rig.count("exec", "stale") == 2, 10, 0.05, message="B finished")
        wait_for(rig.drained, 10, 0.05, message="B acked")
        assert rig.app.job_status(job_id) == "done"
        assert "reservation lost" not in b.output()
    else:
        wait_for(lambda: job_id in failed_ids(rig), 10, 0.05, message="B failed it")
        wait_for(lambda: "reservation lost" in a.output(), 10, 0.05, message="A refused")
        time.sleep(0.5)
        assert direct.hget(k.failed_body, job_id) == envelope  # the whole payload
        assert direct.zscore(k.done, job_id) is None
        assert rig.app.job_status(job_id) == "failed"
        assert "Released" not in b.output()


def test_a_poison_job_ends_in_the_failed_store_after_max_stalls(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """A job that kills every worker running it runs 1 + max_stalls (2) times, then goes
    to the failed store as "stalled 3 times" without running again."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    job_id = str(Poison("poison").dispatch())
    deadline = time.monotonic() + 40
    workers = 0
    while job_id not in failed_ids(rig):
        assert time.monotonic() < deadline, f"poison job never failed: {failed_ids(rig)}"
        w = rig.worker(name=f"w{workers}")
        workers += 1
        while w.alive() and job_id not in failed_ids(rig):
            time.sleep(0.05)
        w.terminate()
        w.wait(10)
    figure(f"poison job: {rig.count('started', 'poison')} runs, {workers} workers started")
    assert rig.count("started", "poison") == 3
    assert "stalled 3 times" in failed_ids(rig)[job_id]


def test_a_frozen_chain_link_does_not_advance_the_chain_its_successor_failed(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """A chain's first link: A freezes in it past its lease, B takes it over and fails
    for good (the chain's catch runs). A wakes and finishes: its success must not push
    the next link, so the next link and the catch never both run."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    first = Plain("link1", 1.5, fail_after_first=True)
    chain(first, Rec("link2", "next")).catch(Rec("caught", "catch")).dispatch()
    a = rig.worker(name="a")
    wait_for(lambda: rig.count("started", "link1") == 1, 15, 0.02, message="A started")
    a.signal(signal.SIGSTOP)
    try:
        rig.worker(name="b")
        wait_for(lambda: rig.count("exec", "caught") == 1, 15, 0.02, message="catch ran")
    finally:
        a.signal(signal.SIGCONT)
    wait_for(lambda: "reservation lost" in a.output(), 10, 0.05, message="A refused")
    time.sleep(1.0)  # time for a wrongly pushed next link to run
    assert rig.count("exec", "link2") == 0
    assert rig.count("exec", "link1") == 1  # A's run, which completed but did not count
    # The catch runs once, plus once for each of its reservations that was lost (a
    # stall): under load a worker can lose the catch's 1 s lease, and a frozen A's pop,
    # run by Redis behind A's blocking wait while A is stopped, can reserve the catch
    # and run it on SIGCONT after B did. Each such run's ack (or renewal) is refused
    # and logged as "reservation lost for <catch id>".
    logs = rig.logs()
    catch_ids = set(re.findall(r"([0-9a-f]{32}) Processing +Rec", logs))
    assert len(catch_ids) == 1, catch_ids  # the next link never ran: every Rec is the catch
    (catch_id,) = catch_ids
    stalls = len(re.findall(rf"reservation lost for [0-9a-f, ]*{catch_id}", logs))
    caught = rig.count("exec", "caught")
    if caught > 1:
        figure(f"frozen chain link: the catch ran {caught} times after {stalls} stalls")
    assert 1 <= caught <= 1 + stalls, f"catch ran {caught} times, {stalls} stalls:\n{logs}"
