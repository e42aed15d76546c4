"""``self.progress(done, total, note)`` from a running job to Redis, throttled.

At most one write per :data:`EVERY_S` per job: a report inside that window is held, and
the latest one held is written when the window ends (and before the job is settled), so
the last value is always kept. Each write is the ``progress`` script, fenced by the
job's reservation token (a stale holder writes nothing), and is announced as
``JobProgressed``. Reports come from the loop (async handlers) or from job threads (sync
ones, handed over with ``call_soon_threadsafe``). Progress is best effort: a write that
fails while Redis is away is logged and the next report tries again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import orjson

from tidings import _clock
from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.observability.lifecycle import JobProgressed
from tidings.redis.errors import REDIS_ERRORS
from tidings.worker.held import HeldJob

log = logging.getLogger("tidings.worker")

EVERY_S = 0.1
KEEP_MS = 24 * 3600 * 1000

Value = tuple[float, float | None, str | None, float]


class JobProgress:
    """The throttled progress writer of one held job."""

    def __init__(self, writer: ProgressWriter, held: HeldJob) -> None:
        self.writer = writer
        self.held = held
        self.latest: Value | None = None
        self.written_at = -1e9
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    def report(self, done: float, total: float | None, note: str | None) -> None:
        """Called by ``self.progress``, from the loop or a job thread."""
        if threading.get_ident() != self.writer.loop_thread:
            self.writer.loop.call_soon_threadsafe(self.report, done, total, note)
            return
        self.latest = (float(done), None if total is None else float(total),
                       None if note is None else str(note)[:1000], _clock.now())  # fmt: skip
        if self.task is not None or self.timer is not None:
            return  # a write is coming: it takes the latest value
        wait = self.written_at + EVERY_S - _clock.monotonic()
        if wait <= 0:
            self._start()
        else:
            self.timer = self.writer.loop.call_later(wait, self._start)

    def _start(self) -> None:
        self.timer = None
        if self.task is None and self.latest is not None:
            self.task = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self.latest is not None:
                value, self.latest = self.latest, None
                self.written_at = _clock.monotonic()
                await self.writer.write(self.held, value)
                if self.latest is not None:
                    wait = self.written_at + EVERY_S - _clock.monotonic()
                    if wait > 0:
                        self.timer = self.writer.loop.call_later(wait, self._start)
                        return
        finally:
            self.task = None

    async def flush(self) -> None:
        """Write the last value held back (before the job is settled)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            await asyncio.shield(self.task)
        if self.latest is not None:
            self.task = asyncio.ensure_future(self._write())
            await asyncio.shield(self.task)


class ProgressWriter:
    """Writes the progress of this worker's jobs (see the module docstring)."""

    def __init__(self, rq: RedisQueue, broker: Broker, emit: Callable[[object], None]) -> None:
        self.rq = rq
        self.broker = broker
        self.emit = emit
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()

    def for_job(self, held: HeldJob) -> JobProgress:
        return JobProgress(self, held)

    async def write(self, held: HeldJob, value: Value) -> None:
        res = held.reserved
        done, total, note, at = value
        data = orjson.dumps({"done": done, "total": total, "note": note, "at": at})
        try:
            ok = await self.broker.progress(self.rq.keys(res.queue), res, data, KEEP_MS)
        except REDIS_ERRORS as exc:
            log.warning("progress of %s not written: redis unavailable (%s)", res.id, exc)
            return
        if ok:
            self.emit(JobProgressed(res.id, res.queue, done, total, note))
