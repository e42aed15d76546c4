"""Which queues exist, for ``monitor``: an empty queue has no keys in Redis, so it is
remembered instead.

``monitor`` lists ``default``, every queue the App dispatched to, schedules on or sends
its queued listeners to, every queue a worker of the App has listened on (each worker
adds its ``--queue`` names to the set ``{prefix}:queues`` as it starts), and every queue
that holds a key now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

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


def _listener_queues(app: Any) -> set[str]:
    """The ``queue`` options of the App's queued listeners."""
    out: set[str] = set()
    signals = getattr(getattr(app, "events", None), "_signals", {})
    for signal in list(signals.values()):
        for reg in list(signal.receivers.values()):
            queue = getattr(getattr(reg, "listener", None), "queue", None)
            if isinstance(queue, str) and queue:
                out.add(queue)
    return out


def known_queues(app: Any, rq: RedisQueue) -> list[str]:
    """Every queue the App knows of (see the module docstring), sorted."""
    names: set[str] = {"default", *getattr(app, "_queues_used", ())}
    for s in getattr(app, "schedules", ()):
        queue = s.queue or getattr(s.job.option_source(), "queue", None)
        if queue:
            names.add(str(queue))
    names.update(_listener_queues(app))
    raw: Any = rq.client.smembers(known_queues_key(rq.prefix))
    names.update(x.decode() if isinstance(x, bytes) else str(x) for x in raw)
    names.update(rq.queue_names())
    return sorted(names)
