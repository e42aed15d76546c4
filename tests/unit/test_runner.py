"""SyncRunner (tidings.worker.threads): the threads sync handlers run on, on a real loop.

What it must keep from a thread pool while handing jobs over in batches: results and
exceptions reach the awaiting task, each call runs in the context it was submitted
with, a call that blocks never holds up the ones queued behind it (up to max_threads at
once), a call past its deadline fails its future while its thread stays counted busy,
and threads are reused (thread-local state lives as long as the worker).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tidings.worker.threads import HANDOVER_S, STALL_S, Overran, SyncRunner

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def run(main: Callable[[SyncRunner], Any], max_threads: int = 4) -> Any:
    runner = SyncRunner(max_threads)

    async def go() -> Any:
        try:
            return await main(runner)
        finally:
            runner.close(wait=False)

    return asyncio.run(go())


def test_results_exceptions_and_context_reach_the_awaiting_task() -> None:
    def in_ctx(value: str) -> contextvars.Context:
        ctx = contextvars.copy_context()
        ctx.run(VAR.set, value)
        return ctx

    def boom() -> None:
        raise KeyError("boom")

    async def main(runner: SyncRunner) -> None:
        futs = [runner.submit(VAR.get, in_ctx(f"v{i}")) for i in range(50)]
        assert await asyncio.gather(*futs) == [f"v{i}" for i in range(50)]
        with pytest.raises(KeyError, match="boom"):
            await runner.submit(boom, contextvars.copy_context())
        assert VAR.get() == "unset"  # the loop's own context is untouched

    run(main)


def test_a_burst_runs_on_one_thread_and_threads_are_reused() -> None:
    names: list[str] = []
    local = threading.local()

    def job() -> int:
        names.append(threading.current_thread().name)
        local.count = getattr(local, "count", 0) + 1
        return int(local.count)

    async def main(runner: SyncRunner) -> None:
        counts = await asyncio.gather(
            *(runner.submit(job, contextvars.copy_context()) for _ in range(200))
        )
        for _ in range(20):  # one at a time: the same thread, woken each time
            counts.append(await runner.submit(job, contextvars.copy_context()))
        # Thread-local state survives from job to job on a thread.
        assert max(counts) > 100
        assert all(n.startswith("job_") for n in names)
        assert len(set(names)) < 4  # not a thread per job

    run(main, max_threads=16)


def test_a_blocking_call_does_not_hold_up_the_ones_queued_behind_it() -> None:
    gate = threading.Event()
    order: list[str] = []

    def blocker() -> None:
        order.append("blocker")
        assert gate.wait(10)

    def quick(tag: str) -> Callable[[], str]:
        def call() -> str:
            order.append(tag)
            return tag

        return call

    async def main(runner: SyncRunner) -> None:
        try:
            # Submitted together: one thread is woken, takes the blocker first.
            b = runner.submit(blocker, contextvars.copy_context())
            q = [runner.submit(quick(f"q{i}"), contextvars.copy_context()) for i in range(3)]
            t0 = time.monotonic()
            assert await asyncio.wait_for(asyncio.gather(*q), 5) == ["q0", "q1", "q2"]
            assert time.monotonic() - t0 < 2  # not behind the blocker
            assert not b.done() and runner.busy == 1
        finally:
            gate.set()
        await b
        assert order[0] == "blocker"

    run(main)


def test_no_more_than_max_threads_run_at_once() -> None:
    gate = threading.Event()
    running: list[int] = []
    lock = threading.Lock()
    state = {"now": 0}

    def blocker() -> None:
        with lock:
            state["now"] += 1
            running.append(state["now"])
        gate.wait(10)
        with lock:
            state["now"] -= 1

    async def main(runner: SyncRunner) -> None:
        futs = [runner.submit(blocker, contextvars.copy_context()) for _ in range(3)]
        while runner.busy < 2:
            await asyncio.sleep(STALL_S)
        await asyncio.sleep(20 * STALL_S)  # stall checks go on: no third thread
        assert runner.busy == 2 and max(running) == 2
        gate.set()
        await asyncio.wait_for(asyncio.gather(*futs), 5)
        assert len(running) == 3

    run(main, max_threads=2)


def test_a_call_past_its_deadline_fails_its_future_and_stays_busy() -> None:
    gate = threading.Event()

    def stuck() -> str:
        gate.wait(10)
        return "late"

    async def main(runner: SyncRunner) -> None:
        try:
            t0 = time.monotonic()
            slow = runner.submit(stuck, contextvars.copy_context(), 0.3)
            quick = runner.submit(lambda: "ok", contextvars.copy_context(), 5.0)
            assert await asyncio.wait_for(quick, 5) == "ok"  # not behind the stuck one
            with pytest.raises(Overran):
                await asyncio.wait_for(slow, 5)
            assert 0.25 < time.monotonic() - t0 < 3
            assert runner.busy == 1  # its thread cannot be stopped
        finally:
            gate.set()
        for _ in range(500):
            if runner.busy == 0:
                break
            await asyncio.sleep(0.01)
        assert runner.busy == 0  # the late result was dropped, nothing raised

    run(main)


def test_an_earlier_deadline_submitted_later_still_fires_on_time() -> None:
    gate = threading.Event()

    async def main(runner: SyncRunner) -> None:
        try:
            runner.submit(lambda: gate.wait(10), contextvars.copy_context(), 30.0)
            t0 = time.monotonic()
            short = runner.submit(lambda: gate.wait(10), contextvars.copy_context(), 0.2)
            with pytest.raises(Overran):
                await asyncio.wait_for(short, 5)
            assert time.monotonic() - t0 < 3
        finally:
            gate.set()

    run(main)


def test_an_idle_handover_waits_only_for_the_thread_to_take_the_job() -> None:
    taken = threading.Event()
    release = threading.Event()

    def job() -> None:
        taken.set()
        release.wait(10)

    async def main(runner: SyncRunner) -> None:
        try:
            fut = runner.submit(job, contextvars.copy_context(), alone=True)
            # submit() returned: the thread had taken the job (or HANDOVER_S passed), and
            # the loop was not held for the whole call.
            assert taken.wait(HANDOVER_S + 2)
            assert not fut.done()
        finally:
            release.set()
        await fut

    run(main)


def test_close_lets_idle_threads_end() -> None:
    runner = SyncRunner(4)

    async def main() -> None:
        await asyncio.gather(
            *(runner.submit(lambda: 1, contextvars.copy_context()) for _ in range(8))
        )

    asyncio.run(main())
    threads = list(runner._threads)
    assert threads
    runner.close(wait=True)
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(_submit_after_close(runner))


async def _submit_after_close(runner: SyncRunner) -> None:
    runner.submit(lambda: 1, contextvars.copy_context())
