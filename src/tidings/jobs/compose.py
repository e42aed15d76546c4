"""Turning jobs into signed envelopes: options, encoding, the body (the wire format is
:mod:`tidings.wire`)."""

from __future__ import annotations

import datetime as dt
import os
import random
from typing import Any

from tidings import _clock
from tidings.jobs.backoff import encode_backoff
from tidings.jobs.job import Job, PendingDispatch, check_priority, delay_seconds, option
from tidings.observability import tracing
from tidings.wire import serializer
from tidings.wire.encryption import seal_data
from tidings.wire.envelope import JobBody, seal
from tidings.wire.signing import Signer

# Job ids need to be unique, not secret (reading or pushing them takes the Redis
# password already): 128 bits from a generator seeded by the OS, reseeded in every
# forked child. uuid4() asked the kernel for 16 bytes per job, a system call that on a
# cold CPU cost as much as the rest of the encoding.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_id() -> str:
    """A fresh job id: 32 hex chars (128 random bits)."""
    return f"{_ids.getrandbits(128):032x}"


def _retry_until(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.astimezone()).timestamp()
    return _clock.now() + delay_seconds(value)


def default_delay(job: Job) -> float:
    """The class-level ``delay`` option of a job, when it sets one instead of the method."""
    src = job.option_source()
    value = getattr(type(src), "delay", None)
    if value is None or callable(value):
        return 0.0
    return delay_seconds(value)


def build_body(job: Job, job_id: str, chain: list[Any] | None = None) -> JobBody:
    """The unsigned body of ``job``.

    Raises:
        SerializationError: the job holds a value with no queued form.
    """
    src = job.option_source()
    path = serializer.class_path(type(job))
    tries, backoff = option(src, "tries"), option(src, "backoff")
    if tries is None or backoff is None:
        defaults = job.option_defaults()
        if tries is None:
            tries = defaults.get("tries")
        if backoff is None:
            backoff = defaults.get("backoff")
    body: JobBody = {
        "uuid": job_id,
        "displayName": job.display_name(),
        "job": path,
        "data": seal_data(serializer.encode(job), job, job_id, path),
        "maxTries": tries,
        "maxExceptions": option(src, "max_exceptions"),
        "backoff": encode_backoff(backoff),
        "timeout": option(src, "timeout"),
        "retryUntil": _retry_until(option(src, "retry_until")),
        "pushedAt": _clock.now(),
        "chain": chain or [],
        "chainCatch": None,
    }
    priority = option(src, "priority")
    if priority:
        body["priority"] = check_priority(priority, f"priority of {job.display_name()}")
    max_stalls = option(src, "max_stalls")
    if max_stalls is not None:
        body["maxStalls"] = int(max_stalls)
    if tracing.ENABLED:  # W3C trace context of the dispatcher (tidings.observability.tracing)
        trace = tracing.carrier()
        if trace:
            body["trace"] = trace
    return body


DEFAULT_RESULT_TTL_S = 86400.0
DEFAULT_RESULT_MAX_BYTES = 1024 * 1024


def priority_of(pending: PendingDispatch) -> int:
    """The priority a dispatch asks for: ``with_priority``, else the job's (or its
    listener's or notification's) ``priority``, else 0.

    Raises:
        ValidationError: not an int from -100 to 100.
    """
    if pending.priority is not None:
        return check_priority(pending.priority, "with_priority()")
    value = option(pending.job.option_source(), "priority")
    if value is None:
        return 0
    return check_priority(value, f"priority of {pending.job.display_name()}")


def result_options(
    pending: PendingDispatch,
    *,
    store_results: bool = False,
    result_ttl_s: float = DEFAULT_RESULT_TTL_S,
    result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
) -> tuple[int, int] | None:
    """``(ttl ms, max bytes)`` when the job's return value is to be kept, else None: the
    dispatch's ``with_result``, else the job's ``store_result``, else the App's
    ``store_results`` (``TIDINGS_STORE_RESULTS``)."""
    src = pending.job.option_source()
    wanted = pending.store_result
    if wanted is None:
        wanted = option(src, "store_result")
    if not (store_results if wanted is None else wanted):
        return None
    ttl = pending.result_ttl_s if pending.result_ttl_s is not None else option(src, "result_ttl_s")
    cap = option(src, "result_max_bytes")
    return int((ttl if ttl is not None else result_ttl_s) * 1000), int(
        cap if cap is not None else result_max_bytes
    )


def prepare(
    pending: PendingDispatch,
    signer: Signer,
    *,
    max_bytes: int,
    store_results: bool = False,
    result_ttl_s: float = DEFAULT_RESULT_TTL_S,
    result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES,
) -> tuple[str, str, bytes, float, int]:
    """Everything a push needs: (queue, job id, envelope, delay seconds, priority).

    Raises:
        SerializationError: nothing was pushed.
        ValidationError: a priority outside -100..100; nothing was pushed.
    """
    job = pending.job
    src = job.option_source()
    queue = pending.queue or option(src, "queue") or "default"
    delay = pending.delay_s if pending.delay_s is not None else default_delay(job)
    priority = priority_of(pending)
    job_id = new_id()
    body = build_body(job, job_id, pending.chain)
    body["chainCatch"] = pending.catch
    if priority:
        body["priority"] = priority
    else:
        body.pop("priority", None)
    keep = result_options(
        pending,
        store_results=store_results,
        result_ttl_s=result_ttl_s,
        result_max_bytes=result_max_bytes,
    )
    if keep is not None:
        body["result"] = keep[0]
        body["resultMaxBytes"] = keep[1]
    envelope = seal(body, signer, max_bytes=max_bytes, queue=str(queue))
    return str(queue), job_id, envelope, delay, priority
