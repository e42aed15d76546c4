"""``monitor --json`` lists every known queue, empty ones with zeros."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import orjson
import redis

from tests.integration.workflows_app import Noted, Tick, make_app
from tests.integration.workflows_support import ROOT, start_worker, stop_all, wait_until
from tests.support import Proc
from tidings import Listener, ShouldQueue
from tidings.cli.observe import known_queues

ZEROS = {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}


def _monitor(redis_url: str, prefix: str) -> dict[str, Any]:
    env = {**os.environ, "WF_REDIS_URL": redis_url, "WF_PREFIX": prefix}
    cmd = [sys.executable, "-m", "tidings.cli", "-A", "tests.integration.workflows_app:app"]
    out = subprocess.run(
        [*cmd, "monitor", "--json"], env=env, cwd=ROOT, capture_output=True, timeout=30
    )
    assert out.returncode == 0, out.stderr.decode()
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def test_monitor_json_lists_empty_queues_with_zeros(
    redis_url: str, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    assert _monitor(redis_url, prefix) == {"default": ZEROS}
    w = start_worker(spawn_proc, redis_url, prefix, "--queue", "emails,default")
    try:
        wait_until(
            lambda: redis_client.sismember(f"{prefix}:queues", "emails"), 20, "queues known", w
        )
    finally:
        stop_all(w)
    assert _monitor(redis_url, prefix) == {"default": ZEROS, "emails": ZEROS}


class Audit(Listener, ShouldQueue):
    queue = "audit"

    def handle(self, event: Noted) -> None:
        pass


def test_known_queues_include_schedules_and_queued_listeners(redis_url: str, prefix: str) -> None:
    app = make_app(redis_url, prefix)
    try:
        app.listen(Noted, Audit)
        app.schedule(Tick("t"), every_s=60, queue="cron")
        rq = app.queue_for(None)
        assert known_queues(app, rq) == ["audit", "cron", "default"]
        assert rq.sizes(known_queues(app, rq))["audit"] == ZEROS
    finally:
        app.close()
