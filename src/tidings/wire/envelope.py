"""The wire format of a job.

A job is stored as an *envelope*, the exact bytes::

    {"sig":"<64 hex chars>","body":<body JSON>}

The signature is an HMAC-SHA256 over the app's Redis key prefix, the queue name and the
raw body bytes (``b"tidings:prefix:<len>:<prefix>:queue:<len>:<queue>\n" + body``, each
name length-prefixed), so a worker checks it before it parses anything, a job copied to
another queue, or to another app sharing the Redis server and the key under its own
prefix, fails verification, and the envelope is still one JSON document for tools that
read it.

Legacy envelopes, signed by older versions over less (the queue and the body,
``b"tidings:queue:<len>:<queue>\n" + body``, or the body alone), are still accepted for
:data:`LEGACY_SIGNATURE_WINDOW_S` after their ``pushedAt`` (a signed field), so jobs
queued before an upgrade drain; after that they are refused.

Body fields (:class:`JobBody`):

``uuid``           the job id (32 hex chars); must equal the id it was queued under
``displayName``    a readable name for logs and the failed store
``job``            the handler class as ``module:QualName`` (a Job subclass)
``data``           the encoded job object (see :mod:`tidings.wire.serializer`)
``maxTries``       how many reservations are allowed (None: the worker's ``--tries``)
``maxExceptions``  how many exceptions are allowed before failing (None: unlimited)
``backoff``        seconds before retry: a list per attempt, or ``{"exp": base, "max": cap}``
``timeout``        seconds a run may take (None: the worker's ``--timeout``)
``retryUntil``     epoch seconds after which the job fails instead of retrying
``pushedAt``       epoch seconds at dispatch (measures enqueue-to-start wait)
``chain``          bodies of the jobs to run after this one succeeds, in order
``chainCatch``     encoded callback run once when a chained job finally fails

Optional fields (absent on plain jobs; see :mod:`tidings.workflows.batch` and
:mod:`tidings.workflows.unique`):

``batch``          the id of the batch the job belongs to
``batchCallback``  the id of the batch whose then/catch/finally callback this job is
``unique``         the unique lock name, when the lock is freed as the job starts
``maxStalls``      how often the job's lease may expire before it fails unrun (None or
                   absent: the worker's ``--max-stalls``)
``uniqueConnection`` the named connection that lock lives on (absent: the default)
``trace``          W3C trace context headers of the dispatcher
                   (see :mod:`tidings.observability.tracing`)
``priority``       -100..100 when not 0 (Redis keeps its own copy beside the job, id:p)
``result``         ms to keep the job's return value (absent: not kept)
``resultMaxBytes`` the most bytes that return value may take, encoded

``attempts`` is not in the body: the scripts count it beside it, so Lua never rewrites a
signed body.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import orjson

from tidings import _clock
from tidings.errors import PayloadRejected, PayloadTooLarge, SerializationError
from tidings.wire.signing import Signer

_HEAD = b'{"sig":"'
_MID = b'","body":'
_SIG_LEN = 64
_BODY_AT = len(_HEAD) + _SIG_LEN + len(_MID)
#: How long after ``pushedAt`` an envelope signed without the prefix or the queue
#: binding (by a version before it) is still run.
LEGACY_SIGNATURE_WINDOW_S = 7 * 86400.0


def _bound(queue: str, prefix: str) -> bytes:
    """What a signature binds besides the body: the key prefix and the queue, each
    length-prefixed (no two pairs of names give the same bytes)."""
    p = prefix.encode("utf-8", "surrogatepass")
    q = queue.encode("utf-8", "surrogatepass")
    return b"tidings:prefix:%d:%s:queue:%d:%s\n" % (len(p), p, len(q), q)


def _queue_bound(queue: str) -> bytes:
    """What legacy envelopes bound: the queue alone (before the prefix was bound)."""
    q = queue.encode("utf-8", "surrogatepass")
    return b"tidings:queue:%d:%s\n" % (len(q), q)


class JobBody(TypedDict):
    """The signed body of a job."""

    uuid: str
    displayName: str
    job: str
    data: Any
    maxTries: int | None
    maxExceptions: int | None
    backoff: Any
    timeout: float | None
    retryUntil: float | None
    pushedAt: float
    chain: list[Any]
    chainCatch: Any
    batch: NotRequired[str]
    batchCallback: NotRequired[str]
    unique: NotRequired[str]
    maxStalls: NotRequired[int]
    uniqueConnection: NotRequired[str]
    trace: NotRequired[dict[str, str]]
    priority: NotRequired[int]
    result: NotRequired[int]
    resultMaxBytes: NotRequired[int]


_REQUIRED: dict[str, tuple[type, ...]] = {
    "uuid": (str,),
    "displayName": (str,),
    "job": (str,),
    "maxTries": (int, type(None)),
    "maxExceptions": (int, type(None)),
    "timeout": (int, float, type(None)),
    "retryUntil": (int, float, type(None)),
    "pushedAt": (int, float),
    "chain": (list,),
    "backoff": (list, dict, type(None)),
    "chainCatch": (dict, type(None)),
}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _valid_backoff(spec: object) -> bool:
    """A list of seconds, or ``{"exp", "f", "max"}`` numbers (see backoff.py), or None."""
    if isinstance(spec, list):
        return all(_number(v) for v in spec)
    if isinstance(spec, dict):
        return all(_number(spec.get(k)) for k in ("exp", "f", "max"))
    return spec is None


def seal(body: JobBody, signer: Signer, *, max_bytes: int, queue: str = "default") -> bytes:
    """Encode and sign ``body`` into envelope bytes, for ``queue`` under the signer's
    key prefix only.

    Raises:
        PayloadTooLarge: the envelope is over ``max_bytes``; nothing was pushed.
    """
    try:
        raw = orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError) as exc:
        # e.g. an unpaired surrogate in a str: not representable as UTF-8 JSON.
        raise SerializationError(
            f"payload of {body['displayName']} is not JSON-safe: {exc}"
        ) from exc
    signature = signer.sign(raw, _bound(queue, signer.prefix)).encode()
    envelope = b"".join((_HEAD, signature, _MID, raw, b"}"))
    if len(envelope) > max_bytes:
        raise PayloadTooLarge(
            f"payload of {body['displayName']} is {len(envelope)} bytes; the limit is {max_bytes}"
        )
    return envelope


def open_envelope(
    envelope: bytes, signer: Signer, *, job_id: str, queue: str = "default"
) -> JobBody:
    """Verify and parse an envelope popped from ``queue`` (under the signer's prefix).

    Raises:
        PayloadRejected: unsigned, tampered, signed for another queue or key prefix,
            malformed, or queued under another id; a legacy envelope pushed more than
            :data:`LEGACY_SIGNATURE_WINDOW_S` ago.
    """
    if not (
        envelope.startswith(_HEAD)
        and envelope[_BODY_AT - len(_MID) : _BODY_AT] == _MID
        and envelope.endswith(b"}")
    ):
        raise PayloadRejected("bad signature: payload is not a signed envelope")
    raw = envelope[_BODY_AT:-1]
    signature = envelope[len(_HEAD) : len(_HEAD) + _SIG_LEN]
    missing = ""  # what a legacy signature did not bind
    if not signer.verify(raw, signature, _bound(queue, signer.prefix)):
        if signer.verify(raw, signature, _queue_bound(queue)):
            missing = "the key prefix binding"
        elif signer.verify(raw, signature):
            missing = "the queue and key prefix binding"
        else:
            raise PayloadRejected(
                "bad signature: payload was not signed with this app's key for queue "
                f"{queue!r} under key prefix {signer.prefix!r}"
            )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PayloadRejected(f"malformed payload: {exc}") from exc
    if not isinstance(body, dict):
        raise PayloadRejected("malformed payload: body is not an object")
    for name, types in _REQUIRED.items():
        if name not in body:
            raise PayloadRejected(f"malformed payload: missing field {name!r}")
        value = body[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise PayloadRejected(f"malformed payload: field {name!r} has the wrong type")
    if "data" not in body:
        raise PayloadRejected("malformed payload: missing field 'data'")
    if not _valid_backoff(body["backoff"]):
        raise PayloadRejected("malformed payload: field 'backoff' has the wrong shape")
    if body["uuid"] != job_id:
        raise PayloadRejected("malformed payload: body id does not match the queued id")
    if missing and _clock.now() - body["pushedAt"] > LEGACY_SIGNATURE_WINDOW_S:
        raise PayloadRejected(
            f"bad signature: signed without {missing} (an older tidings) and "
            "pushed more than 7 days ago"
        )
    return body  # type: ignore[return-value]
