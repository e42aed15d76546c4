"""Fair groups (issue 25): every place that reports a queue's ready count counts the
jobs waiting in fair groups (paused groups too), from one counter the group scripts keep
(``{Q}:gready``), exact after moves run twice, and gone with the queue's last grouped job.
Before the counter, ``monitor``, the dashboard, Prometheus and ``sizes()`` read 0 here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tests.integration.test_groups import KEY, MODULE, RUNS, Note, keys, work
from tests.integration.test_lua_scripts import run
from tidings import App
from tidings.dashboard.data import Reader
from tidings.moves.consume import Broker
from tidings.observability.prometheus import dashboard_text


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    yield


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE,
            retry_after=3, metrics=False)  # fmt: skip
    try:
        yield a
    finally:
        a.close()


def ready(app: App) -> int:
    return app.queue_for(None).sizes(["default"])["default"]["ready"]


def fill(app: App) -> None:
    for i in range(3):
        Note(f"a{i}").on_group("acme").dispatch()
    Note("urgent").on_group("acme").with_priority(5).dispatch()
    Note("b0").on_group("beta").dispatch()
    Note("p0").on_group("paused").dispatch()
    app.groups.pause("paused")
    Note("plain").dispatch()


def test_sizes_count_grouped_ready_jobs_paused_and_prioritised_too(app: App) -> None:
    fill(app)
    assert ready(app) == 7
    job_id = Note("status").on_group("paused").dispatch()
    assert app.queue_for(None).status(job_id, ["default"]) == "pending"
    assert ready(app) == 8
    work(app)  # stop-when-empty: the paused group's job stays
    assert sorted(RUNS) == ["a0", "a1", "a2", "b0", "plain", "urgent"]
    assert ready(app) == 2
    app.groups.resume("paused")
    work(app)
    assert ready(app) == 0
    r: redis.Redis = app.queue_for(None).client
    assert not r.exists(keys(app).gready)  # the counter goes with the last grouped job


def test_the_count_stays_exact_when_moves_run_twice_and_jobs_come_back(app: App) -> None:
    rq = app.queue_for(None)
    k = rq.keys("default")
    for i in range(4):
        Note(f"n{i}").on_group("acme").dispatch()
    assert ready(app) == 4

    async def moves(b: Broker) -> None:
        popped = await b.pop(k, 2)
        assert len(popped.jobs) == 2
        assert ready(app) == 2
        for job in popped.jobs:
            # A released job comes back into its group: counted once, however often sent.
            assert await b.release(k, job, 0) == 1
            assert await b.release(k, job, 0) == 1

    run(rq, moves)
    assert ready(app) == 4
    assert rq.clear("default") == 4
    assert ready(app) == 0 and not rq.client.exists(k.gready)


def test_monitor_dashboard_and_prometheus_show_the_grouped_backlog(
    app: App, redis_url: str, prefix: str
) -> None:
    fill(app)
    env = {**os.environ, "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY,
           "TIDINGS_PREFIX": prefix}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "tidings.cli.main", "monitor", "--json", "--queue", "default"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout)["default"]["ready"] == 7
    rows = {row.name: row for row in Reader(app).queues()}
    assert rows["default"].ready == 7
    text, _ = dashboard_text(app)
    assert b'tidings_queue_jobs{queue="default",state="ready"} 7.0' in text
