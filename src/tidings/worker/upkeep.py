"""The worker's checks beside its jobs, about once a second: the restart signal, the
server (:class:`~tidings.worker.health.ServerWatch`), ``--memory`` and ``--max-time``.
Redis errors here are logged and tried again on the next tick."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import redis.asyncio
from redis.exceptions import ResponseError

from tidings import _clock
from tidings.observability.process import rss_mb
from tidings.redis.errors import REDIS_ERRORS, reraise_cancel
from tidings.redis.keys import restart_key
from tidings.worker.health import ServerWatch
from tidings.worker.options import EXIT_MEMORY, WorkerOptions, short_error

log = logging.getLogger("tidings.worker")


class Upkeep:
    """Restart requests, server health and the process's own limits."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str,
        options: WorkerOptions,
        watch: ServerWatch,
        stop: Callable[[str, int | None], None],
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.opts = options
        self.watch = watch
        self._stop = stop
        self._started = _clock.monotonic()
        self._restart_seen = 0.0
        self._garbage_logged = False

    async def run(self) -> None:
        """The upkeep task."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.check_restart()
                await self.watch.tick()
            except REDIS_ERRORS as exc:
                log.warning("upkeep: redis unavailable (%s)", short_error(exc))
            except ResponseError as exc:  # e.g. OOM on a write
                log.warning("upkeep: %s", short_error(exc))
            reraise_cancel()
            if self.opts.memory_mb and rss_mb() > self.opts.memory_mb:
                self._stop(f"memory above {self.opts.memory_mb} MB", EXIT_MEMORY)
            if self.opts.max_time_s and _clock.monotonic() - self._started > self.opts.max_time_s:
                self._stop("--max-time reached", None)

    async def check_restart(self, *, initial: bool = False) -> None:
        """Stop when ``notify-worker restart`` asked after this worker started."""
        raw = await self.client.get(restart_key(self.prefix))
        try:
            value = float(raw) if raw else 0.0
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            # Written by hand: not a restart request; never a reason to die.
            if not self._garbage_logged:
                self._garbage_logged = True
                log.warning("ignoring the restart key: it is not a Redis timestamp")
            value = self._restart_seen if not initial else 0.0
        if initial:
            self._restart_seen = value
        elif value > self._restart_seen:
            self._stop("restart requested", None)
