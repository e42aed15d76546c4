"""Failover on Redis Cluster and Sentinel with a per-id ledger.

Each test starts its own group (6-node cluster, or master + replica + 3 sentinels), two
``notify-worker --queue high,default --concurrency 4`` processes, and a producer thread
dispatching ~200 jobs/s alternately to both queues. About 1 s into the drain the fault
strikes: ``kill -9`` of the master serving ``high`` (Cluster) or of the master
(Sentinel), or a ``CLUSTER FAILOVER`` / ``SENTINEL FAILOVER``. The accounting lives on a
separate Redis that no fault touches (tests/faults/fault_app.py).

The ledger holds every job whose ``dispatch()`` returned. Afterwards:

* lost: ledger ids neither executed nor in the failed store. Must be 0, except after
  ``SENTINEL FAILOVER``: Sentinel demotes the old master only seconds after promoting its
  replica (11 s measured), and until then the old master takes writes on the
  connections clients already hold, then drops them when it resynchronises. There, a
  lost id must have been dispatched inside that split (after the replica left the old
  master, before the old master turned replica): anything else is a loss of ours;
* run twice: executions beyond the first (bounded by the jobs in flight);
* ran, then failed: a run whose ack was lost in the switch, delivered again and failed
  as MaxAttemptsExceeded (tries 1). Recorded, not asserted: counting such stalls apart
  from attempts is the stall counter's work;
* stranded: jobs left ready/delayed/reserved once the workers are idle (must be 0);
* dispatch errors: ``QueueUnavailable`` during the switch (anything else fails the test);
* worker pause: the longest stretch without an execution after the fault;
* every worker still running.

Asynchronous replication can lose a write the old master acknowledged but had not sent
to its replica yet; on loopback at 200 jobs/s that window is well under a millisecond,
and these tests ask for 0 lost. docs/guarantees.md says what is and is not promised.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.faults.conftest import Rig, Sampler, figure
from tests.faults.fault_app import Once
from tests.support import wait_for
from tests.support.topology import ClusterGroup, SentinelGroup
from tidings.errors import QueueUnavailable

pytestmark = pytest.mark.timeout(120)

WORKERS = 2
CONCURRENCY = 4
QUEUES = ("high", "default")


class Producer:
    """Dispatches Once jobs alternately to both queues in a thread, keeping a ledger."""

    def __init__(self, rig: Rig, rate_per_s: float = 200.0) -> None:
        self.rig = rig
        self.pause_s = 1.0 / rate_per_s
        self.ledger: dict[str, str] = {}  # job id -> record name
        self.times: dict[str, tuple[float, float]] = {}  # name -> dispatch began, returned
        self.unavailable = 0
        self.last_unavailable = ""
        self.other_errors: list[str] = []
        self.error_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            name = f"f{i}"
            began = time.monotonic()
            try:
                job_id = Once(name).on_queue(QUEUES[i % 2]).dispatch()
            except QueueUnavailable as exc:
                self.unavailable += 1
                self.last_unavailable = str(exc)
                self.error_times.append(time.monotonic())
                # The push may have happened all the same (a lost reply, or not
                # confirmed by a replica): the next try is a new job, with a new name.
                i += 1
                self._stop.wait(0.05)
                continue
            except Exception as exc:  # must not happen: producers raise QueueUnavailable
                self.other_errors.append(f"{type(exc).__name__}: {exc}")
                self._stop.wait(0.05)
                continue
            assert job_id is not None
            self.ledger[job_id] = name
            self.times[name] = (began, time.monotonic())
            i += 1
            self._stop.wait(self.pause_s)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def _sizes(rig: Rig) -> dict[str, int]:
    total = {"ready": 0, "delayed": 0, "reserved": 0}
    for sizes in rig.app.queue_for(None).sizes(list(QUEUES)).values():
        for k in total:
            total[k] += sizes[k]
    return total


class SplitWatch:
    """Polls the old master during a Sentinel failover: the last moment a replica still
    replicated from it, and the first moment it reported itself a replica. Writes it
    took between the two are the ones asynchronous replication may drop."""

    def __init__(self, server: redis.Redis) -> None:
        self._r = server
        self.last_replicated: float | None = None
        self.demoted: float | None = None
        self.wall_offset = time.time() - time.monotonic()  # to place runs (wall clock)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.demoted is None:
            t = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                info = self._r.info("replication")
                if info.get("role") != "master":
                    self.demoted = t
                elif int(info.get("connected_slaves", 0)) >= 1:
                    self.last_replicated = t
            self._stop.wait(0.01)

    def __enter__(self) -> SplitWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._r.close()


def _longest_pause(samples: list[tuple[float, int]], t0: float, t1: float) -> float:
    last_t, last_n, longest = t0, None, 0.0
    for t, n in samples:
        if t < t0 or t > t1:
            continue
        if last_n is None or n > last_n:
            longest = max(longest, t - last_t)
            last_t, last_n = t, n
    return longest


def _drill(
    rig: Rig,
    fault: Callable[[], float],
    row: str,
    worker_queues: tuple[str, ...] = QUEUES,
    split: SplitWatch | None = None,
    confirmed: bool = False,
) -> None:
    """Workers on ``worker_queues``; others (there must be some on every queue) on the
    rest, one per queue. ``split``: the old master of a Sentinel failover, watched.
    ``confirmed``: the producer has ``wait_replicas=1``, so nothing may be lost, not even
    in the split."""
    workers = [
        rig.worker("--queue", ",".join(worker_queues), "--concurrency", str(CONCURRENCY),
                   name=f"w{i}")
        for i in range(WORKERS)
    ]  # fmt: skip
    workers += [
        rig.worker("--queue", q, "--concurrency", str(CONCURRENCY), name=f"w-{q}")
        for q in QUEUES
        if q not in worker_queues
    ]
    with Sampler(rig, 0.05) as sampler:
        with Producer(rig) as producer:
            wait_for(lambda: rig.executed() >= 200, 30, 0.05, message="200 executed")
            t_fault = time.monotonic()
            at_fault = rig.executed()
            promotion_s = fault()
            time.sleep(0.5)  # the demoted primary takes acks until Sentinel reconfigures it
            at_promotion = rig.executed()
            wait_for(lambda: rig.executed() >= at_promotion + 100, 30, 0.05, message="progress")
            time.sleep(1.0)
        t_end = time.monotonic()
        if split is not None:
            wait_for(lambda: split.demoted is not None, 30, 0.05, message="old master demoted")
        app_rq = rig.app.queue_for(None)

        def settled() -> bool:
            failed = {f.id for f in app_rq.failed(list(QUEUES))}
            done = set(rig.hash("exec"))
            return all(i in failed or n in done for i, n in producer.ledger.items())

        with contextlib.suppress(TimeoutError):  # counted as lost below
            wait_for(settled, 30, 0.2, message="every ledger id done or failed")
        with contextlib.suppress(TimeoutError):  # counted as stranded below
            wait_for(lambda: _sizes(rig) == {"ready": 0, "delayed": 0, "reserved": 0}, 20, 0.2)
    counts = rig.hash("exec")
    failed = {f.id: f for f in app_rq.failed(list(QUEUES))}
    lost = [n for i, n in producer.ledger.items() if i not in failed and n not in counts]
    twice = sum(c - 1 for c in counts.values() if c > 1)
    ran_then_failed = [n for i, n in producer.ledger.items() if i in failed and n in counts]
    failed_other = [
        f.exception.strip().splitlines()[-1] for i, f in failed.items()
        if producer.ledger.get(i) not in counts
    ]  # fmt: skip
    reasons: dict[str, int] = {}
    for i, f in failed.items():
        if producer.ledger.get(i) in counts:
            last = (f.exception.strip().splitlines() or ["?"])[-1][:80]
            reasons[last] = reasons.get(last, 0) + 1
    stranded = sum(_sizes(rig).values())
    split_lost: list[str] = []  # lost in a Sentinel split, inside its window
    split_note = ""
    if split is not None:
        assert split.last_replicated is not None and split.demoted is not None
        # Replication on loopback lags well under the 10 ms poll: 50 ms of slack.
        lo, hi = split.last_replicated - 0.05, split.demoted + 0.05
        # A push can be lost in the split only if it reached the old master inside it:
        # its dispatch returned after the replica left and began before the demotion.
        split_lost = [n for n in lost if producer.times[n][1] >= lo and producer.times[n][0] <= hi]
        if not confirmed:
            lost = [n for n in lost if n not in split_lost]
        split_note = (
            f", lost in the split {len(split_lost)} (the old master took writes for "
            f"{split.demoted - split.last_replicated:.2f}s after its replica left"
        )
        if split_lost:
            ends = [producer.times[n][1] - split.last_replicated for n in split_lost]
            queues = [QUEUES[int(n[1:]) % 2] for n in split_lost]
            split_note += (
                f"; those returned {min(ends):.2f}-{max(ends):.2f}s after it left, "
                f"{queues.count('high')} high, {queues.count('default')} default"
            )
        # Twice-run ids: each must have run inside the split (a copy on each primary, or
        # an ack sent to the other one); anywhere else, a second run is a bug of ours.
        runs: dict[str, list[float]] = {}
        for raw in rig.acct.lrange(f"{rig.account_prefix}:runs", 0, -1):
            name, wall = raw.decode().split()
            runs.setdefault(name, []).append(float(wall) - split.wall_offset)
        twice_ids = [n for n, c in counts.items() if c > 1]
        twice_outside = [
            n for n in twice_ids if not any(lo - 0.5 <= t <= hi + 0.5 for t in runs.get(n, []))
        ]
        assert twice_outside == [], [(n, runs.get(n), lo, hi) for n in twice_outside[:5]]
        if twice_ids:
            again = [producer.times[n][1] - split.last_replicated
                     for n in twice_ids if n in producer.times]  # fmt: skip
            if again:  # (a dispatch that raised has no time, and may have run too)
                split_note += (
                    f"; those run twice were dispatched {min(again):.2f}-{max(again):.2f}s "
                    f"after it left"
                )
        split_note += ")"
    pause = _longest_pause(sampler.samples, t_fault, t_end)
    errors = ""
    if producer.error_times:
        first, last = (t - t_fault for t in (producer.error_times[0], producer.error_times[-1]))
        errors = f" from {first:.2f}s to {last:.2f}s after the fault (last: "
        errors += f"{producer.last_unavailable[:100]})"
    figure(
        f"{row}: promotion {promotion_s:.2f}s; {len(producer.ledger)} dispatched, "
        f"{producer.unavailable} QueueUnavailable{errors}, "
        f"{len(producer.other_errors)} other errors; "
        f"lost {len(lost)}{split_note}, run twice {twice}, ran then failed (MaxAttemptsExceeded) "
        f"{len(ran_then_failed)} {reasons or ''}, failed unrun {len(failed_other)}, "
        f"stranded {stranded}; "
        f"longest worker pause {pause:.2f}s"
    )
    alive = [w.alive() for w in workers]
    assert producer.other_errors == []
    assert lost == [], [(n, producer.times[n]) for n in lost[:10]]
    assert failed_other == []
    assert stranded == 0
    # A run whose ack reached the old primary after the promotion (asynchronous
    # replication: SENTINEL FAILOVER does not pause the old primary's clients, as CLUSTER
    # FAILOVER does) runs again once its lease expires: a stall, not an attempt. So runs
    # twice are bounded by the jobs in flight plus the jobs finished in the switch.
    # After SENTINEL FAILOVER they are bounded by the split instead (checked above): every
    # job ready when the replica left is on both primaries, and how many there are
    # depends on how far the workers lag, which load decides (565 on a busy machine).
    window = at_promotion - at_fault
    if split is None:
        assert twice <= len(workers) * CONCURRENCY + window, (twice, window)
    # ... and such a job never lands in the failed store (stalls are not attempts).
    assert ran_then_failed == [], reasons
    assert all(alive), rig.logs()[-3000:]
    assert "Traceback" not in rig.logs(), rig.logs()[-3000:]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterGroup]:
    with ClusterGroup(tmp_path / "cluster", node_timeout_ms=1000) as group:
        yield group


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path / "sentinel", down_after_ms=1000) as group:
        yield group


def _high_key(rig: Rig) -> str:
    return rig.app.queue_for(None).keys("high").ready


@pytest.mark.parametrize("worker_queues", [QUEUES, ("high",)], ids=["two-queues", "one-queue"])
def test_cluster_kill_9_of_a_master_mid_drain(
    cluster: ClusterGroup, make_rig: Callable[..., Rig], worker_queues: tuple[str, ...]
) -> None:
    """one-queue: the waits carrying a pop, on a connection to the slot's primary, must
    find the promoted replica."""
    rig = make_rig(cluster.url)
    row = f"cluster kill -9 master, workers on {','.join(worker_queues)}"
    _drill(rig, lambda: cluster.kill_master_of(_high_key(rig))[2], row, worker_queues)


def test_cluster_failover_mid_drain(cluster: ClusterGroup, make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(cluster.url)
    _drill(rig, lambda: cluster.failover_master_of(_high_key(rig))[2], "cluster CLUSTER FAILOVER")


def test_sentinel_kill_9_of_the_master_mid_drain(
    sentinel: SentinelGroup, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(sentinel.url)
    _drill(rig, lambda: sentinel.kill_master()[1], "sentinel kill -9 master")


@pytest.mark.parametrize("confirmed", [False, True], ids=["default", "wait-replicas"])
def test_sentinel_failover_mid_drain(
    sentinel: SentinelGroup, make_rig: Callable[..., Rig], confirmed: bool
) -> None:
    """default: lost ids are allowed only inside the split (see the module docstring).
    wait-replicas: with ``TIDINGS_WAIT_REPLICAS=1`` a push the old master takes in the
    split is confirmed by no replica, so ``dispatch()`` raises instead of returning:
    every id whose dispatch returned must be done or failed, split or not."""
    options = {"wait_replicas": 1, "wait_replicas_timeout": 0.1} if confirmed else {}
    rig = make_rig(sentinel.url, app_options=options)
    old = sentinel.server_on(sentinel.current_master_port())
    row = "sentinel SENTINEL FAILOVER" + (", wait_replicas=1" if confirmed else "")
    with SplitWatch(old.client(socket_timeout=1.0)) as split:
        _drill(rig, lambda: sentinel.failover()[1], row, split=split, confirmed=confirmed)


def test_wait_replicas_pushes_follow_a_cluster_failover(
    cluster: ClusterGroup, make_rig: Callable[..., Rig]
) -> None:
    """With ``wait_replicas`` a push goes straight to its slot's primary (a pipeline
    with ``WAIT``), past the cluster client's routing: after a ``CLUSTER FAILOVER`` the
    old primary answers ``MOVED``, and the client's slot map must be reloaded, or every
    later push raises QueueUnavailable. Sync and async dispatches must both get through
    within a few tries."""
    rig = make_rig(cluster.url, app_options={"wait_replicas": 1, "wait_replicas_timeout": 0.5})
    assert Once("before").on_queue("high").dispatch()

    async def dispatch_async(name: str) -> str | None:
        return await Once(name).on_queue("high").dispatch_async()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(dispatch_async("before-async"))
        cluster.failover_master_of(_high_key(rig))
        for kind in ("sync", "async"):
            errors: list[str] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                try:
                    name = f"after-{kind}-{len(errors)}"
                    if kind == "sync":
                        assert Once(name).on_queue("high").dispatch()
                    else:
                        assert loop.run_until_complete(dispatch_async(name))
                    break
                except QueueUnavailable as exc:
                    errors.append(str(exc))
                    time.sleep(0.2)
            else:
                pytest.fail(f"{kind} pushes still refused after the failover: {errors[-3:]}")
            figure(f"cluster wait_replicas after CLUSTER FAILOVER: {kind} push refused "
                   f"{len(errors)} times first")  # fmt: skip
    finally:
        loop.close()
