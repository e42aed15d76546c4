"""Lost replies at every seam: a proxy in front of Redis
lets one command reach Redis and run, then drops its reply and the connection. redis-py,
the producer's fast lane and the worker's retry loop send the command again; the second
run must change nothing.

The worker runs in-process (as tests/integration/test_worker.py) against the proxy; the
assertions read Redis directly, past the proxy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pytest
import redis

from tests.support import FaultProxy
from tidings import App, Job
from tidings.redis import scripts
from tidings.redis.scripts import UNIQUE_PUSH
from tidings.worker.worker import Worker, WorkerOptions

KEY = "seams-test-key-0123456789abcdef-01"
MODULE = __name__
RUNS: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    yield


@dataclass
class Plain(Job):
    """Records its run; the worker's default tries (1)."""

    tag: str

    async def handle(self) -> None:
        RUNS.append((self.tag, self.attempts))


@dataclass
class Broken(Job):
    """Always raises; no retry."""

    tag: str

    async def handle(self) -> None:
        RUNS.append((self.tag, self.attempts))
        raise ValueError(f"broken {self.tag}")


@dataclass
class Raises(Job):
    """Raises every run; fails at its third exception (max_exceptions 3)."""

    tag: str
    tries = 0
    max_exceptions = 3

    async def handle(self) -> None:
        RUNS.append((self.tag, self.attempts))
        raise ValueError("again")


@dataclass
class Unique(Job):
    tag: str
    unique_for = 60.0

    def unique_id(self) -> str:
        return self.tag

    async def handle(self) -> None:
        RUNS.append((self.tag, self.attempts))


@pytest.fixture
def proxy(redis_url: str, fault_proxy_factory: Callable[[str, int], FaultProxy]) -> FaultProxy:
    u = urlparse(redis_url)
    return fault_proxy_factory(u.hostname or "127.0.0.1", u.port or 6379)


@pytest.fixture
def app(proxy: FaultProxy, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=proxy.url(),
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        retry_after=3,
    )
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


def work(app: App, until: Callable[[], object], timeout_s: float = 20.0) -> Worker:
    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(sleep_s=0.2, concurrency=2))
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout_s
        while not until() and not task.done():
            assert time.monotonic() < deadline, "worker condition not met in time"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # let the batched ack go out
        worker.stop("test condition met")
        await asyncio.wait_for(task, timeout_s)
        return worker

    return asyncio.run(main())


def drop(proxy: FaultProxy, script: scripts.LuaScript, count: int = 1) -> None:
    """Drop the next ``count`` replies of ``script`` (loaded first, so the EVALSHA that
    ran is the one whose reply is lost, not a NOSCRIPT answer)."""
    client = redis.Redis(host=proxy.target_host, port=proxy.target_port)
    try:
        client.script_load(script.source)
    finally:
        client.close()
    proxy.drop_replies({script.name: script.sha.encode()}, count=count)


def test_defect_1_a_lost_fail_reply_keeps_the_payload(app: App, proxy: FaultProxy, r: Any) -> None:
    job_id = Broken("f").dispatch()
    assert job_id is not None
    k = app.queue_for(None).keys("default")
    envelope = r.hget(k.jobs, job_id)
    drop(proxy, scripts.FAIL)
    work(app, lambda: r.zscore(k.failed, job_id) is not None)
    assert proxy.drops == {"fail": 1}
    assert r.hget(k.failed_body, job_id) == envelope  # not b"": the arguments are kept
    assert app.job_status(job_id) == "failed"
    # Retried, it runs with its arguments (and fails again, as it always does).
    RUNS.clear()
    assert app.queue_for(None).retry([job_id]) == 1
    work(app, lambda: RUNS)
    assert RUNS[0] == ("f", 1)


def test_defect_3_a_lost_release_reply_counts_the_exception_once(
    app: App, proxy: FaultProxy, r: Any
) -> None:
    job_id = Raises("x").dispatch()
    k = app.queue_for(None).keys("default")
    drop(proxy, scripts.RELEASE)
    work(app, lambda: r.zscore(k.failed, job_id) is not None)
    assert proxy.drops == {"release": 1}
    assert RUNS == [("x", 1), ("x", 2), ("x", 3)]  # not failed early at the second run


def test_defect_4_a_lost_push_reply_lands_the_id_once(app: App, proxy: FaultProxy, r: Any) -> None:
    k = app.queue_for(None).keys("default")
    drop(proxy, scripts.PUSH)
    job_id = Plain("p").dispatch()
    assert proxy.drops == {"push": 1}
    assert r.lrange(k.ready, 0, -1) == [str(job_id).encode()]
    work(app, lambda: RUNS)
    assert RUNS == [("p", 1)]


def test_defect_5_a_lost_unique_push_reply_still_returns_the_id(
    app: App, proxy: FaultProxy, r: Any
) -> None:
    k = app.queue_for(None).keys("default")
    drop(proxy, UNIQUE_PUSH)
    job_id = Unique("u").dispatch()
    assert proxy.drops == {"unique_push": 1}
    assert job_id is not None  # not "duplicate dropped": it was queued, and it runs
    assert r.lrange(k.ready, 0, -1) == [job_id.encode()]
    assert Unique("u").dispatch() is None  # a real duplicate is still dropped


def test_defect_6_a_lost_ack_reply_logs_no_lost_reservation(
    app: App, proxy: FaultProxy, r: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = Plain("a").dispatch()
    drop(proxy, scripts.ACK)
    worker = work(app, lambda: proxy.drops)
    assert proxy.drops == {"ack": 1}
    assert worker.reservations_lost == 0
    assert "reservation lost" not in caplog.text
    assert app.job_status(str(job_id)) == "done"
    assert RUNS == [("a", 1)]


def test_defect_7_a_lost_pop_reply_runs_the_job_not_fails_it(
    app: App, proxy: FaultProxy, r: Any
) -> None:
    job_id = Plain("q").dispatch()
    drop(proxy, scripts.POP)
    work(app, lambda: RUNS, timeout_s=15)
    assert proxy.drops == {"pop": 1}
    assert RUNS == [("q", 1)]
    assert app.job_status(str(job_id)) == "done"
    k = app.queue_for(None).keys("default")
    assert r.zcard(k.failed) == 0
