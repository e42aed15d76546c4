"""The App and jobs ``notify-worker -A tests.faults.fault_app:app`` runs in the fault tests.

The App is built on first access of ``app`` from ``TIDINGS_*`` variables (as
tests/e2e/jobs_app.py). Jobs do their accounting on a *separate* Redis, named by
``TIDINGS_TEST_ACCOUNT_URL`` (the session's shared redis-server), so the Redis being
restarted, killed, paused or filled is only the queue's, and a figure like "lost 0"
measures the queue, not the accounting. Recording keys, under ``<account prefix>:``::

    exec      hash id -> completed runs (``HINCRBY exec <id> 1``, the side effect)
    started   hash id -> starts (a run cut short counts here, not in ``exec``)
    start_ms  hash id -> Redis TIME (ms, on the *queue's* Redis) at the last start
    pid       hash id -> pid of the worker that last started it
    released  hash id -> Redis TIME (ms, queue's Redis) when it released itself
    gspans    list of ``start|end name pid token µs`` of the runs of the checker's jobs of
              group g0 (``hold`` > 0; µs: the *accounting* Redis's TIME)
    blog      list of ``event name pid ms job_id`` (the checker's batches: :class:`Member`,
              :class:`FailingMember`, :class:`Callback`); ``ms`` is the *accounting*
              Redis's TIME, and the list's order is the order the events happened in

``TIDINGS_TEST_ACCOUNT_PREFIX`` is that prefix (default: ``TIDINGS_PREFIX``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from tidings import App, Job
from tidings.jobs.job import current_run

_app: App | None = None
_accounts: dict[int, redis.asyncio.Redis] = {}


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(
                allowed_modules=os.environ.get("TIDINGS_ALLOWED_MODULES") or __name__
            )
        return _app
    raise AttributeError(name)


def account_prefix() -> str:
    return os.environ.get("TIDINGS_TEST_ACCOUNT_PREFIX") or App.current().settings.prefix


def key(name: str) -> str:
    return f"{account_prefix()}:{name}"


def account() -> redis.asyncio.Redis:
    """The accounting client of the running loop (the worker has one loop)."""
    loop_id = id(asyncio.get_running_loop())
    client = _accounts.get(loop_id)
    if client is None:
        url = os.environ.get("TIDINGS_TEST_ACCOUNT_URL") or App.current().settings.redis_url
        client = _accounts[loop_id] = redis.asyncio.Redis.from_url(url)
    return client


async def _queue_time_ms() -> int:
    s, us = await App.current().queue_for(None).aclient().time()
    return int(s) * 1000 + int(us) // 1000


async def _span_start(job: str, hold: float) -> str:
    """With ``hold`` > 0 (the checker's jobs of group g0, issue 25): append
    ``start <id> <pid> <token> <µs>`` to ``gspans`` (µs: the accounting Redis's TIME, one
    clock for every worker); returns the run's token ("" when not recording)."""
    if hold <= 0:
        return ""
    token = os.urandom(6).hex()
    a = account()
    s, us = await a.time()
    await a.rpush(
        key("gspans"), f"start {job} {os.getpid()} {token} {int(s) * 1_000_000 + int(us)}"
    )
    return token


async def _span_end(job: str, token: str) -> None:
    """``end <id> <pid> <token> <µs>`` of a run :func:`_span_start` recorded."""
    if token:
        a = account()
        s, us = await a.time()
        await a.rpush(
            key("gspans"), f"end {job} {os.getpid()} {token} {int(s) * 1_000_000 + int(us)}"
        )


@dataclass
class Record(Job):
    """The plain side effect: one ``HINCRBY exec <id> 1``."""

    id: str
    tries = 0  # unlimited: an attempt cut short by a fault is retried, not failed

    async def handle(self) -> None:
        await account().hincrby(key("exec"), self.id, 1)


@dataclass
class Padded(Record):
    """A Record carrying ``pad``: F12 fills Redis with 200-byte jobs (RELIABILITY.md)."""

    pad: str = ""


@dataclass
class Work(Job):
    """Marks its start, sleeps ``seconds``, then records its execution."""

    id: str
    seconds: float
    tries = 0

    async def handle(self) -> None:
        pipe = account().pipeline(transaction=False)
        pipe.hincrby(key("started"), self.id, 1)
        pipe.hset(key("pid"), self.id, os.getpid())
        await pipe.execute()
        await asyncio.sleep(self.seconds)
        await account().hincrby(key("exec"), self.id, 1)


@dataclass
class Timed(Job):
    """Records Redis TIME (queue's Redis) at each start; with ``release_once`` the first
    run releases itself with ``release(1)`` and records when it did."""

    id: str
    release_once: bool = False
    tries = 0

    async def handle(self) -> None:
        now = await _queue_time_ms()
        a = account()
        if self.release_once and not await a.hexists(key("released"), self.id):
            await a.hset(key("released"), self.id, now)
            self.release(1)
            return
        pipe = a.pipeline(transaction=False)
        pipe.hset(key("start_ms"), self.id, now)
        pipe.hincrby(key("exec"), self.id, 1)
        await pipe.execute()


@dataclass
class Plain(Job):
    """Marks its start, sleeps ``seconds``, records its execution; the worker's default
    tries (1) and max_stalls, so a stall must not be mistaken for a failed attempt.
    ``fail_after_first``: every run after the first raises (and fails: tries 1)."""

    id: str
    seconds: float = 0.0
    fail_after_first: bool = False

    async def handle(self) -> None:
        a = account()
        pipe = a.pipeline(transaction=False)
        pipe.hincrby(key("started"), self.id, 1)
        pipe.hset(key("pid"), self.id, os.getpid())
        started = (await pipe.execute())[0]
        if started > 1 and self.fail_after_first:
            raise ValueError(f"run {started} of {self.id} fails")
        await asyncio.sleep(self.seconds)
        await a.hincrby(key("exec"), self.id, 1)


@dataclass
class Poison(Job):
    """Kills the worker running it, every time (a segfaulting C extension, say)."""

    id: str
    tries = 0  # unlimited tries: only max_stalls bounds its runs
    max_stalls = 2

    async def handle(self) -> None:
        await account().hincrby(key("started"), self.id, 1)
        os.kill(os.getpid(), 9)


@dataclass
class Rec(Job):
    """The fault-schedule checker's plain job: logs ``id pid arg`` at each start (the
    argument, to prove a retried job runs with it), then counts its completion."""

    id: str
    arg: str
    hold: float = 0.0

    async def handle(self) -> None:
        a = account()
        token = await _span_start(self.id, self.hold)
        try:
            await a.rpush(key("log"), f"{self.id} {os.getpid()} {self.arg}")
            if self.hold > 0:
                await asyncio.sleep(self.hold)
            await a.hincrby(key("exec"), self.id, 1)
        finally:
            # Also when the run is cancelled (the checker's --control canceller): a run
            # that stops logs its end, or the group check would count it running forever.
            await _span_end(self.id, token)


@dataclass
class Flaky(Job):
    """The checker's failing job: logs its start and raises, every time; tries 3."""

    id: str
    arg: str
    hold: float = 0.0
    tries = 3

    async def handle(self) -> None:
        token = await _span_start(self.id, self.hold)
        try:
            await account().rpush(key("log"), f"{self.id} {os.getpid()} {self.arg}")
            if self.hold > 0:
                await asyncio.sleep(self.hold)
        finally:
            await _span_end(self.id, token)  # also when cancelled (see Rec)
        raise RuntimeError(f"flaky {self.id}")


@dataclass
class Once(Job):
    """As :class:`Record`, with the worker's default tries (1): a run whose ack is lost
    in a failover and that is delivered again fails as MaxAttemptsExceeded."""

    id: str

    async def handle(self) -> None:
        pipe = account().pipeline(transaction=False)
        pipe.hincrby(key("exec"), self.id, 1)
        # When it ran (this machine's wall clock; the drills compare it with theirs).
        pipe.rpush(key("runs"), f"{self.id} {time.time():.3f}")
        await pipe.execute()


async def _batch_event(event: str, name: str) -> None:
    """Append ``event name pid ms job_id`` to ``blog`` (ms: the accounting Redis's TIME)."""
    a = account()
    sec, us = await a.time()
    ms = int(sec) * 1000 + int(us) // 1000
    run = current_run()
    job_id = run.job_id if run is not None else "-"
    await a.rpush(key("blog"), f"{event} {name} {os.getpid()} {ms} {job_id}")


@dataclass
class Member(Job):
    """The checker's batch member: logs ``start`` and, as its handler returns, ``end``."""

    id: str

    async def handle(self) -> None:
        await _batch_event("start", self.id)
        await _batch_event("end", self.id)


@dataclass
class FailingMember(Job):
    """A batch member that fails for good: logs ``start`` and ``end``, then raises; tries
    3, so its third run's ``end`` is the last thing it does before its final failure."""

    id: str
    tries = 3

    async def handle(self) -> None:
        await _batch_event("start", self.id)
        await _batch_event("end", self.id)
        raise RuntimeError(f"failing member {self.id}")


@dataclass
class Callback(Job):
    """A batch's then/catch/finally callback in the checker: logs ``cb`` at each start."""

    id: str

    async def handle(self) -> None:
        await _batch_event("cb", self.id)


# -- the worker's own state (tests/faults/test_worker_state.py, the checker's new kinds) --
#
#   spans      list of ``start|end id pid`` in the order they happened: two ``start`` of
#              one id in one pid with no ``end`` between is the same worker running a
#              job twice at once
#   hooks      hash id -> calls of the job's ``failed()`` hook

_sync_accounts: dict[int, redis.Redis] = {}


def sync_account() -> redis.Redis:
    """A blocking accounting client, one per thread (sync handlers run on job threads)."""
    import threading

    import redis as redis_sync

    tid = threading.get_ident()
    client = _sync_accounts.get(tid)
    if client is None:
        url = os.environ.get("TIDINGS_TEST_ACCOUNT_URL") or App.current().settings.redis_url
        client = _sync_accounts[tid] = redis_sync.Redis.from_url(url)
    return client


@dataclass
class Span(Job):
    """Async: counts its start, logs ``start``/``end`` in ``spans``, sleeps ``seconds``,
    counts its completion. The worker's default tries (1) and max_stalls."""

    id: str
    seconds: float

    async def handle(self) -> None:
        a = account()
        pipe = a.pipeline(transaction=False)
        pipe.hincrby(key("started"), self.id, 1)
        pipe.hset(key("pid"), self.id, os.getpid())
        pipe.rpush(key("spans"), f"start {self.id} {os.getpid()}")
        await pipe.execute()
        await asyncio.sleep(self.seconds)
        pipe = a.pipeline(transaction=False)
        pipe.rpush(key("spans"), f"end {self.id} {os.getpid()}")
        pipe.hincrby(key("exec"), self.id, 1)
        await pipe.execute()


@dataclass
class SyncSpan(Job):
    """:class:`Span` with a sync ``handle`` (runs on the worker's job threads)."""

    id: str
    seconds: float

    def handle(self) -> None:
        a = sync_account()
        pipe = a.pipeline(transaction=False)
        pipe.hincrby(key("started"), self.id, 1)
        pipe.hset(key("pid"), self.id, os.getpid())
        pipe.rpush(key("spans"), f"start {self.id} {os.getpid()}")
        pipe.execute()
        time.sleep(self.seconds)
        pipe = a.pipeline(transaction=False)
        pipe.rpush(key("spans"), f"end {self.id} {os.getpid()}")
        pipe.hincrby(key("exec"), self.id, 1)
        pipe.execute()


@dataclass
class PoisonTwice(Job):
    """Kills the worker running it, every time; tries 2 and the worker's max_stalls, as
    in issue 21's poison drill."""

    id: str
    tries = 2

    async def handle(self) -> None:
        await account().hincrby(key("started"), self.id, 1)
        os.kill(os.getpid(), 9)


@dataclass
class FirstRunFails(Job):
    """Run 1 sleeps ``seconds`` then raises (tries 1: it fails for good, unless the
    failure cannot be recorded); every later run succeeds. ``failed()`` counts itself in
    ``hooks``."""

    id: str
    seconds: float = 0.0

    async def handle(self) -> None:
        a = account()
        started = await a.hincrby(key("started"), self.id, 1)
        await asyncio.sleep(self.seconds)
        if started == 1:
            raise RuntimeError(f"first run of {self.id} fails")
        await a.hincrby(key("exec"), self.id, 1)

    async def failed(self, exc: BaseException) -> None:
        await account().hincrby(key("hooks"), self.id, 1)


@dataclass
class LongRec(Job):
    """The checker's long job (longer than the lease): logs ``id pid arg`` at its start
    as :class:`Rec` does, and ``start``/``end`` in ``spans``; sleeps ``seconds``; then
    counts its completion."""

    id: str
    arg: str
    seconds: float

    async def handle(self) -> None:
        a = account()
        pipe = a.pipeline(transaction=False)
        pipe.rpush(key("log"), f"{self.id} {os.getpid()} {self.arg}")
        pipe.rpush(key("spans"), f"start {self.id} {os.getpid()}")
        await pipe.execute()
        await asyncio.sleep(self.seconds)
        pipe = a.pipeline(transaction=False)
        pipe.rpush(key("spans"), f"end {self.id} {os.getpid()}")
        pipe.hincrby(key("exec"), self.id, 1)
        await pipe.execute()


# -- the checker's control mode (issue 23): results, cancels, priorities ----------------


@dataclass
class Kept(Job):
    """As :class:`Rec` (logs ``id pid arg`` at each start, counts its completion), and
    returns a small value the ack stores (``store_result``): the run's argument and pid,
    so the checker can tell which run wrote the result."""

    id: str
    arg: str
    store_result = True

    async def handle(self) -> dict[str, Any]:
        a = account()
        await a.rpush(key("log"), f"{self.id} {os.getpid()} {self.arg}")
        await a.hincrby(key("exec"), self.id, 1)
        return {"arg": self.arg, "pid": os.getpid()}


@dataclass
class Slow(Job):
    """:class:`Kept` that sleeps ``seconds`` between its start and its completion, so a
    canceller finds it running."""

    id: str
    arg: str
    seconds: float
    store_result = True

    async def handle(self) -> dict[str, Any]:
        a = account()
        await a.rpush(key("log"), f"{self.id} {os.getpid()} {self.arg}")
        await asyncio.sleep(self.seconds)
        await a.hincrby(key("exec"), self.id, 1)
        return {"arg": self.arg, "pid": os.getpid()}
