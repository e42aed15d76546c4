"""Fair groups within a queue (issue 25), against a real redis-server and real workers.

Each test names the guarantee it checks, and each would fail without it: round-robin
between groups, limits and pause, the slot of a dead worker coming back, garbage in one
group failing only that group, and no key left behind by an emptied group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tidings import App, Job, ValidationError
from tidings.redis.keys import QueueKeys
from tidings.worker.worker import Worker, WorkerOptions

KEY = "groups-test-key-0123456789abcdef"
MODULE = __name__

RUNS: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    yield


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        retry_after=3,
        metrics=False,
    )
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def r(app: App) -> redis.Redis:
    return app.queue_for(None).client


def keys(app: App, queue: str = "default") -> QueueKeys:
    return app.queue_for(None).keys(queue)


def work(
    app: App,
    *,
    until: Callable[[], object] | None = None,
    timeout_s: float = 30.0,
    **options: Any,
) -> Worker:
    options.setdefault("sleep_s", 0.2)
    options.setdefault("concurrency", 1)
    options.setdefault("stop_when_empty", until is None)

    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(**options))
        task = asyncio.create_task(worker.run())
        if until is not None:
            deadline = time.monotonic() + timeout_s
            while not until() and not task.done():
                assert time.monotonic() < deadline, "worker condition not met in time"
                await asyncio.sleep(0.01)
            worker.stop("test condition met")
        worker.exit_code = await asyncio.wait_for(task, timeout_s)
        return worker

    return asyncio.run(main())


@dataclass
class Note(Job):
    tag: str

    def handle(self) -> None:
        RUNS.append(self.tag)


@dataclass
class TenantJob(Job):
    tenant: str
    tag: str

    def group(self) -> str:
        return self.tenant

    def handle(self) -> None:
        RUNS.append(self.tag)


def group_keys(r: redis.Redis, app: App) -> list[str]:
    k = keys(app)
    left = []
    for key in r.scan_iter(match=f"{k.ready}:g*", count=1000):
        if key.decode() != k.gon:  # the queue's marker (groups on), not a group's
            left.append(key.decode())
    return sorted(left)


# -- round robin ---------------------------------------------------------------------------


def test_a_small_group_waits_one_turn_of_each_other_group_not_the_big_backlog(app: App) -> None:
    for i in range(50):
        Note(f"a{i}").on_group("tenant-a").dispatch()
    Note("b0").on_group("tenant-b").dispatch()
    Note("c0").on_group("tenant-c").dispatch()
    Note("plain").dispatch()  # ungrouped jobs take their turn as one more group
    work(app)
    assert len(RUNS) == 53
    # One job of each active group per turn: b, c and the ungrouped one all ran within
    # the first four jobs, however many tenant-a holds.
    assert set(RUNS[:4]) == {"a0", "b0", "c0", "plain"}
    assert RUNS[4:] == [f"a{i}" for i in range(1, 50)]


def test_the_group_hook_of_a_job_class_picks_its_group(app: App, r: redis.Redis) -> None:
    TenantJob("acme", "x").dispatch()
    k = keys(app)
    assert r.zrange(k.gring, 0, -1) == [b"acme"]
    assert r.llen(k.group("g", "acme")) == 1
    work(app)
    assert RUNS == ["x"]


@pytest.mark.parametrize("bad", ["", "x" * 257, "bad\nkey", "esc\x1b[31m", "\x7f", "é" * 129])
def test_bad_group_keys_are_refused_at_dispatch_and_nothing_is_pushed(
    app: App, r: redis.Redis, bad: str
) -> None:
    with pytest.raises(ValidationError, match="on_group"):
        Note("x").on_group(bad).dispatch()
    with pytest.raises(ValidationError, match="group hook of TenantJob"):
        TenantJob(bad, "x").dispatch()
    assert r.hlen(keys(app).jobs) == 0


def test_a_256_byte_key_is_accepted(app: App) -> None:
    Note("x").on_group("k" * 256).dispatch()
    work(app)
    assert RUNS == ["x"]


# -- limits and pause ------------------------------------------------------------------------


def test_a_paused_group_stays_queued_and_never_blocks_the_others(app: App, r: redis.Redis) -> None:
    app.groups.pause("slow")
    for i in range(3):
        Note(f"s{i}").on_group("slow").dispatch()
        Note(f"f{i}").on_group("fast").dispatch()
    work(app)
    assert sorted(RUNS) == ["f0", "f1", "f2"]
    info = app.groups.show("slow")
    assert (info.ready, info.paused, info.in_turn) == (3, True, False)
    app.groups.resume("slow")
    work(app)
    assert sorted(RUNS) == ["f0", "f1", "f2", "s0", "s1", "s2"]
    assert not app.groups.show("slow").paused


def test_a_delayed_and_a_released_job_come_back_into_their_group(app: App, r: redis.Redis) -> None:
    Note("later").on_group("acme").delay(0.2).dispatch()
    k = keys(app)
    assert r.zcard(k.delayed) == 1 and not r.exists(k.group("g", "acme"))
    work(app, until=lambda: RUNS == ["later"])
    assert group_keys(r, app) == []


def test_an_emptied_group_leaves_no_key_behind(app: App, r: redis.Redis) -> None:
    for g in range(200):
        Note(f"n{g}").on_group(f"tenant-{g}").dispatch()
    assert len(group_keys(r, app)) == 200 + 2  # 200 lists, the ring and the ready count
    work(app, concurrency=8)
    assert len(RUNS) == 200
    assert group_keys(r, app) == []
    assert r.hlen(keys(app).gstat) == 0


# -- garbage ---------------------------------------------------------------------------------


@pytest.mark.topologies
def test_garbage_in_one_group_fails_only_that_groups_pop_with_an_error_naming_it(
    app: App, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(3):
        Note(f"good{i}").on_group("good").dispatch()
    Note("bad0").on_group("broken").dispatch()
    k = keys(app)
    # Someone writes a running set of the wrong type and a concurrency that is no number.
    r.delete(k.group("gr", "broken"))
    r.set(k.group("gr", "broken"), "garbage")
    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        work(app)
    assert sorted(RUNS) == ["good0", "good1", "good2"]
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert any("'broken'" in m and "WRONGTYPE" in m for m in errors), errors
    # The broken group's job is intact, waiting for the repair.
    assert r.lrange(k.group("g", "broken"), 0, -1) and r.hlen(k.jobs) == 1
    r.delete(k.group("gr", "broken"))
    app.groups.resume("broken")
    work(app)
    assert "bad0" in RUNS


def test_a_garbage_limit_is_reported_for_its_group_only(
    app: App, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    Note("ok").on_group("fine").dispatch()
    Note("held").on_group("odd").dispatch()
    r.hset(keys(app).gcfg, "c:odd", "two")
    with caplog.at_level(logging.ERROR, logger="tidings.worker"):
        work(app)
    assert RUNS == ["ok"]
    assert any(
        "'odd'" in rec.getMessage() and "c:odd" in rec.getMessage() for rec in caplog.records
    )


def test_limit_keeps_what_it_is_not_given_and_none_removes_it(app: App, r: redis.Redis) -> None:
    cfg = keys(app).gcfg
    app.groups.limit("acme", concurrency=2, rate="100/min", burst=3)
    app.groups.limit("acme", concurrency=4)  # the rate stays
    info = app.groups.show("acme")
    assert (info.concurrency, r.hget(cfg, "r:acme")) == (4, b"600000 3")
    app.groups.limit("acme", rate="60/s")  # the concurrency stays; burst 1 when not given
    assert (app.groups.show("acme").concurrency, r.hget(cfg, "r:acme")) == (4, b"16667 1")
    app.groups.limit("acme")  # nothing named: nothing changes
    assert app.groups.show("acme").concurrency == 4 and r.hget(cfg, "r:acme") == b"16667 1"
    app.groups.limit("acme", rate=None)
    assert app.groups.show("acme").rate_per_s is None and app.groups.show("acme").concurrency == 4
    app.groups.limit("acme", concurrency=None)
    assert r.hlen(cfg) == 0
    with pytest.raises(ValidationError, match=r"burst=.*rate="):
        app.groups.limit("acme", burst=2)


# -- scale and topologies ----------------------------------------------------------------


@dataclass
class Nop(Job):
    def handle(self) -> None:
        pass


def test_100000_one_job_groups_drain_and_leave_no_key(app: App, r: redis.Redis) -> None:
    n = 100_000
    app.dispatch_many(Nop().on_group(f"t{i}") for i in range(n))
    k = keys(app)
    assert r.zcard(k.gring) == n
    work(app, concurrency=64, timeout_s=600)
    assert r.zcard(k.done) > 0 and r.hlen(k.jobs) == 0
    assert group_keys(r, app) == []
    assert not r.exists(k.gstat)


@pytest.mark.topologies
def test_round_robin_limits_and_cleanup_on_every_topology(app: App, r: redis.Redis) -> None:
    # Every group key carries the queue's hash tag: one slot on Redis Cluster.
    app.groups.limit("big", concurrency=1)
    for i in range(6):
        Note(f"big{i}").on_group("big").dispatch()
    Note("small").on_group("small").dispatch()
    Note("late").on_group("small").delay(0.1).dispatch()
    work(app, concurrency=4)
    assert sorted(RUNS) == sorted([f"big{i}" for i in range(6)] + ["small", "late"])
    assert RUNS.index("small") <= 1
    assert group_keys(r, app) == [keys(app).gcfg]  # only the setting stays


@dataclass
class UniqueNote(Job):
    tag: str
    unique_for = 60

    def unique_id(self) -> str:
        return self.tag

    def handle(self) -> None:
        RUNS.append(self.tag)


def test_a_unique_job_with_a_group_is_refused_not_queued_outside_it(
    app: App, r: redis.Redis
) -> None:
    with pytest.raises(ValidationError, match="unique or debounced"):
        UniqueNote("u").on_group("acme").dispatch()
    with pytest.raises(ValidationError, match="unique or debounced"):
        app.dispatch_many([UniqueNote("v").on_group("acme")])
    assert r.hlen(keys(app).jobs) == 0
