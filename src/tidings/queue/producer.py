"""Turning jobs into signed envelopes: options, encoding, the body."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from tidings import _clock
from tidings.queue import serializer
from tidings.queue.backoff import encode_backoff
from tidings.queue.job import Job, PendingDispatch, delay_seconds, option
from tidings.queue.payload import JobBody, seal
from tidings.queue.signing import Signer


def new_id() -> str:
    """A fresh job id: 32 hex chars."""
    return uuid.uuid4().hex


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
    return {
        "uuid": job_id,
        "displayName": job.display_name(),
        "job": serializer.class_path(type(job)),
        "data": serializer.encode(job),
        "maxTries": option(src, "tries"),
        "maxExceptions": option(src, "max_exceptions"),
        "backoff": encode_backoff(option(src, "backoff")),
        "timeout": option(src, "timeout"),
        "retryUntil": _retry_until(option(src, "retry_until")),
        "pushedAt": _clock.now(),
        "chain": chain or [],
        "chainCatch": None,
    }


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
    return str(queue), job_id, seal(body, signer, max_bytes=max_bytes), delay
