"""Pushing a job whose id was fixed in advance, at most once.

Chain links, a chain's catch callback, batch callbacks and scheduler ticks all have ids
decided before the push. The job that pushes them may be re-delivered after a crash and
push them again, possibly after they already ran and were acknowledged (when their body
is gone from the queue). ``lua/push_once.lua`` refuses such a second push: it keeps a
marker per id (``{prefix}:queue:{Q}:once:<id>``) for :data:`ONCE_KEEP_S`, far beyond
any lease, and refuses an id whose body is still queued.
"""

from __future__ import annotations

from tidings._clock import delay_ms
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts
from tidings.redis.keys import once_key
from tidings.redis.scripts import Arg

ONCE_KEEP_S = 7 * 24 * 3600.0


def _call(
    rq: RedisQueue, queue: str, job_id: str, envelope: bytes, delay_s: float, priority: int
) -> tuple[list[str], list[Arg]]:
    k = rq.keys(queue)
    keys = [k.ready, k.delayed, k.notify, k.jobs, once_key(rq.prefix, queue, job_id)]
    args: list[Arg] = [job_id, envelope, delay_ms(delay_s), int(ONCE_KEEP_S * 1000)]
    if priority:
        keys += [k.prio, k.pseq, k.attempts]
        args.append(priority)
    return keys, args


def push_once(
    rq: RedisQueue,
    queue: str,
    job_id: str,
    envelope: bytes,
    delay_s: float = 0.0,
    priority: int = 0,
) -> bool:
    """Push ``job_id`` unless it was pushed before; True when pushed now."""
    keys, args = _call(rq, queue, job_id, envelope, delay_s, priority)
    return bool(scripts.PUSH_ONCE.call(rq.client, keys, args))


async def push_once_async(
    rq: RedisQueue,
    queue: str,
    job_id: str,
    envelope: bytes,
    delay_s: float = 0.0,
    priority: int = 0,
) -> bool:
    """Async twin of :func:`push_once`."""
    keys, args = _call(rq, queue, job_id, envelope, delay_s, priority)
    return bool(await scripts.PUSH_ONCE.acall(rq.aclient(), keys, args))
