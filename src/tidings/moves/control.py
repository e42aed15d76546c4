"""Control over jobs while they wait or run: cancel, read a result, read progress.

``cancel`` is one Lua script (``lua/cancel.lua``), safe to send twice. Reading a result
subscribes to the job's result channel *before* it looks, so a result written between
the look and the wait still wakes it (the ack, fail and cancel moves publish there): no
polling. Each reader has a sync and an async twin sharing :func:`_verdict`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tidings.errors import JobCancelled, JobFailedError, JobNotFound, ResultMissing
from tidings.moves.queues import RedisQueue, unavailable_aguard, unavailable_guard
from tidings.observability.metrics import Progress
from tidings.redis import scripts
from tidings.redis.clients import async_pubsub
from tidings.redis.keys import QueueKeys, cancel_channel
from tidings.wire.envelope import read_body
from tidings.wire.results import open_result
from tidings.wire.signing import Signer

# Job ids are short printable ASCII (32 hex chars from dispatch); anything else is no job.
_ID = re.compile(r"[!-~]{1,128}")


class CancelOutcome(str):
    """What ``app.cancel`` did: ``"cancelled"`` (it was waiting or delayed: it will never
    run), ``"cancelling"`` (it was running: its worker is told), or ``"done"``,
    ``"failed"``, ``"cancelled already"`` (it had finished: nothing changed), or
    ``"failing"`` (its run failed and its worker is recording the failure: too late,
    nothing changed).
    ``changed`` tells the first two from the rest; ``queue`` is where it was found;
    ``note`` says why nothing changed ("" when something did)."""

    changed: bool
    queue: str
    note: str

    @classmethod
    def of(cls, text: str, *, changed: bool, queue: str, note: str = "") -> CancelOutcome:
        out = cls(text)
        out.changed = changed
        out.queue = queue
        out.note = note
        return out


_FINISHED = "finished already: nothing changed"

#: The script's answer -> (what app.cancel says, whether it changed anything, why not).
_CANCEL_REPLIES = {
    "pending": ("cancelled", True, ""),
    "running": ("cancelling", True, ""),
    "done": ("done", False, _FINISHED),
    "failed": ("failed", False, _FINISHED),
    "cancelled": ("cancelled already", False, _FINISHED),
    "failing": (
        "failing",
        False,
        "its run failed; the failure is being recorded: too late, nothing changed",
    ),
}


def _check_id(job_id: str) -> None:
    if not isinstance(job_id, str) or not _ID.fullmatch(job_id):
        raise JobNotFound(f"no such job: {job_id!r} is not a job id", job_id=str(job_id))


def _cancel_move(rq: RedisQueue, k: QueueKeys, job_id: str) -> tuple[list[str], list[Any]]:
    keys = [
        k.ready, k.delayed, k.reserved, k.notify, k.jobs,
        k.attempts, k.done, k.failed, k.cancelled,
    ]  # fmt: skip
    return keys, [job_id, cancel_channel(rq.prefix)]


def _cancel_reply(raw: Any, job_id: str, queue: str) -> CancelOutcome | None:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    if text == "missing":
        return None
    said, changed, note = _CANCEL_REPLIES[text]
    return CancelOutcome.of(said, changed=changed, queue=queue, note=note)


def _not_found(job_id: str, queues: Sequence[str]) -> JobNotFound:
    return JobNotFound(
        f"no such job: {job_id!r} on queue(s) {', '.join(queues)} (never dispatched here, "
        "or its record expired); pass queue= if it ran on another queue",
        job_id=job_id,
    )


def cancel(rq: RedisQueue, job_id: str, queues: Sequence[str]) -> CancelOutcome:
    """Cancel ``job_id`` on the first of ``queues`` that knows it.

    Raises:
        JobNotFound: no queue knows the id.
        QueueUnavailable: Redis could not be reached.
    """
    _check_id(job_id)
    with unavailable_guard("cancel"):
        for queue in queues:
            keys, args = _cancel_move(rq, rq.keys(queue), job_id)
            out = _cancel_reply(scripts.CANCEL.call(rq.client, keys, args), job_id, queue)
            if out is not None:
                return out
    raise _not_found(job_id, queues)


async def acancel(rq: RedisQueue, job_id: str, queues: Sequence[str]) -> CancelOutcome:
    """Async twin of :func:`cancel`."""
    _check_id(job_id)
    async with unavailable_aguard("cancel"):
        for queue in queues:
            keys, args = _cancel_move(rq, rq.keys(queue), job_id)
            raw = await scripts.CANCEL.acall(rq.aclient(), keys, args)
            out = _cancel_reply(raw, job_id, queue)
            if out is not None:
                return out
    raise _not_found(job_id, queues)


# -- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    value: Any


_WAIT = object()
"""The job is still to finish: wait for its channel."""


def _look_commands(pipe: Any, k: QueueKeys, job_id: str) -> None:
    pipe.get(k.result(job_id))
    pipe.zscore(k.failed, job_id)
    pipe.hget(k.failed_info, job_id)
    pipe.zscore(k.cancelled, job_id)
    pipe.zscore(k.done, job_id)
    pipe.hget(k.jobs, job_id)


def _failure(job_id: str, info_raw: Any) -> JobFailedError:
    try:
        info = orjson.loads(info_raw) if info_raw else {}
    except orjson.JSONDecodeError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    cls = info.get("class")
    message = info.get("message")
    if not isinstance(cls, str) or not isinstance(message, str):
        # Records from before: the last line of the (redacted) traceback.
        last = str(info.get("exception", "")).strip().splitlines()[-1:] or ["Exception: ?"]
        cls, _, message = last[0].partition(": ")
    return JobFailedError(job_id, cls, message)


def _verdict(
    replies: list[Any],
    job_id: str,
    queue: str,
    signer: Signer,
    resolve: Callable[[str], Any],
) -> Any:
    """What one queue's look says: a :class:`_Found`, :data:`_WAIT`, None (not this
    queue); raises for a failed, cancelled, unstored or expired result."""
    result, failed, info, cancelled, done, body = replies
    if result is not None:
        return _Found(open_result(result, signer, queue=queue, job_id=job_id, resolve=resolve))
    if failed is not None:
        raise _failure(job_id, info)
    if cancelled is not None:
        raise JobCancelled(f"job {job_id} was cancelled", job_id=job_id)
    if done is not None:
        raise ResultMissing(
            f"job {job_id} is done but has no stored result: it expired (result_ttl_s) or "
            "the job does not keep one (store_result = True on its class, "
            "dispatch(...).with_result(), or TIDINGS_STORE_RESULTS=1)",
            job_id=job_id,
        )
    if body is None:
        return None
    fields = read_body(body)
    # Unreadable here: the worker will fail it, and the wait ends then.
    keeps = fields is None or "result" in fields
    if not keeps:
        raise ResultMissing(
            f"job {job_id} does not keep its result: set store_result = True on its class, "
            "dispatch it with .with_result(), or set TIDINGS_STORE_RESULTS=1",
            job_id=job_id,
        )
    return _WAIT


def _missing(job_id: str) -> ResultMissing:
    return ResultMissing(
        f"no result for job {job_id}: no queue knows it (never dispatched, or its records expired)",
        job_id=job_id,
    )


def _decide(
    rq: RedisQueue,
    raw: list[Any],
    job_id: str,
    queues: Sequence[str],
    signer: Signer,
    resolve: Callable[[str], Any],
) -> Any:
    waiting = False
    for i, queue in enumerate(queues):
        v = _verdict(raw[i * 6 : i * 6 + 6], job_id, queue, signer, resolve)
        if isinstance(v, _Found):
            return v
        waiting = waiting or v is _WAIT
    if not waiting:
        raise _missing(job_id)
    return _WAIT


def result(
    rq: RedisQueue,
    job_id: str,
    queues: Sequence[str],
    *,
    signer: Signer,
    resolve: Callable[[str], Any],
    timeout_s: float | None,
) -> Any:
    """Block until ``job_id`` finished (at most ``timeout_s``) and return its result.

    Raises:
        JobFailedError, JobCancelled, ResultMissing, TimeoutError, QueueUnavailable.
    """
    _check_result_id(job_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    sync: Any = rq.client
    with unavailable_guard("result"):
        pubsub: Any = sync.pubsub(ignore_subscribe_messages=True)
    try:
        with unavailable_guard("result"):
            pubsub.subscribe(*(rq.keys(q).result(job_id) for q in queues))
        while True:
            with unavailable_guard("result"):
                pipe = sync.pipeline(transaction=False)
                for q in queues:
                    _look_commands(pipe, rq.keys(q), job_id)
                raw = pipe.execute()
            got = _decide(rq, raw, job_id, queues, signer, resolve)
            if isinstance(got, _Found):
                return got.value
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job_id} did not finish within {timeout_s}s")
            # Wakes on the first publish (or a subscribe confirmation): look again.
            with unavailable_guard("result"):
                pubsub.get_message(timeout=1.0 if left is None else min(left, 1.0))
    finally:
        pubsub.close()


async def aresult(
    rq: RedisQueue,
    job_id: str,
    queues: Sequence[str],
    *,
    signer: Signer,
    resolve: Callable[[str], Any],
    timeout_s: float | None,
) -> Any:
    """Async twin of :func:`result`."""
    _check_result_id(job_id)
    client: Any = rq.aclient()
    async with unavailable_aguard("result"):
        pubsub = await async_pubsub(client)
    if pubsub is None:  # the asyncio cluster client of older redis-py releases
        return await asyncio.to_thread(
            result, rq, job_id, queues, signer=signer, resolve=resolve, timeout_s=timeout_s
        )
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    try:
        async with unavailable_aguard("result"):
            await pubsub.subscribe(*(rq.keys(q).result(job_id) for q in queues))
        while True:
            async with unavailable_aguard("result"):
                pipe = client.pipeline(transaction=False)
                for q in queues:
                    _look_commands(pipe, rq.keys(q), job_id)
                raw = await pipe.execute()
            got = _decide(rq, raw, job_id, queues, signer, resolve)
            if isinstance(got, _Found):
                return got.value
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job_id} did not finish within {timeout_s}s")
            async with unavailable_aguard("result"):
                await pubsub.get_message(timeout=1.0 if left is None else min(left, 1.0))
    finally:
        await pubsub.aclose()


def _check_result_id(job_id: str) -> None:
    if not isinstance(job_id, str) or not _ID.fullmatch(job_id):
        raise ResultMissing(f"no result: {job_id!r} is not a job id", job_id=str(job_id))


def progress(rq: RedisQueue, job_id: str, queue: str) -> Progress | None:
    """The progress ``job_id`` last reported on ``queue`` (None: never, or expired)."""
    raw: Any = rq.client.get(rq.keys(queue).progress(job_id))
    return Progress.parse(raw)
