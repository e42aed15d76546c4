"""The worker's moves on Redis, each one Lua script (see ``lua/*.lua``).

Every reservation carries a token (a counter in Redis, handed out by pop); ack, release,
fail and extend send it back and act only while it is still the job's, so a worker that
froze past its lease cannot touch the job's new holder. Each move is safe to send twice:
pop and ack carry this worker's sequence numbers and release and fail their token, and a
re-sent one finds the first run's receipt and changes nothing (docs/guarantees.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio

from tidings._clock import delay_ms
from tidings.moves.queues import DONE_KEEP_MS, DONE_MAX
from tidings.redis import scripts
from tidings.redis.keys import QueueKeys

log = logging.getLogger("tidings.worker")


@dataclass(slots=True)
class Reserved:
    """A job reserved by a pop."""

    id: str
    queue: str
    attempts: int
    exceptions: int
    envelope: bytes
    token: int = 0
    """The reservation token: ack, release, fail and extend act only while it matches."""
    stalls: int = 0
    """How many times a lease of this job expired before (its worker died or froze)."""
    cancelled: bool = False
    """``app.cancel`` marked it before this pop: settle it as cancelled, never run it."""


@dataclass(frozen=True, slots=True)
class Renewed:
    """What a lease renewal found."""

    lost: list[str]
    """Ids whose reservation was lost (handed out again)."""
    cancelled: list[str]
    """Ids renewed that ``app.cancel`` marked meanwhile."""


@dataclass(slots=True)
class PopResult:
    """What one pop returned."""

    jobs: list[Reserved]
    wait_s: float | None
    """Seconds until the next delayed job or lease expiry (None: nothing scheduled)."""
    now_s: float
    dropped: int


def pop_result(k: QueueKeys, raw: list[Any]) -> PopResult:
    """Read the pop script's reply:
    ``{now_ms, wait_ms, dropped, id, attempts, body, token, more, ...}``, ``more`` being
    0 (no exceptions, no stalls, not cancelled) or ``b"<exceptions> <stalls> <cancelled>"``."""
    jobs = []
    i = 3
    while i < len(raw):
        entry = raw[i]
        if isinstance(entry, bytes) and entry.startswith(b"\x01"):
            # A fair group whose structures are garbage: its jobs stay where they are.
            _, group, why = entry.decode(errors="replace").split("\x01", 2)
            log.error(
                "fair group %s on queue %r: %s; that group's jobs are not popped "
                "(the group's next push, or `notify-worker groups resume`, tries it again)",
                ascii(group),
                k.name,
                why,
            )
            i += 1
            continue
        if i + 4 >= len(raw):
            break
        i += 5
        try:
            more = raw[i - 1]
            exceptions, stalls, cancelled = (0, 0, 0) if more == 0 else map(int, more.split())
            jobs.append(
                Reserved(
                    entry.decode(),
                    k.name,
                    int(raw[i - 4]),
                    exceptions,
                    raw[i - 3],
                    int(raw[i - 2]),
                    stalls,
                    cancelled == 1,
                )
            )
        except (AttributeError, TypeError, ValueError):
            # The pop script vets ids and counters; should anything slip past,
            # the entry stays reserved until its lease ends, and the fetch loop lives on.
            log.error("pop returned an unreadable entry on queue %r; skipped", k.name)
    wait = int(raw[1])
    return PopResult(jobs, None if wait < 0 else wait / 1000.0, int(raw[0]) / 1000.0, int(raw[2]))


class Broker:
    """Async moves on one queue connection, for one worker (its receipts and sequences)."""

    def __init__(
        self, client: redis.asyncio.Redis, *, retry_after_s: float, max_bytes: int
    ) -> None:
        self.client = client
        self.lease_ms = int(retry_after_s * 1000)
        self.max_bytes = max_bytes
        self.worker_id = os.urandom(8).hex()
        self._pop_seq: dict[str, int] = {}
        self._ack_seq = 0

    def pop_command(self, k: QueueKeys, n: int) -> tuple[list[str], list[scripts.Arg]]:
        """The keys and arguments of the pop script reserving up to ``n`` jobs of ``k``.

        The sequence number moves on only in :meth:`read_pop`, once a reply arrived: a pop
        whose reply was lost is sent again with the same number, and hands out the jobs
        the lost one reserved."""
        keys = [
            k.ready,
            k.delayed,
            k.reserved,
            k.notify,
            k.jobs,
            k.attempts,
            k.failed,
            k.failed_info,
            k.failed_body,
            k.tokens,
            k.receipt(f"pop:{self.worker_id}"),
            k.done,  # a finished job put back (a replay) is dropped
            k.prio,
            k.pseq,
            k.gon,
            k.gring,
            k.gcfg,
        ]
        seq = self._pop_seq.get(k.name, 0)
        return keys, [n, self.lease_ms, self.max_bytes, 1000, k.name, seq]

    def read_pop(self, k: QueueKeys, raw: list[Any]) -> PopResult:
        """Read a pop reply of ``k`` (and let the next pop be a new one)."""
        self._pop_seq[k.name] = self._pop_seq.get(k.name, 0) + 1
        return pop_result(k, raw)

    async def pop(self, k: QueueKeys, n: int) -> PopResult:
        """Promote due jobs, recover expired leases, reserve up to ``n`` jobs."""
        keys, args = self.pop_command(k, n)
        return self.read_pop(k, await scripts.POP.acall(self.client, keys, args))

    def ack_seq(self) -> int:
        """A fresh sequence number for one batch of acks (re-sent with the batch)."""
        self._ack_seq += 1
        return self._ack_seq

    async def ack(
        self,
        k: QueueKeys,
        jobs: Sequence[tuple[str, int]],
        seq: int,
        results: Sequence[tuple[str, int, int, bytes]] = (),
    ) -> list[str]:
        """Delete finished ``(id, token)`` jobs, and ``(id, token, ttl_ms, result)`` jobs
        storing their signed results in the same step; returns the ids that had lost
        their reservation (handed out again: left alone, no result written).

        ``seq`` comes from :meth:`ack_seq`, once per batch: sending the same batch again
        with it is answered from the first run's receipt."""
        args: list[scripts.Arg] = [DONE_KEEP_MS, DONE_MAX, seq, len(jobs)]
        for job_id, token in jobs:
            args += (job_id, token)
        keys = [k.reserved, k.jobs, k.attempts, k.done, k.receipt(f"ack:{self.worker_id}")]
        for job_id, token, ttl_ms, result in results:
            args += (job_id, token, ttl_ms, result)
            keys.append(k.result(job_id))
        raw = await scripts.ACK.acall(self.client, keys, args)
        return [r.decode() for r in raw]

    async def release(
        self,
        k: QueueKeys,
        job: Reserved,
        delay_s: float,
        *,
        uncount: bool = False,
        exception: bool = False,
    ) -> int:
        """Put a reserved job back: 1; 0 when it no longer exists; -1 when its
        reservation was lost (handed out again: nothing changed)."""
        keys = [
            k.ready,
            k.delayed,
            k.reserved,
            k.notify,
            k.jobs,
            k.attempts,
            k.receipt(str(job.token)),
            k.prio,
            k.pseq,
        ]
        args: list[scripts.Arg] = [
            job.id,
            delay_ms(delay_s),
            int(uncount),
            int(exception),
            job.token,
        ]
        return int(await scripts.RELEASE.acall(self.client, keys, args))

    async def fail(self, k: QueueKeys, job: Reserved, info: dict[str, Any]) -> bool:
        """Move a job to the failed store with ``info`` (exception, name, attempts);
        False when its reservation was lost (nothing changed)."""
        keys = [
            k.reserved,
            k.jobs,
            k.attempts,
            k.failed,
            k.failed_info,
            k.failed_body,
            k.receipt(str(job.token)),
            k.result(job.id),
        ]
        args: list[scripts.Arg] = [job.id, orjson.dumps(info), b"", job.token]
        return int(await scripts.FAIL.acall(self.client, keys, args)) >= 0

    async def extend(
        self, k: QueueKeys, jobs: Sequence[tuple[str, int]], *, failing: bool = False
    ) -> Renewed:
        """Renew the leases of ``(id, token)`` jobs; returns the ids whose reservation
        was lost (their new holder's lease is left alone), and those ``app.cancel``
        marked meanwhile. ``failing``: this check opens the jobs' failure; those not
        marked cancelled are marked failing, and a cancel answers ``"failing"`` (too
        late) from then on."""
        args: list[scripts.Arg] = [self.lease_ms, "failing" if failing else ""]
        for job_id, token in jobs:
            args += (job_id, token)
        raw = await scripts.EXTEND.acall(self.client, [k.reserved, k.attempts], args)
        lost, cancelled = [], []
        for r in raw:
            text = r.decode()
            if text.startswith("c:"):
                cancelled.append(text[2:])
            else:
                lost.append(text)
        return Renewed(lost, cancelled)

    async def cancelled(self, k: QueueKeys, job: Reserved) -> bool:
        """Record a cancelled job as cancelled (it never ran, or its run was cancelled);
        False when its reservation was lost (nothing changed)."""
        keys = [
            k.reserved,
            k.jobs,
            k.attempts,
            k.cancelled,
            k.receipt(str(job.token)),
            k.result(job.id),
        ]
        args: list[scripts.Arg] = [job.id, job.token, DONE_KEEP_MS, DONE_MAX]
        return int(await scripts.CANCEL_SETTLE.acall(self.client, keys, args)) >= 0

    async def progress(self, k: QueueKeys, job: Reserved, data: bytes, ttl_ms: int) -> bool:
        """Keep ``data`` as the job's progress while it is still this worker's."""
        keys = [k.attempts, k.progress(job.id)]
        args: list[scripts.Arg] = [job.id, job.token, data, ttl_ms]
        return bool(await scripts.PROGRESS.acall(self.client, keys, args))
