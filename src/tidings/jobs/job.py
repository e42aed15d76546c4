"""Jobs: classes with a ``handle()`` that a worker runs later.

``@dataclass class ProcessPodcast(Job)`` is the usual shape. The base keeps no instance
state: options are class attributes, dispatch options live on a :class:`PendingDispatch`,
and what a run knows (attempts, release, fail) lives in a context variable the worker
sets, so frozen and slotted dataclasses work too.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tidings import _clock, _current

Delay = float | int | dt.timedelta | dt.datetime


class BatchHandle(Protocol):
    """What ``self.batch`` gives a job of a batch (a
    :class:`~tidings.workflows.batch.BatchRef`, bound to the run by the workflows)."""

    id: str

    def fetch(self) -> Any: ...
    def cancel(self) -> bool: ...
    def add(self, jobs: Any) -> list[str]: ...
    async def add_async(self, jobs: Any) -> list[str]: ...
    @property
    def cancelled(self) -> bool: ...


@dataclass(slots=True)
class JobRun:
    """What the worker knows about the run in progress.

    ``body`` is the job's decoded envelope body (a :class:`~tidings.wire.envelope.JobBody`);
    ``batch`` is bound by :meth:`tidings.workflows.hooks.WorkflowHooks.layers` for a job of a
    batch or a batch's callback."""

    job_id: str
    queue: str
    attempts: int = 1
    released_s: float | None = None
    failed_exc: BaseException | None = None
    body: Any = None
    uncount: bool = False
    batch: BatchHandle | None = None


_ASYNC_HANDLE: dict[type, bool] = {}
_run: contextvars.ContextVar[JobRun | None] = contextvars.ContextVar(
    "tidings_job_run", default=None
)


@contextmanager
def running(run: JobRun) -> Iterator[JobRun]:
    """Bind ``run`` as the current run for the duration of a handler."""
    token = _run.set(run)
    try:
        yield run
    finally:
        _run.reset(token)


def current_run() -> JobRun | None:
    """The run in progress in this context, if any."""
    return _run.get()


def delay_seconds(value: Delay | None) -> float:
    """Seconds from now for a delay given as seconds, a timedelta or a datetime."""
    if value is None:
        return 0.0
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.astimezone()
        return max(0.0, aware.timestamp() - _clock.now())
    if isinstance(value, dt.timedelta):
        return max(0.0, value.total_seconds())
    return max(0.0, float(value))


def option(source: Any, name: str) -> Any:
    """Read option ``name`` from a job or listener: an attribute, or a method returning it."""
    value = getattr(source, name, None)
    if callable(value) and not isinstance(value, type):
        value = value()
    return value


class Job:
    """Base class of queued jobs.

    Option class attributes (or methods returning them): ``connection``, ``queue``,
    ``delay`` (seconds or timedelta), ``tries``, ``backoff`` (seconds, a list per attempt
    or :class:`~tidings.jobs.backoff.Exponential`), ``timeout``, ``retry_until``
    (datetime, timedelta or seconds from dispatch), ``max_exceptions``, ``max_stalls``
    (how often its lease may expire, its worker dead or frozen, before it fails as
    "stalled N times"; None: the worker's ``--max-stalls``, default 3); for unique and
    debounced jobs ``unique_for``, ``unique_until``, ``debounce_for``,
    ``debounce_max_wait`` with :meth:`unique_id` (see :mod:`tidings.workflows.unique`).
    """

    __tidings_serializable__: ClassVar[bool] = True
    connection: ClassVar[str | None] = None
    queue: ClassVar[str | None] = None
    tries: ClassVar[int | None] = None
    backoff: ClassVar[Any] = None
    timeout: ClassVar[float | None] = None
    retry_until: ClassVar[Any] = None
    max_exceptions: ClassVar[int | None] = None
    max_stalls: ClassVar[int | None] = None
    unique_for: ClassVar[float | None] = None
    unique_until: ClassVar[str] = "completion"
    debounce_for: ClassVar[float | None] = None
    debounce_max_wait: ClassVar[float | None] = None

    def unique_id(self) -> str:
        """What makes two dispatches "the same job" for ``unique_for`` / ``debounce_for``."""
        return ""

    def handle(self) -> Any:
        """Do the work. May be ``async def``."""
        raise NotImplementedError(f"{type(self).__qualname__} must define handle()")

    def failed(self, exc: BaseException) -> Any:
        """Called once when the job has finally failed. May be ``async def``."""

    def middleware(self) -> list[Any]:
        """Objects wrapping ``handle`` (see :mod:`tidings.jobs.middleware`)."""
        return []

    def display_name(self) -> str:
        """The name shown in logs and the failed store."""
        return type(self).__qualname__

    def option_source(self) -> Any:
        """The object whose attributes give this job's options."""
        return self

    def option_defaults(self) -> dict[str, Any]:
        """Options used where :meth:`option_source` sets none (``tries``, ``backoff``);
        the worker's ``--tries`` / ``--backoff`` apply where neither does."""
        return {}

    def runs_async(self) -> bool:
        """Whether ``handle`` is a coroutine function (awaited on the loop, not a thread)."""
        cls = type(self)
        known = _ASYNC_HANDLE.get(cls)
        if known is None:
            known = _ASYNC_HANDLE[cls] = inspect.iscoroutinefunction(self.handle)
        return known

    # -- inside handle() -------------------------------------------------------------

    @property
    def attempts(self) -> int:
        """How many times this job has been reserved, this run included."""
        run = _run.get()
        return run.attempts if run else 0

    @property
    def job_id(self) -> str | None:
        """The id of the job being run, inside ``handle``."""
        run = _run.get()
        return run.job_id if run else None

    @property
    def batch(self) -> BatchHandle | None:
        """The batch of the job being run (a :class:`~tidings.workflows.batch.BatchRef`:
        ``.id``, ``.add(jobs)``, ``.cancel()``, ``.fetch()``), or None."""
        run = _run.get()
        return run.batch if run is not None else None

    def release(self, delay: Delay = 0) -> None:
        """Put the job back on its queue after ``handle`` returns (counts as an attempt)."""
        run = _run.get()
        if run is not None:
            run.released_s = delay_seconds(delay)

    def fail(self, exc: BaseException | str | None = None) -> None:
        """Mark the job failed once ``handle`` returns; ``failed()`` runs, no retry."""
        run = _run.get()
        if run is not None:
            if exc is None:
                exc = RuntimeError("job marked as failed")
            run.failed_exc = RuntimeError(exc) if isinstance(exc, str) else exc

    # -- dispatching -----------------------------------------------------------------

    def on_queue(self, name: str) -> PendingDispatch:
        """Dispatch options: the queue."""
        return PendingDispatch(self).on_queue(name)

    def on_connection(self, name: str) -> PendingDispatch:
        """Dispatch options: the named connection."""
        return PendingDispatch(self).on_connection(name)

    def delay(self, delay: Delay) -> PendingDispatch:
        """Dispatch options: run no sooner than ``delay`` from now."""
        return PendingDispatch(self).delay(delay)

    def dispatch(self) -> str | None:
        """Push the job on its queue; returns the job id.

        Returns None only for a unique job (``unique_for``) dropped because a job with
        the same ``unique_id()`` is still pending.
        """
        return PendingDispatch(self).dispatch()

    async def dispatch_async(self) -> str | None:
        """Push the job from async code; returns the job id (None: see :meth:`dispatch`)."""
        return await PendingDispatch(self).dispatch_async()

    def dispatch_sync(self) -> Any:
        """Run the job now, in this process, and return what ``handle`` returns."""
        run = JobRun(job_id="sync", queue="sync")
        with running(run):
            result = self.handle()
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
        return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


@dataclass(slots=True)
class PendingDispatch:
    """A job with its dispatch options, pushed by :meth:`dispatch`."""

    job: Job
    queue: str | None = None
    connection: str | None = None
    delay_s: float | None = None
    chain: list[Any] = field(default_factory=list)
    catch: Any = None

    def on_queue(self, name: str) -> PendingDispatch:
        """Use queue ``name``."""
        self.queue = name
        return self

    def on_connection(self, name: str) -> PendingDispatch:
        """Use connection ``name``."""
        self.connection = name
        return self

    def delay(self, delay: Delay) -> PendingDispatch:
        """Run no sooner than ``delay`` from now."""
        self.delay_s = delay_seconds(delay)
        return self

    def dispatch(self) -> str | None:
        """Push the job; returns its id (None: a unique job dropped as a duplicate)."""
        job_id: str | None = _current.current().push_pending(self)
        return job_id

    async def dispatch_async(self) -> str | None:
        """Push the job from async code; returns its id (None: see :meth:`dispatch`)."""
        job_id: str | None = await _current.current().push_pending_async(self)
        return job_id
