"""Turning jobs into signed envelopes: options, encoding, the body (the wire format is
:mod:`tidings.wire`)."""

from __future__ import annotations

import datetime as dt
import os
import random
from typing import Any

from tidings import _clock
from tidings.jobs.backoff import encode_backoff
from tidings.jobs.job import Job, PendingDispatch, delay_seconds, option
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
    max_stalls = option(src, "max_stalls")
    if max_stalls is not None:
        body["maxStalls"] = int(max_stalls)
    if tracing.ENABLED:  # W3C trace context of the dispatcher (tidings.observability.tracing)
        trace = tracing.carrier()
        if trace:
            body["trace"] = trace
    return body


def prepare(
    pending: PendingDispatch, signer: Signer, *, max_bytes: int
) -> tuple[str, str, bytes, float]:
    """Everything a push needs: (queue, job id, envelope, delay seconds).

    Raises:
        SerializationError: nothing was pushed.
    """
    job = pending.job
    src = job.option_source()
    queue = pending.queue or option(src, "queue") or "default"
    delay = pending.delay_s if pending.delay_s is not None else default_delay(job)
    job_id = new_id()
    body = build_body(job, job_id, pending.chain)
    body["chainCatch"] = pending.catch
    envelope = seal(body, signer, max_bytes=max_bytes, queue=str(queue))
    return str(queue), job_id, envelope, delay
