"""The App and jobs the queue benchmarks push and drain.

Configured from the environment that ``benchmarks/run.py`` sets for itself and for the
workers it spawns (``TIDINGS_REDIS_URL``, ``TIDINGS_KEY``, ``TIDINGS_PREFIX``)::

    notify-worker -A benchmarks.bench_app:app --stop-when-empty

Bench-only side channels, all under the prefix (``marks`` below), so the figures come
from Redis and not from parsing worker output:

* ``WorkerStarting`` appends the worker's wall-clock start (one write per process), so a
  drain is timed from the first pop, not from Python start-up.
* with ``TIDINGS_BENCH_LATENCY=1`` in the worker's environment, a ``JobProcessing``
  listener keeps each job's ``wait_s`` and when it heard the event, and :class:`Stamp`
  writes ``start - sent_at``, that ``wait_s`` and ``heard - sent_at``. The listener is
  left out otherwise: it would cost every drained job.

Peers (optional; only when installed) are built on first access of their names, so this
module never needs them: ``huey_app``/``huey_noop`` (``huey_consumer
benchmarks.bench_app.huey_app``), ``dramatiq_broker``/``dramatiq_noop`` (``dramatiq
benchmarks.bench_app:dramatiq_broker``), and :func:`rq_noop` for rq, which needs nothing.
They connect to ``TIDINGS_REDIS_URL`` too.

``python -m benchmarks.bench_app [--concurrency N]`` runs a bare
:class:`~tidings.queue.worker.Worker` until the queue is empty, without notify-worker's
one-line-per-job output listeners (used to price that output, and for profiling).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from tidings import App, Job
from tidings.queue.events import JobProcessing, WorkerStarting

app = App(allowed_modules=["benchmarks"])


def mark_key(name: str) -> str:
    """Key of a bench-only record (outside every queue's keys)."""
    return f"{app.settings.prefix}:bench:{name}"


@dataclass
class NoOpJob(Job):
    """An async job that does nothing (the drain figures)."""

    n: int = 0

    async def handle(self) -> None:
        return None


@dataclass
class NoOpSyncJob(Job):
    """The same no-op with a sync ``handle``: it runs in the worker's thread pool."""

    n: int = 0

    def handle(self) -> None:
        return None


_waits: dict[str, tuple[float, float]] = {}
"""job id -> (wait_s of its JobProcessing, wall clock when that event was heard)."""


@dataclass
class Stamp(Job):
    """Records how long after ``sent_at`` (producer's ``time.time()``) it started."""

    sent_at: float = 0.0

    async def handle(self) -> None:
        started = time.time()
        wait, heard = _waits.pop(self.job_id or "", (-1.0, 0.0))
        record = f"{started - self.sent_at:.6f},{wait:.6f},{heard - self.sent_at:.6f}"
        await app.queue_for(None).aclient().rpush(mark_key("latency"), record)


def _on_starting(event: WorkerStarting) -> None:
    app.queue_for(None).client.rpush(mark_key("started"), f"{time.time():.6f}")


def _on_processing(event: JobProcessing) -> None:
    _waits[event.job_id] = (event.wait_s, time.time())


app.listen(WorkerStarting, _on_starting)
if os.environ.get("TIDINGS_BENCH_LATENCY") == "1":
    app.listen(JobProcessing, _on_processing)


def rq_noop(n: int = 0) -> None:
    """The no-op for rq (a plain function, imported by the rq worker by name)."""
    return None


_peers: dict[str, Any] = {}


def _build_huey() -> None:
    from huey import RedisHuey  # type: ignore[import-untyped]

    huey = RedisHuey(f"{app.settings.prefix}-huey", url=app.settings.redis_url)

    @huey.task()  # type: ignore[untyped-decorator]
    def huey_noop(n: int = 0) -> None:
        return None

    _peers.update(huey_app=huey, huey_noop=huey_noop)


def _build_dramatiq() -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(  # type: ignore[no-untyped-call]
        url=app.settings.redis_url, namespace=f"{app.settings.prefix}-dramatiq"
    )
    dramatiq.set_broker(broker)

    def dramatiq_noop(n: int = 0) -> None:
        return None

    _peers.update(
        dramatiq_broker=broker, dramatiq_noop=dramatiq.actor(broker=broker)(dramatiq_noop)
    )


def __getattr__(name: str) -> Any:
    """Build a peer's app on first use (PEP 562), so the peers stay optional."""
    builders = {"huey": _build_huey, "dramatiq": _build_dramatiq}
    peer = name.partition("_")[0]
    if peer in builders and name.startswith(("huey_", "dramatiq_")):
        if name not in _peers:
            builders[peer]()
        if name in _peers:
            return _peers[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Drain the default queue with a bare Worker (no per-job output), then exit."""
    from tidings.queue.worker import Worker, WorkerOptions

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    code = asyncio.run(
        Worker(app, WorkerOptions(concurrency=args.concurrency, stop_when_empty=True)).run()
    )
    raise SystemExit(code)


if __name__ == "__main__":
    main()
