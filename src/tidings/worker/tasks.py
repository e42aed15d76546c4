"""Every background task of the worker, watched: none dies silently.

A task that raises is logged at ERROR with its exception and started again after a
short backoff; one that keeps dying (``MAX_RESTARTS`` within ``WINDOW_S``) stops the
worker with ``EXIT_SOFTWARE``, so its supervisor starts a fresh process instead of
leaving a half-alive worker that looks healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from tidings import _clock

log = logging.getLogger("tidings.worker")

MAX_RESTARTS = 5
WINDOW_S = 60.0
# How long stop() cancels a task again and again before it gives up on it (logged).
STOP_LIMIT_S = 5.0

Factory = Callable[[], Coroutine[Any, Any, None]]


class Supervised:
    """Starts named tasks and restarts the ones that die (see the module docstring)."""

    def __init__(self, on_fatal: Callable[[str], None]) -> None:
        self._on_fatal = on_fatal
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, factory: Factory, *, restart: bool = True) -> asyncio.Task[None]:
        """Run ``factory()`` as task ``name``; with ``restart``, again when it raises."""
        task = asyncio.create_task(self._watch(name, factory, restart), name=f"tidings:{name}")
        self._tasks[name] = task
        return task

    async def _watch(self, name: str, factory: Factory, restart: bool) -> None:
        deaths: list[float] = []
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # A library turned the cancellation into another error (redis-py
                    # may answer one mid-command with a ConnectionError): not a death.
                    raise asyncio.CancelledError from None
                log.exception("worker task %r died", name)
            now = _clock.monotonic()
            deaths = [t for t in deaths if now - t < WINDOW_S] + [now]
            if not restart or len(deaths) > MAX_RESTARTS:
                log.error(
                    "worker task %r died %d times in %gs: the worker exits for its "
                    "supervisor to start a fresh one",
                    name,
                    len(deaths),
                    WINDOW_S,
                )
                self._on_fatal(name)
                return
            await asyncio.sleep(min(5.0, 0.1 * 2 ** len(deaths)))
            log.warning("worker task %r restarted", name)

    def names(self) -> list[str]:
        return list(self._tasks)

    async def stop(self, names: list[str] | None = None) -> None:
        """Cancel the named tasks (all when ``names`` is None) and wait for them.

        A cancel can be lost: on Python 3.11 ``asyncio.wait_for`` (redis-py sends through
        it when a socket timeout is set) returns the result of a command that completed
        as the cancel landed, and the task loops on as if never cancelled. So a task
        still running is cancelled again every ``0.2`` s, for at most
        :data:`STOP_LIMIT_S`; one that outlives that is logged and left behind rather
        than holding up the worker's exit forever."""
        picked = list(self._tasks) if names is None else [n for n in names if n in self._tasks]
        chosen = {self._tasks.pop(n): n for n in picked}
        pending = set(chosen)
        deadline = _clock.monotonic() + STOP_LIMIT_S
        while pending:
            for t in pending:
                t.cancel()
            done, pending = await asyncio.wait(pending, timeout=0.2)
            for t in done:
                if not t.cancelled():
                    t.exception()  # retrieved: _watch logs its own deaths
            if pending and _clock.monotonic() > deadline:
                log.error(
                    "worker tasks %s did not end %gs after being cancelled; the worker "
                    "exits without them",
                    ", ".join(sorted(repr(chosen[t]) for t in pending)),
                    STOP_LIMIT_S,
                )
                return
