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
module never needs them: ``huey_app``/``huey_noop``/``huey_stamp`` (``huey_consumer
benchmarks.bench_app.huey_app``), ``dramatiq_broker``/``dramatiq_noop``/``dramatiq_stamp``
(``dramatiq benchmarks.bench_app:dramatiq_broker``), ``saq_queue``/``saq_settings`` (``saq
benchmarks.bench_app.saq_settings``), ``taskiq_broker``/``taskiq_noop``/``taskiq_stamp``
(``taskiq worker benchmarks.bench_app:taskiq_broker``); rq, :func:`saq_noop` and
:func:`saq_stamp` need no import of their library. They connect to ``TIDINGS_REDIS_URL``
too, under names of their own (``<prefix>-huey``, ``saq:<prefix>-saq:...``...), never
under ``<prefix>:``. Each peer's ``*_stamp`` job appends ``time.time() - sent_at`` to
``mark_key("latency")`` when it starts, as :class:`Stamp` does for tidings.

``python -m benchmarks.bench_app [--concurrency N]`` runs a bare
:class:`~tidings.worker.worker.Worker` until the queue is empty, without notify-worker's
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
from tidings.observability.lifecycle import JobProcessing, WorkerStarting

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


@dataclass
class StampSync(Job):
    """:class:`Stamp` with a sync ``handle`` (the handler most Django and Flask users write)."""

    sent_at: float = 0.0

    def handle(self) -> None:
        started = time.time()
        wait, heard = _waits.pop(self.job_id or "", (-1.0, 0.0))
        record = f"{started - self.sent_at:.6f},{wait:.6f},{heard - self.sent_at:.6f}"
        app.queue_for(None).client.rpush(mark_key("latency"), record)


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


_peer_clients: dict[str, Any] = {}


def _peer_record(sent_at: float) -> None:
    """A peer's stamp job starting: append its enqueue->start seconds (sync client)."""
    started = time.time()
    client = _peer_clients.get("sync")
    if client is None:
        import redis

        client = _peer_clients["sync"] = redis.Redis.from_url(app.settings.redis_url)
    client.rpush(mark_key("latency"), f"{started - sent_at:.6f}")


async def _peer_arecord(sent_at: float) -> None:
    """The same from an asyncio peer (one event loop per worker process)."""
    started = time.time()
    client = _peer_clients.get("async")
    if client is None:
        import redis.asyncio

        client = _peer_clients["async"] = redis.asyncio.Redis.from_url(app.settings.redis_url)
    await client.rpush(mark_key("latency"), f"{started - sent_at:.6f}")


def rq_stamp(sent_at: float = 0.0) -> None:
    """rq's latency job."""
    _peer_record(sent_at)


async def saq_noop(ctx: Any, *, n: int = 0) -> None:
    """The no-op for saq (registered by name in ``saq_settings``)."""
    return None


async def saq_stamp(ctx: Any, *, sent_at: float = 0.0) -> None:
    """saq's latency job."""
    await _peer_arecord(sent_at)


_peers: dict[str, Any] = {}


def _build_huey() -> None:
    from huey import RedisHuey  # type: ignore[import-untyped]

    huey = RedisHuey(f"{app.settings.prefix}-huey", url=app.settings.redis_url)

    @huey.task()  # type: ignore[untyped-decorator]
    def huey_noop(n: int = 0) -> None:
        return None

    @huey.task()  # type: ignore[untyped-decorator]
    def huey_stamp(sent_at: float = 0.0) -> None:
        _peer_record(sent_at)

    _peers.update(huey_app=huey, huey_noop=huey_noop, huey_stamp=huey_stamp)


def _build_dramatiq() -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(  # type: ignore[no-untyped-call]
        url=app.settings.redis_url, namespace=f"{app.settings.prefix}-dramatiq"
    )
    dramatiq.set_broker(broker)

    def dramatiq_noop(n: int = 0) -> None:
        return None

    def dramatiq_stamp(sent_at: float = 0.0) -> None:
        _peer_record(sent_at)

    _peers.update(
        dramatiq_broker=broker,
        dramatiq_noop=dramatiq.actor(broker=broker)(dramatiq_noop),
        dramatiq_stamp=dramatiq.actor(broker=broker)(dramatiq_stamp),
    )


def _build_saq() -> None:
    from saq import Queue

    queue = Queue.from_url(app.settings.redis_url, name=f"{app.settings.prefix}-saq")
    # saq's Worker(**settings): only what it cannot default (concurrency stays 10).
    functions: list[Any] = [saq_noop, saq_stamp]
    _peers.update(saq_queue=queue, saq_settings={"queue": queue, "functions": functions})


def _build_taskiq() -> None:
    from taskiq_redis import RedisStreamBroker

    # The broker taskiq-redis's README leads with (acks; ListQueueBroker has none).
    broker = RedisStreamBroker(
        url=app.settings.redis_url, queue_name=f"{app.settings.prefix}-taskiq"
    )

    # Sync bodies, as every peer's but saq's (taskiq runs them in its thread pool).
    @broker.task
    def taskiq_noop(n: int = 0) -> None:
        return None

    @broker.task
    def taskiq_stamp(sent_at: float = 0.0) -> None:
        _peer_record(sent_at)

    _peers.update(taskiq_broker=broker, taskiq_noop=taskiq_noop, taskiq_stamp=taskiq_stamp)


def __getattr__(name: str) -> Any:
    """Build a peer's app on first use (PEP 562), so the peers stay optional."""
    builders = {
        "huey": _build_huey,
        "dramatiq": _build_dramatiq,
        "saq": _build_saq,
        "taskiq": _build_taskiq,
    }
    peer = name.partition("_")[0]
    if peer in builders and name.startswith(tuple(f"{p}_" for p in builders)):
        if name not in _peers:
            builders[peer]()
        if name in _peers:
            return _peers[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Drain the default queue with a bare Worker (no per-job output), then exit."""
    from tidings.worker.worker import Worker, WorkerOptions

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    code = asyncio.run(
        Worker(app, WorkerOptions(concurrency=args.concurrency, stop_when_empty=True)).run()
    )
    raise SystemExit(code)


if __name__ == "__main__":
    main()
