"""Acks in batches: one script call a queue for every job that finished meanwhile.

A batch is sent again, with the same sequence number, while Redis is unavailable (the
ack script answers a re-sent batch from its receipt). A queue whose ack fails on its
data (a key of the wrong type) gets an ERROR line and its jobs are left to their
leases; the other queues' acks in the same batch go out as usual.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import ResponseError

from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.redis.errors import reraise_cancel
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.options import short_error
from tidings.worker.retrying import GaveUp, retrying

log = logging.getLogger("tidings.worker")


class AckBatcher:
    """Collects finished jobs and acks them in batches (see the module docstring)."""

    def __init__(
        self,
        rq: RedisQueue,
        broker: Broker,
        held: HeldJobs,
        *,
        report_lost: Callable[[HeldJob, str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.rq = rq
        self.broker = broker
        self.held = held
        self._report_lost = report_lost
        self._stopping = stopping
        self._pending: dict[str, list[HeldJob]] = {}
        self._event = asyncio.Event()
        # Held while a batch is out: the final flush waits for it instead of cutting it.
        self._lock = asyncio.Lock()

    def add(self, held: HeldJob) -> None:
        """Queue ``held``'s ack (its token is read when the batch is sent)."""
        self.held.set_state(held, State.ACKING)
        self._pending.setdefault(held.reserved.queue, []).append(held)
        self._event.set()

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def run(self) -> None:
        """The ack task: send what collected, as soon as the last batch is back."""
        while True:
            await self._event.wait()
            self._event.clear()
            await self.flush()
            reraise_cancel()  # a cancel lost inside redis-py (see worker.tasks.stop)

    async def flush(self, *, limit_s: float | None = None) -> None:
        """Send every queued ack. Retries through an outage until the worker stops;
        at exit, for at most ``limit_s``."""
        async with self._lock:
            while self._pending:
                batch, self._pending = self._pending, {}
                for queue, jobs in batch.items():
                    await self._ack_queue(queue, jobs, limit_s)
                if limit_s is not None:
                    return

    async def _ack_queue(self, queue: str, jobs: list[HeldJob], limit_s: float | None) -> None:
        k = self.rq.keys(queue)
        # Jobs that keep a result are sent apart (with their result keys), after the rest.
        jobs = [h for h in jobs if h.result is None] + [h for h in jobs if h.result is not None]
        sent = [(h.reserved.id, h.reserved.token) for h in jobs]
        plain = [s for s, h in zip(sent, jobs, strict=True) if h.result is None]
        results = [
            (job_id, token, h.result_ttl_ms, h.result)
            for (job_id, token), h in zip(sent, jobs, strict=True)
            if h.result is not None
        ]
        seq = self.broker.ack_seq()  # the same for every re-send of this batch
        try:
            lost_ids = set(
                await retrying(
                    lambda: self.broker.ack(k, plain, seq, results),
                    limit_s=limit_s if limit_s is not None else 60.0,
                    what=f"the acks of {len(jobs)} jobs on queue {queue!r}",
                    forever=lambda: limit_s is None and not self._stopping(),
                )
            )
        except GaveUp:
            for h in jobs:
                self.held.drop(h)  # left to their leases: they run again
            return
        except ResponseError as exc:
            log.error(
                "queue %r: cannot ack %d jobs (%s); they are left to their leases; the "
                "worker and its other queues go on",
                queue,
                len(jobs),
                short_error(exc),
            )
            for h in jobs:
                self.held.drop(h)
            return
        for h, (job_id, token) in zip(jobs, sent, strict=True):
            if job_id in lost_ids and h.adopted_since(token):
                self._pending.setdefault(queue, []).append(h)  # adopted: ack the new token
                self._event.set()
                continue
            self.held.drop(h)
            if job_id in lost_ids:
                self._report_lost(h, "its ack")
