"""Cron on real Redis: two schedules of one class with other arguments both
run; a second schedule with the same name is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.workflows_app import Tick, make_app
from tidings import App
from tidings.redis.keys import schedule_lease_key
from tidings.wire.envelope import read_body
from tidings.workflows.schedule import Scheduler


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _queued_kinds(app: App) -> list[str]:
    rq = app.queue_for(None)
    k = rq.keys("default")
    ids: Any = rq.client.lrange(k.ready, 0, -1)
    bodies: Any = rq.client.hmget(k.jobs, ids) if ids else []
    return sorted(read_body(b)["data"]["f"]["kind"] for b in bodies)  # type: ignore[index]


def test_two_schedules_of_one_class_both_dispatch(app: App) -> None:
    app.schedule(Tick("a"), every_s=0.2)
    app.schedule(Tick("b"), every_s=0.2)

    async def run() -> None:
        sch = Scheduler(app, lease_s=5)
        rq = app.queue_for(None)
        client = rq.aclient()
        lease = schedule_lease_key(rq.prefix)
        try:
            await sch._step(client, lease, f"{lease}:last")  # first sight: starts from now
            await asyncio.sleep(0.5)
            await sch._step(client, lease, f"{lease}:last")
        finally:
            await client.aclose()

    asyncio.run(run())
    kinds = _queued_kinds(app)
    assert kinds.count("a") >= 1 and kinds.count("b") >= 1
    assert kinds.count("a") == kinds.count("b")


def test_a_second_schedule_with_the_same_name_is_refused(app: App) -> None:
    app.schedule(Tick("a"), cron="* * * * *")
    with pytest.raises(ValueError, match="pass name="):
        app.schedule(Tick("a"), cron="* * * * *")
    with pytest.raises(ValueError, match="pass name="):
        app.schedule(Tick("b"), cron="*/5 * * * *", name=app.schedules[0].name)
    app.schedule(Tick("a"), cron="* * * * *", name="a-again")
    assert len(app.schedules) == 2


def test_the_app_zone_is_the_default_for_cron(redis_url: str, prefix: str) -> None:
    from tests.integration.workflows_app import KEY

    zoned = App(
        redis_url=redis_url, key=KEY, prefix=prefix, env=False, schedule_timezone="Asia/Tokyo"
    )
    try:
        assert zoned.schedule(Tick("a"), cron="0 9 * * *").tz == "Asia/Tokyo"
        assert zoned.schedule(Tick("b"), cron="0 9 * * *", tz="UTC").tz == "UTC"
        assert zoned.schedule(Tick("c"), every_s=5).tz is None
        with pytest.raises(ValueError, match="unknown time zone"):
            zoned.schedule(Tick("d"), cron="0 9 * * *", tz="Nowhere/Land")
    finally:
        zoned.close()
