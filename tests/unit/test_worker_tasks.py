"""The worker's background tasks are watched (tidings.worker.tasks): a task that dies is
logged at ERROR and started again; one that keeps dying stops the worker; a cancellation
that a library turned into an error is not a death."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tidings.worker import tasks as tasks_mod
from tidings.worker.tasks import MAX_RESTARTS, Supervised


def test_a_task_that_dies_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    fatal: list[str] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("WRONGTYPE Operation against a key holding the wrong kind")
        await asyncio.sleep(30)

    async def main() -> None:
        sup = Supervised(fatal.append)
        sup.start("acks", flaky)
        for _ in range(200):
            if len(runs) >= 3:
                break
            await asyncio.sleep(0.05)
        await sup.stop()

    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        asyncio.run(main())
    assert len(runs) == 3
    assert fatal == []
    died = [r for r in caplog.records if "worker task 'acks' died" in r.getMessage()]
    assert len(died) == 2 and all(r.levelno == logging.ERROR and r.exc_info for r in died)


def test_a_task_that_keeps_dying_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks_mod.asyncio, "sleep", _no_sleep)
    fatal: list[str] = []

    async def broken() -> None:
        raise ValueError("always")

    async def main() -> None:
        sup = Supervised(fatal.append)
        task = sup.start("leases", broken)
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert fatal == ["leases"]


def test_a_task_without_restart_stops_the_worker_at_its_first_death() -> None:
    fatal: list[str] = []

    async def once() -> None:
        raise KeyError("x")

    async def main() -> None:
        sup = Supervised(fatal.append)
        await asyncio.wait_for(sup.start("app-0", once, restart=False), 5)

    asyncio.run(main())
    assert fatal == ["app-0"]


def test_a_cancel_turned_into_an_error_is_not_a_death(caplog: pytest.LogCaptureFixture) -> None:
    """redis-py may answer a cancellation mid-command with a ConnectionError."""
    started = asyncio.Event

    async def main() -> None:
        entered = started()
        runs: list[int] = []

        async def converts() -> None:
            runs.append(1)
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                raise ConnectionError("Connection closed by server") from None

        sup = Supervised(lambda name: None)
        sup.start("acks", converts)
        await asyncio.wait_for(entered.wait(), 5)
        await asyncio.wait_for(sup.stop(), 5)
        assert runs == [1]

    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "died" in r.getMessage()]


_real_sleep = asyncio.sleep


async def _no_sleep(delay: float, result: object = None) -> object:
    return await _real_sleep(0, result)


assert MAX_RESTARTS >= 1
