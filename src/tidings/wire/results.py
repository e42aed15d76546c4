"""The stored form of a job's return value: signed, bounded, type-tagged JSON.

A result is kept (``store_result``) as the exact bytes::

    <64 hex chars: HMAC-SHA256>{"v": <the value, encoded like job arguments>}

The signature binds the key prefix, the queue and the job id, so a value written by
anyone but a worker of this app, or copied from another job, is refused when read
(``app.result`` raises :class:`~tidings.errors.ResultMissing` for it rather than decode
it). Values go through :mod:`tidings.wire.serializer`, as arguments do: dataclasses,
datetimes, models by key; anything else fails the job with the value's path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tidings.errors import ResultMissing, ResultTooLarge, SerializationError
from tidings.wire import serializer
from tidings.wire.signing import Signer

_SIG_LEN = 64


def _bound(prefix: str, queue: str, job_id: str) -> bytes:
    parts = [x.encode("utf-8", "surrogatepass") for x in (prefix, queue, job_id)]
    return b"tidings:result:%d:%s:%d:%s:%d:%s\n" % (
        len(parts[0]), parts[0], len(parts[1]), parts[1], len(parts[2]), parts[2]
    )  # fmt: skip


def seal_result(value: Any, signer: Signer, *, queue: str, job_id: str, max_bytes: int) -> bytes:
    """Encode and sign ``value`` as ``job_id``'s result.

    Raises:
        SerializationError: the value has no stored form (the message names its path).
        ResultTooLarge: the encoded result is over ``max_bytes``.
    """
    data = serializer.encode(value, path="result")
    try:
        raw = orjson.dumps({"v": data})
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise SerializationError(f"the job's return value is not JSON-safe: {exc}") from exc
    blob = signer.sign(raw, _bound(signer.prefix, queue, job_id)).encode() + raw
    if len(blob) > max_bytes:
        raise ResultTooLarge(
            f"the job's return value is {len(blob)} bytes encoded; the limit is {max_bytes} "
            "(result_max_bytes on the job class, or TIDINGS_RESULT_MAX_BYTES)"
        )
    return blob


def open_result(
    blob: bytes,
    signer: Signer,
    *,
    queue: str,
    job_id: str,
    resolve: Callable[[str], Any],
) -> Any:
    """Verify and decode a stored result.

    Raises:
        ResultMissing: the bytes were not written by a worker of this app for this job.
    """
    raw, signature = blob[_SIG_LEN:], blob[:_SIG_LEN]
    if not signer.verify(raw, signature, _bound(signer.prefix, queue, job_id)):
        raise ResultMissing(
            f"the stored result of job {job_id} is not signed with this app's key; refused",
            job_id=job_id,
        )
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ResultMissing(
            f"the stored result of job {job_id} is unreadable", job_id=job_id
        ) from exc
    return serializer.decode(doc["v"], resolve)
