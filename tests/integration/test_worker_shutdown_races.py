"""Two races at the end of a job, against a real Redis.

- A lease renewal that runs just after the job's ack landed finds no token: that is not
  a lost reservation (the ack's own reply says whether one was lost). Reported as one,
  a long job on a busy machine logged "reservation lost" although it ran once and its
  ack was accepted (CI, tests/faults/test_redis_stall.py F13).
- A background task whose cancel was lost (Python 3.11's ``asyncio.wait_for``, which
  redis-py sends through, returns a completed command's result instead of raising the
  cancel) must not hold up the worker's exit: ``Supervised.stop`` cancels it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tidings import App, Job
from tidings.moves.consume import Broker
from tidings.redis.clients import async_client
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.leases import LeaseKeeper
from tidings.worker.tasks import Supervised

KEY = "shutdown-races-key-0123456789abcdef"


@dataclass
class Noop(Job):
    tag: str

    async def handle(self) -> None:
        return None


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix,
            allowed_modules=__name__, retry_after=3)  # fmt: skip
    try:
        yield a
    finally:
        a.close()


def _renewal_after_the_job_left(app: App, state: State) -> list[str]:
    """Reserve a job, settle it in Redis (ack), then renew its lease as a worker holding
    it in ``state`` would; returns the losses the renewal reported."""
    Noop("x").dispatch()
    rq = app.queue_for(None)
    k = rq.keys("default")

    async def main() -> list[str]:
        client = async_client(rq.url)
        try:
            broker = Broker(client, retry_after_s=3.0, max_bytes=1 << 20)
            popped = await broker.pop(k, 1)
            assert len(popped.jobs) == 1
            res = popped.jobs[0]
            held = HeldJobs()
            h = held.hold(res)
            assert h is not None
            held.set_state(h, state)
            lost = await broker.ack(k, [(res.id, res.token)], broker.ack_seq(), [])
            assert list(lost) == []  # the ack was accepted: nothing was lost
            reported: list[str] = []

            def report(job: HeldJob, what: str) -> None:
                reported.append(f"{job.reserved.id}: {what}")

            keeper = LeaseKeeper(rq, broker, held, retry_after_s=3.0, report_lost=report)
            await keeper.renew()  # the ack landed first: its token is gone
            return reported
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_renewal_racing_an_accepted_ack_reports_no_loss(app: App) -> None:
    assert _renewal_after_the_job_left(app, State.ACKING) == []


def test_a_running_job_whose_token_is_gone_is_reported_lost(app: App) -> None:
    """The control: the same missing token for a job still running is a loss."""
    reported = _renewal_after_the_job_left(app, State.RUNNING)
    assert len(reported) == 1 and reported[0].endswith("its lease renewal")


def test_stop_ends_a_task_whose_cancel_was_lost(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> float:
        entered = asyncio.Event()

        async def swallows() -> None:
            entered.set()
            # As wait_for does when the command completed as the cancel landed:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(30)
            while True:  # the loop goes on as if never cancelled
                await asyncio.sleep(0.05)

        sup = Supervised(lambda name: None)
        sup.start("leases", swallows)
        await asyncio.wait_for(entered.wait(), 5)
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(sup.stop(), 10)
        return asyncio.get_running_loop().time() - t0

    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        took = asyncio.run(main())
    assert took < 5.0  # the second cancel ended it; no give-up needed
    assert "did not end" not in caplog.text


def test_stop_gives_up_on_a_task_that_never_ends(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.worker import tasks as tasks_mod

    monkeypatch.setattr(tasks_mod, "STOP_LIMIT_S", 0.5)

    async def main() -> None:
        entered = asyncio.Event()
        released = asyncio.Event()

        async def immortal() -> None:
            entered.set()
            while not released.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue

        sup = Supervised(lambda name: None)
        task = sup.start("upkeep", immortal)
        await asyncio.wait_for(entered.wait(), 5)
        await asyncio.wait_for(sup.stop(), 5)
        assert not task.done()
        released.set()  # the test's own cleanup
        await asyncio.wait_for(task, 5)

    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        asyncio.run(main())
    assert "'upkeep' did not end" in caplog.text
