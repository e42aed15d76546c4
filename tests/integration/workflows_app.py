"""The App and jobs the workflow tests run in ``notify-worker`` subprocesses.

The worker imports this module (``-A tests.integration.workflows_app:app``); the App is
configured from ``WF_REDIS_URL``, ``WF_PREFIX`` and ``WF_RETRY_AFTER``. Every job
records what it did under ``{prefix}:test:*`` keys, stamped with Redis ``TIME``, so the
tests count from Redis records, never from wall-clock speed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import redis

from tidings import App, Job, Listener, ShouldQueue, _current
from tidings.jobs.limits import RateLimited, Skip, ThrottlesExceptions, WithoutOverlapping
from tidings.wire.envelope import JobBody
from tidings.workflows.hooks import WorkflowHooks

KEY = "k" * 32


def make_app(redis_url: str, prefix: str, retry_after: float = 2.0) -> App:
    """An App like the workers' (same key and prefix), for producers in the test process."""
    return WorkflowApp(
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        retry_after=retry_after,
        allowed_modules=["tests", "tidings"],
        env=False,
    )


def _r() -> tuple[redis.Redis, str]:
    app = _current.current()
    return app.queue_for(None).client, app.settings.prefix


def now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def record(tag: str) -> None:
    """Count an execution of ``tag`` and log it in order, with Redis time."""
    r, p = _r()
    pipe = r.pipeline(transaction=False)
    pipe.hincrby(f"{p}:test:exec", tag, 1)
    pipe.rpush(f"{p}:test:order", tag)
    pipe.execute()


class KillingHooks(WorkflowHooks):
    """Workflow hooks that SIGKILL their own worker right after a job advanced its chain
    or batch but before the ack (``WF_KILL_AFTER_SUCCESS`` = the job's display name;
    ``WF_KILL_TAG`` = only for a job whose ``tag`` field equals it), or right after a
    final failure was counted (``WF_KILL_AFTER_FAILURE``). Once per test."""

    async def on_success(self, job: Job, body: JobBody, queue: str) -> None:
        await super().on_success(job, body, queue)
        name = os.environ.get("WF_KILL_AFTER_SUCCESS")
        tag = os.environ.get("WF_KILL_TAG")
        if not name or body["displayName"] != name:
            return
        if tag and getattr(job, "tag", None) != tag:
            return
        r, p = _r()
        if r.set(f"{p}:test:killed-after-success", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)

    async def on_final_failure(self, job: Job | None, body: JobBody, queue: str) -> None:
        """As ``on_success``: ``WF_KILL_AFTER_FAILURE`` = the display name of a job
        whose worker dies right after its final failure was counted (chain catch pushed,
        batch failure recorded) and before its move to the failed store."""
        await super().on_final_failure(job, body, queue)
        if body["displayName"] != os.environ.get("WF_KILL_AFTER_FAILURE"):
            return
        r, p = _r()
        if r.set(f"{p}:test:killed-after-failure", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)


class WorkflowApp(App):
    """An App whose workflow hooks can kill its worker (see :class:`KillingHooks`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.workflow_hooks = KillingHooks(self)


# -- jobs ---------------------------------------------------------------------------------


@dataclass
class Record(Job):
    """Records its tag."""

    tag: str

    def handle(self) -> None:
        record(self.tag)


@dataclass
class Fail(Job):
    """Records its tag, then raises."""

    tag: str
    tries = 1

    def handle(self) -> None:
        record(self.tag)
        raise RuntimeError(f"{self.tag} failed on purpose")


@dataclass
class KillOnce(Job):
    """Records its tag; the first run SIGKILLs its own worker mid-job."""

    tag: str

    def handle(self) -> None:
        record(self.tag)
        r, p = _r()
        if r.set(f"{p}:test:killonce:{self.tag}", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Poison(Job):
    """Kills its worker every time it runs (RELIABILITY row F3)."""

    tag: str
    tries = 3

    def handle(self) -> None:
        record(self.tag)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Block(Job):
    """A sync job that blocks its thread (cannot be cancelled); records when it starts."""

    tag: str
    seconds: float
    tries = 2

    def handle(self) -> None:
        record(self.tag)
        time.sleep(self.seconds)


@dataclass
class BlockLoop(Job):
    """A misbehaving async job that blocks the event loop (signals cannot be handled)."""

    tag: str
    seconds: float

    async def handle(self) -> None:
        record(self.tag)
        time.sleep(self.seconds)


@dataclass
class Sleep(Job):
    """Records its tag after sleeping (async)."""

    tag: str
    seconds: float

    async def handle(self) -> None:
        await asyncio.sleep(self.seconds)
        record(self.tag)


@dataclass
class Item(Job):
    """A batch member: optionally fails, optionally adds ``add`` jobs to its batch."""

    tag: str
    fails: bool = False
    sleep: float = 0.0
    add: int = 0
    tries = 1

    def handle(self) -> None:
        if self.sleep:
            time.sleep(self.sleep)
        record(self.tag)
        if self.add:
            self.batch.add([Item(f"{self.tag}.{i}") for i in range(self.add)])
        if self.fails:
            raise RuntimeError(f"{self.tag} failed on purpose")


@dataclass
class Sturdy(Item):
    """A batch member that survives its worker being killed (three tries)."""

    tries = 3


@dataclass
class Noted:
    """An event."""

    tag: str


class NoteListener(Listener, ShouldQueue):
    """A queued listener (a chain link in the tests)."""

    def handle(self, event: Noted) -> None:
        record(event.tag)


@dataclass
class Callback(Job):
    """A batch callback: counts ``kind`` and remembers which batch it saw."""

    kind: str

    def handle(self) -> None:
        r, p = _r()
        r.hincrby(f"{p}:test:callbacks", self.kind, 1)
        r.hset(f"{p}:test:callback-batch", self.kind, str(self.batch.id if self.batch else ""))


@dataclass
class Limited(Job):
    """Rate limited across all workers; logs Redis time at start."""

    tag: str
    tries = 1

    def middleware(self) -> list[Any]:
        return [RateLimited("wf-rate", per_second=float(os.environ.get("WF_RATE", "10")))]

    def handle(self) -> None:
        r, p = _r()
        r.zadd(f"{p}:test:starts", {self.tag: now_ms(r)})
        r.hincrby(f"{p}:test:exec", self.tag, 1)


@dataclass
class Exclusive(Job):
    """Never two at once (WithoutOverlapping); records the concurrency it saw."""

    tag: str
    tries = 1

    def middleware(self) -> list[Any]:
        return [WithoutOverlapping("wf-overlap", release_after=0.05, expire_after=30)]

    async def handle(self) -> None:
        r, p = _r()
        running = r.incr(f"{p}:test:running")
        r.rpush(f"{p}:test:concurrency", running)
        await asyncio.sleep(0.05)
        r.decr(f"{p}:test:running")
        r.hincrby(f"{p}:test:exec", self.tag, 1)


@dataclass
class Flaky(Job):
    """Fails while ``{prefix}:test:down`` is set; throttled after 2 exceptions."""

    tag: str
    tries = 0

    def middleware(self) -> list[Any]:
        return [ThrottlesExceptions(2, 1.5, key="wf-flaky")]

    def handle(self) -> None:
        r, p = _r()
        r.rpush(f"{p}:test:attempt-times", now_ms(r))
        if r.get(f"{p}:test:down"):
            raise RuntimeError("downstream is down")
        r.hincrby(f"{p}:test:exec", self.tag, 1)


@dataclass
class Skippable(Job):
    """Skipped when its tag starts with 'skip'."""

    tag: str

    def middleware(self) -> list[Any]:
        return [Skip(if_=lambda job: job.tag.startswith("skip"))]

    def handle(self) -> None:
        record(self.tag)


@dataclass
class Unique(Job):
    """Unique per ``key`` for 30 s."""

    key: str
    n: int = 0
    sleep: float = 0.0
    unique_for = 30

    def unique_id(self) -> str:
        return self.key

    def handle(self) -> None:
        r, p = _r()
        r.set(f"{p}:test:started:{self.key}:{self.n}", 1)
        time.sleep(self.sleep)
        record(f"{self.key}:{self.n}")


@dataclass
class UniqueUntilStart(Job):
    """Unique per ``key`` until it starts; sleeps so a dispatch can land while it runs."""

    key: str
    n: int = 0
    unique_for = 30
    unique_until = "processing"

    def unique_id(self) -> str:
        return self.key

    async def handle(self) -> None:
        r, p = _r()
        r.set(f"{p}:test:started:{self.key}:{self.n}", 1)
        await asyncio.sleep(0.5)
        record(f"{self.key}:{self.n}")


@dataclass
class Debounced(Job):
    """Debounced per ``key``: a burst runs its last dispatch once."""

    key: str
    n: int = 0
    debounce_for = 0.6
    debounce_max_wait = 3.0

    def unique_id(self) -> str:
        return self.key

    def handle(self) -> None:
        r, p = _r()
        r.rpush(f"{p}:test:debounced", f"{self.n}@{now_ms(r)}")


@dataclass
class Tick(Job):
    """A scheduled job: logs the tick's job id with Redis time."""

    kind: str

    def handle(self) -> None:
        r, p = _r()
        r.rpush(f"{p}:test:ticks", f"{self.job_id}@{now_ms(r)}@{os.getpid()}")


# -- the workers' App (last: it schedules Tick) --------------------------------------

app: App | None = None
if os.environ.get("WF_REDIS_URL"):
    app = make_app(
        os.environ["WF_REDIS_URL"],
        os.environ["WF_PREFIX"],
        float(os.environ.get("WF_RETRY_AFTER", "2")),
    )
    if os.environ.get("WF_LEASE_S"):
        app.schedule_lease_s = float(os.environ["WF_LEASE_S"])  # type: ignore[attr-defined]
    if os.environ.get("WF_EVERY_S"):
        app.schedule(Tick("every"), every_s=float(os.environ["WF_EVERY_S"]))
    if os.environ.get("WF_CRON"):
        app.schedule(Tick("cron"), cron=os.environ["WF_CRON"])
