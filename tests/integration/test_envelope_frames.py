"""A rolling upgrade, producers first: ``envelope_frame=1`` makes an upgraded producer
write the previous envelope frame (which workers of the previous version read; see
tests/unit/test_payload.py for the byte-for-byte check), and an upgraded worker runs
both frames side by side."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from tidings import App, Job
from tidings.worker.worker import Worker, WorkerOptions

KEY = "envelope-frames-key-0123456789abcdef"
RAN: list[str] = []


@dataclass
class Mark(Job):
    tag: str

    async def handle(self) -> None:
        RAN.append(self.tag)


def _app(url: str, prefix: str, frame: int) -> App:
    return App(env=False, redis_url=url, key=KEY, prefix=prefix,
               allowed_modules=__name__, envelope_frame=frame)  # fmt: skip


@pytest.fixture
def apps(redis_url: str, prefix: str) -> Iterator[tuple[App, App]]:
    old, new = _app(redis_url, prefix, 1), _app(redis_url, prefix, 2)
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def test_both_frames_queued_side_by_side_run_once_each(
    apps: tuple[App, App], redis_url: str
) -> None:
    RAN.clear()
    old, new = apps
    [first] = old.dispatch_many([Mark("frame 1")])
    [second] = new.dispatch_many([Mark("frame 2")])
    r = redis.Redis.from_url(redis_url)
    try:
        jobs_key = new.queue_for(None).keys("default").jobs
        raw1, raw2 = r.hget(jobs_key, str(first)), r.hget(jobs_key, str(second))
    finally:
        r.close()
    assert raw1 is not None and raw1.startswith(b'{"sig":"') and b'"uuid":' in raw1
    assert raw2 is not None and raw2.startswith(b'{"s":"') and b'"uuid"' not in raw2
    asyncio.run(Worker(new, WorkerOptions(stop_when_empty=True, sleep_s=0.2)).run())
    assert sorted(RAN) == ["frame 1", "frame 2"]
    assert new.job_status(str(first)) == new.job_status(str(second)) == "done"
