"""Django's Tasks API (``django.tasks``, or the ``django-tasks`` backport) run by tidings.

::

    # settings.py
    INSTALLED_APPS = [..., "tidings.contrib.django"]
    TASKS = {
        "default": {
            "BACKEND": "tidings.contrib.django.tasks.TidingsBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"result_ttl_s": 86400, "tries": 3, "backoff": [1, 5, 30],
                        "timeout": 60, "after_commit": True},
        }
    }

A task is a tidings job (:class:`RunTask`) on the tidings queue named by the task's
``queue_name``, at its ``priority``, delayed to its ``run_after``; the job's id is the
``TaskResult.id``, so ``app.cancel``, ``app.job_status`` (progress included), the
dashboard and ``failed retry`` work on tasks as on any job.

Nothing is written beside the job on the way that succeeds: ``enqueue`` is one push
(the envelope carries the function, arguments, queue, priority and ``enqueued_at``), and
a successful run's ``TaskResult`` (its start, finish, worker id and return value) is the
job's stored result, written by the ack that finishes the job. ``get_result`` derives
the rest from what tidings keeps: the envelope (waiting or running), the reservation
(RUNNING), the failed store (FAILED), the cancel mark. Only a failed attempt, a final
failure and a cancel write a small record, ``{prefix}:djtask:{<id>}`` (a hash with lists
of the earlier attempts' worker ids and errors; one Lua move, ``djtask_record``), kept
``result_ttl_s`` (a day). Per-task options: ``@task(tries=..., timeout=...)`` (the
backend's ``task_class`` is :class:`TidingsTask`) or a stacked :func:`tidings_options`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import inspect
import json
import os
import socket
import time
import traceback
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import orjson
from django.utils import timezone

from tidings import _current, after_commit
from tidings.app import App
from tidings.contrib.django._tasks_api import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from tidings.errors import ConfigurationError, JobCancelled, PayloadRejected, ResultMissing
from tidings.jobs.job import Job, PendingDispatch, current_run, option
from tidings.observability.lifecycle import JobWasCancelled
from tidings.observability.redaction import redact
from tidings.redis import scripts
from tidings.wire import serializer
from tidings.wire.envelope import open_envelope
from tidings.wire.results import open_result

DEFAULT_RESULT_TTL_S = 86400.0
_OPTION_NAMES = {"result_ttl_s", "tries", "backoff", "timeout", "after_commit", "connection"}
_READY, _RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
_SUCCESSFUL, _FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
_OUTCOME = "djtask:"  # heads a stored job result that is a task's outcome
_CANCEL_WAIT_S = 2.0  # how long get_result waits for a worker's record of a cancel


def progress(done: float, total: float | None = None, note: str | None = None) -> None:
    """Report how far the running task is, from inside its function (a tidings
    extension: ``app.job_status(result.id).progress``, ``notify-worker status ID``).

    Throttled like ``Job.progress`` (one write per 100 ms, the last one always kept); a
    no-op outside a tidings worker (on ``ImmediateBackend``, say).
    """
    run = current_run()
    if run is not None and run.report is not None:
        run.report(done, total, note)


_WORKER_ID = ""


def _forget_worker_id() -> None:
    global _WORKER_ID
    _WORKER_ID = ""


os.register_at_fork(after_in_child=_forget_worker_id)  # a fork gets its own


def _worker_id() -> str:
    """This process's worker id (``host:pid``), made once per process."""
    global _WORKER_ID
    if not _WORKER_ID:
        _WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
    return _WORKER_ID


def _now() -> str:
    """Now as kept in records and outcomes: seconds since the epoch."""
    return repr(time.time())


def _when(raw: Any) -> dt.datetime | None:
    """A kept time as Django shows it (aware, UTC)."""
    if not raw:
        return None
    return dt.datetime.fromtimestamp(float(raw), tz=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _normalized(value: Any) -> Any:
    """``normalize_json(value)`` (as Django's backends normalise a return value), with
    the common answer, a plain scalar, passed through without its pattern match."""
    return value if type(value) in _SCALARS else normalize_json(value)


def _plain_json(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """``(normalize_json(args), normalize_json(kwargs))`` when both are flat and plain
    (a list or tuple of scalars; a dict of ``str`` keys to scalars), the common call,
    answered without Django's pattern match per value (which gives the same answer);
    None for anything else (Django's own normalising then decides, and refuses)."""
    if type(args) not in (tuple, list) or type(kwargs) is not dict:
        return None
    for value in args:
        if type(value) not in _SCALARS:
            return None
    for key, value in kwargs.items():
        if type(key) is not str or type(value) not in _SCALARS:
            return None
    return list(args), dict(kwargs)


_RESULT_FIELDS = {f.name: f for f in dataclasses.fields(TaskResult)}
_RESULT_INIT = frozenset(n for n, f in _RESULT_FIELDS.items() if f.init)
_RESULT_EXTRA = {
    n: f.default for n, f in _RESULT_FIELDS.items() if not f.init
}  # ``_return_value``: None
_RESULT_WRITTEN_FOR = {
    "task", "id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at",
    "args", "kwargs", "backend", "errors", "worker_ids",
}  # fmt: skip
_RESULT_FAST = _RESULT_INIT == _RESULT_WRITTEN_FOR and all(
    v is not dataclasses.MISSING for v in _RESULT_EXTRA.values()
)


def _json_result(
    task: Task[Any, Any],
    status: TaskResultStatus,
    enqueued_at: dt.datetime | None,
    started_at: dt.datetime | None,
    last_attempted_at: dt.datetime | None,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    worker_ids: list[str],
    errors: list[TaskError],
    task_id: str = "",
) -> TaskResult[Any]:
    """A ``TaskResult`` (not finished) whose arguments are already what Django's
    normalising gives (the envelope's, normalised when the task was enqueued, or
    :func:`_plain_json`'s): the constructor's pass over them (``normalize_json``,
    idempotent) is skipped where ``TaskResult`` has the fields this was written against
    (Django 5.2 + ``django-tasks`` 0.12, Django 6.0); any other shape goes through the
    constructor."""
    if not _RESULT_FAST:
        return TaskResult(
            task=task, id=task_id, status=status, enqueued_at=enqueued_at,
            started_at=started_at, finished_at=None, last_attempted_at=last_attempted_at,
            args=args, kwargs=kwargs, backend=backend, errors=errors, worker_ids=worker_ids,
        )  # fmt: skip
    result: TaskResult[Any] = _new(TaskResult)
    _set(result, "task", task)
    _set(result, "id", task_id)
    _set(result, "status", status)
    _set(result, "enqueued_at", enqueued_at)
    _set(result, "started_at", started_at)
    _set(result, "finished_at", None)
    _set(result, "last_attempted_at", last_attempted_at)
    _set(result, "args", args)
    _set(result, "kwargs", kwargs)
    _set(result, "backend", backend)
    _set(result, "errors", errors)
    _set(result, "worker_ids", worker_ids)
    for name, value in _RESULT_EXTRA.items():
        _set(result, name, value)
    return result


_new, _set = object.__new__, object.__setattr__


def _errors_of(raw: str | None) -> list[TaskError]:
    """The ``TaskError`` list of a record's JSON errors."""
    if not raw or raw == "[]":
        return []
    return [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in json.loads(raw)
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Records:
    """The record of a task's failed attempts and cancel, in Redis: a hash (identity,
    ``started_at``, status and times), a list of worker ids and a list of errors, one
    per failed attempt. Written only off the way that succeeds (a failed attempt, a
    final failure, a cancel); each write appends or sets, so writes may land in any
    order and twice."""

    def __init__(self, app: App, ttl_s: float, connection: str | None) -> None:
        self.rq = app.queue_for(connection)
        self.ttl_ms = int(ttl_s * 1000)

    def key(self, task_id: str) -> str:
        """The record hash; its lists are ``…:w`` and ``…:e`` (one hash tag: a Cluster
        slot)."""
        return f"{self.rq.prefix}:djtask:{{{task_id}}}"

    def _script(
        self,
        task_id: str,
        fields: dict[str, str],
        error: str | None,
        worker_id: str | None,
        started_at: str | None,
        only_unset: bool = False,
    ) -> tuple[list[str], list[scripts.Arg]]:
        key = self.key(task_id)
        args: list[scripts.Arg] = [
            self.ttl_ms,
            uuid.uuid4().hex,  # this write's token: a re-sent call changes nothing
            worker_id or "",
            error or "",
            started_at or "",
            "1" if only_unset else "0",
        ]
        for name, value in fields.items():
            args += [name, value]
        return [key, f"{key}:w", f"{key}:e"], args

    def read_commands(self, pipe: Any, task_id: str) -> None:
        key = self.key(task_id)
        pipe.hgetall(key)
        pipe.lrange(f"{key}:w", 0, -1)
        pipe.lrange(f"{key}:e", 0, -1)

    @staticmethod
    def state(replies: Sequence[Any]) -> dict[str, str]:
        raw, workers, errors = replies[:3]
        state = {_text(k): _text(v) for k, v in raw.items()}
        if state or workers or errors:
            state["worker_ids"] = json.dumps([_text(w) for w in workers])
            state["errors"] = "[" + ",".join(_text(e) for e in errors) + "]"
        return state

    def write(
        self,
        task_id: str,
        fields: dict[str, str],
        error: str | None = None,
        worker_id: str | None = None,
        started_at: str | None = None,
    ) -> None:
        keys, args = self._script(task_id, fields, error, worker_id, started_at)
        scripts.DJTASK_RECORD.call(self.rq.client, keys, args)

    async def awrite(
        self,
        task_id: str,
        fields: dict[str, str],
        error: str | None = None,
        worker_id: str | None = None,
        started_at: str | None = None,
        only_unset: bool = False,
    ) -> None:
        keys, args = self._script(task_id, fields, error, worker_id, started_at, only_unset)
        await scripts.DJTASK_RECORD.acall(self.rq.aclient(), keys, args)

    def read(self, task_id: str) -> dict[str, str]:
        pipe = self.rq.client.pipeline(transaction=False)
        self.read_commands(pipe, task_id)
        return self.state(pipe.execute())

    async def aread(self, task_id: str) -> dict[str, str]:
        pipe = self.rq.aclient().pipeline(transaction=False)
        self.read_commands(pipe, task_id)
        return self.state(await pipe.execute())


_TASK_OPTIONS = ("tries", "backoff", "timeout", "after_commit", "result_ttl_s")


def _check_task_options(where: str, options: Mapping[str, Any]) -> None:
    """Refuse a per-task option tidings cannot use, naming the task and the option.

    Raises:
        ConfigurationError: an unknown name or a value of the wrong kind.
    """
    unknown = sorted(set(options) - set(_TASK_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown tidings task options {unknown}; the options are "
            f"{list(_TASK_OPTIONS)} (retries: tries=N)"
        )

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0

    checks: dict[str, tuple[Any, str]] = {
        "tries": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                  "an int >= 1"),
        "backoff": (lambda v: number(v) or (isinstance(v, list | tuple) and all(map(number, v))),
                    "seconds, or a list of seconds per retry"),
        "timeout": (lambda v: number(v) and v > 0, "seconds > 0"),
        "after_commit": (lambda v: isinstance(v, bool), "True or False"),
        "result_ttl_s": (lambda v: number(v) and v > 0, "seconds > 0"),
    }  # fmt: skip
    for name, value in options.items():
        ok, wanted = checks[name]
        if value is not None and not ok(value):
            raise ConfigurationError(f"{where}: {name}={value!r} must be {wanted}")


if TYPE_CHECKING:
    _TaskBase: TypeAlias = Task[Any, Any]
else:  # Django 6's Task is not subscriptable at run time (the backport's is)
    _TaskBase = Task


@dataclass(frozen=True, slots=True, kw_only=True)
class TidingsTask(_TaskBase):
    """The ``Task`` of a task on :class:`TidingsBackend` (its ``task_class``): Django's
    fields plus tidings' per-task options, so ``@task(tries=5, timeout=30)`` works
    where Django passes extra ``@task`` keyword arguments to the backend's task class
    (the ``django-tasks`` backport does; Django 6's ``@task`` takes none: stack
    :func:`tidings_options` there). ``None``: the backend's ``OPTIONS`` decide."""

    tries: int | None = None
    backoff: float | list[float] | None = None
    timeout: float | None = None
    after_commit: bool | None = None
    result_ttl_s: float | None = None

    def __post_init__(self) -> None:
        _check_task_options(
            f"task {self.func.__module__}.{self.func.__qualname__}", self.tidings_options()
        )
        Task.__post_init__(self)  # slots=True: a new class, so no zero-argument super()

    def tidings_options(self) -> dict[str, Any]:
        """The options this task sets (the others come from the backend's ``OPTIONS``)."""
        found = {name: getattr(self, name) for name in _TASK_OPTIONS}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in found.items()
                if v is not None}  # fmt: skip


def _overrides_of(task: Task[Any, Any]) -> dict[str, Any] | None:
    """The tidings options ``task`` sets itself, or None (most tasks: the backend's);
    the attribute checks name every option of ``_TASK_OPTIONS`` (cheaper than building
    the dict per enqueue)."""
    if not isinstance(task, TidingsTask) or (
        task.tries is None and task.backoff is None and task.timeout is None
        and task.after_commit is None and task.result_ttl_s is None
    ):  # fmt: skip
        return None
    return task.tidings_options() or None


def tidings_options(**options: Any) -> Any:
    """Per-task tidings options, on any Django version: stack it above ``@task``::

        @tidings_options(tries=5, backoff=[1, 10, 60], timeout=30, after_commit=True,
                         result_ttl_s=3600)
        @task(priority=10)
        def send_receipt(order_id: int) -> str: ...

    Options it does not name come from the backend's ``OPTIONS``.

    Raises:
        ConfigurationError: an unknown option or a value of the wrong kind.
    """
    _check_task_options("tidings_options()", options)

    def apply(found: Task[Any, Any]) -> TidingsTask:
        if not isinstance(found, Task):
            raise ConfigurationError(
                "tidings_options() decorates a Django task: put it above @task"
            )
        fields = {f: getattr(found, f) for f in ("func", "priority", "backend", "queue_name",
                                                 "run_after", "takes_context")}  # fmt: skip
        if isinstance(found, TidingsTask):
            fields.update(found.tidings_options())
        return TidingsTask(**{**fields, **options})

    return apply


# A resolved task, and its function where calling it directly is what ``Task.call``
# does (a sync function, ``call`` not overridden): None, call through the task.
_TASKS: dict[tuple[int, str, str, str, int], tuple[Task[Any, Any], Any]] = {}
_JOB_OF: dict[Any, tuple[type[RunTask], str]] = {}
_OPTIONS: dict[tuple[str, str], tuple[dict[str, Any], _TaskOptions]] = {}


def _backend_options(alias: str) -> dict[str, Any]:
    from django.conf import settings

    config = (getattr(settings, "TASKS", None) or {}).get(alias) or {}
    return dict(config.get("OPTIONS") or {})


def _options_of(
    alias: str, overrides: dict[str, Any] | None
) -> tuple[dict[str, Any], _TaskOptions]:
    """The options of a task of backend ``alias`` with its own ``overrides`` (merged
    once per process for each pair)."""
    key = (alias, json.dumps(overrides, sort_keys=True) if overrides else "")
    found = _OPTIONS.get(key)
    if found is None:
        merged = {**_backend_options(alias), **(overrides or {})}
        found = (merged, _TaskOptions(merged))
        if len(_OPTIONS) > 1024:
            _OPTIONS.clear()
        _OPTIONS[key] = found
    return found


class _TaskOptions:
    """What :class:`RunTask` gives tidings as its job options (the backend's
    ``OPTIONS``, under the task's own)."""

    # The options tidings reads that a task does not set: plain attributes, so a read
    # is a lookup, not a failed getattr.
    queue = delay = max_exceptions = retry_until = priority = max_stalls = None
    result_max_bytes = unique_for = unique_until = debounce_for = debounce_max_wait = None

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.tries = options.get("tries")
        self.backoff = options.get("backoff")
        self.timeout = options.get("timeout")
        self.after_commit = options.get("after_commit")
        self.connection = options.get("connection")
        self.store_result = True
        self.result_ttl_s = options.get("result_ttl_s", DEFAULT_RESULT_TTL_S)


@dataclass
class RunTask(Job):
    """The tidings job of one Django task: calls the module-level function the task
    wraps (by its ``module:qualname``, imported under the allowed modules only); its
    stored result is the task's outcome (value, start, finish, worker id)."""

    function: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "default"
    queue_name: str = "default"
    task_priority: int = 0
    enqueued_at: float = 0.0
    overrides: dict[str, Any] | None = None

    def display_name(self) -> str:
        """The task's module path, as Django names it."""
        return self.function.replace(":", ".")

    @property
    def options(self) -> dict[str, Any]:
        """The backend's ``OPTIONS`` under the task's own (:func:`tidings_options`)."""
        return _options_of(self.backend, self.overrides)[0]

    def option_source(self) -> Any:
        """Tries, backoff, timeout, after-commit, result TTL: :attr:`options`."""
        found = self.__dict__.get("_option_source")
        if found is None:  # asked ten times per push: looked up once per job (a dict
            # lookup: a missing attribute's AttributeError costs more than the lookups)
            found = self.__dict__["_option_source"] = _options_of(self.backend, self.overrides)[1]
        return found

    # -- in the worker ----------------------------------------------------------------

    def _records(self) -> _Records:
        return _records_for(_current.current(), self.options)

    def _resolved(self) -> tuple[Task[Any, Any], Any]:
        found = self.__dict__.get("_tidings_task")
        if found is not None:
            return found  # type: ignore[no-any-return]
        app = _current.current()
        key = (id(app), self.function, self.backend, self.queue_name, self.task_priority)
        found = _TASKS.get(key)
        if found is None:  # resolved and validated once per process, not per run
            task = _resolve_task(app, self.function, self.backend).using(
                queue_name=self.queue_name, priority=self.task_priority
            )
            direct = type(task).call is Task.call and not inspect.iscoroutinefunction(task.func)
            found = (task, task.func if direct else None)
            if len(_TASKS) > 4096:
                _TASKS.clear()
            _TASKS[key] = found
        self.__dict__["_tidings_task"] = found
        return found

    def _task(self) -> Task[Any, Any]:
        return self._resolved()[0]

    def identity(self) -> dict[str, str]:
        """The fields every record of this task has (the envelope carries them)."""
        return {
            "task": self.function,
            "queue": self.queue_name,
            "priority": str(self.task_priority),
            "args": json.dumps(self.args),
            "kwargs": json.dumps(self.kwargs),
            "enqueued_at": repr(self.enqueued_at),
        }

    def _reads_earlier(self) -> bool:
        """Whether this run reads what earlier attempts recorded: on a retry, and for a
        task that sees its attempt number (a ``failed retry`` restarts tidings' count)."""
        run = current_run()
        return run is not None and (run.attempts > 1 or self._task().takes_context)

    @staticmethod
    def _merged(
        earlier: dict[str, str], worker_id: str | None, error: str | None
    ) -> dict[str, str]:
        """The worker ids and errors of the earlier attempts, with this one's."""
        workers = json.loads(earlier.get("worker_ids", "[]"))
        errors = earlier.get("errors", "[]")
        if worker_id is not None:
            workers.append(worker_id)
        if error is not None:
            errors = f"{errors[:-1]}{',' if errors != '[]' else ''}{error}]"
        return {"worker_ids": json.dumps(workers), "errors": errors}

    def _state(
        self,
        earlier: dict[str, str],
        status: TaskResultStatus,
        started: str,
        finished: str | None = None,
        error: str | None = None,
    ) -> dict[str, str]:
        state = {
            **self.identity(),
            **self._merged(earlier, _worker_id(), error),
            "status": str(status),
            "started_at": earlier.get("started_at") or started,
            "last_attempted_at": started,
        }
        if finished is not None:
            state["finished_at"] = finished
        return state

    def _call_args(self, result: TaskResult[Any]) -> list[Any]:
        return (
            [TaskContext(task_result=result), *result.args]
            if result.task.takes_context
            else list(result.args)
        )

    @staticmethod
    def _error(exc: BaseException) -> str:
        tb = redact("".join(traceback.format_exception(exc)))
        return json.dumps({"exception_class_path": _class_path(type(exc)), "traceback": tb})

    def _outcome(self, value: Any, started: float, finished: float) -> str:
        """The job's stored result: what ``get_result`` shows of a successful task, one
        JSON string (the cheapest value to seal)."""
        return (
            _OUTCOME
            + orjson.dumps(
                [
                    value,
                    self.function,
                    self.queue_name,
                    self.task_priority,
                    self.args,
                    self.kwargs,
                    self.enqueued_at,
                    started,
                    finished,
                    _worker_id(),
                ]
            ).decode()
        )

    def _running(self, earlier: dict[str, str], started: float) -> TaskResult[Any]:
        """This run's ``TaskResult`` as it starts (built from objects, nothing parsed
        on a first attempt; the arguments are the envelope's, already normalised)."""
        workers = json.loads(earlier["worker_ids"]) if "worker_ids" in earlier else []
        workers.append(_worker_id())
        first = earlier.get("started_at")
        attempted = _at(started)
        return _json_result(
            self._task(),
            _RUNNING,
            _at(self.enqueued_at),
            _when(first) if first else attempted,
            attempted,
            self.args,
            self.kwargs,
            self.backend,
            workers,
            _errors_of(earlier.get("errors")),
            self.job_id or "",
        )

    @staticmethod
    def _succeeded(result: TaskResult[Any], value: Any, finished: float) -> TaskResult[Any]:
        """``result`` finished (changed in place, as Django's ``ImmediateBackend`` does)."""
        object.__setattr__(result, "status", _SUCCESSFUL)
        object.__setattr__(result, "finished_at", _at(finished))
        object.__setattr__(result, "_return_value", value)
        return result

    def _failed_attempt(self, exc: BaseException, started: float) -> tuple[bool, dict[str, str]]:
        """Record a failed attempt (a cancel is final); returns (final, its fields)."""
        self._recorded = True
        final = isinstance(exc, JobCancelled)
        fields = {**self.identity(), "status": str(_FAILED if final else _READY)}
        fields["last_attempted_at"] = repr(started)
        if final:
            fields["finished_at"] = _now()
        return final, fields

    def _result(self, state: dict[str, str]) -> TaskResult[Any]:
        return _build_result(self._task(), self.job_id or "", state, self.backend)

    def handle(self) -> Any:
        """Run the task function (sync); its outcome is the job's result."""
        self._started = True
        started = time.time()
        earlier = self._records().read(self.job_id or "") if self._reads_earlier() else {}
        result = self._running(earlier, started)
        task_started.send(sender=TidingsBackend, task_result=result)
        direct = self._resolved()[1]
        try:
            if direct is not None and not result.task.takes_context:
                value = _normalized(direct(*result.args, **result.kwargs))
            else:
                value = _normalized(result.task.call(*self._call_args(result), **result.kwargs))
        except Exception as exc:
            final, fields = self._failed_attempt(exc, started)
            error = self._error(exc)
            self._records().write(self.job_id or "", fields, error, _worker_id(), repr(started))
            if final:
                state = {**self._state(earlier, _FAILED, repr(started), error=error), **fields}
                task_finished.send(sender=TidingsBackend, task_result=self._result(state))
            raise
        finished = time.time()
        task_finished.send(
            sender=TidingsBackend, task_result=self._succeeded(result, value, finished)
        )
        return self._outcome(value, started, finished)

    async def failed(self, exc: BaseException) -> None:
        """The job failed for good: the task is FAILED (an error its run did not record,
        a timeout, is added; a stall's error without a worker id)."""
        records = self._records()
        task_id = self.job_id or ""
        ran_here = getattr(self, "_started", False)
        missing = not getattr(self, "_recorded", False)
        fields = {**self.identity(), "status": str(_FAILED), "finished_at": _now()}
        await records.awrite(
            task_id,
            fields,
            self._error(exc) if missing else None,
            _worker_id() if missing and ran_here else None,
        )
        state = {**self.identity(), **await records.aread(task_id)}
        await task_finished.asend(sender=TidingsBackend, task_result=self._result(state))


@dataclass
class RunAsyncTask(RunTask):
    """:class:`RunTask` for an ``async def`` task function, awaited on the worker's loop."""

    async def handle(self) -> Any:
        """Await the task coroutine; its outcome is the job's result."""
        self._started = True
        started = time.time()
        earlier = await self._records().aread(self.job_id or "") if self._reads_earlier() else {}
        result = self._running(earlier, started)
        await task_started.asend(sender=TidingsBackend, task_result=result)
        try:
            value = _normalized(await result.task.acall(*self._call_args(result), **result.kwargs))
        except (Exception, JobCancelled) as exc:
            final, fields = self._failed_attempt(exc, started)
            error = self._error(exc)
            await self._records().awrite(
                self.job_id or "", fields, error, _worker_id(), repr(started)
            )
            if final:
                state = {**self._state(earlier, _FAILED, repr(started), error=error), **fields}
                await task_finished.asend(sender=TidingsBackend, task_result=self._result(state))
            raise
        finished = time.time()
        await task_finished.asend(
            sender=TidingsBackend, task_result=self._succeeded(result, value, finished)
        )
        return self._outcome(value, started, finished)


def _class_path(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _records_for(app: App, options: dict[str, Any]) -> _Records:
    return _Records(
        app, float(options.get("result_ttl_s", DEFAULT_RESULT_TTL_S)), options.get("connection")
    )


def _resolve_task(app: App, function: str, backend: str) -> Task[Any, Any]:
    """The ``Task`` whose function is ``module:qualname`` (the module attribute holds the
    ``@task`` object), imported under the App's allowed modules."""
    found = app.resolve_class(function)
    if isinstance(found, Task):
        return found.using(backend=backend)
    if isinstance(found, types.FunctionType):  # ``t = task(f)`` under another name
        return Task(func=found, backend=backend)
    raise PayloadRejected(f"{function!r} is not a Django task")


def _build_result(
    task: Task[Any, Any], task_id: str, state: dict[str, str], backend: str
) -> TaskResult[Any]:
    status = TaskResultStatus(state.get("status") or str(_READY))
    errors = _errors_of(state.get("errors"))
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=task_id,
        status=status,
        enqueued_at=_when(state.get("enqueued_at")),
        started_at=_when(state.get("started_at")),
        finished_at=_when(state.get("finished_at")),
        last_attempted_at=_when(state.get("last_attempted_at")),
        args=json.loads(state.get("args", "[]")),
        kwargs=json.loads(state.get("kwargs", "{}")),
        backend=backend,
        errors=errors,
        worker_ids=json.loads(state.get("worker_ids", "[]")),
    )
    if status == _SUCCESSFUL and "return" in state:
        object.__setattr__(result, "_return_value", json.loads(state["return"]))
    return result


async def _record_cancel(event: JobWasCancelled) -> None:
    """A worker settled a cancelled job: if it is a task, record it (the job's
    envelope is gone), so ``get_result`` answers FAILED."""
    module, _, name = event.name.rpartition(".")
    if not module:
        return
    app = _current.current()
    function = f"{module}:{name}"
    try:
        if not isinstance(app.resolve_class(function), Task):
            return
    except Exception:  # not a task (or not importable here): nothing to record
        return
    fields = {"task": function, "queue": event.queue, "status": str(_FAILED)}
    fields["finished_at"] = _now()
    await _Records(app, DEFAULT_RESULT_TTL_S, None).awrite(event.job_id, fields, only_unset=True)


def listen_for_cancels(app: App) -> None:
    """Called by the Django integration when ``TASKS`` names :class:`TidingsBackend`."""
    app.listen(JobWasCancelled, _record_cancel)


_LOOK = 8  # replies per queue of one get_result look
# tidings.contrib.django.setup.get_app, imported on first use
_get_app: Callable[[], App] | None = None


class _Cancelled:
    """A look found the task cancelled and settled before the worker's record landed."""


class TidingsBackend(BaseTaskBackend):
    """A production backend for Django's Tasks API: tasks run in ``notify-worker``.

    ``OPTIONS`` (all optional): ``result_ttl_s`` (how long a ``TaskResult`` is kept; a
    day), ``tries``, ``backoff`` (seconds, or a list per attempt), ``timeout``
    (seconds), ``after_commit`` (hold the push until the surrounding ``atomic()`` block
    commits; default: the App's), ``connection`` (a named tidings connection).
    """

    task_class = TidingsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - _OPTION_NAMES)
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}; "
                f"the keys are {sorted(_OPTION_NAMES)}"
            )
        self._look_queues = sorted(self.queues) or ["default"]
        self._validated: set[Task[Any, Any]] = set()

    def _app(self) -> App:
        global _get_app
        if _get_app is None:
            from tidings.contrib.django.setup import get_app

            _get_app = get_app
        return _get_app()

    def _validate(self, task: Task[Any, Any]) -> None:
        """``validate_task``, once per task object (frozen, so its answer holds)."""
        try:
            if task in self._validated:
                return
        except TypeError:  # unhashable arguments in a bound task: check every time
            self.validate_task(task)
            return
        self.validate_task(task)
        if len(self._validated) > 4096:
            self._validated.clear()
        self._validated.add(task)

    def _pending(self, task: Task[Any, Any], args: Any, kwargs: Any, at: float) -> PendingDispatch:
        func = task.func
        found = _JOB_OF.get(func)
        if found is None:  # once per function: its job class and its import path
            job_class = RunAsyncTask if inspect.iscoroutinefunction(func) else RunTask
            found = (job_class, f"{func.__module__}:{func.__qualname__}")
            if len(_JOB_OF) > 4096:
                _JOB_OF.clear()
            _JOB_OF[func] = found
        job_class, function = found
        job = job_class(
            function=function,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            queue_name=task.queue_name,
            task_priority=task.priority,
            enqueued_at=at,
            overrides=_overrides_of(task),
        )
        pending = PendingDispatch(job).on_queue(task.queue_name)
        if task.priority:
            pending.with_priority(task.priority)
        if task.run_after is not None:
            pending.delay(task.run_after)
        return pending

    def _held(self, app: App, pending: PendingDispatch) -> after_commit.Deferrer | None:
        wanted = option(pending.job.option_source(), "after_commit")
        if not (app.settings.after_commit if wanted is None else wanted):
            return None
        return after_commit.deferrer()

    def _ready(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """The result ``enqueue`` returns, before the push (Django normalises the
        arguments to JSON here, so a value JSON cannot hold fails before anything is
        pushed; flat plain arguments are normalised by :func:`_plain_json`, to the same
        values); the id is set once the push gave one."""
        plain = _plain_json(args, kwargs)
        if plain is None:
            return TaskResult(
                task=task, id="", status=_READY, enqueued_at=timezone.now(),
                started_at=None, finished_at=None, last_attempted_at=None, args=args,
                kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[],
            )  # fmt: skip
        return _json_result(task, _READY, timezone.now(), None, None, *plain, self.alias, [], [])

    def _prepare(
        self, task: Task[Any, Any], args: Any, kwargs: Any
    ) -> tuple[TaskResult[Any], PendingDispatch]:
        self._validate(task)
        result = self._ready(task, args, kwargs)
        at = result.enqueued_at
        assert at is not None
        return result, self._pending(task, result.args, result.kwargs, at.timestamp())

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Push the task as a tidings job (one push); its id is the result's id."""
        app = self._app()
        result, pending = self._prepare(task, args, kwargs)
        task_id = app.push_pending(pending)
        assert task_id is not None  # not a unique job: a push always has an id
        object.__setattr__(result, "id", task_id)
        held = self._held(app, pending)
        if held is not None:  # sent after the push, on commit; never on rollback
            held(lambda: task_enqueued.send(type(self), task_result=result))
        else:
            task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Async twin of :meth:`enqueue`: the push on the event loop."""
        app = self._app()
        result, pending = self._prepare(task, args, kwargs)
        if self._held(app, pending) is not None:
            return self.enqueue(task, args, kwargs)  # held until commit: no I/O now
        task_id = await app.push_pending_async(pending)
        assert task_id is not None
        object.__setattr__(result, "id", task_id)
        await task_enqueued.asend(type(self), task_result=result)
        return result

    # -- get_result: derived from what tidings keeps ------------------------------------

    def _look_commands(self, pipe: Any, records: _Records, result_id: str) -> None:
        for queue in self._look_queues:
            k = records.rq.keys(queue)
            pipe.get(k.result(result_id))
            pipe.hget(k.jobs, result_id)
            pipe.zscore(k.reserved, result_id)
            pipe.hexists(k.attempts, f"{result_id}:c")
            pipe.zscore(k.failed, result_id)
            pipe.hget(k.failed_body, result_id)
            pipe.hget(k.failed_info, result_id)
            pipe.zscore(k.cancelled, result_id)
        records.read_commands(pipe, result_id)

    def _task_of(self, app: App, state: dict[str, str]) -> Task[Any, Any]:
        return _resolve_task(app, state["task"], self.alias).using(
            queue_name=state.get("queue") or "default", priority=int(state.get("priority") or 0)
        )

    @staticmethod
    def _stamp(ms: Any) -> str:
        return repr(float(ms) / 1000)

    def _derive(self, app: App, result_id: str, raw: list[Any]) -> Any:
        """The ``TaskResult`` a look's replies show; a :class:`_Cancelled` or None (no
        such task)."""
        record = _Records.state(raw[-3:])
        for i, queue in enumerate(self._look_queues):
            stored, body, reserved, marked, failed_at, failed_body, info, cancelled = raw[
                i * _LOOK : i * _LOOK + _LOOK
            ]
            if stored is not None:
                return self._succeeded(app, result_id, queue, stored, record)
            envelope = body if body is not None else failed_body
            if envelope is not None:
                state = {**record, **self._identity(app, result_id, queue, envelope)}
                if body is None:  # in the failed store
                    state["status"] = str(_FAILED)
                    state.setdefault("finished_at", self._stamp(failed_at or time.time() * 1000))
                    if state.get("errors", "[]") == "[]":
                        state["errors"] = f"[{self._info_error(info)}]"
                elif marked:  # cancelled: waiting (never to run) or asked to stop
                    state["status"] = str(_FAILED)
                    state.setdefault("finished_at", _now())
                else:
                    state["status"] = str(_RUNNING if reserved is not None else _READY)
                    state.pop("finished_at", None)
                return self._from_state(app, result_id, state)
            if cancelled is not None:
                if not record.get("task"):
                    return _Cancelled()
                return self._from_state(app, result_id, {**record, "status": str(_FAILED)})
        if record.get("task") and record.get("status") == str(_FAILED):
            return self._from_state(app, result_id, record)
        return None

    @staticmethod
    def _info_error(info: Any) -> str:
        try:
            doc = json.loads(info) if info else {}
        except ValueError:
            doc = {}
        return json.dumps(
            {
                "exception_class_path": str(doc.get("class") or "builtins.Exception"),
                "traceback": str(doc.get("exception") or ""),
            }
        )

    def _identity(self, app: App, result_id: str, queue: str, envelope: bytes) -> dict[str, str]:
        body = open_envelope(envelope, app.signer, job_id=result_id, queue=queue)
        job = serializer.decode(body["data"], app.resolve_class)
        if not isinstance(job, RunTask):
            raise TaskResultDoesNotExist(result_id)
        return job.identity()

    def _succeeded(
        self, app: App, result_id: str, queue: str, stored: bytes, record: dict[str, str]
    ) -> TaskResult[Any]:
        try:
            out = open_result(
                stored, app.signer, queue=queue, job_id=result_id, resolve=app.resolve_class
            )
        except ResultMissing as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        if not isinstance(out, str) or not out.startswith(_OUTCOME):
            raise TaskResultDoesNotExist(result_id)
        value, task, queue, priority, args, kwargs, enqueued, started, finished, worker = (
            orjson.loads(out[len(_OUTCOME) :])
        )
        workers = [*json.loads(record.get("worker_ids", "[]")), worker]
        state = {
            "task": task,
            "queue": queue,
            "priority": str(priority),
            "args": json.dumps(args),
            "kwargs": json.dumps(kwargs),
            "enqueued_at": repr(enqueued),
            "started_at": record.get("started_at") or repr(started),
            "last_attempted_at": repr(started),
            "finished_at": repr(finished),
            "status": str(_SUCCESSFUL),
            "worker_ids": json.dumps(workers),
            "errors": record.get("errors", "[]"),
            "return": json.dumps(value),
        }
        return self._from_state(app, result_id, state)

    def _from_state(self, app: App, result_id: str, state: dict[str, str]) -> TaskResult[Any]:
        if not state.get("task"):
            raise TaskResultDoesNotExist(result_id)
        return _build_result(self._task_of(app, state), result_id, state, self.alias)

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The ``TaskResult`` of ``result_id``, from one pipelined look.

        Raises:
            TaskResultDoesNotExist: no such task, or its records expired.
        """
        app = self._app()
        records = _records_for(app, self.options)
        end = time.monotonic() + _CANCEL_WAIT_S
        while True:
            pipe = records.rq.client.pipeline(transaction=False)
            self._look_commands(pipe, records, result_id)
            found = self._derive(app, result_id, pipe.execute())
            if not isinstance(found, _Cancelled):
                break
            if time.monotonic() > end:
                raise TaskResultDoesNotExist(result_id)
            time.sleep(0.05)  # the worker records the cancel right after settling it
        if found is None:
            raise TaskResultDoesNotExist(result_id)
        result: TaskResult[Any] = found
        return result

    async def aget_result(self, result_id: str) -> TaskResult[Any]:
        """Async twin of :meth:`get_result` (the look on the loop)."""
        app = self._app()
        records = _records_for(app, self.options)
        end = time.monotonic() + _CANCEL_WAIT_S
        while True:
            pipe = records.rq.aclient().pipeline(transaction=False)
            self._look_commands(pipe, records, result_id)
            found = self._derive(app, result_id, await pipe.execute())
            if not isinstance(found, _Cancelled):
                break
            if time.monotonic() > end:
                raise TaskResultDoesNotExist(result_id)
            await asyncio.sleep(0.05)
        if found is None:
            raise TaskResultDoesNotExist(result_id)
        result: TaskResult[Any] = found
        return result
