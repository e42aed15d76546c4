"""The worker's moves on Redis, each one Lua script (see ``lua/*.lua``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio

from tidings.queue import scripts
from tidings.queue.keys import QueueKeys
from tidings.queue.redis_queue import DONE_KEEP_MS, DONE_MAX

log = logging.getLogger("tidings.worker")


@dataclass(slots=True)
class Reserved:
    """A job reserved by a pop."""

    id: str
    queue: str
    attempts: int
    exceptions: int
    envelope: bytes


@dataclass(slots=True)
class PopResult:
    """What one pop returned."""

    jobs: list[Reserved]
    wait_s: float | None
    """Seconds until the next delayed job or lease expiry (None: nothing scheduled)."""
    now_s: float
    dropped: int


def pop_result(k: QueueKeys, raw: list[Any]) -> PopResult:
    """Read the pop script's reply: ``{now_ms, wait_ms, dropped, id, attempts, exc, body, ...}``."""
    jobs = []
    for i in range(3, len(raw) - 3, 4):
        try:
            jobs.append(
                Reserved(raw[i].decode(), k.name, int(raw[i + 1]), int(raw[i + 2]), raw[i + 3])
            )
        except (AttributeError, TypeError, ValueError):
            # The pop script vets ids and counters (issue 12); should anything slip past,
            # the entry stays reserved until its lease ends, and the fetch loop lives on.
            log.error("pop returned an unreadable entry on queue %r; skipped", k.name)
    wait = int(raw[1])
    return PopResult(jobs, None if wait < 0 else wait / 1000.0, int(raw[0]) / 1000.0, int(raw[2]))


class Broker:
    """Async moves on one queue connection."""

    def __init__(
        self, client: redis.asyncio.Redis, *, retry_after_s: float, max_bytes: int
    ) -> None:
        self.client = client
        self.lease_ms = int(retry_after_s * 1000)
        self.max_bytes = max_bytes

    def pop_command(self, k: QueueKeys, n: int) -> tuple[list[str], list[scripts.Arg]]:
        """The keys and arguments of the pop script reserving up to ``n`` jobs of ``k``."""
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
            k.done,  # issue 12: a finished job put back (a replay) is dropped
        ]
        return keys, [n, self.lease_ms, self.max_bytes, 1000, k.name]

    async def pop(self, k: QueueKeys, n: int) -> PopResult:
        """Promote due jobs, recover expired leases, reserve up to ``n`` jobs."""
        keys, args = self.pop_command(k, n)
        return pop_result(k, await scripts.POP.acall(self.client, keys, args))

    async def ack(self, k: QueueKeys, ids: Sequence[str]) -> int:
        """Delete finished jobs; returns how many had lost their reservation."""
        args: list[scripts.Arg] = [DONE_KEEP_MS, DONE_MAX, *ids]
        return int(
            await scripts.ACK.acall(self.client, [k.reserved, k.jobs, k.attempts, k.done], args)
        )

    async def release(
        self,
        k: QueueKeys,
        job_id: str,
        delay_s: float,
        *,
        uncount: bool = False,
        exception: bool = False,
    ) -> bool:
        """Put a reserved job back; False when it no longer exists."""
        keys = [k.ready, k.delayed, k.reserved, k.notify, k.jobs, k.attempts]
        args: list[scripts.Arg] = [job_id, int(delay_s * 1000), int(uncount), int(exception)]
        return bool(await scripts.RELEASE.acall(self.client, keys, args))

    async def fail(
        self, k: QueueKeys, job_id: str, info: dict[str, Any], body: bytes = b""
    ) -> None:
        """Move a job to the failed store with ``info`` (exception, name, attempts)."""
        keys = [k.reserved, k.jobs, k.attempts, k.failed, k.failed_info, k.failed_body]
        await scripts.FAIL.acall(self.client, keys, [job_id, orjson.dumps(info), body])

    async def extend(self, k: QueueKeys, ids: Sequence[str]) -> list[str]:
        """Renew leases; returns the ids whose lease was already lost."""
        raw = await scripts.EXTEND.acall(self.client, [k.reserved], [self.lease_ms, *ids])
        return [r.decode() for r in raw]
