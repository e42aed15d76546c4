"""``async def`` listeners of the queue's lifecycle events (JobProcessed, JobFailed...).

Before: ``App.emit`` dispatched lifecycle events synchronously, which refuses an event
that has an async listener, so one async listener of ``JobFailed`` (say, an alert sent
with an async HTTP client) silenced *every* listener of that event, the sync ones
included, with a logged ConfigurationError per job. Now, on an event loop (a worker,
async code) all the listeners run in order in a task, and the worker waits for those
tasks as it stops; where no loop runs (a sync ``dispatch()``), the sync and queued ones
run and the async ones are skipped with one warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tidings import App, Job
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobQueued, WorkerStopping
from tidings.worker.worker import Worker, WorkerOptions

KEY = "y" * 32
SEEN: list[str] = []


@dataclass
class Fine(Job):
    n: int

    async def handle(self) -> None:
        pass


@dataclass
class Broken(Job):
    n: int

    async def handle(self) -> None:
        raise RuntimeError(f"broken {self.n}")


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    SEEN.clear()
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules="tests")
    try:
        yield a
    finally:
        a.close()


def test_async_and_sync_listeners_of_lifecycle_events_all_run_in_a_worker(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    async def on_processed(e: JobProcessed) -> None:
        await asyncio.sleep(0.01)  # really async: it awaits
        SEEN.append(f"async processed {e.name}")

    def on_processed_sync(e: JobProcessed) -> None:
        SEEN.append(f"sync processed {e.name}")

    async def on_failed(e: JobFailed) -> None:
        await asyncio.sleep(0.01)
        SEEN.append(f"async failed {e.name}")

    async def on_stopping(e: WorkerStopping) -> None:
        await asyncio.sleep(0.05)  # the worker must wait for this one as it exits
        SEEN.append("async stopping")

    app.listen(JobProcessed, [on_processed, on_processed_sync])
    app.listen(JobFailed, on_failed)
    app.listen(WorkerStopping, on_stopping)
    for i in range(3):
        Fine(i).dispatch()
    Broken(0).dispatch()
    worker = Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.5))
    with caplog.at_level(logging.ERROR):
        assert asyncio.run(asyncio.wait_for(worker.run(), 15)) == 0
    assert sum(1 for x in SEEN if x.startswith("async processed")) == 3, SEEN
    assert sum(1 for x in SEEN if x.startswith("sync processed")) == 3, SEEN
    assert sum(1 for x in SEEN if x.startswith("async failed")) == 1, SEEN
    assert SEEN[-1] == "async stopping", SEEN
    assert "listener" not in caplog.text, caplog.text


def test_a_sync_dispatch_runs_the_sync_listeners_and_warns_once_about_async_ones(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    async def on_queued(e: JobQueued) -> None:
        SEEN.append("async queued")

    app.listen(JobQueued, [on_queued, lambda e: SEEN.append(f"sync queued {e.job_id}")])
    with caplog.at_level(logging.WARNING, logger="tidings"):
        ids = [Fine(i).dispatch() for i in range(3)]
    assert [f"sync queued {i}" for i in ids] == SEEN
    warnings = [r for r in caplog.records if "async listeners of JobQueued" in r.getMessage()]
    assert len(warnings) == 1 and "dispatch_async" in warnings[0].getMessage()

    async def from_async_code() -> str | None:
        job_id = await Fine(9).dispatch_async()
        await app.wait_listeners()
        return job_id

    SEEN.clear()
    job_id = asyncio.run(from_async_code())
    assert ["async queued", f"sync queued {job_id}"] == SEEN  # all of them, in order
