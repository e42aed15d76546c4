"""The queues a worker listened on, remembered in ``{prefix}:queues`` as it starts: an
empty queue has no keys in Redis, and ``monitor`` (:func:`tidings.cli.observe.known_queues`)
still lists it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tidings.moves.queues import RedisQueue
from tidings.redis.keys import known_queues_key

log = logging.getLogger("tidings.worker")


async def remember_queues(rq: RedisQueue, queues: Sequence[str]) -> None:
    """Add a worker's queues to the known set (retried while Redis is unreachable)."""
    if not queues:
        return
    while True:
        try:
            await rq.aclient().sadd(known_queues_key(rq.prefix), *queues)
            return
        except Exception as exc:  # never let bookkeeping stop a worker
            log.debug("could not record the worker's queues yet: %s", exc)
            await asyncio.sleep(5.0)
