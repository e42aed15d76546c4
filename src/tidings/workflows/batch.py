"""Batches: dispatch many jobs as one unit with progress, cancellation and callbacks.

::

    batch_id = (
        batch([ImportRow(r) for r in rows])
        .then(ImportDone()).catch(ImportHadErrors()).finally_(Cleanup())
        .allow_failures().name("import").dispatch()
    )
    app.find_batch(batch_id).progress

State lives beside the jobs in Redis under the batch's own hash tag (see
:mod:`tidings.redis.keys`) and is changed only by Lua scripts:

* ``lua/batch_add.lua`` counts jobs in *before* they are pushed (so a fast worker can
  never finish a job the batch does not know yet); an id counted before is not counted
  again, so a job that adds jobs to its own batch and is re-delivered does not inflate it.
* ``lua/batch_record.lua`` records a job's outcome once (a set of finished ids) and, in
  the same atomic step, decides which callbacks that outcome fires: ``catch`` on the
  first failure, ``then`` when the last job finishes with no failure and no cancel,
  ``finally`` when the last job finishes. Two workers finishing the last two jobs at
  the same moment cannot both fire them; a re-delivered job is not counted twice.
* The callbacks are jobs whose ids are fixed at dispatch and which are pushed with
  :func:`~tidings.moves.push_once.push_once`, so a worker that dies between recording and
  pushing is covered by the re-delivery of its job, and no callback is pushed twice.

The worker records outcomes just before it acknowledges a job (success) or moves it to
the failed store (final failure). A job of a cancelled batch is skipped when it starts
and counts as processed. Without :meth:`PendingBatch.allow_failures` the first failure
cancels the batch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from tidings import _clock, _current
from tidings.errors import BatchClosed, MaxAttemptsExceeded, PayloadRejected
from tidings.hosts import AppHost, WorkflowHost
from tidings.jobs.compose import build_body, default_delay, new_id, priority_of
from tidings.jobs.job import Job, PendingDispatch, current_run, option
from tidings.moves.push_once import push_once, push_once_async
from tidings.moves.queues import unavailable_aguard, unavailable_guard
from tidings.redis import scripts
from tidings.redis.keys import BatchKeys, batches_key
from tidings.redis.scripts import Arg
from tidings.wire.envelope import JobBody, envelope_id, seal
from tidings.workflows.batch_admin import (
    BatchInfo,
    cancel_batch,
    failed_job_ids,
    find_batch,
    list_batches,
    prune_batches,
)

log = logging.getLogger("tidings.worker")

KEEP_IDS_S = 7 * 24 * 3600.0
"""How long the finished/failed id sets of a finished batch are kept (its hash stays)."""

Item = Job | PendingDispatch
Pushed = tuple[str, str, bytes, float, int]
"""(queue, job id, envelope, delay seconds)."""

__all__ = [
    "BatchInfo",
    "BatchRef",
    "PendingBatch",
    "batch",
    "cancel_batch",
    "failed_job_ids",
    "find_batch",
    "list_batches",
    "prune_batches",
]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seal_item(app: AppHost, item: Item, batch_id: str, queue: str | None, job_id: str) -> Pushed:
    pending = item if isinstance(item, PendingDispatch) else PendingDispatch(item)
    job = pending.job
    q = pending.queue or queue or option(job.option_source(), "queue") or "default"
    delay = pending.delay_s if pending.delay_s is not None else default_delay(job)
    body: JobBody = build_body(job, job_id, pending.chain)
    body["chainCatch"] = pending.catch
    body["batch"] = batch_id
    priority = priority_of(pending)
    if priority:
        body["priority"] = priority
    envelope = seal(body, app.signer, max_bytes=app.max_payload_bytes, queue=str(q))
    return str(q), job_id, envelope, delay, priority


def _callback_fields(
    app: AppHost, kind: str, job: Job, batch_id: str, queue: str | None
) -> list[Arg]:
    q = queue or option(job.option_source(), "queue") or "default"
    body = build_body(job, new_id())
    body["batchCallback"] = batch_id
    # Kept in the batch's record without its id: the envelope carries it (keep_id).
    envelope = seal(body, app.signer, max_bytes=app.max_payload_bytes, queue=str(q), keep_id=True)
    return [f"cb:{kind}:q", str(q), f"cb:{kind}:b", envelope]


def _callbacks(raw: list[Any]) -> list[tuple[str, str, bytes]]:
    """(kind, queue, envelope) triples after the code in a script's reply."""
    return [(_text(raw[i]), _text(raw[i + 1]), raw[i + 2]) for i in range(1, len(raw), 3)]


def _envelope_id(envelope: bytes) -> str:
    job_id = envelope_id(envelope)
    if job_id is None:
        raise PayloadRejected("a batch callback's envelope carries no job id")
    return job_id


def _is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def _group(
    items: list[Pushed],
) -> dict[tuple[str, float], tuple[list[tuple[str, bytes]], list[int]]]:
    """The members by queue and delay: their ``(id, envelope)`` items and, alongside,
    their priorities (one push per group, whatever the priorities)."""
    groups: dict[tuple[str, float], tuple[list[tuple[str, bytes]], list[int]]] = {}
    for queue, job_id, envelope, delay, priority in items:
        pushes, priorities = groups.setdefault((queue, delay), ([], []))
        pushes.append((job_id, envelope))
        priorities.append(priority)
    return groups


class PendingBatch:
    """A batch being built; :func:`batch` starts one and :meth:`dispatch` sends it."""

    def __init__(self, jobs: Iterable[Item]) -> None:
        self.jobs = list(jobs)
        self._callbacks: dict[str, Job] = {}
        self._allow = False
        self._name = ""
        self._queue: str | None = None

    def then(self, job: Job) -> PendingBatch:
        """Dispatch ``job`` once when every job succeeded (none failed, not cancelled)."""
        self._callbacks["then"] = job
        return self

    def catch(self, job: Job) -> PendingBatch:
        """Dispatch ``job`` once, on the batch's first job failure."""
        self._callbacks["catch"] = job
        return self

    def finally_(self, job: Job) -> PendingBatch:
        """Dispatch ``job`` once when every job has finished, whatever the outcome."""
        self._callbacks["finally"] = job
        return self

    def allow_failures(self, allow: bool = True) -> PendingBatch:
        """Keep running the other jobs after a failure (else the first one cancels)."""
        self._allow = allow
        return self

    def name(self, name: str) -> PendingBatch:
        """A name shown by ``find_batch`` and ``notify-worker batches``."""
        self._name = name
        return self

    def on_queue(self, name: str) -> PendingBatch:
        """Run the jobs and callbacks on queue ``name`` (else each job's own queue)."""
        self._queue = name
        return self

    def _prepare(self, app: AppHost) -> tuple[BatchKeys, list[Arg], list[Pushed]]:
        batch_id = new_id()
        fields: list[Arg] = ["name", self._name, "allow_failures", int(self._allow)]
        for kind, job in self._callbacks.items():
            fields += _callback_fields(app, kind, job, batch_id, self._queue)
        items = [_seal_item(app, j, batch_id, self._queue, new_id()) for j in self.jobs]
        pairs = len(fields) // 2
        args: list[Arg] = [batch_id, pairs, *fields, *(i[1] for i in items)]
        return BatchKeys.build(app.queue_for(None).prefix, batch_id), args, items

    def dispatch(self) -> str:
        """Create the batch (counting the jobs in and indexing it), then push the jobs;
        returns the batch id.

        Creating is one script that is safe to run twice (see ``lua/batch_create.lua``),
        so a create re-sent after its reply was lost changes nothing.

        Raises:
            SerializationError: a job cannot be queued; nothing was written.
            QueueUnavailable: Redis could not be reached.
        """
        app = _current.current()
        k, args, items = self._prepare(app)
        rq = app.queue_for(None)
        with unavailable_guard("batch dispatch"):
            index = batches_key(rq.prefix)
            if _is_cluster(rq.client):
                # The index lives in another slot: index first, so that a producer dying in
                # between leaves an index entry without a batch (skipped, pruned), never a
                # batch nobody can list.
                rq.client.zadd(index, {k.id: int(_clock.now() * 1000)}, nx=True)
                raw = scripts.BATCH_CREATE.call(rq.client, [k.info, k.members], args)
            else:
                raw = scripts.BATCH_CREATE.call(rq.client, [k.info, k.members, index], args)
        for (queue, delay), (group, priorities) in _group(items).items():
            rq.push(queue, group, delay, priorities)
        for _, queue, envelope in _callbacks(raw):
            push_once(rq, queue, _envelope_id(envelope), envelope)
        return k.id

    async def dispatch_async(self) -> str:
        """Async twin of :meth:`dispatch`."""
        app = _current.current()
        k, args, items = self._prepare(app)
        rq = app.queue_for(None)
        client = rq.aclient()
        async with unavailable_aguard("batch dispatch"):
            index = batches_key(rq.prefix)
            if _is_cluster(client):
                await client.zadd(index, {k.id: int(_clock.now() * 1000)}, nx=True)
                raw = await scripts.BATCH_CREATE.acall(client, [k.info, k.members], args)
            else:
                raw = await scripts.BATCH_CREATE.acall(client, [k.info, k.members, index], args)
        for (queue, delay), (group, priorities) in _group(items).items():
            await rq.push_async(queue, group, delay, priorities)
        for _, queue, envelope in _callbacks(raw):
            await push_once_async(rq, queue, _envelope_id(envelope), envelope)
        return k.id


def batch(jobs: Iterable[Item]) -> PendingBatch:
    """Start a batch of ``jobs`` (Job instances or ``job.on_queue(...)`` dispatches)."""
    return PendingBatch(jobs)


class BatchRef:
    """A handle on a batch by id: what ``self.batch`` gives a job of the batch."""

    def __init__(self, batch_id: str) -> None:
        self.id = batch_id

    def __repr__(self) -> str:
        return f"BatchRef({self.id!r})"

    def __str__(self) -> str:
        return self.id

    def _keys(self, app: AppHost) -> BatchKeys:
        return BatchKeys.build(app.queue_for(None).prefix, self.id)

    def fetch(self) -> BatchInfo | None:
        """A fresh snapshot (None once pruned)."""
        return find_batch(_current.current(), self.id)

    @property
    def cancelled(self) -> bool:
        """Whether the batch is cancelled now (reads Redis)."""
        info = self.fetch()
        return info is not None and info.cancelled

    def cancel(self) -> bool:
        """Cancel the batch: jobs not started yet are skipped. True if cancelled now."""
        return cancel_batch(_current.current(), self.id)

    def _prepare_add(self, app: AppHost, jobs: Iterable[Item]) -> tuple[list[Arg], list[Pushed]]:
        run = current_run()
        body: dict[str, Any] | None = (
            run.body if run is not None and isinstance(run.body, dict) else None
        )
        items: list[Pushed] = []
        for item in jobs:
            if body is not None and body.get("batch") == self.id:
                # Ids derived from the adding job's id: a re-delivered job adds the same ids,
                # which are neither counted nor pushed twice.
                n = int(body.get("_batchAdded", 0))
                body["_batchAdded"] = n + 1
                job_id = uuid.uuid5(uuid.NAMESPACE_OID, f"{body['uuid']}:{n}").hex
            else:
                job_id = new_id()
            items.append(_seal_item(app, item, self.id, None, job_id))
        return [i[1] for i in items], items

    def _check(self, raw: list[Any]) -> None:
        code = int(raw[0])
        if code == -1:
            raise BatchClosed(f"batch {self.id} has finished", batch_id=self.id)
        if code == -2:
            raise BatchClosed(f"no batch {self.id}", batch_id=self.id)

    def add(self, jobs: Iterable[Item]) -> list[str]:
        """Add jobs to the batch and push them; returns their ids.

        Raises:
            BatchClosed: the batch has finished or does not exist; nothing was pushed.
        """
        app = _current.current()
        rq = app.queue_for(None)
        k = self._keys(app)
        args, items = self._prepare_add(app, jobs)
        self._check(scripts.BATCH_ADD.call(rq.client, [k.info, k.members], args))
        for queue, job_id, envelope, delay, priority in items:
            push_once(rq, queue, job_id, envelope, delay, priority)
        return [i[1] for i in items]

    async def add_async(self, jobs: Iterable[Item]) -> list[str]:
        """Async twin of :meth:`add`."""
        app = _current.current()
        rq = app.queue_for(None)
        k = self._keys(app)
        args, items = self._prepare_add(app, jobs)
        self._check(await scripts.BATCH_ADD.acall(rq.aclient(), [k.info, k.members], args))
        for queue, job_id, envelope, delay, priority in items:
            await push_once_async(rq, queue, job_id, envelope, delay, priority)
        return [i[1] for i in items]


# -- the worker's side -------------------------------------------------------------------


async def record(app: WorkflowHost, body: JobBody, outcome: str) -> None:
    """Record a batch job's outcome (``ok`` or ``fail``) and push what it fires."""
    batch_id = body.get("batch")
    if not batch_id:
        return
    rq = app.queue_for(None)
    k = BatchKeys.build(rq.prefix, batch_id)
    args: list[Arg] = [body["uuid"], outcome, int(KEEP_IDS_S * 1000)]
    keys = [k.info, k.finished, k.failed, k.retried]
    raw = await scripts.BATCH_RECORD.acall(rq.aclient(), keys, args)
    for kind, queue, envelope in _callbacks(raw):
        try:
            callback_id = _envelope_id(envelope)
        except PayloadRejected:
            # A callback envelope spoiled in Redis: it could never run (its
            # signature is checked too); skip it rather than fail the job that fired it.
            log.error("batch %s: %s callback is unreadable; skipped", batch_id, kind)
            continue
        await push_once_async(rq, queue, callback_id, envelope)


class BatchGate:
    """Built-in first layer of a batch job: skip it when the batch was cancelled or when
    its outcome is already recorded (a re-delivery after the recording run died).

    A re-delivered job whose recorded outcome is a failure is failed again, unrun, so
    it ends in the failed store as the batch counted it (its worker died between the
    count and the move; acked, it would be done while the batch says failed).

    A failed job sent back by ``failed retry`` always runs (see ``lua/batch_retry.lua``):
    it is in the batch's ``retried`` set until its new outcome is recorded."""

    def __init__(self, app: WorkflowHost, batch_id: str, job_id: str) -> None:
        self.app = app
        self.batch_id = batch_id
        self.job_id = job_id

    async def handle(self, job: Job, nxt: Callable[[], Awaitable[Any]]) -> Any:
        """Run the job unless the batch is cancelled or already counted it."""
        rq = self.app.queue_for(None)
        k = BatchKeys.build(rq.prefix, self.batch_id)
        pipe = rq.aclient().pipeline(transaction=False)
        pipe.hget(k.info, "cancelled_at")
        pipe.sismember(k.finished, self.job_id)
        pipe.sismember(k.retried, self.job_id)
        pipe.sismember(k.failed, self.job_id)
        cancelled, done, retried, failed = await pipe.execute()
        if retried:
            return await nxt()
        if done and failed:
            raise MaxAttemptsExceeded(
                f"its final failure was counted in batch {self.batch_id}, then its worker "
                "was lost before moving it to the failed store (the original error is gone)"
            )
        if done or (cancelled is not None and _text(cancelled) != "0"):
            return None
        return await nxt()
