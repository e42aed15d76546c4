"""Helpers for the workflow tests: start ``notify-worker`` on the workflows app, read
the records its jobs leave in Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.support import Proc, python_cmd

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.workflows_app:app"


def start_worker(
    spawn_proc: Callable[..., Proc],
    redis_url: str,
    prefix: str,
    *args: str,
    name: str = "worker",
    env: dict[str, str] | None = None,
    retry_after: float = 2.0,
) -> Proc:
    """A ``notify-worker`` subprocess (or supervisor, with ``--processes``)."""
    extra = {
        "WF_REDIS_URL": redis_url,
        "WF_PREFIX": prefix,
        "WF_RETRY_AFTER": str(retry_after),
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    cmd = python_cmd("-m", "tidings.cli", "-A", APP, "--sleep", "1", *args)
    return spawn_proc(cmd, name=name, extra_env=extra, cwd=ROOT)


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, *procs: Proc) -> Any:
    """Poll ``predicate`` until truthy; on timeout fail with the workers' output."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p!r}\n{p.tail(30)}" for p in procs)
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")
        time.sleep(0.05)


def execs(r: redis.Redis, prefix: str) -> dict[str, int]:
    """``{tag: executions}`` recorded by the jobs."""
    raw: Any = r.hgetall(f"{prefix}:test:exec")
    return {k.decode(): int(v) for k, v in raw.items()}


def order(r: redis.Redis, prefix: str) -> list[str]:
    """Tags in the order the jobs ran."""
    raw: Any = r.lrange(f"{prefix}:test:order", 0, -1)
    return [x.decode() for x in raw]


def stop_all(*procs: Proc) -> None:
    """SIGTERM every process, then wait (SIGKILL after 10 s)."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.stop(timeout_s=10)
