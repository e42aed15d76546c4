"""The fault-schedule checker: real workers, real Redis, a seeded schedule of
faults, and every job's outcome accounted for by id.

One :class:`Checker` owns a private redis-server (AOF, ``appendfsync always``), a
:class:`~tests.support.FaultProxy` in front of it, and ``notify-worker`` processes
(``tests.faults.fault_app:app``) that reach Redis through the proxy; job accounting goes
to a separate Redis the faults never touch. :meth:`Checker.run_seed` then, for one seed:

1. dispatches two chains and two batches (below), then arms the proxy to drop, with a
   seeded probability, the replies of some move kinds (push, pop, ack, release, fail,
   extend; batch_record and push_once) after the command ran;
2. produces ``Rec`` jobs (they log ``id pid arg`` and count their completion) and
   ``Flaky`` jobs (tries 3, always raise) through the proxy, re-sending a push that
   failed with the same id and envelope, as a careful producer does;
3. meanwhile applies the seed's faults: SIGKILL a worker (a new one starts), SIGSTOP one
   past its lease then SIGCONT, SIGKILL Redis and start it again on its AOF, reset every
   proxied connection;
4. waits until every job settled, retries one failed job, and checks the invariants:

   * every dispatched job ends done or failed, never both, never neither;
   * a job that did not stall (none of its runs was on a killed or frozen worker, no
     worker logged its reservation lost, and no Redis outage outlasted two thirds of
     the lease) ran exactly once (Rec) or exactly ``tries`` times (Flaky), and its
     failed record counts those attempts;
   * every run saw the arguments it was dispatched with; the failed store holds the
     envelope byte for byte; a retried job runs again with its arguments;
   * chains (one that succeeds, one whose second link fails for good): links run in
     order; the failed chain's catch runs and its next link never does; the good
     chain's catch never runs; each ran once unless a crash or freeze hit its run;
   * batches (one whose members all succeed, one with a member that fails for good;
     ``allow_failures`` or not; some members delayed into the faults and past a cancel):
     total/pending/processed/failed equal the members' outcomes in the done and failed
     stores, id by id (a member skipped by the cancel is processed and done); cancelled
     exactly when a member failed without allow_failures; every member ran once (the
     failing one ``tries`` times; a skipped one never); ``then`` ran iff nothing failed,
     ``catch`` iff something did, ``finally`` always, each under its fixed id and once
     unless a crash or freeze hit its run; ``then`` and ``finally`` started after every
     member's last run ended (one ordered event log) and not before the batch's
     ``finished_at``, ``catch`` after the final run of the member that failed;
   * no worker logged an internal error;
   * with ``--groups`` (fair groups, issue 25): no group key is left once every job
     settled, and group g0's concurrency limit of 1 held during the faults: its jobs log
     the start and end of every run (the accounting Redis's TIME) and no two runs
     overlapped, unless one of them was on a worker killed or frozen in the seed, or
     lost its reservation, or a Redis outage outlasted two thirds of the lease (the
     exactly-once waivers; see :func:`g0_overlaps`).

``--control`` (issue 23) adds, from its own random stream: every job dispatched at a
random priority (0 or -100..100); a third of the plain jobs keep a small result
(``Kept``), a third also sleep 0.2-0.8 s (``Slow``, so they are often running); a
canceller that, every few pushes, cancels a random job (waiting, running or finished,
often a Slow one) through the proxy, re-sending a cancel whose reply was lost, and
logs a marker in the run log once it returned; the cancel's reply among the replies
the proxy may drop. Result writes are counted from Redis's keyspace notifications (SET
of a result key, straight from the queue's Redis; the replay of the AOF after a
restart is dropped). Checked per job id:

   * it ends one way: done, failed or cancelled; cancelled only if a cancel was sent;
   * no start after a cancel returned ``cancelled`` (it was waiting), at most the one
     reserved run after ``cancelling`` (running), unless the job stalled or was retried;
   * a job whose cancel returned ``cancelled`` or ``cancelling`` never ends failed (but
     as "stalled" after a crash), and ``cancelled`` never ends done unless it stalled;
   * a job whose cancel returned ``failing`` (its failure had opened) ends failed
     unless it stalled;
   * a result is written at most once per completed run, only for a job that keeps
     one and ended done, never for a failed or cancelled one; the stored value is the
     one a run of that job returned (its argument and pid); a done job keeping a result
     has exactly one write when no run of it stalled.

``python -m tests.faults.checker --seeds 1000`` (or ``benchmarks/checker.py``) runs a
soak and prints the seed of any violation; ``--seed N`` replays one. The test suite runs
a few seeds (tests/faults/test_checker.py), three of them with ``--control``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.faults.fault_app import (  # noqa: E402
    Callback,
    FailingMember,
    FirstRunFails,
    Flaky,
    Kept,
    LongRec,
    Member,
    PoisonTwice,
    Rec,
    Slow,
)
from tests.support import FaultProxy, RedisServer  # noqa: E402
from tidings import App, Job, batch, chain  # noqa: E402
from tidings.errors import QueueUnavailable  # noqa: E402
from tidings.jobs.compose import prepare  # noqa: E402
from tidings.jobs.job import PendingDispatch  # noqa: E402
from tidings.moves.queues import RedisQueue  # noqa: E402
from tidings.redis import scripts  # noqa: E402
from tidings.redis.keys import BatchKeys  # noqa: E402
from tidings.wire.envelope import envelope_id  # noqa: E402
from tidings.wire.results import open_result  # noqa: E402
from tidings.workflows.batch import BatchInfo  # noqa: E402

KEY = "checker-key-0123456789abcdef-0123456"
MODULE = "tests.faults.fault_app"
LEASE_S = 1.5
FLAKY_TRIES = 3
KINDS: dict[str, scripts.LuaScript] = {
    "push": scripts.PUSH,
    "pop": scripts.POP,
    "ack": scripts.ACK,
    "release": scripts.RELEASE,
    "fail": scripts.FAIL,
    "extend": scripts.EXTEND,
}
# Drawn from the seed's batch stream (the schedules of the seeds above stay as they were):
# a worker re-sends these after a lost reply, and the re-send must count nothing twice
# and push no callback twice.
BATCH_KINDS: dict[str, scripts.LuaScript] = {
    "batch_record": scripts.BATCH_RECORD,
    "push_once": scripts.PUSH_ONCE,
}
CALLBACKS = ("then", "catch", "finally")
FAULTS = ("kill", "stop", "restart", "reset")
# A Redis outage this long can outlast a lease (renewed every third of it): jobs then
# stall and run again, as the docs promise, so the seed's exactly-once checks are waived.
OUTAGE_STALLS_S = LEASE_S * 2 / 3 - 0.2
EVERYONE = -1  # in ``affected``: every run may have stalled
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
# Faults of the worker's own state (issue 21), one a seed when ``state_faults`` is on,
# drawn from their own random stream (the schedules above stay as they were):
#   longstop   a job longer than the lease; its worker is frozen past the lease while a
#              push wakes the wait it sits in (the pop behind it hands the job back to the
#              same frozen worker); the job must end done, run at most twice, never
#              twice at once in one process
#   wrongtype  every key of queue ``junk`` (the workers serve ``default,junk``) becomes
#              a string while a job of ``junk`` runs: an ERROR names ``junk``, the
#              workers live on, and ``default``'s jobs keep every invariant
#   outage     Redis is down longer than the workers' retry give-up
#              (``TIDINGS_REDIS_GIVE_UP_S``) while a job fails: giving up is not success
#              (its failed() hook, Failed line and failed record agree)
#   poison     a job that kills its worker (tries 2) among ordinary ones; dead workers
#              are started again: it ends failed after <= 1 + max_stalls runs, and no
#              ordinary job ends failed
STATE_FAULTS = ("longstop", "wrongtype", "outage", "poison")
GIVE_UP_S = 2.0
GIVE_UP_ENV = "TIDINGS_REDIS_GIVE_UP_S"
JUNK = "junk"
MAX_STALLS = 3
# The control mode (issue 23), drawn from its own random stream: every job gets a random
# priority, some keep a result (Kept, Slow), some run long enough to be cancelled while
# they run (Slow), and a canceller cancels random jobs, waiting or running, with the
# cancel's reply among the ones the proxy may drop.
CANCEL_REPLIES = ("cancelled", "cancelling", "done", "failed", "cancelled already", "failing")

# How long a run of group g0 (concurrency 1) lasts in ``--groups`` mode: long enough that
# two runs let through together would overlap in the spans the jobs log.
HOLD_S = 0.03


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class Outcome:
    """What one seed did and found."""

    seed: int
    jobs: int
    faults: list[str]
    drops: dict[str, int]
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    state: str = ""
    g0_runs: int = 0


@dataclass
class _Batch:
    """One dispatched batch: member names (``<tag>m<i>``), the one meant to fail for
    good (None in the batch meant to succeed), and the ids read back after dispatch."""

    tag: str
    id: str
    names: list[str]
    failing: str | None
    allow: bool
    member_ids: set[str]
    callback_ids: dict[str, str]


@dataclass
class _Sent:
    name: str
    arg: str
    envelope: bytes
    flaky: bool
    keeps: bool = False  # stores its result (control mode)
    slow: bool = False  # runs long enough to be cancelled while it runs


@dataclass
class _Cancel:
    """One cancel the canceller sent (re-sent with the same id after a lost reply):
    its final reply, whether it was re-sent, and where its marker sits in the run log
    (every start logged after it started after the cancel returned)."""

    reply: str
    resent: bool
    marker: int = -1


class _ResultWrites(threading.Thread):
    """Counts the writes of result keys (keyspace notifications of SET, straight from
    the queue's Redis, not through the proxy): a result is written at most once per
    successful run, never for a failed or cancelled job. A reconnect (Redis restarted)
    may miss some: ``gaps`` says so, and only "at most" is checked then. The replay of
    the AOF after a restart is announced too: it is dropped, not counted."""

    def __init__(self, host: str, port: int, pattern: str) -> None:
        super().__init__(daemon=True, name="result-writes")
        self.host, self.port, self.pattern = host, port, pattern
        self.counts: dict[str, int] = {}
        self.gaps = 0
        self.ready = threading.Event()
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        probe = redis.Redis(host=self.host, port=self.port, socket_timeout=2)
        while not self.halt.is_set():
            client = redis.Redis(host=self.host, port=self.port, socket_timeout=2)
            try:
                # redis-py reconnects a PubSub on its own and subscribes again: each
                # confirmation after the first is a reconnect (Redis restarted).
                pubsub = client.pubsub()
                pubsub.psubscribe(self.pattern)
                # A new subscription after the first (the last one broke for good while
                # Redis was down) may meet the AOF load too.
                confirmed = 1 if self.ready.is_set() else 0
                while not self.halt.is_set():
                    m = pubsub.get_message(timeout=0.2)
                    if m is None:
                        continue
                    if m.get("type") == "psubscribe":
                        confirmed += 1
                        if confirmed > 1:
                            self._skip_replay(probe, pubsub)
                        self.ready.set()
                    elif m.get("type") == "pmessage" and m.get("data") == b"set":
                        job_id = _text(m["channel"]).rsplit(":", 1)[1]
                        with self.lock:
                            self.counts[job_id] = self.counts.get(job_id, 0) + 1
            except (redis.RedisError, OSError):
                self.gaps += 1
                time.sleep(0.05)
            finally:
                client.close()
        probe.close()

    def _skip_replay(self, probe: redis.Redis, pubsub: Any) -> None:
        """Subscribed again while Redis loads its AOF: the replayed SETs are announced
        like new ones. Wait for the load to end and drop what came meanwhile (a real
        write in that time is missed: a gap)."""
        self.gaps += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if not probe.info("persistence").get("loading"):
                    break
            except (redis.RedisError, OSError):
                pass
            time.sleep(0.01)
        while pubsub.get_message(timeout=0.05) is not None:
            pass

    def take(self) -> tuple[dict[str, int], int]:
        """The counts and gaps since the last take."""
        with self.lock:
            counts, self.counts = self.counts, {}
        gaps, self.gaps = self.gaps, 0
        return counts, gaps


class Checker:
    """A queue Redis behind a proxy, workers, and the per-seed schedule (module doc)."""

    def __init__(
        self,
        workdir: Path,
        account_url: str,
        *,
        workers: int = 2,
        concurrency: int = 4,
        on_worker: Callable[[subprocess.Popen[bytes]], None] | None = None,
        state_faults: bool = False,
        groups: bool = False,
        control: bool = False,
    ) -> None:
        self.workdir = workdir
        self.groups = groups
        self.state_faults = state_faults
        self.control = control
        self.state_totals: dict[str, int] = {}
        # cancels sent, by final reply; results checked; result writes counted
        self.control_totals: dict[str, int] = {}
        self.server = RedisServer(workdir / "queue")
        self.server.start()
        self._announce_writes()
        self.proxy = FaultProxy(self.server.host, self.server.port)
        self.proxy.start()
        self.prefix = f"chk{os.getpid()}"
        self.acct_prefix = f"{self.prefix}:acct"
        self.acct = redis.Redis.from_url(account_url)
        self.direct = RedisQueue(self.server.url, self.prefix)
        self.writes: _ResultWrites | None = None
        if control:
            pattern = f"__keyspace@0__:{self.direct.keys('default').result('*')}"
            self.writes = _ResultWrites(self.server.host, self.server.port, pattern)
            self.writes.start()
            self.writes.ready.wait(10)
        self.concurrency = concurrency
        self.on_worker = on_worker
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
        self.env.update(
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            TIDINGS_REDIS_URL=self.proxy.url(),
            TIDINGS_KEY=KEY,
            TIDINGS_PREFIX=self.prefix,
            TIDINGS_RETRY_AFTER=str(LEASE_S),
            TIDINGS_ALLOWED_MODULES=MODULE,
            TIDINGS_TEST_ACCOUNT_URL=account_url,
            TIDINGS_TEST_ACCOUNT_PREFIX=self.acct_prefix,
        )
        if state_faults:
            self.env[GIVE_UP_ENV] = f"{GIVE_UP_S:g}"
        self.app = App(
            env=False,
            redis_url=self.proxy.url(),
            key=KEY,
            prefix=self.prefix,
            retry_after=LEASE_S,
            allowed_modules=MODULE,
        )
        self.workers: list[subprocess.Popen[bytes]] = []
        self.retired: list[subprocess.Popen[bytes]] = []
        self._n = 0
        self.drops_total: dict[str, int] = {}
        # batches, members, members skipped (cancelled batch), callback runs, cancelled
        self.batch_totals: dict[str, int] = {}
        self.notes: list[str] = []
        for _ in range(workers):
            self._start_worker()

    # -- processes --------------------------------------------------------------------

    def _start_worker(self) -> subprocess.Popen[bytes]:
        self._n += 1
        cmd = [NOTIFY_WORKER, "-A", f"{MODULE}:app", "--sleep", "1"]
        cmd += ["--concurrency", str(self.concurrency), "--grace", "5"]
        if self.state_faults:
            cmd += ["--queue", f"default,{JUNK}"]
        with open(self.workdir / f"worker-{self._n}.log", "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
        self.workers.append(proc)
        if self.on_worker is not None:
            self.on_worker(proc)
        return proc

    def close(self) -> None:
        """Stop every worker (by PID), the proxy and the server."""
        for p in self.workers:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.send_signal(signal.SIGTERM)
        for p in self.workers + self.retired:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.writes is not None:
            self.writes.halt.set()
            self.writes.join(5)
        self.app.close()
        self.direct.close()
        self.acct.close()
        self.proxy.stop()
        self.server.close()

    def worker_logs(self) -> str:
        out = []
        for path in sorted(self.workdir.glob("worker-*.log")):
            out.append(path.read_text(errors="replace"))
        return "\n".join(out)

    # -- one seed ---------------------------------------------------------------------

    def _push(
        self, job: Job | PendingDispatch, group: str | None = None, delay_s: float = 0.0
    ) -> tuple[str, bytes]:
        pending = job if isinstance(job, PendingDispatch) else PendingDispatch(job)
        queue, job_id, envelope, _, priority = prepare(
            pending, self.app.signer, max_bytes=self.app.max_payload_bytes
        )
        rq = self.app.queue_for(None)
        deadline = time.monotonic() + 30
        while True:
            try:
                rq.push(queue, [(job_id, envelope)], delay_s, priority, group)
                return job_id, envelope
            except QueueUnavailable:
                # The push may have landed: send the very same id and envelope again.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _load_scripts(self) -> None:
        client = self.direct.client
        for script in (
            *KINDS.values(),
            *BATCH_KINDS.values(),
            scripts.PUSH_GROUP,
            scripts.CANCEL,
            scripts.PUSH_PRIORITY,
        ):
            client.script_load(script.source)

    def run_seed(self, seed: int) -> Outcome:
        """Run seed ``seed``'s schedule and check the invariants (module doc)."""
        t_start = time.monotonic()
        rng = random.Random(seed)
        n_rec, n_flaky = rng.randint(15, 40), rng.randint(0, 4)
        kinds = rng.sample(sorted(KINDS), rng.randint(1, len(KINDS)))
        rate = rng.choice((0.05, 0.1, 0.2, 0.3))
        schedule = sorted(
            (rng.uniform(0.0, 1.2), rng.choice(FAULTS)) for _ in range(rng.randint(0, 3))
        )
        out = Outcome(seed, n_rec + n_flaky, [f"{k}@{t:.2f}" for t, k in schedule], {})
        srng = random.Random(f"state {seed}")
        state = srng.choice(STATE_FAULTS) if self.state_faults else ""
        state_at = srng.uniform(0.2, 0.8)
        out.state = state
        self._state: dict[str, object] = {}
        self._seed_affected = affected_set = set[int]()
        self._load_scripts()
        # Two chains, dispatched before the drops are armed (a chain's dispatch is not
        # re-sent by id): one that succeeds, one whose second link fails for good.
        chains = {
            "ok": [f"s{seed}c{i}" for i in range(3)],
            "bad": [f"s{seed}d{i}" for i in range(3)],
        }
        chain(*(Rec(n, n) for n in chains["ok"])).catch(Rec(f"s{seed}cx", "catch")).dispatch()
        d0, d1, d2 = chains["bad"]
        chain(Rec(d0, d0), Flaky(d1, d1), Rec(d2, d2)).catch(Rec(f"s{seed}dx", "catch")).dispatch()
        # Two batches, dispatched there too, from their own random stream: one whose
        # members all succeed, one with a member that fails for good (allow_failures or
        # not); both with then, catch and finally.
        brng = random.Random(f"batches {seed}")
        batches = [self._dispatch_batch(f"s{seed}b{j}", bad, brng) for j, bad in enumerate((0, 1))]
        bkinds = brng.sample(sorted(BATCH_KINDS), brng.randint(0, len(BATCH_KINDS)))
        markers = {k: KINDS[k].sha.encode() for k in kinds}
        markers |= {k: BATCH_KINDS[k].sha.encode() for k in bkinds}
        # Grouped producers (fair groups, issue 25), from their own random stream: most
        # jobs join g0 (concurrency 1), g1 or g2, and push_group's replies may be dropped
        # too; every invariant above holds for them, and no group slot or list is left.
        grng = random.Random(f"groups {seed}")
        group_names: tuple[str | None, ...] = (None,)
        if self.groups:
            group_names = ("g0", "g1", "g2", None)
            self.app.groups.limit("g0", concurrency=1)
            if grng.random() < 0.7:
                markers["push_group"] = scripts.PUSH_GROUP.sha.encode()
        crng = random.Random(f"control {seed}")
        if self.control and crng.random() < 0.7:
            markers["cancel"] = scripts.CANCEL.sha.encode()
        cancels: dict[str, _Cancel] = {}
        if self.writes is not None:
            self.writes.take()  # writes before this seed (none: its keys were flushed)
        self.proxy.drops = {}
        self.proxy.drop_replies(markers, rate=rate, seed=seed)
        jobs: list[tuple[str, str, bool]] = [(f"s{seed}r{i}", "", False) for i in range(n_rec)]
        jobs += [(f"s{seed}f{i}", "", True) for i in range(n_flaky)]
        rng.shuffle(jobs)
        sent: dict[str, _Sent] = {}
        g0: dict[str, str] = {}  # job id -> name of the jobs of group g0 (concurrency 1)
        affected: set[int] = affected_set
        self.notes = []
        log_sizes = self._log_sizes()
        resume: list[tuple[float, subprocess.Popen[bytes]]] = []
        if state in ("longstop", "outage", "wrongtype", "poison"):
            self._state_prepare(state, seed, sent)
        t0 = time.monotonic()
        todo = list(jobs)
        control_until = 1.6 if self.control else 0.0  # the canceller's time
        if self.control:
            # One cancel of a job surely waiting (delayed a minute) in every seed: the
            # random canceller meets waiting jobs only while the workers are busy, which
            # a loaded machine can make rare (3 seeds beside two CPU hogs met none).
            name, arg = f"s{seed}w", f"s{seed}w:waiting"
            job_id, envelope = self._push(Rec(name, arg), delay_s=60.0)
            sent[job_id] = _Sent(name, arg, envelope, False)
            self._cancel(job_id, name, cancels)

        def busy() -> bool:
            return time.monotonic() - t0 < control_until

        while todo or schedule or resume or state or busy():
            now = time.monotonic() - t0
            if state and now >= state_at:
                self._state_fault(state, seed, affected, sent)
                state = ""
            self._revive(None)
            while schedule and schedule[0][0] <= now:
                _, kind = schedule.pop(0)
                self._fault(kind, rng, affected, resume)
            for at, proc in list(resume):
                if time.monotonic() >= at:
                    resume.remove((at, proc))
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGCONT)
            for name, _, flaky in todo[:4]:
                arg = f"{name}:{rng.getrandbits(32):08x}:é✓"
                group = grng.choice(group_names)
                # g0's runs last HOLD_S and log their spans: no two may overlap (below).
                hold = HOLD_S if group == "g0" else 0.0
                job: Job = Flaky(name, arg, hold) if flaky else Rec(name, arg, hold)
                if not self.control:
                    job_id, envelope = self._push(job, group)
                    sent[job_id] = _Sent(name, arg, envelope, flaky)
                    if group == "g0":
                        g0[job_id] = name
                    continue
                kind = crng.random()
                if not flaky and kind < 0.35:
                    job = Kept(name, arg)
                elif not flaky and kind < 0.65:
                    job = Slow(name, arg, round(crng.uniform(0.2, 0.8), 2))
                priority = crng.choice((0, crng.randint(-100, 100)))
                job_id, envelope = self._push(job.with_priority(priority), group)
                keeps, slow = isinstance(job, Kept | Slow), isinstance(job, Slow)
                sent[job_id] = _Sent(name, arg, envelope, flaky, keeps, slow)
                if group == "g0" and not keeps:  # Kept and Slow log no spans
                    g0[job_id] = name
            todo = todo[4:]
            if self.control:
                self._canceller(crng, sent, cancels)
            time.sleep(0.03)
        self._settle(sent, out)
        self.proxy.drop_replies({})
        if self.control:
            self._tally_cancels(cancels)
        if out.state:
            self._state_settle(out)
        retried = self._retry_one(sent, rng, out)
        time.sleep(0.3)  # the last log lines of the slowest run
        stalled = self._stalled_ids(log_sizes)
        self._check(sent, affected, retried, out, stalled, cancels)
        if self.control:
            self._check_control(sent, cancels, affected, stalled, retried, out)
        # A lost reservation of a job that is not one of ours is a chain link's (their ids
        # are made inside the chain): the chains' run counts are waived then.
        batch_ids = {i for b in batches for i in (*b.member_ids, *b.callback_ids.values())}
        links_stalled = bool(stalled - set(sent) - batch_ids)
        self._check_chains(seed, chains, affected | ({EVERYONE} if links_stalled else set()), out)
        self._check_batches(batches, affected, stalled, out)
        if self.groups:
            k = self.direct.keys("default")
            left = sorted(
                _text(key)
                for kind in ("g", "gp", "gr")
                for key in self.direct.client.scan_iter(match=f"{k.ready}:{kind}:*")
            )
            if left or self.direct.client.zcard(k.gring):
                out.violations.append(f"group keys left after every job settled: {left}")
            self._check_group_limit(g0, affected, stalled, out)
        if out.state:
            self._check_state(out.state, sent, out, log_sizes, affected, stalled)
            self.state_totals[out.state] = self.state_totals.get(out.state, 0) + 1
        for kind, n in self.proxy.drops.items():
            out.drops[kind] = out.drops.get(kind, 0) + n
            self.drops_total[kind] = self.drops_total.get(kind, 0) + n
        self._reset_state(sent)
        out.faults += self.notes
        out.seconds = time.monotonic() - t_start
        return out

    def _log_sizes(self) -> dict[Path, int]:
        return {p: p.stat().st_size for p in self.workdir.glob("worker-*.log")}

    def _stalled_ids(self, sizes: dict[Path, int]) -> set[str]:
        """Job ids whose worker logged "reservation lost for <id>" during this seed."""
        found: set[str] = set()
        for path in self.workdir.glob("worker-*.log"):
            with open(path, "rb") as f:
                f.seek(sizes.get(path, 0))
                text = f.read().decode(errors="replace")
            found.update(re.findall(r"reservation lost for ([0-9a-f]{32})", text))
        return found

    def _fault(
        self,
        kind: str,
        rng: random.Random,
        affected: set[int],
        resume: list[tuple[float, subprocess.Popen[bytes]]],
    ) -> None:
        alive = [p for p in self.workers if p.poll() is None]
        if kind == "kill" and alive:
            victim = rng.choice(alive)
            affected.add(victim.pid)
            victim.kill()
            victim.wait(10)
            self.workers.remove(victim)
            self.retired.append(victim)
            self._start_worker()
        elif kind == "stop" and alive:
            victim = rng.choice(alive)
            if any(p is victim for _, p in resume):
                return
            affected.add(victim.pid)
            victim.send_signal(signal.SIGSTOP)
            resume.append((time.monotonic() + LEASE_S + 0.5, victim))
        elif kind == "restart":
            t0 = time.monotonic()
            self.server.restart(hard=True)  # SIGKILL; AOF (always) brings it back
            took = time.monotonic() - t0
            self._announce_writes()
            self.notes.append(f"outage {took:.2f}s")
            if took > OUTAGE_STALLS_S:
                affected.add(EVERYONE)
        elif kind == "reset":
            self.proxy.mode = "reset"
            time.sleep(0.05)
            self.proxy.mode = "pass"

    def _announce_writes(self) -> None:
        """Keyspace notifications of string writes on (control mode), set once Redis
        answers, that is after its AOF is loaded: the replay of a long AOF (1-2 s late in
        a soak) is announced like new writes to a subscriber that reconnected during the
        load, which counted results twice. A write between the load and this call is
        missed (the restart is a gap: only "at most" is checked)."""
        if self.control:
            with redis.Redis(host=self.server.host, port=self.server.port) as c:
                c.config_set("notify-keyspace-events", "K$")

    def _states(self, ids: list[str]) -> dict[str, tuple[bool, bool]]:
        k = self.direct.keys("default")
        pipe = self.direct.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.zscore(k.done, job_id)
            pipe.zscore(k.failed, job_id)
        raw = pipe.execute()
        return {
            job_id: (raw[2 * i] is not None, raw[2 * i + 1] is not None)
            for i, job_id in enumerate(ids)
        }

    def _cancelled(self, ids: list[str]) -> set[str]:
        """The ids among ``ids`` in the queue's cancelled store."""
        k = self.direct.keys("default")
        pipe = self.direct.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.zscore(k.cancelled, job_id)
        return {job_id for job_id, score in zip(ids, pipe.execute(), strict=True) if score}

    def _settle(self, sent: dict[str, _Sent], out: Outcome, timeout_s: float = 40.0) -> None:
        ids = list(sent)
        deadline = time.monotonic() + timeout_s
        states: dict[str, tuple[bool, bool]] = {}
        while True:
            with contextlib.suppress(redis.RedisError):
                states = self._states(ids)
                if self.control:
                    for job_id in self._cancelled(ids):
                        states[job_id] = (True, True)  # settled, as cancelled
                sizes = self.direct.sizes(["default"])["default"]
                busy = sizes["ready"] + sizes["delayed"] + sizes["reserved"]
                if busy == 0 and all(d or f for d, f in states.values()):
                    return
            self._revive(None)
            if time.monotonic() > deadline:
                pending = [sent[i].name for i, (d, f) in states.items() if not (d or f)]
                out.violations.append(f"not settled after {timeout_s:g}s: {pending[:10]}")
                return
            time.sleep(0.05)

    def _retry_one(self, sent: dict[str, _Sent], rng: random.Random, out: Outcome) -> str | None:
        failed = sorted(i for i, (_, f) in self._states(list(sent)).items() if f)
        if not failed:
            return None
        job_id = rng.choice(failed)
        if self.direct.retry([job_id]) != 1:
            out.violations.append(f"failed retry did not move {sent[job_id].name}")
            return None
        self._settle({job_id: sent[job_id]}, out)
        return job_id

    def _check(
        self,
        sent: dict[str, _Sent],
        affected: set[int],
        retried: str | None,
        out: Outcome,
        stalled: set[str],
        cancels: dict[str, _Cancel] | None = None,
    ) -> None:
        k = self.direct.keys("default")
        cancels = cancels or {}
        cancelled = self._cancelled(list(sent)) if self.control else set()
        runs: dict[str, list[tuple[int, str]]] = {}
        for line in self.acct.lrange(f"{self.acct_prefix}:log", 0, -1):
            name, pid, arg = _text(line).split(" ", 2)
            if name.startswith("!"):
                continue  # a canceller's marker (control mode)
            runs.setdefault(name, []).append((int(pid), arg))
        exec_counts = {
            _text(key): int(v) for key, v in self.acct.hgetall(f"{self.acct_prefix}:exec").items()
        }
        states = self._states(list(sent))
        client = self.direct.client
        for job_id, s in sent.items():
            done, failed = states[job_id]
            mine = runs.get(s.name, [])
            touched = (
                EVERYONE in affected or job_id in stalled or any(pid in affected for pid, _ in mine)
            )
            where = f"{s.name} ({job_id})"
            if done and failed:
                out.violations.append(f"{where} is both done and failed")
            if not done and not failed and job_id not in cancelled:
                out.violations.append(f"{where} is neither done nor failed")
            if job_id in cancels:
                # A job a cancel was sent for: its runs and end are _check_control's.
                if any(arg != s.arg for _, arg in mine):
                    out.violations.append(f"{where} ran with other arguments")
                continue
            if any(arg != s.arg for _, arg in mine):
                out.violations.append(f"{where} ran with other arguments")
            if failed:
                body = client.hget(k.failed_body, job_id)
                if body != s.envelope:
                    got = len(body or b"")
                    out.violations.append(f"{where} failed record is not the payload ({got} B)")
            if s.flaky:
                if done:
                    out.violations.append(f"{where}: a Flaky job ended done")
                want = FLAKY_TRIES * (2 if job_id == retried else 1)
                if not touched and len(mine) != want:
                    out.violations.append(f"{where}: Flaky ran {len(mine)} times, not {want}")
                if failed and not touched and job_id != retried:
                    info = self.direct.find_failed(job_id)
                    if info is None or info.attempts != FLAKY_TRIES:
                        attempts = None if info is None else info.attempts
                        out.violations.append(f"{where}: failed after {attempts} attempts")
            else:
                if failed:
                    info = self.direct.find_failed(job_id)
                    reason = info.exception.splitlines()[-1] if info else "?"
                    if not touched or "stalled" not in reason:
                        out.violations.append(f"{where} failed: {reason[:200]}")
                if not touched and (len(mine), exec_counts.get(s.name, 0)) != (1, 1):
                    out.violations.append(
                        f"{where} ran {len(mine)} times ({exec_counts.get(s.name, 0)} "
                        "completed) though no worker running it crashed or froze"
                    )
                if done and exec_counts.get(s.name, 0) < 1:
                    out.violations.append(f"{where} is done but never completed a run")
        if "internal error" in self.worker_logs():
            out.violations.append("a worker logged an internal error")

    # -- control mode (issue 23): cancels, results, priorities --------------------------

    def _canceller(
        self, crng: random.Random, sent: dict[str, _Sent], cancels: dict[str, _Cancel]
    ) -> None:
        """Now and then cancel a random job not cancelled yet: half the time a Slow one
        (often running), else any (often waiting, or finished already)."""
        if crng.random() > 0.3:
            return
        # The longstop fault's long job must end done (its own invariant): not cancelled.
        long = self._state.get("long")
        spared = {long[0]} if isinstance(long, tuple) else set()
        todo = [i for i in sent if i not in cancels and i not in spared]
        slow = [i for i in todo if sent[i].slow]
        pool = slow if slow and crng.random() < 0.5 else todo
        if pool:
            job_id = crng.choice(sorted(pool))
            self._cancel(job_id, sent[job_id].name, cancels)

    def _cancel(self, job_id: str, name: str, cancels: dict[str, _Cancel]) -> None:
        """``app.cancel`` through the proxy, re-sent with the same id after a lost reply
        (as a careful canceller does: a cancel is safe to send twice); then a marker in
        the run log, after which no start of a job cancelled while waiting may appear."""
        deadline = time.monotonic() + 30
        resent = False
        while True:
            try:
                reply = str(self.app.cancel(job_id, queue="default"))
                break
            except QueueUnavailable:
                if time.monotonic() > deadline:
                    self.notes.append(f"cancel of {name} never answered")
                    return
                resent = True
                time.sleep(0.05)
        marker = int(self.acct.rpush(f"{self.acct_prefix}:log", f"!c:{name} 0 {reply}")) - 1
        cancels[job_id] = _Cancel(reply, resent, marker)

    def _tally_cancels(self, cancels: dict[str, _Cancel]) -> None:
        for c in cancels.values():
            key = f"cancel {c.reply}"
            self.control_totals[key] = self.control_totals.get(key, 0) + 1
            if c.resent:
                self.control_totals["cancel re-sent"] = (
                    self.control_totals.get("cancel re-sent", 0) + 1
                )

    def _check_control(
        self,
        sent: dict[str, _Sent],
        cancels: dict[str, _Cancel],
        affected: set[int],
        stalled: set[str],
        retried: str | None,
        out: Outcome,
    ) -> None:
        """Per job id: one end (done, failed or cancelled); cancelled only after a cancel
        was sent; no start after a cancel returned ``cancelled`` (it was waiting), at most
        the one reserved run after ``cancelling``; a cancelled job never failed as an
        error; a result written at most once per completed run, only by a job that keeps
        one and ended done, never for a failed or cancelled one, and it is the value one
        of the job's own runs returned."""
        assert self.writes is not None
        time.sleep(0.2)  # the last keyspace events
        writes, gaps = self.writes.take()
        k = self.direct.keys("default")
        starts: dict[str, list[tuple[int, int]]] = {}
        for pos, line in enumerate(self.acct.lrange(f"{self.acct_prefix}:log", 0, -1)):
            name, pid, _ = _text(line).split(" ", 2)
            starts.setdefault(name, []).append((pos, int(pid)))
        exec_counts = self._acct("exec")
        ids = list(sent)
        states = self._states(ids)
        cancelled = self._cancelled(ids)
        client = self.direct.client
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.get(k.result(job_id))
        stored = dict(zip(ids, pipe.execute(), strict=True))
        n_results = 0
        for job_id, s in sent.items():
            done, failed = states[job_id]
            is_cancelled = job_id in cancelled
            where = f"{s.name} ({job_id})"
            mine = starts.get(s.name, [])
            pids = {pid for _, pid in mine}
            touched = EVERYONE in affected or job_id in stalled or bool(pids & affected)
            ends = int(done) + int(failed) + int(is_cancelled)
            if ends != 1:
                out.violations.append(f"{where} ends {ends} ways (done/failed/cancelled)")
            c = cancels.get(job_id)
            if is_cancelled and c is None:
                out.violations.append(f"{where} is cancelled, but no cancel was sent")
            # Results.
            n = writes.get(job_id, 0)
            raw = stored[job_id]
            n_results += n
            completed = exec_counts.get(s.name, 0)
            if n > completed:
                out.violations.append(f"{where}: result written {n} times, {completed} runs ended")
            if not s.keeps and (n or raw is not None):
                out.violations.append(f"{where}: a result written for a job that keeps none")
            if (failed or is_cancelled) and (n or raw is not None):
                end = "failed" if failed else "cancelled"
                out.violations.append(f"{where}: {end}, yet a result was written ({n} writes)")
            if s.keeps and done and not failed:
                if raw is None:
                    out.violations.append(f"{where}: done and keeps its result, none stored")
                else:
                    value = open_result(
                        raw, self.app.signer, queue="default", job_id=job_id,
                        resolve=self.app.resolve_class,
                    )  # fmt: skip
                    if value.get("arg") != s.arg or value.get("pid") not in pids:
                        out.violations.append(f"{where}: the stored result is no run's: {value}")
                if not gaps and not n:
                    out.violations.append(f"{where}: done, but no write of its result seen")
                if not gaps and not touched and n != 1:
                    out.violations.append(f"{where}: result written {n} times in one run")
            if c is None:
                continue
            # Cancels.
            late = [pid for pos, pid in mine if pos > c.marker and pid not in affected]
            allowed = 1 if c.reply == "cancelling" else 0
            if job_id == retried or job_id in stalled or EVERYONE in affected:
                allowed = len(late)
            if len(late) > allowed:
                out.violations.append(
                    f"{where}: started {len(late)} times after its cancel returned {c.reply!r}"
                )
            if c.reply in ("cancelled", "cancelling") and failed and job_id != retried:
                info = self.direct.find_failed(job_id)
                reason = info.exception.splitlines()[-1] if info else "?"
                if not (touched and "stalled" in reason):
                    out.violations.append(
                        f"{where}: cancel returned {c.reply!r}, yet it failed: {reason[:160]}"
                    )
            if c.reply == "cancelled" and done and not touched:
                out.violations.append(f"{where}: cancel returned 'cancelled', yet it ended done")
            if c.reply == "cancelled already" and not is_cancelled:
                out.violations.append(f"{where}: cancel said 'cancelled already', it is not")
            if c.reply == "done" and not done:
                out.violations.append(f"{where}: cancel said 'done', it is not")
            if c.reply == "failing" and not failed and not touched:
                # Its failure had opened (extend.lua's mark): only a holder that lost the
                # job (it stalled) leaves it to another run that may end otherwise.
                out.violations.append(f"{where}: cancel said 'failing', it did not fail")
        self.control_totals["results written"] = (
            self.control_totals.get("results written", 0) + n_results
        )
        if gaps:
            self.control_totals["write-count gaps"] = (
                self.control_totals.get("write-count gaps", 0) + gaps
            )

    def _check_group_limit(
        self, g0: dict[str, str], affected: set[int], stalled: set[str], out: Outcome
    ) -> None:
        """Group g0's concurrency limit of 1 held during the faults: no two of its runs
        overlapped (:func:`g0_overlaps`)."""
        raw = [_text(line) for line in self.acct.lrange(f"{self.acct_prefix}:gspans", 0, -1)]
        spans = parse_spans(raw)
        stalled_names = {g0[i] for i in stalled if i in g0}
        out.g0_runs = len(spans)
        for a, b in g0_overlaps(spans, affected, stalled_names):
            out.violations.append(
                f"group g0 (concurrency 1) ran two jobs at once: {a.name} (pid {a.pid}, "
                f"{a.start_us}..{a.end_us}) and {b.name} (pid {b.pid}, {b.start_us}..{b.end_us})"
            )

    def _check_chains(
        self, seed: int, chains: dict[str, list[str]], affected: set[int], out: Outcome
    ) -> None:
        """Links run in order; the failed chain's catch runs, its next link never; the
        good chain's catch never; each ran once unless a crash or freeze hit its run."""
        order: list[str] = []
        pids: dict[str, list[int]] = {}
        for line in self.acct.lrange(f"{self.acct_prefix}:log", 0, -1):
            name, pid, _ = _text(line).split(" ", 2)
            order.append(name)
            pids.setdefault(name, []).append(int(pid))

        def runs(name: str) -> int:
            return len(pids.get(name, []))

        def touched(name: str) -> bool:
            return EVERYONE in affected or any(p in affected for p in pids.get(name, []))

        good, bad = chains["ok"], chains["bad"]
        for name in good + bad[:1]:
            if runs(name) == 0:
                out.violations.append(f"chain link {name} never ran")
            elif runs(name) > 1 and not touched(name):
                out.violations.append(f"chain link {name} ran {runs(name)} times")
        firsts = [order.index(n) for n in good if n in order]
        if firsts != sorted(firsts):
            out.violations.append(f"chain links ran out of order: {good} at {firsts}")
        if runs(f"s{seed}cx"):
            out.violations.append("the catch of a chain that succeeded ran")
        if not touched(bad[1]) and runs(bad[1]) != FLAKY_TRIES:
            out.violations.append(f"failing link ran {runs(bad[1])} times, not {FLAKY_TRIES}")
        if runs(bad[2]):
            out.violations.append("the link after a failed link ran (beside the catch)")
        catch = f"s{seed}dx"
        if runs(catch) == 0 or (runs(catch) > 1 and not touched(catch)):
            out.violations.append(f"the catch of the failed chain ran {runs(catch)} times")

    def _dispatch_batch(self, tag: str, bad: int, rng: random.Random) -> _Batch:
        names = [f"{tag}m{i}" for i in range(rng.randint(3, 8))]
        failing = rng.choice(names) if bad else None
        allow = rng.random() < 0.5
        members: list[Job | PendingDispatch] = []
        for n in names:
            # Half the others start later, into the faults, and past a cancel: skipped.
            late = n != failing and rng.random() < 0.5
            members.append(
                FailingMember(n)
                if n == failing
                else Member(n).delay(rng.uniform(0.2, 1.2))
                if late
                else Member(n)
            )
        pending = batch(members).name(tag).allow_failures(allow)
        pending.then(Callback(f"{tag}:then")).catch(Callback(f"{tag}:catch"))
        batch_id = pending.finally_(Callback(f"{tag}:finally")).dispatch()
        k = BatchKeys.build(self.prefix, batch_id)
        client = self.direct.client
        member_ids = {_text(m) for m in client.smembers(k.members)}
        callback_ids: dict[str, str] = {}
        for kind in CALLBACKS:
            envelope = client.hget(k.info, f"cb:{kind}:b")
            callback_ids[kind] = str(envelope_id(envelope))
        return _Batch(tag, batch_id, names, failing, allow, member_ids, callback_ids)

    def _check_batches(
        self, batches: list[_Batch], affected: set[int], stalled: set[str], out: Outcome
    ) -> None:
        """The counters equal the members' outcomes in the done and failed stores; then,
        catch and finally each ran once when the outcome calls for it (more only when a
        crash or freeze hit its run) and never otherwise; no then/finally started before
        every member's last run ended and the batch was marked finished, no catch before
        the final run of the member that failed."""
        # event name pid ms job_id, in the order they happened (one list on one Redis)
        events: dict[str, list[tuple[int, str, int, int, str]]] = {}
        for pos, line in enumerate(self.acct.lrange(f"{self.acct_prefix}:blog", 0, -1)):
            event, name, pid, ms, job_id = _text(line).split(" ")
            events.setdefault(name, []).append((pos, event, int(pid), int(ms), job_id))
        client = self.direct.client
        for b in batches:
            self._check_batch(b, events, affected, stalled, client, out)

    def _check_batch(
        self,
        b: _Batch,
        events: dict[str, list[tuple[int, str, int, int, str]]],
        affected: set[int],
        stalled: set[str],
        client: redis.Redis,
        out: Outcome,
    ) -> None:
        where = f"batch {b.tag} ({b.id})"
        k = BatchKeys.build(self.prefix, b.id)
        raw = client.hgetall(k.info)
        if not raw:
            out.violations.append(f"{where} is gone")
            return
        info = BatchInfo.from_hash(b.id, raw)
        runs_of = {n: sum(e[1] == "cb" for e in events.get(f"{b.tag}:{n}", [])) for n in CALLBACKS}
        tally = {
            "batches": 1,
            "members": len(b.names),
            "skipped": sum(not events.get(n) for n in b.names),
            "cancelled": int(info.cancelled),
            **{f"{n} runs": r for n, r in runs_of.items()},
        }
        for name, n in tally.items():
            self.batch_totals[name] = self.batch_totals.get(name, 0) + n
        finished_ms = int(raw.get(b"finished_at", b"0"))

        def of(name: str, event: str) -> list[tuple[int, str, int, int, str]]:
            return [e for e in events.get(name, []) if e[1] == event]

        def touched(name: str, job_ids: set[str]) -> bool:
            return (
                EVERYONE in affected
                or bool(job_ids & stalled)
                or any(e[2] in affected for e in events.get(name, []))
            )

        # Counters against the stores, per id.
        ids = sorted(b.member_ids)
        if info.total != len(b.names) or len(ids) != len(b.names):
            out.violations.append(
                f"{where}: total {info.total}, {len(ids)} member ids, {len(b.names)} dispatched"
            )
        states = self._states(ids)
        done = {i for i, (d, f) in states.items() if d and not f}
        failed = {i for i, (d, f) in states.items() if f and not d}
        for job_id, (d, f) in states.items():
            if d == f:
                both = "both done and failed" if d else "neither done nor failed"
                out.violations.append(f"{where}: member {job_id} is {both}")
        if info.pending != 0 or not info.finished:
            out.violations.append(f"{where}: pending {info.pending}, finished {info.finished}")
        if (info.processed, info.failed) != (len(done), len(failed)):
            out.violations.append(
                f"{where}: processed {info.processed}, failed {info.failed}; the stores hold "
                f"{len(done)} done, {len(failed)} failed"
            )
        if info.total != info.processed + info.failed + info.pending:
            out.violations.append(f"{where}: total is not processed + failed + pending")
        failed_set = {_text(m) for m in client.smembers(k.failed)}
        if failed_set != failed:
            out.violations.append(f"{where}: failed ids {len(failed_set)}, store {len(failed)}")
        if info.cancelled != (bool(failed) and not b.allow):
            out.violations.append(
                f"{where}: cancelled {info.cancelled} with {len(failed)} failed, "
                f"allow_failures {b.allow}"
            )
        catch_by = _text(raw.get(b"catch_by", b""))
        if bool(catch_by) != bool(failed) or (catch_by and catch_by not in failed):
            out.violations.append(f"{where}: catch_by {catch_by or '-'} is not a failed member")
        finisher = _text(raw.get(b"finisher", b""))
        if finisher not in b.member_ids:
            out.violations.append(f"{where}: finisher {finisher or '-'} is not a member")

        # Members' runs: once each (the failing one: tries times), unless a crash or
        # freeze hit a run; none in a cancelled batch is fine (skipped).
        last_end = -1
        for name in b.names:
            runs, ends = of(name, "start"), of(name, "end")
            job_ids = {e[4] for e in events.get(name, [])}
            if len(job_ids) > 1 or not job_ids <= b.member_ids:
                out.violations.append(f"{where}: {name} ran as {sorted(job_ids)}")
            if touched(name, job_ids):
                continue
            if ends:
                last_end = max(last_end, ends[-1][0])
            outcome = "failed" if job_ids & failed else "done" if job_ids & done else "unrun"
            if name == b.failing:
                if catch_by and catch_by not in job_ids:
                    continue  # another member failed first (a stall): the cancel may cut it
                want = (FLAKY_TRIES, "failed")
            else:
                want = (1, "done")
                if info.cancelled and not runs:
                    want = (0, "unrun")  # skipped: counted as processed, in the done store
            if (len(runs), len(ends), outcome) != (want[0], want[0], want[1]):
                out.violations.append(
                    f"{where}: {name} started {len(runs)} times, ended {len(ends)}, "
                    f"is {outcome}; want {want[0]} runs, {want[1]}"
                )
        unrun = set(ids) - {e[4] for n in b.names for e in events.get(n, [])}
        if not unrun <= done:
            out.violations.append(
                f"{where}: {len(unrun - done)} members never ran and are not done"
            )

        # Callbacks: which, how often, and not too early.
        want_cb = {
            "then": not failed and not info.cancelled,
            "catch": bool(failed),
            "finally": True,
        }
        fail_end = -1
        if b.failing is not None and not touched(b.failing, set()):
            ends = of(b.failing, "end")
            fail_end = ends[-1][0] if ends else -1
        for kind in CALLBACKS:
            name = f"{b.tag}:{kind}"
            runs = of(name, "cb")
            cb_id = b.callback_ids[kind]
            if any(e[4] != cb_id for e in runs):
                out.violations.append(f"{where}: {kind} ran under another id")
            if not want_cb[kind]:
                if runs:
                    out.violations.append(f"{where}: {kind} ran {len(runs)} times, should not run")
                continue
            if not runs:
                out.violations.append(f"{where}: {kind} never ran")
                continue
            if len(runs) > 1 and not touched(name, {cb_id}):
                out.violations.append(f"{where}: {kind} ran {len(runs)} times")
            first_pos, first_ms = runs[0][0], runs[0][3]
            if kind == "catch":
                if first_pos < fail_end:
                    out.violations.append(f"{where}: catch ran before the failing member settled")
                continue
            if first_pos < last_end:
                out.violations.append(f"{where}: {kind} ran before every member settled")
            if first_ms < finished_ms:
                out.violations.append(
                    f"{where}: {kind} ran {finished_ms - first_ms} ms before the batch finished"
                )

    def _reset_state(self, sent: dict[str, _Sent]) -> None:
        names = ("log", "exec", "blog", "spans", "gspans", "started", "hooks")
        self.acct.delete(*(f"{self.acct_prefix}:{n}" for n in names))
        if self.state_faults:
            self.direct.client.delete(*_junk_keys(self.direct.keys(JUNK)))
        self.direct.flush()
        if self.groups:
            self.direct.client.delete(self.direct.keys("default").gcfg)

    # -- the worker's own state (issue 21) --------------------------------------------

    def _revive(self, affected: set[int] | None) -> None:
        """Start a worker in place of each one that died on its own (a poison job):
        its jobs stall, so its pid joins the seed's ``affected``."""
        if not self.state_faults:
            return
        for p in list(self.workers):
            if p.poll() is not None:
                self.workers.remove(p)
                self.retired.append(p)
                self._seed_affected.add(p.pid)
                self._start_worker()

    def _acct(self, what: str) -> dict[str, int]:
        raw = self.acct.hgetall(f"{self.acct_prefix}:{what}")
        return {_text(k): int(v) for k, v in raw.items()}

    def _started_pid(self, name: str, timeout_s: float = 10.0) -> int | None:
        """The pid that logged ``name``'s first start (``log`` list), waiting for it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.acct.lrange(f"{self.acct_prefix}:log", 0, -1):
                n, pid, _ = _text(line).split(" ", 2)
                if n == name:
                    return int(pid)
            time.sleep(0.02)
        return None

    def _state_prepare(self, state: str, seed: int, sent: dict[str, _Sent]) -> None:
        if state == "longstop":
            name = f"s{seed}L"
            job_id, envelope = self._push(LongRec(name, name, LEASE_S * 2.5))
            sent[job_id] = _Sent(name, name, envelope, False)
            self._state["long"] = (job_id, name)
        elif state == "wrongtype":
            name = f"s{seed}J"
            self._push(LongRec(name, name, 1.0).on_queue(JUNK))
            self._state["junk"] = name

    def _state_fault(
        self, state: str, seed: int, affected: set[int], sent: dict[str, _Sent]
    ) -> None:
        if state == "longstop":
            _, name = self._state["long"]  # type: ignore[misc]
            pid = self._started_pid(name)
            victim = next((p for p in self.workers if p.pid == pid and p.poll() is None), None)
            if victim is None:
                self.notes.append("longstop: no worker")
                return
            affected.add(victim.pid)
            victim.send_signal(signal.SIGSTOP)
            try:
                time.sleep(LEASE_S + 0.5)
                poke = f"s{seed}K"
                job_id, envelope = self._push(Rec(poke, poke))  # wakes the frozen wait
                sent[job_id] = _Sent(poke, poke, envelope, False)
                time.sleep(0.5)
            finally:
                victim.send_signal(signal.SIGCONT)
            self.notes.append(f"longstop pid {victim.pid}")
        elif state == "wrongtype":
            name = self._state["junk"]
            pid = self._started_pid(str(name))
            self.notes.append(f"wrongtype (junk job started in {pid})")
            for key in _junk_keys(self.direct.keys(JUNK)):
                self.direct.client.set(key, "not-a-queue-key")
            # default's jobs while the junk job ends (its ack meets the wrong types)
            for i in range(8):
                more = f"s{seed}W{i}"
                job_id, envelope = self._push(Rec(more, more))
                sent[job_id] = _Sent(more, more, envelope, False)
                time.sleep(0.25)
        elif state == "outage":
            name = f"s{seed}O"
            self._push(FirstRunFails(name, 0.3))
            self._state["outage"] = name
            deadline = time.monotonic() + 10
            while not self._acct("started").get(name) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.server.kill()
            try:
                time.sleep(GIVE_UP_S + 1.5)
            finally:
                self.server.start()
                self._announce_writes()
            affected.add(EVERYONE)
            self.notes.append(f"outage {GIVE_UP_S + 1.5:g}s > give-up {GIVE_UP_S:g}s")
        elif state == "poison":
            name = f"s{seed}P"
            job_id, _ = self._push(PoisonTwice(name))
            self._state["poison"] = (job_id, name)

    def _state_settle(self, out: Outcome, timeout_s: float = 60.0) -> None:
        """Wait for the state fault's own jobs (outage, poison) to settle too."""
        ids: list[str] = []
        if "poison" in self._state:
            ids.append(self._state["poison"][0])  # type: ignore[index]
        deadline = time.monotonic() + timeout_s
        while ids:
            self._revive(None)
            with contextlib.suppress(redis.RedisError):
                if all(d or f for d, f in self._states(ids).values()):
                    break
            if time.monotonic() > deadline:
                out.violations.append(f"state fault's jobs not settled after {timeout_s:g}s")
                break
            time.sleep(0.1)
        if "junk" in self._state:
            # The failed-store admin (retry) reads every queue: take the garbage away
            # (`failed retry <id>` itself raises WRONGTYPE on it; noted in issue 21).
            time.sleep(LEASE_S)
            self.direct.client.delete(*_junk_keys(self.direct.keys(JUNK)))
        if "outage" in self._state:
            name = str(self._state["outage"])
            deadline = time.monotonic() + timeout_s
            k = self.direct.keys("default")
            while time.monotonic() < deadline:
                hooks = self._acct("hooks").get(name, 0)
                if self._acct("exec").get(name) or (hooks and self.direct.client.zcard(k.failed)):
                    break
                time.sleep(0.1)

    def _check_state(
        self,
        state: str,
        sent: dict[str, _Sent],
        out: Outcome,
        sizes: dict[Path, int],
        affected: set[int],
        stalled: set[str],
    ) -> None:
        text = ""
        for path in self.workdir.glob("worker-*.log"):
            with open(path, "rb") as f:
                f.seek(sizes.get(path, 0))
                text += f.read().decode(errors="replace")
        states = self._states(list(sent))
        for job_id, s in sent.items():
            if not s.flaky and states[job_id][1]:
                info = self.direct.find_failed(job_id)
                reason = info.exception.splitlines()[-1] if info else "?"
                out.violations.append(
                    f"{state}: ordinary job {s.name} ended failed: {reason[:120]}"
                )
        if state == "longstop":
            job_id, name = self._state["long"]  # type: ignore[misc]
            done, failed = self._states([job_id])[job_id]
            if not done or failed:
                out.violations.append(f"longstop: the long job is not done (failed {failed})")
            starts = [
                _text(x).split(" ") for x in self.acct.lrange(f"{self.acct_prefix}:spans", 0, -1)
            ]
            live: dict[str, int] = {}
            most = 0
            n_starts = 0
            for what, n, pid in starts:
                if n != name:
                    continue
                n_starts += what == "start"
                live[pid] = live.get(pid, 0) + (1 if what == "start" else -1)
                most = max(most, live[pid])
            if most > 1:
                out.violations.append(f"longstop: one worker ran the long job {most} times at once")
            # Started once, plus once more for each run on a worker that was killed or
            # frozen (the freeze itself is one: another worker may take the job over),
            # plus one when a worker reported its reservation lost.
            on_affected = sum(
                1 for what, n, pid in starts if n == name and what == "start"
                and int(pid) in affected
            )  # fmt: skip
            allowed = 1 + on_affected + (job_id in stalled)
            if EVERYONE not in affected and n_starts > allowed:
                out.violations.append(
                    f"longstop: the long job started {n_starts} times ({allowed} allowed)"
                )
        elif state == "wrongtype":
            if not re.search(rf"ERROR.*'{JUNK}'", text):
                out.violations.append(f"wrongtype: no ERROR line names queue {JUNK!r}")
            dead = [p.pid for p in self.workers if p.poll() is not None]
            if dead:
                out.violations.append(f"wrongtype: workers {dead} died")
        elif state == "outage":
            name = str(self._state["outage"])
            hooks = self._acct("hooks").get(name, 0)
            ran_ok = self._acct("exec").get(name, 0)
            failed_lines = re.findall(r"([0-9a-f]{32}) Failed +FirstRunFails", text)
            if hooks and ran_ok:
                out.violations.append(
                    "outage: failed() ran for a job that then ran again and ended done"
                )
            if failed_lines and ran_ok:
                out.violations.append("outage: JobFailed emitted for a job that ended done")
            if not hooks and not ran_ok:
                out.violations.append("outage: the failing job neither failed nor ran again")
        elif state == "poison":
            job_id, name = self._state["poison"]  # type: ignore[misc]
            runs = self._acct("started").get(name, 0)
            done, failed = self._states([job_id])[job_id]
            if not failed or done:
                out.violations.append("poison: the poison job did not end failed")
            if runs > 1 + MAX_STALLS:
                out.violations.append(f"poison: ran {runs} times (max {1 + MAX_STALLS})")


@dataclass(frozen=True)
class Span:
    """One run of a job of group g0 as the job logged it (fault_app ``gspans``): µs on
    the accounting Redis's clock; ``end_us`` None when the run never ended (its worker
    was killed, or is frozen still)."""

    name: str
    pid: int
    start_us: int
    end_us: int | None


def parse_spans(lines: list[str]) -> list[Span]:
    """Pair the ``start``/``end`` lines of ``gspans`` by run token."""
    starts: dict[str, tuple[str, int, int]] = {}
    ends: dict[str, int] = {}
    for line in lines:
        event, name, pid, token, at = line.split(" ")
        if event == "start":
            starts[token] = (name, int(pid), int(at))
        else:
            ends[token] = int(at)
    return sorted(
        (Span(name, pid, at, ends.get(token)) for token, (name, pid, at) in starts.items()),
        key=lambda s: s.start_us,
    )


def g0_overlaps(
    spans: list[Span], affected: set[int], stalled: set[str]
) -> list[tuple[Span, Span]]:
    """Pairs of runs of a concurrency-1 group that overlapped and are not waived.

    Waived, as the exactly-once checks waive a second run: a pair where either run was on
    a worker killed or SIGSTOPped in this seed (its pid in ``affected``: the group's slot
    comes back when that run's lease ends, while the frozen run may still go on, or the
    killed one never logged its end), or whose job's worker logged its reservation lost
    (``stalled``: the lease ended under it), or any pair when a Redis outage outlasted
    two thirds of the lease (``EVERYONE``: every lease may have ended). A run with no end
    overlaps every later run."""
    if EVERYONE in affected:
        return []
    found = []
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if a.end_us is not None and b.start_us >= a.end_us:
                continue
            waived = {a.pid, b.pid} & affected or {a.name, b.name} & stalled
            if not waived:
                found.append((a, b))
    return found


def _junk_keys(k: object) -> list[str]:
    names = ("ready", "delayed", "reserved", "notify", "jobs", "attempts", "done", "failed")
    names += ("failed_info", "failed_body", "tokens")
    return [getattr(k, n) for n in names]


def run_seeds(
    seeds: list[int],
    account_url: str,
    *,
    workdir: Path | None = None,
    print_fn: Callable[[str], None] = print,
    stop_on_violation: bool = False,
    state_faults: bool = False,
    groups: bool = False,
    control: bool = False,
) -> list[Outcome]:
    """Run ``seeds`` on one Checker; prints one line a seed and every violation."""
    own = workdir is None
    wd = workdir or Path(tempfile.mkdtemp(prefix="tidings-checker-"))
    checker = Checker(wd, account_url, state_faults=state_faults, groups=groups, control=control)
    outcomes: list[Outcome] = []
    try:
        for seed in seeds:
            o = checker.run_seed(seed)
            outcomes.append(o)
            status = "ok" if not o.violations else f"VIOLATION x{len(o.violations)}"
            print_fn(
                f"seed {seed:6d}  {status}  jobs {o.jobs:3d}  {o.seconds:5.2f}s  "
                f"faults {','.join(o.faults) or '-'}  drops {o.drops or '-'}"
                + (f"  state {o.state}" if o.state else "")
                + (f"  g0 runs {o.g0_runs}" if groups else "")
            )
            for v in o.violations:
                print_fn(f"  seed {seed}: {v}")
            if o.violations and stop_on_violation:
                break
    finally:
        totals = checker.drops_total
        bad = [o.seed for o in outcomes if o.violations]
        print_fn(
            f"seeds run {len(outcomes)}  violations {sum(len(o.violations) for o in outcomes)}"
            f"  seeds with violations {bad or '-'}  drops injected {dict(sorted(totals.items()))}"
        )
        print_fn(f"batches checked {checker.batch_totals or '-'}")
        if state_faults:
            print_fn(f"state faults injected {dict(sorted(checker.state_totals.items()))}")
        if control:
            print_fn(f"control checked {dict(sorted(checker.control_totals.items()))}")
        checker.close()
        if own:
            shutil.rmtree(wd, ignore_errors=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds (from --first)")
    ap.add_argument("--first", type=int, default=1, help="the first seed")
    ap.add_argument("--seed", type=int, action="append", help="replay this seed (repeatable)")
    ap.add_argument("--stop", action="store_true", help="stop at the first violation")
    ap.add_argument(
        "--state-faults",
        action="store_true",
        help="add one fault of the worker's own state a seed (longstop, wrongtype, "
        "outage, poison; needs TIDINGS_REDIS_GIVE_UP_S honoured by the worker)",
    )
    ap.add_argument(
        "--groups",
        action="store_true",
        help="grouped producers: jobs in fair groups g0 (concurrency 1), g1, g2 or none, "
        "push_group replies dropped too",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="results, cancels and priorities: random priorities, jobs keeping a result, "
        "a canceller cancelling waiting and running jobs (its replies droppable too)",
    )
    args = ap.parse_args(argv)
    seeds = args.seed or list(range(args.first, args.first + args.seeds))
    # SIGTERM ends the run through the finally blocks: every worker and server stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="tidings-checker-acct-"))
    account = RedisServer(tmp, appendonly=False)
    account.start()
    try:
        outcomes = run_seeds(
            seeds,
            account.url,
            stop_on_violation=args.stop,
            state_faults=args.state_faults,
            groups=args.groups,
            control=args.control,
        )
    finally:
        account.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if any(o.violations for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
