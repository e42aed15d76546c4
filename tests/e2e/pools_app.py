"""The App that ``notify-worker supervise -A tests.e2e.pools_app:app`` runs in the pool tests
(and benchmarks/pools.py).

Configured from the environment: ``POOLS_REDIS_URL``, ``POOLS_PREFIX`` and
``POOLS_CONFIG`` (JSON: ``{"pools": [{Pool keywords}], "max_processes": ..,
"cooldown_s": .., "max_shift": .., "lease_s": ..}``). Jobs record their completed runs in
``{prefix}:test:exec`` (id -> runs), so a test counts what ran from Redis.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from tidings import App, Job, Pool, _current

KEY = "p" * 32
_app: App | None = None


def make_app(redis_url: str, prefix: str, config: dict[str, Any] | None = None) -> App:
    cfg = dict(config or {})
    pools = [Pool(**p) for p in cfg.pop("pools", [])]
    return App(redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"],
               env=False, pools=pools, **cfg)  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            config = orjson.loads(os.environ.get("POOLS_CONFIG", "{}"))
            _app = make_app(os.environ["POOLS_REDIS_URL"], os.environ["POOLS_PREFIX"], config)
        return _app
    raise AttributeError(name)


async def _wait(queue: str, t0: float) -> None:
    """Log ``"<start> <wait>"`` under ``{prefix}:test:wait:<queue>`` (benchmarks/pools.py)."""
    if t0:
        app = _current.current()
        now = time.time()
        await (
            app.queue_for(None)
            .aclient()
            .rpush(f"{app.settings.prefix}:test:wait:{queue}", f"{now:.3f} {now - t0:.4f}")
        )


async def _record(job_id: str) -> None:
    app = _current.current()
    await app.queue_for(None).aclient().hincrby(f"{app.settings.prefix}:test:exec", job_id, 1)


@dataclass
class Noop(Job):
    id: str
    t0: float = 0.0  # the dispatch time: the job logs its wait

    async def handle(self) -> None:
        await _wait("fast", self.t0)
        await _record(self.id)


@dataclass
class Slow(Job):
    id: str
    ms: float = 50.0
    t0: float = 0.0

    async def handle(self) -> None:
        await _wait("slow", self.t0)
        await asyncio.sleep(self.ms / 1000)
        await _record(self.id)


Noop.queue = "fast"
Slow.queue = "slow"
