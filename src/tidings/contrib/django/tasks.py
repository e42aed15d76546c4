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

A task becomes a tidings job (:class:`RunTask`) on the tidings queue named by the
task's ``queue_name``, at its ``priority``, delayed to its ``run_after``; the job's id
is the ``TaskResult.id``, so ``app.cancel``, ``app.job_status`` (progress included),
the dashboard and ``failed retry`` work on tasks as on any job. What Django's
``TaskResult`` shows (timestamps, worker ids, errors, the return value) is kept in one
Redis hash per task, ``{prefix}:djtask:{id}``, for ``result_ttl_s`` (a day).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import os
import socket
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

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
    task_enqueued,
    task_finished,
    task_started,
)
from tidings.errors import ConfigurationError, JobCancelled, PayloadRejected
from tidings.jobs.job import Job, PendingDispatch, current_run, option
from tidings.observability.redaction import redact

DEFAULT_RESULT_TTL_S = 86400.0
_OPTION_NAMES = {"result_ttl_s", "tries", "backoff", "timeout", "after_commit", "connection"}
_READY, _RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
_SUCCESSFUL, _FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def progress(done: float, total: float | None = None, note: str | None = None) -> None:
    """Report how far the running task is, from inside its function (a tidings
    extension: ``app.job_status(result.id).progress``, ``notify-worker status ID``).

    Throttled like ``Job.progress`` (one write per 100 ms, the last one always kept); a
    no-op outside a tidings worker (on ``ImmediateBackend``, say).
    """
    run = current_run()
    if run is not None and run.report is not None:
        run.report(done, total, note)


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now() -> str:
    return timezone.now().isoformat()


def _when(raw: Any) -> dt.datetime | None:
    if not raw:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dt.datetime.fromisoformat(text)


def _json_value(value: Any) -> Any:
    """``value`` as Django keeps a return value: JSON types only (tuples become lists)."""
    return json.loads(json.dumps(value))


class _Records:
    """What Django's ``TaskResult`` shows of each task, in Redis: a hash (the producer
    writes task, queue, priority, args, kwargs, enqueued_at; the worker the status and
    times), a list of worker ids (one per attempt) and a list of errors. Each step is
    one pipelined round trip and appends rather than rewrites, so the producer's write
    and the worker's may land in either order."""

    def __init__(self, app: App, ttl_s: float, connection: str | None) -> None:
        self.rq = app.queue_for(connection)
        self.ttl_ms = int(ttl_s * 1000)

    def key(self, task_id: str) -> str:
        return f"{self.rq.prefix}:djtask:{task_id}"

    def _expire(self, pipe: Any, task_id: str, lists: bool = True) -> None:
        key = self.key(task_id)
        for name in (key, f"{key}:w", f"{key}:e") if lists else (key,):
            pipe.pexpire(name, self.ttl_ms)

    # Each step queues its commands on a pipeline (sync or asyncio: the same calls),
    # and parses the replies.

    def _write(self, pipe: Any, task_id: str, fields: dict[str, str], error: str | None) -> None:
        key = self.key(task_id)
        if error is not None:
            pipe.rpush(f"{key}:e", error)
        pipe.hset(key, mapping=fields)
        self._expire(pipe, task_id, lists=error is not None or "status" in fields)

    def _start(
        self, pipe: Any, task_id: str, fields: dict[str, str], worker_id: str, now: str
    ) -> None:
        key = self.key(task_id)
        pipe.hset(key, mapping=fields)
        pipe.hsetnx(key, "started_at", now)
        pipe.rpush(f"{key}:w", worker_id)
        self._read(pipe, task_id)
        self._expire(pipe, task_id)

    def _read(self, pipe: Any, task_id: str) -> None:
        key = self.key(task_id)
        pipe.hgetall(key)
        pipe.lrange(f"{key}:w", 0, -1)
        pipe.lrange(f"{key}:e", 0, -1)

    @staticmethod
    def _state(replies: list[Any]) -> dict[str, str]:
        raw, workers, errors = replies[:3]
        state = {_text(k): _text(v) for k, v in raw.items()}
        if state:
            state["worker_ids"] = json.dumps([_text(w) for w in workers])
            state["errors"] = "[" + ",".join(_text(e) for e in errors) + "]"
        return state

    def write(self, task_id: str, fields: dict[str, str], error: str | None = None) -> None:
        pipe = self.rq.client.pipeline(transaction=False)
        self._write(pipe, task_id, fields, error)
        pipe.execute()

    async def awrite(self, task_id: str, fields: dict[str, str], error: str | None = None) -> None:
        pipe = self.rq.aclient().pipeline(transaction=False)
        self._write(pipe, task_id, fields, error)
        await pipe.execute()

    def start(self, task_id: str, fields: dict[str, str], worker_id: str) -> dict[str, str]:
        pipe = self.rq.client.pipeline(transaction=False)
        self._start(pipe, task_id, fields, worker_id, fields["last_attempted_at"])
        return self._state(pipe.execute()[3:])

    async def astart(self, task_id: str, fields: dict[str, str], worker_id: str) -> dict[str, str]:
        pipe = self.rq.aclient().pipeline(transaction=False)
        self._start(pipe, task_id, fields, worker_id, fields["last_attempted_at"])
        return self._state((await pipe.execute())[3:])

    def read(self, task_id: str) -> dict[str, str]:
        pipe = self.rq.client.pipeline(transaction=False)
        self._read(pipe, task_id)
        return self._state(pipe.execute())

    async def aread(self, task_id: str) -> dict[str, str]:
        pipe = self.rq.aclient().pipeline(transaction=False)
        self._read(pipe, task_id)
        return self._state(await pipe.execute())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_TASKS: dict[tuple[int, str, str, str, int], Task[Any, Any]] = {}


class _TaskOptions:
    """What :class:`RunTask` gives tidings as its job options (from the backend's
    ``OPTIONS``)."""

    def __init__(self, options: dict[str, Any]) -> None:
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
    wraps (by its ``module:qualname``, imported under the allowed modules only) and
    keeps what Django's ``TaskResult`` shows."""

    function: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "default"
    queue_name: str = "default"
    task_priority: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def display_name(self) -> str:
        """The task's module path, as Django names it."""
        return self.function.replace(":", ".")

    def option_source(self) -> Any:
        """The backend's ``OPTIONS``: tries, backoff, timeout, after-commit, result TTL."""
        return _TaskOptions(self.options)

    # -- in the worker ----------------------------------------------------------------

    def _records(self) -> _Records:
        return _records_for(_current.current(), self.options)

    def _task(self) -> Task[Any, Any]:
        app = _current.current()
        key = (id(app), self.function, self.backend, self.queue_name, self.task_priority)
        found = _TASKS.get(key)
        if found is None:  # resolved and validated once per process, not per run
            found = _resolve_task(app, self.function, self.backend).using(
                queue_name=self.queue_name, priority=self.task_priority
            )
            if len(_TASKS) > 4096:
                _TASKS.clear()
            _TASKS[key] = found
        return found

    def _started(self, now: str) -> dict[str, str]:
        """The fields a run writes as it starts (the producer's too: its write may land
        after this one)."""
        return {
            "task": self.function,
            "queue": self.queue_name,
            "priority": str(self.task_priority),
            "args": json.dumps(self.args),
            "kwargs": json.dumps(self.kwargs),
            "status": str(_RUNNING),
            "last_attempted_at": now,
        }

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

    @staticmethod
    def _failure(final: bool) -> dict[str, str]:
        update = {"status": str(_FAILED if final else _READY)}
        if final:
            update["finished_at"] = _now()
        return update

    @staticmethod
    def _with_error(state: dict[str, str], error: str | None) -> dict[str, str]:
        if error is None:
            return state
        errors = state.get("errors", "[]")
        return {**state, "errors": f"{errors[:-1]}{',' if errors != '[]' else ''}{error}]"}

    def _success(self, value: Any) -> dict[str, str]:
        return {"status": str(_SUCCESSFUL), "finished_at": _now(), "return": json.dumps(value)}

    def _finish(self, state: dict[str, str], update: dict[str, str]) -> TaskResult[Any]:
        return _build_result(self._task(), self.job_id or "", {**state, **update}, self.backend)

    def handle(self) -> Any:
        """Run the task function (sync) and record the outcome."""
        records = self._records()
        task_id = self.job_id or ""
        state = records.start(task_id, self._started(_now()), _worker_id())
        result = self._finish(state, {})
        task_started.send(sender=TidingsBackend, task_result=result)
        try:
            value = _json_value(result.task.call(*self._call_args(result), **result.kwargs))
        except Exception as exc:
            final = isinstance(exc, JobCancelled)
            update, error = self._failure(final), self._error(exc)
            records.write(task_id, update, error)
            if final:
                state = self._with_error(state, error)
                task_finished.send(sender=TidingsBackend, task_result=self._finish(state, update))
            raise
        update = self._success(value)
        records.write(task_id, update)
        task_finished.send(sender=TidingsBackend, task_result=self._finish(state, update))
        return value

    async def failed(self, exc: BaseException) -> None:
        """The job failed for good: the task is FAILED (an error a run did not record,
        a timeout or a stall, is added)."""
        records = self._records()
        task_id = self.job_id or ""
        state = await records.aread(task_id)
        update = self._failure(True)
        recorded = len(json.loads(state.get("errors", "[]")))
        runs = len(json.loads(state.get("worker_ids", "[]")))
        error = None if recorded >= runs else self._error(exc)  # handle() recorded it
        await records.awrite(task_id, update, error)
        state = self._with_error(state, error)
        await task_finished.asend(sender=TidingsBackend, task_result=self._finish(state, update))


@dataclass
class RunAsyncTask(RunTask):
    """:class:`RunTask` for an ``async def`` task function, awaited on the worker's loop."""

    async def handle(self) -> Any:
        """Await the task coroutine and record the outcome."""
        records = self._records()
        task_id = self.job_id or ""
        state = await records.astart(task_id, self._started(_now()), _worker_id())
        result = self._finish(state, {})
        await task_started.asend(sender=TidingsBackend, task_result=result)
        try:
            value = _json_value(await result.task.acall(*self._call_args(result), **result.kwargs))
        except (Exception, JobCancelled) as exc:
            final = isinstance(exc, JobCancelled)
            update, error = self._failure(final), self._error(exc)
            await records.awrite(task_id, update, error)
            if final:
                state = self._with_error(state, error)
                await task_finished.asend(
                    sender=TidingsBackend, task_result=self._finish(state, update)
                )
            raise
        update = self._success(value)
        await records.awrite(task_id, update)
        await task_finished.asend(sender=TidingsBackend, task_result=self._finish(state, update))
        return value


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
    errors = [
        TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
        for e in json.loads(state.get("errors", "[]"))
    ]
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


class TidingsBackend(BaseTaskBackend):
    """A production backend for Django's Tasks API: tasks run in ``notify-worker``.

    ``OPTIONS`` (all optional): ``result_ttl_s`` (how long a ``TaskResult`` is kept; a
    day), ``tries``, ``backoff`` (seconds, or a list per attempt), ``timeout``
    (seconds), ``after_commit`` (hold the push until the surrounding ``atomic()`` block
    commits; default: the App's), ``connection`` (a named tidings connection).
    """

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

    def _app(self) -> App:
        from tidings.contrib.django.setup import get_app

        return get_app()

    def _pending(self, task: Task[Any, Any], args: Any, kwargs: Any) -> PendingDispatch:
        func = task.func
        job_class = RunAsyncTask if inspect.iscoroutinefunction(func) else RunTask
        job = job_class(
            function=f"{func.__module__}:{func.__qualname__}",
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            queue_name=task.queue_name,
            task_priority=task.priority,
            options=dict(self.options),
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

    def _enqueued(
        self, task: Task[Any, Any], task_id: str, args: Any, kwargs: Any, at: str
    ) -> tuple[TaskResult[Any], dict[str, str]]:
        fields = {
            "task": f"{task.func.__module__}:{task.func.__qualname__}",
            "queue": task.queue_name,
            "priority": str(task.priority),
            "args": json.dumps(list(args)),
            "kwargs": json.dumps(dict(kwargs)),
            "enqueued_at": at,
        }
        return _build_result(task, task_id, fields, self.alias), fields

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Push the task as a tidings job; its id is the result's id."""
        self.validate_task(task)
        app = self._app()
        pending = self._pending(task, args, kwargs)
        held = self._held(app, pending)
        at = _now()  # before the push: a worker may start it at once
        task_id = app.push_pending(pending)
        assert task_id is not None  # not a unique job: a push always has an id
        result, fields = self._enqueued(task, task_id, args, kwargs, at)
        records = _records_for(app, self.options)

        def record() -> None:
            records.write(task_id, fields)
            task_enqueued.send(type(self), task_result=result)

        if held is not None:
            held(record)  # after the push, on commit; nothing on rollback
        else:
            record()
        return result

    async def aenqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Async twin of :meth:`enqueue`: the push and the record on the event loop."""
        self.validate_task(task)
        app = self._app()
        pending = self._pending(task, args, kwargs)
        if self._held(app, pending) is not None:
            return self.enqueue(task, args, kwargs)  # held until commit: no I/O now
        at = _now()
        task_id = await app.push_pending_async(pending)
        assert task_id is not None
        result, fields = self._enqueued(task, task_id, args, kwargs, at)
        await _records_for(app, self.options).awrite(task_id, fields)
        await task_enqueued.asend(type(self), task_result=result)
        return result

    def _from_state(self, app: App, result_id: str, state: dict[str, str]) -> TaskResult[Any]:
        if not state.get("task"):
            raise TaskResultDoesNotExist(result_id)
        task = _resolve_task(app, state["task"], self.alias).using(
            queue_name=state.get("queue") or "default", priority=int(state.get("priority") or 0)
        )
        return _build_result(task, result_id, state, self.alias)

    @staticmethod
    def _settled(state: dict[str, str], job_state: str | None) -> dict[str, str]:
        """A job tidings settled without a run recording it (cancelled while waiting,
        failed by a stall): FAILED."""
        if state.get("status") in (str(_SUCCESSFUL), str(_FAILED)):
            return state
        unrun = job_state == "cancelling" and state.get("status") != str(_RUNNING)
        if job_state in ("cancelled", "failed") or unrun:  # cancelling: popped, not run
            return {
                **state,
                "status": str(_FAILED),
                "finished_at": state.get("finished_at") or _now(),
            }
        return state

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The ``TaskResult`` of ``result_id``.

        Raises:
            TaskResultDoesNotExist: no such task, or its record expired.
        """
        app = self._app()
        state = _records_for(app, self.options).read(result_id)
        if state.get("task") and state.get("status") not in (str(_SUCCESSFUL), str(_FAILED)):
            job_state = app.job_status(result_id, state.get("queue"))
            state = self._settled(state, None if job_state is None else str(job_state))
        return self._from_state(app, result_id, state)

    async def aget_result(self, result_id: str) -> TaskResult[Any]:
        """Async twin of :meth:`get_result` (the record read on the loop)."""
        app = self._app()
        state = await _records_for(app, self.options).aread(result_id)
        if state.get("task") and state.get("status") not in (str(_SUCCESSFUL), str(_FAILED)):
            from asgiref.sync import sync_to_async

            job_state = await sync_to_async(app.job_status)(result_id, state.get("queue"))
            state = self._settled(state, None if job_state is None else str(job_state))
        return self._from_state(app, result_id, state)
