"""The wire format of a job.

A job is stored as an *envelope*: one JSON object whose first member is its signature
tag, followed by the body's members in their *wire* form (below)::

    {"s":"<22 base64url chars>","j":"app.jobs:SendMail","f":{"to":"a@b.c"},"t":1795672216173}

The tag is HMAC-SHA256 truncated to 128 bits (base64url, unpadded) over the app's Redis
key prefix, the queue name, the job id and the envelope's bytes after the tag
(``b"tidings:2:prefix:<len>:<prefix>:queue:<len>:<queue>:id:<len>:<id>\n" + rest``, each
name length-prefixed), so a worker checks it before it parses anything; a job copied to
another queue, to another app sharing the Redis server and the key under its own
prefix, or to another id, fails verification. The id is not in the body: it is the
hash field the envelope is stored under, and the tag binds the two.

The frame is fixed (``{"s":"`` at byte 0, ``","`` at bytes 28-30, ``}`` last), so the
pop script tells an envelope from garbage without decoding it (``envelope_shaped`` in
``redis/lua/pop.lua``).

Wire members, all but ``j`` and ``t`` omitted when they hold their default:

=======  ==================================================================
``j``    ``job``
``n``    ``displayName``; absent: the class name (the part of ``j`` after ``:``)
``f``    ``data`` when it is the job's own dataclass: its fields (``{"__t": "dc",
         "c": j, "f": f}``); ``o`` likewise for a tidings ``obj``; ``d`` any other data
         (sealed data: ``{"__t": "enc", ...}``)
``t``    ``pushedAt`` in integer milliseconds
others   by their body names below; absent means None (``chain``: ``[]``)
=======  ==================================================================

:func:`open_envelope` and :func:`read_body` give back the full body, every field of
:class:`JobBody` by its name, whichever form was stored.

Envelopes of earlier versions (``{"sig":"<64 hex>","body":{...}}``: the full HMAC in hex
over the prefix, queue and body, the body holding every field with ``uuid``) are still
read and run: jobs queued before an upgrade drain. Older ones still, signed over less
(the queue and the body, ``b"tidings:queue:<len>:<queue>\n" + body``, or the body
alone), are accepted for :data:`LEGACY_SIGNATURE_WINDOW_S` after their ``pushedAt`` (a
signed field); after that they are refused. Only the current form is written, unless
the ``envelope_frame`` setting asks for the previous one (a rolling upgrade with the
producers first: :func:`_seal_earlier`).

Body fields (:class:`JobBody`):

``uuid``           the job id (32 hex chars): on the wire only where an envelope is kept
                   apart from its id (batch callbacks, ``seal(keep_id=True)``), and then
                   it must equal the id it is queued under
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

# The current frame: {"s":"<tag>", then the body's members, then its closing brace.
_TAG_HEAD = b'{"s":"'
_TAG_LEN = 22
_REST_AT = len(_TAG_HEAD) + _TAG_LEN + 2  # past the tag's closing quote and the comma
# Earlier versions' frame: {"sig":"<64 hex>","body":<body JSON>}.
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


_CONTEXTS: dict[tuple[str, str], bytes] = {}


def _tag_context(queue: str, prefix: str, job_id: str) -> bytes:
    """What a tag binds besides the envelope's bytes: prefix, queue and job id."""
    head = _CONTEXTS.get((prefix, queue))
    if head is None:
        p = prefix.encode("utf-8", "surrogatepass")
        q = queue.encode("utf-8", "surrogatepass")
        head = b"tidings:2:prefix:%d:%s:queue:%d:%s:id:" % (len(p), p, len(q), q)
        if len(_CONTEXTS) < 4096:
            _CONTEXTS[(prefix, queue)] = head
    i = job_id.encode("utf-8", "surrogatepass")
    return b"%s%d:%s\n" % (head, len(i), i)


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
# Body fields written under another name (or not at all) on the wire.
_RENAMED = frozenset(("uuid", "displayName", "job", "data", "pushedAt"))
# Wire names that are no body field's: a body member by one of these names is not
# carried (it would be read back as something else).
_WIRE_ONLY = frozenset(("s", "j", "n", "f", "o", "d", "t"))
# Body fields that default to None when absent from the wire (chain: []).
_NULLABLE = ("maxTries", "maxExceptions", "backoff", "timeout", "retryUntil", "chainCatch")
# The fields every body has.
_CORE = _RENAMED | frozenset(_NULLABLE) | {"chain"}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_NUMBERS = frozenset((int, float))  # exactly (a bool is an int, not a number here)


def _valid_backoff(spec: object) -> bool:
    """A list of seconds, or ``{"exp", "f", "max"}`` numbers (see backoff.py), or None."""
    if spec is None:
        return True
    if isinstance(spec, dict):  # a notification's default (exponential): no generator
        exp, factor, cap = spec.get("exp"), spec.get("f"), spec.get("max")
        if type(exp) in _NUMBERS and type(factor) in _NUMBERS and type(cap) in _NUMBERS:
            return True
        return _number(exp) and _number(factor) and _number(cap)
    if isinstance(spec, list):
        return all(_number(v) for v in spec)
    return False


def _class_name(path: str) -> str:
    return path[path.rfind(":") + 1 :]


def to_wire(body: JobBody, *, keep_id: bool = False) -> dict[str, Any]:
    """The members an envelope carries for ``body`` (see the module's table), ``j``
    first (the frame the pop script checks needs a member after the tag)."""
    job = body["job"]
    wire: dict[str, Any] = {"j": job}
    name = body["displayName"]
    if name != _class_name(job):
        wire["n"] = name
    data = body["data"]
    if (
        type(data) is dict
        and len(data) == 3
        and data.get("c") == job
        and "f" in data
        and (tag := data.get("__t")) in ("dc", "obj")
    ):
        wire["f" if tag == "dc" else "o"] = data["f"]
    else:
        wire["d"] = data
    wire["t"] = round(body["pushedAt"] * 1000)
    if keep_id:
        wire["uuid"] = body["uuid"]
    for key in _NULLABLE:
        value = body.get(key)
        if value is not None:
            wire[key] = value
    chain = body.get("chain")
    if chain:
        wire["chain"] = chain
    if not body.keys() <= _CORE:  # optional fields (batch, priority, trace, ...)
        for key, value in body.items():
            if value is not None and key not in _CORE and key not in _WIRE_ONLY:
                wire[key] = value
    return wire


def from_wire(wire: dict[str, Any], job_id: str | None) -> dict[str, Any]:
    """The full body (every :class:`JobBody` field by its name) of wire members; its
    ``uuid`` is ``job_id`` unless the members carry one. Unchecked: see
    :func:`open_envelope`."""
    job = wire.get("j")
    body: dict[str, Any] = {"uuid": wire.get("uuid", job_id), "displayName": wire.get("n")}
    body["job"] = job
    if body["displayName"] is None and isinstance(job, str):
        body["displayName"] = _class_name(job)
    if "f" in wire:
        body["data"] = {"__t": "dc", "c": job, "f": wire["f"]}
    elif "o" in wire:
        body["data"] = {"__t": "obj", "c": job, "f": wire["o"]}
    elif "d" in wire:
        body["data"] = wire["d"]
    for key in _NULLABLE:
        body[key] = None
    body["chain"] = []
    t = wire.get("t")
    body["pushedAt"] = t / 1000 if isinstance(t, int | float) and not isinstance(t, bool) else t
    for key, value in wire.items():
        if key not in _WIRE_ONLY and key != "uuid":
            body[key] = value
    return body


def seal(
    body: JobBody,
    signer: Signer,
    *,
    max_bytes: int,
    queue: str = "default",
    keep_id: bool = False,
) -> bytes:
    """Encode and sign ``body`` into envelope bytes, for ``queue`` under the signer's
    key prefix and the body's ``uuid`` only. ``keep_id``: the id goes into the envelope
    too, for one kept where its id is not (a batch's callbacks).

    Raises:
        PayloadTooLarge: the envelope is over ``max_bytes``; nothing was pushed.
    """
    if signer.frame == 1 and not keep_id:
        return _seal_earlier(body, signer, max_bytes=max_bytes, queue=queue)
    raw = _json(to_wire(body, keep_id=keep_id), body)
    rest = raw[1:]  # the members and the closing brace, after the tag
    tag = signer.tag(rest, _tag_context(queue, signer.prefix, body["uuid"]))
    return _sized(b"".join((_TAG_HEAD, tag, b'",', rest)), body, max_bytes)


def _json(value: object, body: JobBody) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        # e.g. an unpaired surrogate in a str: not representable as UTF-8 JSON.
        raise SerializationError(
            f"payload of {body['displayName']} is not JSON-safe: {exc}"
        ) from exc


def _sized(envelope: bytes, body: JobBody, max_bytes: int) -> bytes:
    if len(envelope) > max_bytes:
        raise PayloadTooLarge(
            f"payload of {body['displayName']} is {len(envelope)} bytes; the limit is {max_bytes}"
        )
    return envelope


def _seal_earlier(body: JobBody, signer: Signer, *, max_bytes: int, queue: str) -> bytes:
    """The previous frame (``{"sig":"<64 hex>","body":{...}}``, every field by its long
    name), which workers of earlier versions read: written with ``envelope_frame=1``
    during a rolling upgrade."""
    raw = _json(body, body)
    signature = signer.sign(raw, _bound(queue, signer.prefix)).encode()
    return _sized(b"".join((_HEAD, signature, _MID, raw, b"}")), body, max_bytes)


def _tagged(envelope: bytes) -> bool:
    """Whether ``envelope`` is in the current frame (not checked: its tag, its JSON)."""
    return (
        envelope.startswith(_TAG_HEAD)
        and envelope[_REST_AT - 2 : _REST_AT + 1] == b'","'
        and envelope.endswith(b"}")
    )


def read_body(envelope: Any, job_id: str | None = None) -> dict[str, Any] | None:
    """The full body of an envelope of either frame, WITHOUT checking its signature (for
    display and bookkeeping: the worker verifies before anything runs); None when it is
    not a readable envelope. ``job_id`` is the body's ``uuid`` when the envelope does
    not carry one."""
    if not isinstance(envelope, bytes):
        return None
    try:
        if _tagged(envelope):
            wire = orjson.loads(b"{" + envelope[_REST_AT:])
            return from_wire(wire, job_id) if isinstance(wire, dict) else None
        doc = orjson.loads(envelope)
    except orjson.JSONDecodeError:
        return None
    body = doc.get("body") if isinstance(doc, dict) else None
    return body if isinstance(body, dict) else None


def read_envelope(envelope: Any, job_id: str | None = None) -> dict[str, Any] | None:
    """``{"sig": ..., "body": ...}`` of an envelope of either frame, the body full (see
    :func:`read_body`), unverified; None when it is not a readable envelope."""
    body = read_body(envelope, job_id)
    if body is None:
        return None
    assert isinstance(envelope, bytes)
    if _tagged(envelope):
        sig = envelope[len(_TAG_HEAD) : _REST_AT - 2].decode("ascii", "replace")
    else:
        doc = orjson.loads(envelope)
        sig = doc.get("sig")
    return {"sig": sig, "body": body}


def envelope_id(envelope: bytes) -> str | None:
    """The id an envelope carries itself (one sealed with ``keep_id``, or of an earlier
    version), unverified; None when it has none."""
    body = read_body(envelope)
    job_id = body.get("uuid") if body is not None else None
    return job_id if isinstance(job_id, str) else None


def open_envelope(
    envelope: bytes, signer: Signer, *, job_id: str, queue: str = "default"
) -> JobBody:
    """Verify and parse an envelope popped from ``queue`` (under the signer's prefix),
    into the full body.

    Raises:
        PayloadRejected: unsigned, tampered, signed for another queue, key prefix or id,
            malformed; a legacy envelope pushed more than
            :data:`LEGACY_SIGNATURE_WINDOW_S` ago.
    """
    if _tagged(envelope):
        rest = envelope[_REST_AT:]
        tag = envelope[len(_TAG_HEAD) : _REST_AT - 2]
        if not signer.verify_tag(rest, tag, _tag_context(queue, signer.prefix, job_id)):
            raise PayloadRejected(
                "bad signature: payload was not signed with this app's key for queue "
                f"{queue!r} under key prefix {signer.prefix!r} as job {job_id!r}"
            )
        try:
            wire = orjson.loads(b"{" + rest)
        except orjson.JSONDecodeError as exc:
            raise PayloadRejected(f"malformed payload: {exc}") from exc
        if not isinstance(wire, dict):  # pragma: no cover - '{' + rest is an object or not JSON
            raise PayloadRejected("malformed payload: body is not an object")
        if not isinstance(wire.get("j"), str):
            raise PayloadRejected("malformed payload: missing field 'job'")
        if not _number(wire.get("t")):
            raise PayloadRejected("malformed payload: field 'pushedAt' has the wrong type")
        if sum(k in wire for k in ("f", "o", "d")) != 1:
            raise PayloadRejected("malformed payload: missing field 'data'")
        if not isinstance(wire.get("f", wire.get("o", {})), dict):
            raise PayloadRejected("malformed payload: field 'data' has the wrong type")
        return _checked(from_wire(wire, job_id), job_id, "")
    return _open_earlier(envelope, signer, job_id=job_id, queue=queue)


def _open_earlier(envelope: bytes, signer: Signer, *, job_id: str, queue: str) -> JobBody:
    """An envelope of an earlier version (``{"sig":"<64 hex>","body":{...}}``)."""
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
    return _checked(body, job_id, missing)


def _checked(body: dict[str, Any], job_id: str, missing: str) -> JobBody:
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
