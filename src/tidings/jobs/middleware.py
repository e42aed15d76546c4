"""Job middleware: objects whose ``handle(job, next)`` wraps a job's ``handle``.

A layer calls ``await next()`` to go on, or returns without calling it (and may call
``job.release(delay)``) to skip the run. ``release_uncounted`` releases without using
up an attempt, for limits that are not the job's fault (rate limits, overlap).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tidings.jobs.job import Delay, Job, current_run, delay_seconds


class Middleware(Protocol):
    """A layer around a job's ``handle``: call ``next()`` to go on, or return to skip."""

    def handle(self, job: Job, next: Callable[[], Awaitable[Any]]) -> Any: ...


def release_uncounted(delay: Delay) -> None:
    """Put the current job back without counting this attempt."""
    run = current_run()
    if run is not None:
        run.released_s = delay_seconds(delay)
        run.uncount = True


async def run_through(
    layers: Sequence[Middleware], job: Job, call: Callable[[], Awaitable[Any]]
) -> Any:
    """Run ``call`` inside ``layers``, outermost first."""

    async def step(i: int) -> Any:
        if i == len(layers):
            return await call()
        out = layers[i].handle(job, lambda: step(i + 1))
        return await out if inspect.isawaitable(out) else out

    return await step(0)
