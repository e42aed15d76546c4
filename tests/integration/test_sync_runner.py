"""Sync handlers on the worker's job threads (tidings.worker.threads), against real Redis.

The runner hands sync jobs to long-lived threads in batches: these check, through a
real Worker, what a thread pool gave for free. A sync job that blocks does not hold up
the sync jobs popped with it; a sync job that runs longer than ``retry_after`` keeps
its lease (renewed while it runs) and is acked once; a burst of sync jobs each runs once
with its own job id and attempt, on the "job" threads, and all are acked.
(Timeouts -> exit 13, SIGTERM grace and failed() are in test_worker.py and
tests/e2e/test_notify_worker.py, which run sync jobs through the same runner.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tidings import App, Job
from tidings.worker.worker import Worker, WorkerOptions

KEY = "sync-runner-test-key-0123456789abcdef"
RUNS: list[tuple[Any, ...]] = []
GATES: dict[str, threading.Event] = {}


@dataclass
class Blocks(Job):
    """Blocks its thread until the test opens its gate."""

    tag: str

    def handle(self) -> None:
        RUNS.append(("start", self.tag, time.monotonic()))
        GATES.setdefault(self.tag, threading.Event()).wait(10)
        RUNS.append(("end", self.tag, time.monotonic()))


@dataclass
class Quick(Job):
    tag: str

    def handle(self) -> None:
        RUNS.append(
            ("quick", self.tag, self.job_id, self.attempts, threading.current_thread().name)
        )


@dataclass
class Sleeps(Job):
    """Runs past the App's retry_after (its lease must be renewed meanwhile)."""

    tag: str
    seconds: float
    timeout = 30

    def handle(self) -> None:
        time.sleep(self.seconds)
        RUNS.append(("slept", self.tag, self.attempts))


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    yield
    for gate in GATES.values():
        gate.set()
    GATES.clear()


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=__name__,
        retry_after=1,
    )
    try:
        yield a
    finally:
        a.close()


def work(app: App, until: Callable[[], object] | None = None, **options: Any) -> Worker:
    options.setdefault("sleep_s", 0.2)
    options.setdefault("concurrency", 4)
    options.setdefault("stop_when_empty", until is None)

    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(**options))
        task = asyncio.create_task(worker.run())
        if until is not None:
            deadline = time.monotonic() + 20
            while not until() and not task.done():
                assert time.monotonic() < deadline, "worker condition not met in time"
                await asyncio.sleep(0.02)
            worker.stop("test condition met")
        worker.exit_code = await asyncio.wait_for(task, 20)
        return worker

    return asyncio.run(main())


def sizes(app: App) -> dict[str, int]:
    return app.queue_for(None).sizes(["default"])["default"]


def test_a_blocking_sync_job_does_not_hold_up_the_sync_jobs_popped_with_it(app: App) -> None:
    # Popped together in one batch, the blocker first: the quick ones must run while it
    # blocks, not after (the runner wakes another thread when none takes queued jobs).
    ids = [Blocks("b").dispatch()] + [Quick(f"q{i}").dispatch() for i in range(3)]

    state: dict[str, bool] = {}

    def until() -> bool:
        ended = any(r[0] == "end" for r in RUNS)
        if "blocked" not in state and len([r for r in RUNS if r[0] == "quick"]) == 3:
            state["blocked"] = not ended  # all three ran while the blocker still blocked
            GATES.setdefault("b", threading.Event()).set()
        return "blocked" in state and ended

    worker = work(app, until=until)
    assert worker.exit_code == 0
    assert state == {"blocked": True}
    assert [r[1] for r in RUNS if r[0] == "start"] == ["b"]
    assert all(app.job_status(i) == "done" for i in ids)
    assert sizes(app)["reserved"] == 0


def test_a_sync_job_longer_than_retry_after_keeps_its_lease_and_is_acked_once(app: App) -> None:
    job_id = Sleeps("s", 2.5).dispatch()  # retry_after=1: renewed every ~0.33 s meanwhile
    worker = work(app)
    assert worker.exit_code == 0
    assert worker.reservations_lost == 0
    assert RUNS == [("slept", "s", 1)]
    assert app.job_status(job_id) == "done"
    assert sizes(app) == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}


def test_a_burst_of_sync_jobs_each_runs_once_with_its_own_id_and_is_acked(app: App) -> None:
    ids = app.dispatch_many([Quick(f"q{i}") for i in range(300)])
    worker = work(app, concurrency=16)
    assert worker.exit_code == 0 and not worker.threads_left
    runs = [r for r in RUNS if r[0] == "quick"]
    assert sorted(r[1] for r in runs) == sorted(f"q{i}" for i in range(300))
    assert sorted(r[2] for r in runs) == sorted(ids)  # each saw its own job id (context)
    assert all(r[3] == 1 for r in runs)
    assert all(r[4].startswith("job_") for r in runs)
    assert all(app.job_status(i) == "done" for i in ids)
    assert sizes(app) == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}
