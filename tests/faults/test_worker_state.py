"""The worker's own state under faults that touch no Redis move (issue 21): a worker
frozen past its lease, wrong-typed keys in one of its queues, a Redis outage longer than
its retry give-up, a pause while a pop rides behind its blocking wait, and a poison job
among ordinary ones. Real ``notify-worker`` processes, a private redis-server.

Env hook these tests need from the worker (see the module's report in issue 21):
``TIDINGS_REDIS_GIVE_UP_S`` -- seconds a worker retries one Redis move through an outage
before it gives up (default 60, the ``limit_s`` of ``_retrying``).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

from tests.faults.conftest import Rig, figure
from tests.faults.fault_app import (
    FirstRunFails,
    Plain,
    PoisonTwice,
    Rec,
    Record,
    Span,
    SyncSpan,
)
from tests.support import Proc, RedisServer, wait_for
from tidings import chain

pytestmark = pytest.mark.timeout(120)
LEASE = 1.5
GIVE_UP_ENV = "TIDINGS_REDIS_GIVE_UP_S"


def failed_ids(rig: Rig, queues: list[str] | None = None) -> dict[str, str]:
    return {f.id: f.exception for f in rig.app.queue_for(None).failed(queues)}


def spans(rig: Rig) -> list[tuple[str, str, int]]:
    raw = rig.acct.lrange(f"{rig.account_prefix}:spans", 0, -1)
    out = []
    for line in raw:
        what, name, pid = line.decode().split(" ")
        out.append((what, name, int(pid)))
    return out


def max_overlap(rig: Rig, name: str, pid: int) -> int:
    """Most runs of ``name`` in flight at once in process ``pid`` (from the span log)."""
    live = most = 0
    for what, n, p in spans(rig):
        if n == name and p == pid:
            live += 1 if what == "start" else -1
            most = max(most, live)
    return most


@contextmanager
def stall_sampler(client: redis.Redis, attempts_key: str, job_id: str) -> Iterator[list[int]]:
    """Samples the job's stall counter (``<id>:s`` in the attempts hash) every 20 ms;
    yields a one-item list holding the highest value seen (the pop deletes the field
    when the job settles, so the last value alone would say 0)."""
    seen = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                raw = client.hget(attempts_key, f"{job_id}:s")
            except redis.RedisError:
                raw = None
            if raw is not None:
                seen[0] = max(seen[0], int(raw))
            stop.wait(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


def blocked_on_wait(client: redis.Redis) -> bool:
    """Whether some client sits in a blocking wait (the worker's BLPOP)."""
    return any(c.get("cmd") == "blpop" for c in client.client_list())


# -- 1. a worker frozen past its lease ------------------------------------------------


@pytest.mark.parametrize("kind", [Span, SyncSpan], ids=["async", "sync"])
def test_a_worker_frozen_past_its_lease_does_not_run_its_own_job_twice(
    redis_server: RedisServer, make_rig: Callable[..., Rig], kind: type
) -> None:
    """One worker (concurrency 4), one 4 s job; SIGSTOP right after the job starts, a
    push while it is frozen wakes the blocking wait (the pop riding behind it runs on
    the server, recovers the expired lease and hands the job back to the same frozen
    worker), SIGCONT after 2.5 s. The job must start once in that process, stall at most
    once, and end done."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    job_id = str(kind("long", 4.0).dispatch())
    k = rig.app.queue_for(None).keys("default")
    direct = redis_server.client()
    # --sleep 10: the worker's blocking wait (and the pop behind it) is pending all along.
    w = rig.worker("--concurrency", "4", "--sleep", "10", name="w")
    with stall_sampler(direct, k.attempts, job_id) as stalls:
        wait_for(lambda: rig.count("started", "long") == 1, 20, 0.01, message="started")
        w.signal(signal.SIGSTOP)
        try:
            time.sleep(LEASE + 0.5)  # past the lease (renewed every LEASE/3 until now)
            Record("poke").dispatch()  # wakes the frozen worker's wait on the server
            time.sleep(2.5 - (LEASE + 0.5))
        finally:
            w.signal(signal.SIGCONT)
        # Settled, or started a third time (today: it would go on until failed as stalled).
        wait_for(
            lambda: (
                rig.app.job_status(job_id) in ("done", "failed")
                or rig.count("started", "long") >= 3
            ),
            40,
            0.05,
            message="the long job settled",
        )
        time.sleep(0.5)
    started = rig.count("started", "long")
    overlap = max_overlap(rig, "long", w.pid)
    status = rig.app.job_status(job_id)
    failed = failed_ids(rig)
    figure(
        f"frozen past lease ({kind.__name__}): started {started}, at once {overlap}, "
        f"stalls {stalls[0]}, status {status}, failed {list(failed.values())[:1]}"
    )
    assert overlap == 1, f"the same worker ran the job {overlap} times at once:\n{w.tail()}"
    assert started == 1, f"started {started} times in pid {w.pid}"
    assert stalls[0] <= 1
    assert status == "done"
    assert failed == {}
    assert w.alive()


# -- 2. wrong-typed keys of one queue -------------------------------------------------


def test_wrong_typed_keys_of_one_queue_do_not_stop_the_other_queues_acks(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """A worker on ``a,b``; while a job of ``a`` runs, every key of ``a`` is replaced by
    a string. Expected: an ERROR line naming queue ``a``; each job of ``b`` (dispatched
    before, during and after ``a``'s job ends) runs exactly once, is acked, never stalls,
    never fails; ``job_status`` answers for them; the worker keeps running."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    direct = redis_server.client()
    b_ids: dict[str, str] = {}

    def push_b(i: int) -> None:
        b_ids[f"b{i}"] = str(Plain(f"b{i}", 0.05).on_queue("b").dispatch())

    Span("a-long", 2.0).on_queue("a").dispatch()
    push_b(0)
    w = rig.worker("--queue", "a,b", "--concurrency", "4", name="w")
    wait_for(lambda: rig.count("started", "a-long") == 1, 20, 0.01, message="a's job started")
    ka = rig.app.queue_for(None).keys("a")
    garbled = [
        ka.ready, ka.delayed, ka.reserved, ka.notify, ka.jobs, ka.attempts,
        ka.done, ka.failed, ka.failed_info, ka.failed_body, ka.tokens,
    ]  # fmt: skip
    for key in garbled:
        direct.set(key, "not-a-queue-key")
    # b's jobs: while a's job runs, as it ends (its ack meets the wrong types), after.
    for i in range(1, 13):
        push_b(i)
        time.sleep(0.25)
    wait_for(
        lambda: all(rig.count("exec", n) >= 1 for n in b_ids), 20, 0.05, message="b's jobs ran"
    )
    time.sleep(3 * LEASE + 1.0)  # time for an unacked job to stall and run again
    started = {n: rig.count("started", n) for n in b_ids}
    statuses = {n: rig.app.job_status(i, "b") for n, i in b_ids.items()}
    failed = failed_ids(rig, ["b"])
    log = w.output()
    errors = [line for line in log.splitlines() if "ERROR" in line]
    figure(
        f"wrong-typed keys of a: b runs {sorted(set(started.values()))}, statuses "
        f"{sorted({str(s) for s in statuses.values()})}, b failed {len(failed)}, "
        f"ERROR lines {len(errors)}, alive {w.alive()}"
    )
    assert [line for line in errors if re.search(r"queue '?a'?\b", line)], (
        f"no ERROR line naming queue a:\n{w.tail()}"
    )
    assert {n: c for n, c in started.items() if c != 1} == {}, "b's jobs ran more than once"
    assert failed == {}
    assert set(statuses.values()) == {"done"}, statuses
    assert w.alive(), w.tail()
    assert "reservation lost" not in log
    # job_status without a queue looks at every queue used, a's garbage included.
    for i in b_ids.values():
        assert rig.app.job_status(i) == "done"


# -- 3. a Redis outage longer than the worker's retry give-up -------------------------


@pytest.mark.parametrize(
    "give_up",
    [3.0, pytest.param(60.0, marks=pytest.mark.soak, id="60.0-default")],
)
@pytest.mark.parametrize("ends", ["fails", "succeeds"])
def test_a_redis_move_given_up_on_is_not_read_as_success(
    redis_server: RedisServer, make_rig: Callable[..., Rig], give_up: float, ends: str
) -> None:
    """A chain's first link ends (raises for good / returns) while Redis is down for
    longer than the worker's retry give-up (``TIDINGS_REDIS_GIVE_UP_S``; 60 s by
    default, the soak variant). Giving up is an error, never a success: no ``failed()``
    hook, no ``Failed``/``Processed`` line, no catch pushed, while the job is still
    reserved; it stays for its lease, runs again once Redis is back (its second run
    succeeds) and ends done, and the chain goes on to its next link once."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    first = FirstRunFails("link1", 0.5) if ends == "fails" else Span("link1", 0.5)
    chain(first, Rec("link2", "next")).catch(Rec("caught", "catch")).dispatch()
    extra = {} if give_up == 60.0 else {GIVE_UP_ENV: f"{give_up:g}"}
    w = rig.worker("--concurrency", "4", name="w", extra_env=extra)
    wait_for(lambda: rig.count("started", "link1") == 1, 20, 0.01, message="link1 started")
    redis_server.kill()
    t0 = time.monotonic()
    try:
        # The link ends 0.5 s in; its moves are retried until the give-up, then given up.
        time.sleep(give_up + 3.0)
    finally:
        redis_server.start()
    outage = time.monotonic() - t0
    wait_for(
        lambda: rig.count("exec", "link2") >= 1 or rig.count("exec", "caught") >= 1,
        40,
        0.05,
        message="the chain went on (next link or catch)",
    )
    time.sleep(1.0)  # a wrongly pushed next link or catch has time to run too
    log = w.output()
    processing = re.findall(r"([0-9a-f]{32}) Processing +(?:FirstRunFails|Span)", log)
    link1_id = processing[0] if processing else "?"
    processed = len(re.findall(rf"{link1_id} Processed", log))
    failed_lines = len(re.findall(rf"{link1_id} Failed", log))
    hooks = rig.count("hooks", "link1")
    status = rig.app.job_status(link1_id)
    figure(
        f"outage {outage:.1f}s, give-up {give_up:g}s, link1 {ends}: gave up "
        f"{'giving up' in log}, failed() {hooks}, Processed {processed}, Failed "
        f"{failed_lines}, catch {rig.count('exec', 'caught')}, next "
        f"{rig.count('exec', 'link2')}, status {status}"
    )
    assert re.search(r"ERROR.*giv(e|ing) up", log), f"no give-up logged:\n{w.tail()}"
    assert hooks == 0, "failed() ran for a job whose failure was never recorded"
    assert failed_lines == 0, "JobFailed emitted for a job still reserved"
    assert processed <= 1, "JobProcessed emitted for a run whose ack was given up on"
    assert rig.count("exec", "caught") == 0
    assert rig.count("exec", "link2") == 1
    assert status == "done"
    assert failed_ids(rig) == {}
    assert w.alive()


# -- 4. SIGUSR2 while a pop rides behind the blocking wait ----------------------------


def test_a_paused_worker_starts_nothing_its_waiting_pop_reserved(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """An idle worker sits in its blocking wait (a pop pipelined behind it); SIGUSR2
    pauses it; jobs dispatched then must not start until SIGCONT resumes it."""
    rig = make_rig(redis_server.url, retry_after=LEASE)
    direct = redis_server.client()
    w = rig.worker("--concurrency", "4", "--sleep", "10", name="w")
    wait_for(lambda: blocked_on_wait(direct), 20, 0.05, message="worker in its blocking wait")
    w.signal(signal.SIGUSR2)
    wait_for(lambda: "paused" in w.output(), 10, 0.05, message="worker paused")
    names = [f"p{i}" for i in range(3)]
    for n in names:
        Plain(n).dispatch()
    time.sleep(2.0)
    started_paused = {n: rig.count("started", n) for n in names}
    w.signal(signal.SIGCONT)
    wait_for(lambda: all(rig.count("exec", n) == 1 for n in names), 20, 0.05, message="ran")
    figure(f"paused worker: {sum(started_paused.values())} of {len(names)} started while paused")
    assert started_paused == dict.fromkeys(names, 0), f"started while paused:\n{w.tail()}"
    wait_for(rig.drained, 10, 0.05, message="acked")
    assert failed_ids(rig) == {}


# -- 5. a poison job among ordinary ones ----------------------------------------------


def test_a_poison_job_does_not_take_the_jobs_popped_beside_it_to_the_failed_store(
    redis_server: RedisServer, make_rig: Callable[..., Rig]
) -> None:
    """One job that kills its process (tries 2) and 20 quick ones dispatched after it;
    ``notify-worker --processes 1`` (concurrency 16) restarts the crashed child. The
    poison ends in the failed store after at most 1 + max_stalls (3) runs; every one of
    the 20 ends done, none failed as stalled."""
    lease = 2.0
    rig = make_rig(redis_server.url, retry_after=lease)
    poison_id = str(PoisonTwice("poison").dispatch())
    names = [f"q{i}" for i in range(20)]
    ids = {n: str(Plain(n).dispatch()) for n in names}
    w: Proc = rig.worker("--processes", "1", "--concurrency", "16", name="sup")
    try:

        def settled() -> bool:
            failed = failed_ids(rig)
            return poison_id in failed and all(
                i in failed or rig.app.job_status(i) == "done" for i in ids.values()
            )

        wait_for(settled, 90, 0.2, message="poison failed and the 20 settled")
    finally:
        w.stop(timeout_s=15)
    failed = failed_ids(rig)
    innocent_failed = {n: failed[i].splitlines()[-1] for n, i in ids.items() if i in failed}
    runs = rig.count("started", "poison")
    figure(
        f"poison (tries 2, lease {lease:g}s, --processes 1): {runs} runs; "
        f"{len(innocent_failed)} of 20 ordinary jobs failed: "
        f"{sorted(set(innocent_failed.values()))[:2]}"
    )
    assert innocent_failed == {}
    assert all(rig.app.job_status(i) == "done" for i in ids.values())
    assert 1 <= runs <= 4
