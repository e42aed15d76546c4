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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tidings import _clock, _current
from tidings.errors import JobCancelled, ValidationError

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
    cancelled: bool = False
    """``app.cancel`` asked for this run to stop (set by the worker, read by the job)."""
    report: Callable[[float, float | None, str | None], None] | None = None
    """Where ``self.progress`` goes (the worker's throttled progress writer)."""
    handler_task: asyncio.Task[Any] | None = None
    """The task awaiting an async ``handle`` right now (None outside it): what a cancel
    of a running async job cancels."""
    cancel_sent: bool = False
    """The worker cancelled ``handler_task`` for a cancel (told from a timeout's)."""
    handle_started: bool = False
    """``handle`` was called: an error before it (a middleware's Redis call during an
    outage) is not the job's."""

    def request_cancel(self) -> None:
        """Ask this run to stop: a sync job sees ``self.cancelled``; an async handler
        running now is cancelled at its current ``await`` (its ``finally`` blocks run)."""
        self.cancelled = True
        task = self.handler_task
        if task is not None and not self.cancel_sent and not task.done():
            self.cancel_sent = True
            task.cancel("tidings: job cancelled")


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


PRIORITY_MIN, PRIORITY_MAX = -100, 100


def check_priority(value: object, where: str = "priority") -> int:
    """``value`` as a priority, an int from -100 to 100 (higher runs first).

    Raises:
        ValidationError: not an int in that range (``where`` names the option or call).
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{where} must be an int from -100 to 100, not {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(f"{where} must be from -100 to 100 (Django's range), not {value}")
    return value


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
    ``debounce_max_wait`` with :meth:`unique_id` (see :mod:`tidings.workflows.unique`);
    ``priority`` (-100..100, higher first within a queue; default 0); ``store_result``
    (keep what ``handle`` returns for ``app.result``; None: ``TIDINGS_STORE_RESULTS``),
    ``result_ttl_s`` and ``result_max_bytes`` (None: the App's settings).
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
    priority: ClassVar[int | None] = None
    store_result: ClassVar[bool | None] = None
    result_ttl_s: ClassVar[float | None] = None
    result_max_bytes: ClassVar[int | None] = None

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

    def group_args(self) -> tuple[Any, ...]:
        """What a ``group`` hook on :meth:`option_source` is called with (fair groups,
        :mod:`tidings.jobs.groups`): nothing for a job; a listener's event arguments, a
        notification's notifiable."""
        return ()

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

    @property
    def cancelled(self) -> bool:
        """Whether ``app.cancel`` asked this run to stop (a sync job polls it)."""
        run = _run.get()
        return run.cancelled if run is not None else False

    def check_cancelled(self) -> None:
        """Raise :class:`~tidings.errors.JobCancelled` if this run was cancelled.

        The job is then recorded as cancelled: not retried, ``failed()`` not called.
        """
        run = _run.get()
        if run is not None and run.cancelled:
            raise JobCancelled(f"job {run.job_id} was cancelled", job_id=run.job_id)

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the run is (``app.job_status(id).progress``, ``JobProgressed``).

        Cheap to call often: at most one Redis write per 100 ms per job, and the last
        value is always written. Works in sync and async handlers.
        """
        run = _run.get()
        if run is not None and run.report is not None:
            run.report(done, total, note)

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

    def with_priority(self, priority: int) -> PendingDispatch:
        """Dispatch options: ``priority`` from -100 to 100 (higher runs first)."""
        return PendingDispatch(self).with_priority(priority)

    def on_group(self, group: str) -> PendingDispatch:
        """Dispatch options: join fair group ``group`` of its queue (docs/groups.md)."""
        return PendingDispatch(self).on_group(group)

    def with_result(self, ttl_s: float | None = None) -> PendingDispatch:
        """Dispatch options: keep what ``handle`` returns (for ``app.result``)."""
        return PendingDispatch(self).with_result(ttl_s)

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
    priority: int | None = None
    store_result: bool | None = None
    result_ttl_s: float | None = None
    group: str | None = None

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

    def with_priority(self, priority: int) -> PendingDispatch:
        """Run before jobs of lower priority on its queue (-100..100, default 0).

        Raises:
            ValidationError: not an int from -100 to 100.
        """
        self.priority = check_priority(priority, "with_priority()")
        return self

    def on_group(self, group: str) -> PendingDispatch:
        """Join fair group ``group``: within its queue, ready jobs of different groups
        are taken round-robin, and the group's limits apply (docs/groups.md).

        Raises:
            ValidationError: an empty key, one over 256 bytes or with control characters.
        """
        from tidings.jobs.groups import check_group

        self.group = check_group(group, "on_group()")
        return self

    def with_result(self, ttl_s: float | None = None) -> PendingDispatch:
        """Keep what ``handle`` returns, for ``app.result``, ``ttl_s`` seconds (None: the
        job's ``result_ttl_s``, else ``TIDINGS_RESULT_TTL_S``, a day)."""
        self.store_result = True
        self.result_ttl_s = ttl_s
        return self

    def dispatch(self) -> str | None:
        """Push the job; returns its id (None: a unique job dropped as a duplicate)."""
        job_id: str | None = _current.current().push_pending(self)
        return job_id

    async def dispatch_async(self) -> str | None:
        """Push the job from async code; returns its id (None: see :meth:`dispatch`)."""
        job_id: str | None = await _current.current().push_pending_async(self)
        return job_id
