"""Job middleware that limits when jobs run: rate limits, overlap locks, exception
throttling and skipping.

A job (or a notification, or a queued listener) returns them from ``middleware()``::

    def middleware(self) -> list[Any]:
        return [RateLimited("sms-provider", per_second=10), WithoutOverlapping(f"user:{self.uid}")]

State lives in Redis under keys of its own hash tag (``{prefix}:limit:{<key>}``,
``:overlap:``, ``:throttle:``), so a limit holds across every worker process and
machine. Each check is one Lua script reading Redis ``TIME``. A job held back by a limit
is released with :func:`~tidings.jobs.middleware.release_uncounted`: waiting for a rate
limit or a lock does not use up one of its ``tries``.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

from tidings import _current
from tidings.jobs.job import Job, current_run
from tidings.jobs.middleware import release_uncounted
from tidings.redis import scripts
from tidings.redis.keys import limit_key
from tidings.wire import serializer

Next = Callable[[], Awaitable[Any]]


def _client_and_prefix() -> tuple[Any, str]:
    rq = _current.current().queue_for(None)
    return rq.aclient(), str(rq.prefix)


def _job_key(job: Job) -> str:
    return serializer.class_path(type(job.option_source()))


class RateLimited:
    """Let at most ``per_second`` (or ``per_minute``) jobs with this key start, across all
    workers; a job over the limit goes back to its queue until a slot frees up.

    The limit is a GCRA (generic cell rate algorithm) in ``lua/rate_limit.lua``: over any
    window of W seconds at most ``W * rate + burst`` jobs pass.

    Args:
        key: names the limit; jobs sharing a key share it (e.g. ``"sms-provider"``).
        per_second, per_minute: the rate (give one).
        burst: how many may start at once after a quiet spell (default 1).
    """

    def __init__(
        self,
        key: str,
        *,
        per_second: float | None = None,
        per_minute: float | None = None,
        burst: int = 1,
    ) -> None:
        if (per_second is None) == (per_minute is None):
            raise ValueError("give exactly one of per_second= or per_minute=")
        rate = per_second if per_second is not None else (per_minute or 0) / 60.0
        if rate <= 0 or burst < 1:
            raise ValueError("the rate must be positive and burst at least 1")
        self.key = key
        self.rate = float(rate)
        self.burst = int(burst)
        self.interval_us = max(1, round(1_000_000 / self.rate))

    def __repr__(self) -> str:
        return f"RateLimited({self.key!r}, per_second={self.rate:g}, burst={self.burst})"

    async def handle(self, job: Job, nxt: Next) -> Any:
        """Take a slot and run, or release the job until one frees up."""
        client, prefix = _client_and_prefix()
        key = limit_key(prefix, "limit", self.key)
        wait_us = int(await scripts.RATE_LIMIT.acall(client, [key], [self.interval_us, self.burst]))
        if wait_us > 0:
            # Spread the waiters over a few slots so they do not all come back at once.
            spread = random.uniform(0, 4 * self.interval_us)
            release_uncounted((wait_us + spread) / 1e6)
            return None
        return await nxt()


class WithoutOverlapping:
    """Run at most one job with this key at a time, across all workers.

    Args:
        key: names the lock (default: the job's class).
        release_after: seconds before a job that found the lock taken is tried again;
            None drops it instead (Laravel's ``dontRelease()``).
        expire_after: seconds after which the lock frees itself (a worker killed
            mid-job cannot hold it forever). The job that held it may take it again at
            once when it is re-delivered (the lock holds the job id).
    """

    def __init__(
        self,
        key: str | None = None,
        *,
        release_after: float | None = 1.0,
        expire_after: float = 300.0,
    ) -> None:
        self.key = key
        self.release_after = release_after
        self.expire_after = expire_after

    async def handle(self, job: Job, nxt: Next) -> Any:
        """Run under the lock, or release (or drop) the job while another holds it."""
        client, prefix = _client_and_prefix()
        key = limit_key(prefix, "overlap", self.key or _job_key(job))
        run = current_run()
        owner = run.job_id if run is not None else f"local-{id(job)}"
        got = int(await scripts.LOCK.acall(client, [key], [owner, int(self.expire_after * 1000)]))
        if got != 1:
            if self.release_after is not None:
                release_uncounted(self.release_after)
            return None
        try:
            return await nxt()
        finally:
            await scripts.UNLOCK.acall(client, [key], [owner])


class ThrottlesExceptions:
    """After ``max_exceptions`` exceptions within ``decay_s``, hold back every job with
    this key until the window decays (a failing downstream service gets a rest).

    An exception still goes through the job's normal retry (it counts toward ``tries``);
    the jobs held back while throttled do not. A success clears the count.

    Args:
        max_exceptions: exceptions allowed within the window.
        decay_s: length of the window, from its first exception.
        key: names the counter (default: the job's class).
    """

    def __init__(self, max_exceptions: int = 10, decay_s: float = 600.0, *, key: str | None = None):
        self.max_exceptions = max_exceptions
        self.decay_s = decay_s
        self.key = key

    async def handle(self, job: Job, nxt: Next) -> Any:
        """Run unless throttled; count exceptions, clear the count on success."""
        client, prefix = _client_and_prefix()
        key = limit_key(prefix, "throttle", self.key or _job_key(job))
        decay_ms = int(self.decay_s * 1000)
        wait_ms = int(
            await scripts.THROTTLE.acall(client, [key], ["check", self.max_exceptions, decay_ms])
        )
        if wait_ms > 0:
            release_uncounted(wait_ms / 1000.0)
            return None
        try:
            out = await nxt()
        except Exception:
            await scripts.THROTTLE.acall(client, [key], ["hit", self.max_exceptions, decay_ms])
            raise
        await scripts.THROTTLE.acall(client, [key], ["clear", self.max_exceptions, decay_ms])
        return out


class Skip:
    """Skip the job (it counts as done, no retry) when ``if_`` is true or ``unless`` is
    false. Each may be a bool or a callable taking the job."""

    def __init__(self, if_: Any = None, *, unless: Any = None) -> None:
        self.if_ = if_
        self.unless = unless

    @classmethod
    def when(cls, condition: Any) -> Skip:
        """Skip when ``condition`` (a bool or ``callable(job)``) is true."""
        return cls(if_=condition)

    @classmethod
    def unless_(cls, condition: Any) -> Skip:
        """Skip unless ``condition`` (a bool or ``callable(job)``) is true."""
        return cls(unless=condition)

    @staticmethod
    def _eval(condition: Any, job: Job) -> bool:
        return bool(condition(job) if callable(condition) else condition)

    async def handle(self, job: Job, nxt: Next) -> Any:
        """Run the job unless a condition says to skip it."""
        if self.if_ is not None and self._eval(self.if_, job):
            return None
        if self.unless is not None and not self._eval(self.unless, job):
            return None
        return await nxt()


def channel_limits(channel: str) -> list[Any]:
    """The rate limit configured with ``app.rate_limit(channel, ...)``, as middleware."""
    limits: dict[str, Any] = getattr(_current.current(), "channel_limits", {})
    limit = limits.get(channel)
    return [limit] if limit is not None else []
