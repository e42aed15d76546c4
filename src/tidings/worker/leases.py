"""Renewing the leases of the jobs this worker holds, every third of ``retry_after``.

A renewal that finds a running job's token moved on reports the loss (once): the job was
handed out again and may run elsewhere too; its moves here will be refused. A job whose
ack or release is on its way is renewed too (the move may wait out an outage), but a
missing token there is not reported: the move may have landed first, and its own reply
says whether the reservation was lost. A queue whose
renewal fails on its data (a key of the wrong type) gets an ERROR line; the others are
renewed as usual.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import ResponseError

from tidings import _clock
from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.redis.errors import REDIS_ERRORS, is_transient, reraise_cancel
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.options import short_error

log = logging.getLogger("tidings.worker")

# A release, fail or ack is on its way for these: not renewal's to report (see above).
_MOVING = (State.SETTLING, State.ACKING)


class LeaseKeeper:
    """Keeps the leases of held jobs (see the module docstring)."""

    def __init__(
        self,
        rq: RedisQueue,
        broker: Broker,
        held: HeldJobs,
        *,
        retry_after_s: float,
        report_lost: Callable[[HeldJob, str], None],
        cancel: Callable[[str], object] = lambda job_id: None,
    ) -> None:
        self.rq = rq
        self.broker = broker
        self.held = held
        self.every_s = max(0.2, retry_after_s / 3)
        self._report_lost = report_lost
        self._cancel = cancel

    async def run(self) -> None:
        """The lease task."""
        due = _clock.monotonic() + self.every_s
        while True:
            await asyncio.sleep(max(0.0, min(1.0, due - _clock.monotonic())))
            if _clock.monotonic() < due:
                continue
            due = _clock.monotonic() + self.every_s
            await self.renew()
            reraise_cancel()  # a cancel lost inside redis-py (see worker.tasks.stop)

    async def renew(self) -> None:
        """Renew every held lease once, a script call a queue."""
        for queue, jobs in self.held.renewable().items():
            sent = [(h.reserved.id, h.reserved.token) for h in jobs]
            try:
                renewed = await self.broker.extend(self.rq.keys(queue), sent)
            except (*REDIS_ERRORS, ResponseError) as exc:
                reraise_cancel()
                if is_transient(exc):
                    log.warning("lease renewal: redis unavailable (%s)", short_error(exc))
                    return
                log.error("queue %r: cannot renew leases (%s)", queue, short_error(exc))
                continue
            lost = set(renewed.lost)
            for job_id in renewed.cancelled:
                self._cancel(job_id)  # a cancel whose message this worker missed
            for h, (job_id, token) in zip(jobs, sent, strict=True):
                if job_id not in lost or h.state in _MOVING or h.adopted_since(token):
                    # Settling or acking: the move may have landed just before this
                    # renewal (which then finds no token); the move's own reply tells a
                    # real loss ("its ack refused"), so a renewal never reports one here.
                    continue
                if self.held.get(job_id) is not h:
                    continue  # settled meanwhile: not a loss
                self._report_lost(h, "its lease renewal")
