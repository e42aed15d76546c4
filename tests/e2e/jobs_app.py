"""The App and jobs that ``notify-worker -A tests.e2e.jobs_app:app`` runs in the e2e tests.

The App is built on first access of ``app`` (a module ``__getattr__``), from the
environment: ``TIDINGS_REDIS_URL`` (none: the embedded default under ./.tidings),
``TIDINGS_KEY``, ``TIDINGS_PREFIX``, ``TIDINGS_RETRY_AFTER``. The test process imports
the job classes only, and dispatches them with its own App.

Every job records itself on the App's own Redis, under ``<prefix>:test:*``:

    exec       hash id -> completed runs (the side effect: ``HINCRBY test:exec <id> 1``)
    started    hash id -> starts (a killed run counts here, not in ``exec``)
    attempts   hash id -> ``self.attempts`` at the last start
    pid        hash id -> the pid of the worker that last started it
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from tidings import App, Job

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(
                allowed_modules=os.environ.get("TIDINGS_ALLOWED_MODULES") or __name__
            )
        return _app
    raise AttributeError(name)


def key(name: str) -> str:
    """The name of a recording key, under the current App's prefix."""
    return f"{App.current().settings.prefix}:test:{name}"


async def _start(job_id: str, attempts: int) -> int:
    r = App.current().queue_for(None).aclient()
    pipe = r.pipeline(transaction=False)
    pipe.hincrby(key("started"), job_id, 1)
    pipe.hset(key("attempts"), job_id, attempts)
    pipe.hset(key("pid"), job_id, os.getpid())
    starts, _, _ = await pipe.execute()
    return int(starts)


@dataclass
class Record(Job):
    """The plain side effect."""

    id: str

    async def handle(self) -> None:
        await App.current().queue_for(None).aclient().hincrby(key("exec"), self.id, 1)


@dataclass
class Sleeper(Job):
    """Marks its start, sleeps ``seconds`` (on its first start only, with
    ``first_only``), then records its execution."""

    id: str
    seconds: float
    first_only: bool = False
    tries = 3  # a killed run counts as an attempt; the worker's default is 1

    async def handle(self) -> None:
        starts = await _start(self.id, self.attempts)
        if starts == 1 or not self.first_only:
            await asyncio.sleep(self.seconds)
        await App.current().queue_for(None).aclient().hincrby(key("exec"), self.id, 1)


@dataclass
class SyncSleeper(Job):
    """As :class:`Sleeper`, blocking a worker thread."""

    id: str
    seconds: float
    first_only: bool = False
    tries = 3

    def handle(self) -> None:
        r = App.current().queue_for(None).client
        starts = r.hincrby(key("started"), self.id, 1)
        r.hset(key("attempts"), self.id, self.attempts)
        r.hset(key("pid"), self.id, os.getpid())
        if starts == 1 or not self.first_only:
            time.sleep(self.seconds)
        r.hincrby(key("exec"), self.id, 1)


@dataclass
class Boom(Job):
    """Always fails."""

    id: str

    def handle(self) -> None:
        raise RuntimeError(f"boom {self.id}")


@dataclass
class Ordered(Job):
    """Appends its id to ``<prefix>:test:order`` (execution order across queues)."""

    id: str

    async def handle(self) -> None:
        await App.current().queue_for(None).aclient().rpush(key("order"), self.id)


@dataclass
class UniqueOrdered(Ordered):
    """:class:`Ordered`, unique for a minute (its push goes through the unique script)."""

    unique_for = 60.0

    def unique_id(self) -> str:
        return self.id


@dataclass
class GroupSlot(Job):
    """Counts itself among its fair group's running jobs while it runs (fair groups,
    issue 25): ``INCR <prefix>:test:running:<group>`` at start, the value pushed on
    ``test:seen:<group>`` (so the test reads the most ever running at once, as the jobs
    saw it), then ``seconds`` asleep (``first_only``: on its first start only), then
    ``DECR`` and its execution recorded."""

    id: str
    tenant: str
    seconds: float
    first_only: bool = False
    tries = 3

    def group(self) -> str:
        return self.tenant

    async def handle(self) -> None:
        r = App.current().queue_for(None).aclient()
        starts = await _start(self.id, self.attempts)
        now = await r.incr(key(f"running:{self.tenant}"))
        await r.rpush(key(f"seen:{self.tenant}"), now)
        try:
            if starts == 1 or not self.first_only:
                await asyncio.sleep(self.seconds)
        finally:
            await r.decr(key(f"running:{self.tenant}"))
        await r.hincrby(key("exec"), self.id, 1)


@dataclass
class Answer(Job):
    """Keeps its result: sleeps ``seconds``, records when it returned (``test:answered``,
    epoch seconds), and returns a value the serializer carries (a datetime inside)."""

    id: str
    seconds: float = 0.0
    store_result = True

    async def handle(self) -> dict[str, Any]:
        import datetime as dt

        if self.seconds:
            await asyncio.sleep(self.seconds)
        r = App.current().queue_for(None).aclient()
        await r.hset(key("answered"), self.id, repr(time.time()))
        return {"id": self.id, "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)}


@dataclass
class Crawler(Job):
    """A long async job reporting progress every ``pause`` seconds. Records its start in
    ``test:started`` and how it ended in ``test:crawl`` (``cancelled`` when it saw
    CancelledError, with the time in ``test:crawl-at``), and ``failed()`` calls in
    ``test:crawl-failed``."""

    id: str
    steps: int = 100_000
    pause: float = 0.02
    tries = 3

    async def handle(self) -> None:
        r = App.current().queue_for(None).aclient()
        await r.hincrby(key("started"), self.id, 1)
        outcome = "finished"
        try:
            for i in range(1, self.steps + 1):
                self.progress(i, self.steps, note=f"step {i}")
                await asyncio.sleep(self.pause)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            await r.hset(key("crawl-at"), self.id, repr(time.time()))
            await r.hset(key("crawl"), self.id, outcome)

    async def failed(self, exc: BaseException) -> None:
        await App.current().queue_for(None).aclient().hset(key("crawl-failed"), self.id, repr(exc))
