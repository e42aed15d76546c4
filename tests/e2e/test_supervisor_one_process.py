"""``notify-worker --processes 1`` supervises one child; a job that kills
its process kills that child, not the supervisor, and ends in the failed store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from tests.e2e.test_supervisor import children_of
from tests.integration.breakable_jobs import KillsItself
from tests.integration.workflows_app import Record, make_app
from tests.integration.workflows_support import execs, start_worker, wait_until
from tests.support import Proc
from tidings import App


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def test_processes_1_survives_a_poison_job(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    poison = KillsItself("poison").dispatch()
    sup = start_worker(
        spawn_proc, app.settings.redis_url, prefix, "--processes", "1", "--concurrency", "1"
    )
    try:
        wait_until(lambda: execs(redis_client, prefix).get("poison"), 20, "poison ran", sup)
        assert sup.alive(), f"the supervisor died with its job:\n{sup.tail()}"
        failed = wait_until(
            lambda: app.queue_for(None).failed(["default"]), 60, "poison failed", sup
        )
        assert [f.id for f in failed] == [poison]
        assert sup.alive()
        # Work goes on in a fresh child.
        Record("after").dispatch()
        wait_until(lambda: execs(redis_client, prefix).get("after") == 1, 20, "after ran", sup)
        assert len(children_of(sup.pid)) == 1
    finally:
        sup.terminate()
        assert sup.wait(20) == 0


def test_processes_1_with_stop_when_empty_exits_when_done(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """A finite run under the supervisor ends: children exiting 0 are not restarted."""
    app.dispatch_many([Record(f"r{i}") for i in range(3)])
    sup = start_worker(
        spawn_proc, app.settings.redis_url, prefix, "--processes", "1", "--stop-when-empty"
    )
    try:
        assert sup.wait(30) == 0
    finally:
        if sup.alive():
            sup.kill(group=True)
    assert {k: v for k, v in execs(redis_client, prefix).items()} == {"r0": 1, "r1": 1, "r2": 1}
    assert "finished" in sup.output()
