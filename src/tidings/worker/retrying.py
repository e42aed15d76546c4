"""A Redis move retried through an outage, and what giving up on it means.

A move that still fails after its limit raises :class:`GaveUp`: never a value a caller
could read as success. The caller leaves the job to its lease (it runs again after
``retry_after``) and reports nothing about it: no ``JobFailed``, no chain link pushed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ResponseError

from tidings import _clock
from tidings.redis.errors import REDIS_ERRORS, is_transient, reraise_cancel
from tidings.worker.options import short_error

log = logging.getLogger("tidings.worker")

T = TypeVar("T")


class GaveUp(Exception):
    """A Redis move could not be made within its limit: the job is left to its lease."""


async def retrying(
    op: Callable[[], Awaitable[T]],
    *,
    limit_s: float,
    what: str,
    forever: Callable[[], bool] | None = None,
) -> T:
    """Run ``op``, retrying transient Redis errors with a capped backoff for ``limit_s``
    (or while ``forever()`` says so). Non-transient errors (data, not Redis, is broken)
    propagate at once.

    Raises:
        GaveUp: Redis stayed unavailable past ``limit_s``.
    """
    delay = 0.05
    deadline = _clock.monotonic() + limit_s
    while True:
        try:
            return await op()
        except (*REDIS_ERRORS, ResponseError) as exc:
            reraise_cancel()
            if not is_transient(exc):
                raise
            if _clock.monotonic() > deadline and not (forever is not None and forever()):
                log.error(
                    "giving up on %s after %gs: %s; the job is left to its lease",
                    what,
                    limit_s,
                    short_error(exc),
                )
                raise GaveUp(what) from exc
            log.warning("redis unavailable (%s); retrying in %.2fs", short_error(exc), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
