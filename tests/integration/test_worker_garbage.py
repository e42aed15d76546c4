"""A finished job leaves no reference cycle behind: its objects are freed by refcount.

Before: the held job, its run and its progress writer referred to each other (held ->
run -> progress.report -> progress -> held), so every job's objects (its body, its
decoded job, its task) waited for the cyclic GC; the gen-1 collections that freed them
took 10-20 % of a no-op job's CPU in a drain (benchmarks/README.md, issue 28 goal 4).
(A job that reports progress can still leave one, through its progress write: a
traceback holding an ``asyncio.timeout`` that holds the write's task; not covered here.)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tidings import App, Job
from tidings.jobs.job import JobRun
from tidings.worker.held import HeldJob
from tidings.worker.progress import JobProgress
from tidings.worker.worker import Worker, WorkerOptions

KEY = "g" * 32


@dataclass
class Quiet(Job):
    n: int

    async def handle(self) -> None:
        return None


@dataclass
class SyncQuiet(Job):
    n: int

    def handle(self) -> None:
        return None


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules="tests")
    try:
        yield a
    finally:
        a.close()


def test_drained_jobs_leave_nothing_for_the_cyclic_gc(app: App) -> None:
    app.dispatch_many(
        [*(Quiet(i) for i in range(40)), *(SyncQuiet(i) for i in range(5))]
    )  # fmt: skip
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        asyncio.run(Worker(app, WorkerOptions(concurrency=8, stop_when_empty=True)).run())
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, HeldJob | JobRun | JobProgress | Job)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    sizes = app.queue_for(None).sizes(["default"])["default"]
    assert (sizes["ready"], sizes["reserved"], sizes["failed"]) == (0, 0, 0)  # all ran, fine
    assert left == []
