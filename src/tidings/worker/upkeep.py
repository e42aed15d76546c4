"""The worker's upkeep beside its jobs: batched acks, lease renewal, limits, restarts.

Two tasks run next to the fetch loop. The ack loop sends the acks that collected while
the last batch was out, one script call a queue, so a busy worker acks in few round
trips. Housekeeping ticks about once a second: every third of ``retry_after`` it
renews the leases of the running jobs (reporting any lease already lost: that job may
run elsewhere too), and on every tick it checks the restart signal, the server
(:class:`~tidings.worker.health.ServerWatch`), ``--memory`` and ``--max-time``. Redis
errors here are logged and retried on the next tick; the worker never dies of them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any

from redis.exceptions import ResponseError

from tidings import _clock
from tidings.observability.lifecycle import ReservationLost
from tidings.redis.keys import restart_key
from tidings.worker.base import (
    EXIT_MEMORY,
    REDIS_ERRORS,
    WorkerBase,
    reraise_cancel,
    short_error,
)

log = logging.getLogger("tidings.worker")


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Upkeep(WorkerBase):
    """Acks finished jobs in batches and keeps the worker's leases and limits."""

    async def _ack_loop(self) -> None:
        while True:
            await self._ack_event.wait()
            self._ack_event.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        async with self._ack_lock:
            while self._acks:
                batch, self._acks = self._acks, {}
                for queue, jobs in batch.items():
                    lost_ids = await self._ack(queue, jobs) or []
                    # Jobs whose loss a lease renewal already reported count once.
                    ids = [job_id for job_id, _ in jobs]
                    lost = [i for i in lost_ids if i not in self._lost]
                    self._lost.difference_update(ids)
                    if lost:
                        self.reservations_lost += len(lost)
                        log.warning(
                            "reservation lost for %s (%d of %d acked jobs on %r): their lease "
                            "had expired and they were handed out again; the ack was refused",
                            ", ".join(lost[:10]) + (", ..." if len(lost) > 10 else ""),
                            len(lost),
                            len(ids),
                            queue,
                        )

    async def _ack(self, queue: str, jobs: list[tuple[str, int]]) -> Any:
        k = self.rq.keys(queue)
        seq = self.broker.ack_seq()  # the same for every re-send of this batch
        return await self._retrying(lambda: self.broker.ack(k, jobs, seq))

    async def _housekeeping(self) -> None:
        lease_every = max(0.2, self.host.retry_after_s / 3)
        next_lease = _clock.monotonic() + lease_every
        while True:
            await asyncio.sleep(min(1.0, lease_every))
            try:
                if _clock.monotonic() >= next_lease:
                    next_lease = _clock.monotonic() + lease_every
                    await self._renew_leases()
                await self._check_restart()
                await self.watch.tick()
            except REDIS_ERRORS as exc:
                log.warning("housekeeping: redis unavailable (%s)", short_error(exc))
            except ResponseError as exc:  # pragma: no cover - e.g. OOM on a write
                log.warning("housekeeping: %s", exc)
            reraise_cancel()
            if self.opts.memory_mb and _rss_mb() > self.opts.memory_mb:
                self.stop(f"memory above {self.opts.memory_mb} MB", EXIT_MEMORY)
            if self.opts.max_time_s and _clock.monotonic() - self._started > self.opts.max_time_s:
                self.stop("--max-time reached")

    async def _renew_leases(self) -> None:
        by_queue: dict[str, list[tuple[str, int]]] = {}
        for job_id, entry in list(self._running.items()):
            if not entry.settling:
                by_queue.setdefault(entry.reserved.queue, []).append((job_id, entry.reserved.token))
        for queue, ids in by_queue.items():
            lost = await self.broker.extend(self.rq.keys(queue), ids)
            if len(self._lost) > 10_000:  # ids of lost jobs later released, not acked
                self._lost.clear()
            for job_id in lost:
                held = self._running.get(job_id)
                if held is None or held.settling:
                    continue  # released or failed meanwhile: not a loss
                if job_id in self._lost:
                    continue  # reported at an earlier renewal
                self._lost.add(job_id)
                self.reservations_lost += 1
                log.warning(
                    "reservation lost for %s: its lease expired and it was handed out "
                    "again; it may run elsewhere too (its moves will be refused)",
                    job_id,
                )
                self.host.emit(ReservationLost(job_id, queue))

    async def _check_restart(self, *, initial: bool = False) -> None:
        assert self._client is not None
        raw = await self._client.get(restart_key(self.rq.prefix))
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            # Written by hand (issue 12): not a restart request; never a reason to die.
            if not self._restart_garbage_logged:
                self._restart_garbage_logged = True
                log.warning("ignoring the restart key: it is not a Redis timestamp")
            value = self._restart_seen if not initial else 0.0
        if initial:
            self._restart_seen = value
        elif value > self._restart_seen:
            self.stop("restart requested")
