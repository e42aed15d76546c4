"""Hearing ``app.cancel`` of a running job: the ``{prefix}:cancels`` channel.

``lua/cancel.lua`` marks the job (id:c) and publishes its id; the worker holding it
passes the cancel to it (:meth:`~tidings.worker.held.HeldJobs.cancel`): an async handler
is cancelled at its current ``await``, a sync one sees ``self.cancelled``. A message
missed (the worker was reconnecting) is caught by the next lease renewal, which reports
marked jobs (``extend.lua``); a job not started yet is handed out by pop as cancelled.
On Redis Cluster the channel is classic pub/sub (a ``PUBLISH`` reaches every node) heard
through redis-py's asyncio cluster pub/sub, its slot map loaded first (it does not load
it itself); with a redis-py whose asyncio cluster client has no pub/sub, renewals (every
third of ``retry_after``) carry the cancel there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio

from tidings.redis.clients import async_pubsub
from tidings.redis.errors import REDIS_ERRORS
from tidings.redis.keys import cancel_channel
from tidings.worker.held import HeldJobs

log = logging.getLogger("tidings.worker")


class CancelListener:
    """Passes cancels heard on the channel to the held jobs."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str, held: HeldJobs) -> None:
        self.client: Any = client
        self.channel = cancel_channel(prefix)
        self.held = held

    async def run(self) -> None:
        """The cancel task: listen, reconnecting with a capped backoff; never dies of
        Redis being away."""
        delay = 0.1
        while True:
            pubsub: Any = None
            try:
                pubsub = await async_pubsub(self.client)
                if pubsub is None:
                    log.info("cancels of running jobs reach this worker at lease renewals "
                             "(this redis-py has no asyncio cluster pub/sub)")  # fmt: skip
                    return
                await pubsub.subscribe(self.channel)
                delay = 0.1
                me = asyncio.current_task()
                while True:
                    # Bounded waits: redis-py may swallow a cancel that lands while it
                    # subscribes; the task then sees it here within a second.
                    if me is not None and me.cancelling():
                        raise asyncio.CancelledError
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    data = message.get("data")
                    if isinstance(data, bytes):
                        self.held.cancel(data.decode("utf-8", "replace"))
            except REDIS_ERRORS as exc:
                log.debug("cancel channel: redis unavailable (%s)", exc)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
