"""Unique and debounced jobs: at most one pending job per unique id.

A job class opts in with class attributes (or methods returning them)::

    @dataclass
    class RebuildIndex(Job):
        shop_id: int
        unique_for = 60                     # seconds the lock may last at most
        unique_until = "completion"         # or "processing": free the lock as it starts

        def unique_id(self) -> str:
            return str(self.shop_id)

**Unique** (``unique_for``): ``lua/unique_push.lua`` takes the lock
``{prefix}:queue:{Q}:unique:<class>:<unique_id>`` (holding the job id, with an expiry of
``unique_for``) and pushes the job in the same atomic step. While the holder is waiting,
delayed, reserved or being retried, another dispatch of the same id is dropped and
``dispatch()`` returns None. The lock frees itself when the holder has finished (acked
or failed: its body is gone, so the next dispatch takes the lock over), when
``unique_for`` runs out, or, with ``unique_until = "processing"``, when the holder
starts (the worker unlocks it before ``handle``).

**Debounce** (``debounce_for``, optional ``debounce_max_wait``): ``lua/debounce_push.lua``
keeps one waiting job per id on the delayed set; each dispatch replaces it by the new one,
due ``debounce_for`` seconds later, but never later than ``debounce_max_wait`` after the
first dispatch of the burst. So a burst of dispatches runs the last one once.
``dispatch()`` returns the new id (the replaced one disappears).

Uniqueness is per queue: the lock lives beside the queue so that checking it and pushing
are one script on one slot. ``dispatch_many`` applies the same checks: its unique and
debounced jobs go through these scripts one by one (after every job was encoded), the
others in bulk. A debounced dispatch ignores ``delay()``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidings._clock import delay_ms
from tidings.hosts import AppHost, WorkflowHost
from tidings.jobs.compose import build_body, default_delay, new_id, priority_of, result_options
from tidings.jobs.job import Job, PendingDispatch, option
from tidings.moves.queues import RedisQueue, unavailable_aguard, unavailable_guard
from tidings.observability.lifecycle import JobQueued
from tidings.redis import scripts
from tidings.redis.keys import debounce_key, unique_key
from tidings.redis.scripts import Arg, LuaScript
from tidings.wire import serializer
from tidings.wire.envelope import seal


@dataclass(frozen=True, slots=True)
class Guard:
    """How a job's dispatch is guarded.

    Attributes:
        kind: ``unique`` or ``debounce``.
        name: ``<class path>:<unique_id>``.
        window_s: ``unique_for`` or ``debounce_for``.
        max_wait_s: ``debounce_max_wait`` (0: none).
        until: ``completion`` or ``processing`` (unique only).
    """

    kind: str
    name: str
    window_s: float
    max_wait_s: float = 0.0
    until: str = "completion"


def guard_for(job: Job) -> Guard | None:
    """The guard of ``job``, or None for a plain job."""
    src = job.option_source()
    debounce = option(src, "debounce_for")
    unique_for = option(src, "unique_for")
    if not debounce and not unique_for:
        return None
    uid = getattr(job, "unique_id", None)
    uid_value = uid() if callable(uid) else ""
    name = f"{serializer.class_path(type(src))}:{uid_value or ''}"
    if debounce:
        max_wait = float(option(src, "debounce_max_wait") or 0.0)
        return Guard("debounce", name, float(debounce), max_wait)
    until = str(option(src, "unique_until") or "completion")
    if until not in ("completion", "processing"):
        raise ValueError(f"unique_until must be 'completion' or 'processing', not {until!r}")
    return Guard("unique", name, float(unique_for), until=until)


@dataclass(slots=True)
class _Prepared:
    rq: RedisQueue
    queue: str
    job_id: str
    envelope: bytes
    delay_s: float
    script: LuaScript
    keys: list[str]
    args: list[Arg]


def _prepare(app: AppHost, pending: PendingDispatch, guard: Guard) -> _Prepared:
    job = pending.job
    src = job.option_source()
    queue = str(pending.queue or option(src, "queue") or "default")
    delay = pending.delay_s if pending.delay_s is not None else default_delay(job)
    priority = priority_of(pending)
    job_id = new_id()
    body = build_body(job, job_id, pending.chain)
    body["chainCatch"] = pending.catch
    if priority:
        body["priority"] = priority
    else:
        body.pop("priority", None)
    s = app.settings
    keep = result_options(
        pending,
        store_results=s.store_results,
        result_ttl_s=s.result_ttl_s,
        result_max_bytes=s.result_max_bytes,
    )
    if keep is not None:
        body["result"], body["resultMaxBytes"] = keep
    conn = pending.connection or option(src, "connection")
    if guard.kind == "unique" and guard.until == "processing":
        body["unique"] = guard.name
        if conn:
            body["uniqueConnection"] = conn  # the worker unlocks there
    envelope = seal(body, app.signer, max_bytes=app.max_payload_bytes, queue=queue)
    rq: RedisQueue = app.queue_for(conn)
    app.note_queue(queue)
    k = rq.keys(queue)
    if guard.kind == "debounce":
        keys = [k.delayed, k.notify, k.jobs, k.attempts, debounce_key(rq.prefix, queue, guard.name)]
        keys.append(k.pseq)
        args: list[Arg] = [
            job_id,
            envelope,
            int(guard.window_s * 1000),
            int(guard.max_wait_s * 1000),
            priority,
        ]
        return _Prepared(rq, queue, job_id, envelope, delay, scripts.DEBOUNCE_PUSH, keys, args)
    keys = [k.ready, k.delayed, k.notify, k.jobs, unique_key(rq.prefix, queue, guard.name)]
    keys += [k.done, k.failed]  # a re-sent push of a job that already ran is refused
    keys += [k.attempts, k.prio, k.pseq]
    args = [job_id, envelope, delay_ms(delay), max(1, int(guard.window_s * 1000)), priority]
    return _Prepared(rq, queue, job_id, envelope, delay, scripts.UNIQUE_PUSH, keys, args)


def _outcome(app: AppHost, p: _Prepared, pending: PendingDispatch, raw: Any) -> str | None:
    if p.script is scripts.UNIQUE_PUSH and int(raw[0]) == 0:
        return None
    app.emit(JobQueued(p.job_id, p.queue, pending.job.display_name(), p.delay_s))
    return p.job_id


def push_guarded(app: AppHost, pending: PendingDispatch, guard: Guard) -> str | None:
    """Push a unique or debounced job; returns its id, or None when it was dropped.

    Raises:
        SerializationError: nothing was pushed.
        QueueUnavailable: Redis could not be reached.
    """
    return GuardedPush(app, pending, guard).push()


async def push_guarded_async(app: AppHost, pending: PendingDispatch, guard: Guard) -> str | None:
    """Async twin of :func:`push_guarded`."""
    return await GuardedPush(app, pending, guard).push_async()


class UniqueStart:
    """Built-in layer of a ``unique_until = "processing"`` job: free its lock, then run."""

    def __init__(
        self, app: WorkflowHost, queue: str, name: str, job_id: str, connection: str | None = None
    ) -> None:
        self.app = app
        self.queue = queue
        self.name = name
        self.job_id = job_id
        self.connection = connection

    async def handle(self, job: Job, nxt: Callable[[], Awaitable[Any]]) -> Any:
        """Unlock (only if this job still holds the lock), then go on."""
        rq = self.app.queue_for(self.connection)
        key = unique_key(rq.prefix, self.queue, self.name)
        await scripts.UNLOCK.acall(rq.aclient(), [key], [self.job_id])
        return await nxt()


# -- many at once (dispatch_many) ---------------------------------------------------------


class GuardedPush:
    """A unique or debounced job encoded ahead of its push (``dispatch_many`` encodes
    every job before it pushes any)."""

    def __init__(self, app: AppHost, pending: PendingDispatch, guard: Guard) -> None:
        self.app = app
        self.pending = pending
        self.prepared = _prepare(app, pending, guard)

    def push(self) -> str | None:
        """Push through the guard's script; the id, or None when dropped as a duplicate.

        Raises:
            QueueUnavailable: Redis could not be reached.
        """
        p = self.prepared
        with unavailable_guard(f"push to {p.queue!r}"):
            raw = p.rq.produce(p.queue, p.script, p.keys, p.args)
        return _outcome(self.app, p, self.pending, raw)

    async def push_async(self) -> str | None:
        """Async twin of :meth:`push`."""
        p = self.prepared
        async with unavailable_aguard(f"push to {p.queue!r}"):
            raw = await p.rq.aproduce(p.queue, p.script, p.keys, p.args)
        return _outcome(self.app, p, self.pending, raw)
