"""Cron against real Redis and two ``notify-worker`` subprocesses.

Guarantees: each tick is dispatched once across all workers; when the leader dies, the
other worker takes the lease over and dispatches the ticks missed meanwhile, so no tick
is lost or doubled.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.integration.workflows_app import Tick, make_app
from tests.integration.workflows_support import start_worker, stop_all, wait_until
from tests.support import Proc
from tidings import App
from tidings.redis.keys import schedule_lease_key
from tidings.workflows.schedule import Schedule, make_schedule


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _ticks(r: redis.Redis, prefix: str) -> list[tuple[str, int, int]]:
    raw: Any = r.lrange(f"{prefix}:test:ticks", 0, -1)
    out = []
    for item in raw:
        job_id, at, pid = item.decode().split("@")
        out.append((job_id, int(at), int(pid)))
    return out


def _tick_id(prefix: str, name: str, tick_s: int) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{prefix}|{name}|{tick_s * 1000}").hex


def test_two_workers_one_dispatch_per_tick_and_failover(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    url = app.settings.redis_url
    env = {"WF_EVERY_S": "1", "WF_LEASE_S": "2"}
    workers = {
        p.pid: p
        for p in (start_worker(spawn_proc, url, prefix, name=f"w{i}", env=env) for i in range(2))
    }
    wait_until(lambda: len(_ticks(redis_client, prefix)) >= 3, 15, "3 ticks", *workers.values())
    token: Any = redis_client.get(schedule_lease_key(prefix))
    leader = workers[int(token.decode().split(":")[1])]
    leader.kill()
    follower = next(p for p in workers.values() if p is not leader)
    n = len(_ticks(redis_client, prefix))
    wait_until(
        lambda: len(_ticks(redis_client, prefix)) >= n + 4, 15, "ticks after failover", follower
    )
    ticks = _ticks(redis_client, prefix)
    ids = [t[0] for t in ticks]
    assert len(ids) == len(set(ids)), "a tick ran twice"
    # Every second between the first and the last tick was dispatched: none lost.
    name = make_schedule(Tick("every"), every_s=1.0).name
    by_id = {
        _tick_id(prefix, name, s): s
        for s in range(ticks[0][1] // 1000 - 3, ticks[-1][1] // 1000 + 1)
    }
    seconds = sorted(by_id[i] for i in ids)
    assert seconds == list(range(seconds[0], seconds[-1] + 1)), seconds
    print(f"\ncron failover: {len(ids)} ticks, none missed or doubled")
    stop_all(follower)


def test_six_field_cron_every_second(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    env = {"WF_CRON": "* * * * * *", "WF_LEASE_S": "2"}
    w = start_worker(spawn_proc, app.settings.redis_url, prefix, env=env)
    wait_until(lambda: len(_ticks(redis_client, prefix)) >= 2, 15, "2 cron ticks", w)
    stop_all(w)


def test_schedule_ticks() -> None:
    s = Schedule(Tick("x"), "x", cron="*/5 * * * *")
    assert s.ticks(0.0, 900.0) == [300.0, 600.0, 900.0]
    assert s.next_after(900.0) == 1200.0
    e = Schedule(Tick("x"), "e", every_s=2.0)
    assert e.ticks(10.0, 16.5) == [12.0, 14.0, 16.0]
    assert len(e.ticks(0.0, 1000.0)) == 10  # catch-up is bounded
    with pytest.raises(ValueError):
        Schedule(Tick("x"), "bad", cron="not a cron")
