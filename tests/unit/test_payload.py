"""Signed envelopes: sealing, verifying, and refusing every tampered or malformed one;
envelopes of the previous frame (``{"sig":"<64 hex>","body":{...}}``) still read.

B2 (wrong shape) and B5 (tampering) at the unit level; the worker-level rows (failed
store, nothing imported) are in tests/integration/test_worker.py. No sockets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings.errors import ConfigurationError, PayloadRejected, PayloadTooLarge, SerializationError
from tidings.wire.envelope import (
    JobBody,
    envelope_id,
    open_envelope,
    read_body,
    read_envelope,
    seal,
    to_wire,
)
from tidings.wire.signing import Signer, parse_keys

KEY = b"k" * 32
OTHER = b"o" * 32
MAX = 1024 * 1024


def body_for(job_id: str | None = None, **changes: Any) -> JobBody:
    body: dict[str, Any] = {
        "uuid": job_id or uuid.uuid4().hex,
        "displayName": "SendInvoice",
        "job": "app.jobs:SendInvoice",
        "data": {"__t": "dc", "c": "app.jobs:SendInvoice", "f": {"id": 7, "items": [], "meta": {}}},
        "maxTries": 3,
        "maxExceptions": None,
        "backoff": [1.0, 5.0],
        "timeout": 30,
        "retryUntil": None,
        "pushedAt": 1_700_000_000.25,
        "chain": [],
        "chainCatch": None,
    }
    body.update(changes)
    return body  # type: ignore[return-value]


def sealed(body: JobBody | None = None, key: bytes = KEY) -> tuple[str, bytes]:
    body = body or body_for()
    return body["uuid"], seal(body, Signer([key]), max_bytes=MAX)


def sign_raw(raw: bytes, key: bytes = KEY) -> bytes:
    """An envelope of the previous frame around arbitrary body bytes, correctly signed
    (over the body alone, as the oldest versions did)."""
    sig = hmac.new(key, raw, hashlib.sha256).hexdigest().encode()
    return b'{"sig":"' + sig + b'","body":' + raw + b"}"


def previous(body: JobBody, key: bytes = KEY, queue: str = "default") -> bytes:
    """``body`` as the previous version sealed it: every field, the full hex HMAC over
    the prefix, the queue and the body."""
    raw = orjson.dumps(body)
    bound = b"tidings:prefix:7:tidings:queue:%d:%s\n" % (len(queue), queue.encode())
    sig = hmac.new(key, bound + raw, hashlib.sha256).hexdigest().encode()
    return b'{"sig":"' + sig + b'","body":' + raw + b"}"


def tag_for(rest: bytes, job_id: str, key: bytes = KEY, queue: str = "default") -> bytes:
    """The textbook HMAC-SHA256-128 tag (base64url) of the current frame."""
    context = b"tidings:2:prefix:7:tidings:queue:%d:%s:id:%d:%s\n" % (
        len(queue),
        queue.encode(),
        len(job_id),
        job_id.encode(),
    )
    mac = hmac.new(key, context + rest, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(mac).rstrip(b"=")


def sign_wire(members: dict[str, Any], job_id: str, key: bytes = KEY) -> bytes:
    """An envelope of the current frame around arbitrary wire members, correctly tagged."""
    rest = orjson.dumps(members)[1:]
    return b'{"s":"' + tag_for(rest, job_id, key) + b'",' + rest


# -- the happy path --------------------------------------------------------------------------


def test_seal_then_open_returns_the_body() -> None:
    body = body_for()
    job_id, env = sealed(body)
    assert open_envelope(env, Signer([KEY]), job_id=job_id) == body


def test_envelope_shape_is_one_json_document_with_a_tag_over_the_rest() -> None:
    body = body_for()
    job_id, env = sealed(body)
    doc = orjson.loads(env)
    assert list(doc)[:2] == ["s", "j"]
    rest = env[30:]
    assert env == b'{"s":"' + doc["s"].encode() + b'",' + rest
    # The tag binds the key prefix, the queue and the job id (each length-prefixed) as
    # well as the bytes after it: HMAC-SHA256 truncated to 128 bits, base64url.
    assert doc["s"].encode() == tag_for(rest, job_id)
    assert len(doc["s"]) == 22
    # Defaults, the id, a display name equal to the class name and the class path of
    # the job's own dataclass are left out; pushedAt is in ms.
    assert env == (
        b'{"s":"' + doc["s"].encode() + b'","j":"app.jobs:SendInvoice",'
        b'"f":{"id":7,"items":[],"meta":{}},"t":1700000000250,"maxTries":3,'
        b'"backoff":[1.0,5.0],"timeout":30}'
    )


def test_a_plain_job_fits_in_a_small_envelope() -> None:
    """What a queued no-op job costs in Redis is mostly its envelope (issue 28)."""
    body = body_for(maxTries=None, backoff=None, timeout=None)
    body["data"]["f"] = {"n": 1}
    job_id, env = sealed(body)
    assert len(env) == 30 + len(b'"j":"app.jobs:SendInvoice","f":{"n":1},"t":1700000000250}')
    assert open_envelope(env, Signer([KEY]), job_id=job_id) == body


@pytest.mark.parametrize(
    "data",
    [
        {"__t": "dc", "c": "app.jobs:SendInvoice", "f": {"id": 1}},
        {"__t": "obj", "c": "app.jobs:SendInvoice", "f": {"id": 1}},
        {"__t": "dc", "c": "app.jobs:Other", "f": {"id": 1}},
        {"__t": "dc", "c": "app.jobs:SendInvoice", "f": {"id": 1}, "x": 2},
        {"__t": "enc", "k": "ab12", "v": "sealed"},
        [1, 2],
        None,
    ],
    ids=["dc", "obj", "other-class", "extra-key", "encrypted", "list", "null"],
)
def test_every_data_form_reads_back_the_same(data: Any) -> None:
    body = body_for(data=data)
    job_id, env = sealed(body)
    assert open_envelope(env, Signer([KEY]), job_id=job_id) == body
    assert read_body(env, job_id) == body


def test_fields_that_differ_from_their_default_are_kept() -> None:
    chain = [{"queue": "default", "body": {"uuid": "c" * 32}}]
    body = body_for(
        displayName="Invoice #7",
        maxExceptions=2,
        retryUntil=1_700_000_100.5,
        chain=chain,
        chainCatch={"queue": "q", "body": {}},
        backoff={"exp": 2, "f": 1, "max": 60},
        batch="b" * 32,
        priority=5,
        result=1000,
        resultMaxBytes=10,
    )
    job_id, env = sealed(body)
    assert open_envelope(env, Signer([KEY]), job_id=job_id) == body
    assert orjson.loads(env)["n"] == "Invoice #7"


def test_the_tag_binds_the_job_id() -> None:
    """The id is not in the body: an envelope copied under another id fails its tag."""
    job_id, env = sealed()
    assert open_envelope(env, Signer([KEY]), job_id=job_id)["uuid"] == job_id
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(env, Signer([KEY]), job_id=uuid.uuid4().hex)


def test_an_envelope_kept_apart_from_its_id_carries_it() -> None:
    body = body_for()
    env = seal(body, Signer([KEY]), max_bytes=MAX, keep_id=True)
    assert envelope_id(env) == body["uuid"]
    assert open_envelope(env, Signer([KEY]), job_id=body["uuid"]) == body
    with pytest.raises(PayloadRejected):
        open_envelope(env, Signer([KEY]), job_id=uuid.uuid4().hex)
    # Signed under one id while carrying another: refused.
    members = to_wire(body, keep_id=True)
    other = uuid.uuid4().hex
    with pytest.raises(PayloadRejected, match="does not match"):
        open_envelope(sign_wire(members, other), Signer([KEY]), job_id=other)


def test_envelopes_of_the_previous_frame_still_open() -> None:
    """Jobs queued by the previous version drain after an upgrade."""
    body = body_for()
    env = previous(body)
    assert open_envelope(env, Signer([KEY]), job_id=body["uuid"]) == body
    assert read_body(env) == body
    assert envelope_id(env) == body["uuid"]
    assert read_envelope(env) == orjson.loads(env)
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(env, Signer([KEY]), job_id=body["uuid"], queue="other")
    with pytest.raises(PayloadRejected, match="does not match"):
        open_envelope(env, Signer([KEY]), job_id=uuid.uuid4().hex)


def test_envelope_frame_1_writes_exactly_what_the_previous_version_wrote() -> None:
    """``envelope_frame=1`` (a rolling upgrade: producers first): byte for byte the
    previous frame, which workers of the previous version open; the current one too."""
    body = body_for()
    env = seal(body, Signer([KEY], frame=1), max_bytes=MAX)
    assert env == previous(body)
    assert open_envelope(env, Signer([KEY]), job_id=body["uuid"]) == body
    other = seal(body, Signer([KEY], frame=1), max_bytes=MAX, queue="mail")
    assert other == previous(body, queue="mail")
    with pytest.raises(PayloadTooLarge):
        seal(body, Signer([KEY], frame=1), max_bytes=100)


def test_the_envelope_frame_setting() -> None:
    from tidings.config import Settings

    base = {"redis_url": "redis://x:1"}
    assert Settings.resolve(base, {"TIDINGS_KEY": "k" * 40}).envelope_frame == 2
    env = {"TIDINGS_KEY": "k" * 40, "TIDINGS_ENVELOPE_FRAME": "1"}
    assert Settings.resolve(base, env).envelope_frame == 1
    with pytest.raises(ConfigurationError, match="TIDINGS_ENVELOPE_FRAME must be 1 or 2"):
        Settings.resolve({**base, "envelope_frame": 3}, {"TIDINGS_KEY": "k" * 40})


def test_read_envelope_shows_both_frames_alike() -> None:
    body = body_for()
    job_id, env = sealed(body)
    shown = read_envelope(env, job_id)
    assert shown == {"sig": orjson.loads(env)["s"], "body": body}
    assert envelope_id(env) is None  # not kept: the id is where the envelope is stored
    for garbage in (b"", b"not json", b"[]", b'{"s":"' + b"x" * 22 + b'","j"}', None):
        assert read_body(garbage) is None


def test_body_bytes_are_kept_exactly() -> None:
    """[] stays [], {} stays {}, big ints and non-ASCII survive (no cjson in the path)."""
    data = {
        "empty_list": [],
        "empty_obj": {},
        "big": 2**63 - 1,
        "slash": "a/b",
        "text": "\u00e9\u4e2d",
    }
    body = body_for(data=data)
    job_id, env = sealed(body)
    assert b'"empty_list":[]' in env and b'"empty_obj":{}' in env
    assert str(2**63 - 1).encode() in env
    assert open_envelope(env, Signer([KEY]), job_id=job_id)["data"] == data


def test_key_rotation_first_signs_all_verify() -> None:
    job_id, old_env = sealed(key=OTHER)
    rotated = Signer([KEY, OTHER])
    assert open_envelope(old_env, rotated, job_id=job_id)["uuid"] == job_id
    new_id, new_env = sealed(body_for(), key=KEY)
    assert new_env == seal(open_envelope(new_env, rotated, job_id=new_id), rotated, max_bytes=MAX)
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(old_env, Signer([KEY]), job_id=job_id)


def test_extra_body_fields_are_tolerated() -> None:
    """Documented outcome: unknown fields are ignored (forward compatible); the body is
    still signed, so nobody but a key holder can add them."""
    body = body_for(extra="x")
    job_id, env = sealed(body)
    assert open_envelope(env, Signer([KEY]), job_id=job_id)["extra"] == "x"  # type: ignore[typeddict-item]


def test_seal_refuses_oversize_before_anything_is_pushed() -> None:
    body = body_for(data="x" * 5000)
    with pytest.raises(PayloadTooLarge, match="limit is 4096") as info:
        seal(body, Signer([KEY]), max_bytes=4096)
    assert isinstance(info.value, SerializationError)


# -- keys ------------------------------------------------------------------------------------


def test_parse_keys() -> None:
    raw = bytes(range(32))
    keys = parse_keys(f" {'a' * 16} , base64:{base64.b64encode(raw).decode()} ,")
    assert keys == [b"a" * 16, raw]
    for bad in ("", "short", ",,", f"{'a' * 16},tooshort"):
        with pytest.raises(ConfigurationError):
            parse_keys(bad)


# -- tampering (B5) --------------------------------------------------------------------------


def _flip(env: bytes, index: int) -> bytes:
    b = bytearray(env)
    b[index] ^= 0x01
    return bytes(b)


def test_flip_one_byte_of_the_body_is_refused() -> None:
    job_id, env = sealed()
    at = env.index(b'"id":7') + 5  # the digit 7 -> 6: still valid JSON, same shape
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(_flip(env, at), Signer([KEY]), job_id=job_id)


def test_flip_one_byte_of_the_signature_is_refused() -> None:
    job_id, env = sealed()
    for at in (6, 15, 27):
        with pytest.raises(PayloadRejected, match="bad signature"):
            open_envelope(_flip(env, at), Signer([KEY]), job_id=job_id)


def test_uppercase_signature_is_refused() -> None:
    job_id, env = sealed()
    upper = env[:6] + env[6:28].swapcase() + env[28:]
    assert upper != env
    with pytest.raises(PayloadRejected):
        open_envelope(upper, Signer([KEY]), job_id=job_id)


def test_swapped_bodies_are_refused() -> None:
    a_id, a = sealed()
    b_id, b = sealed(body_for(timeout=31))
    swapped = a[:30] + b[30:]  # a's tag, b's body
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(swapped, Signer([KEY]), job_id=b_id)
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(swapped, Signer([KEY]), job_id=a_id)


def test_signature_made_with_another_key_is_refused() -> None:
    job_id, env = sealed(key=OTHER)
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(env, Signer([KEY]), job_id=job_id)


@pytest.mark.parametrize(
    "make",
    [
        lambda raw: raw,  # a bare body, no envelope
        lambda raw: b'{"body":' + raw + b"}",
        lambda raw: b'{"sig":"","body":' + raw + b"}",
        lambda raw: b'{"body":' + raw + b',"sig":"' + b"0" * 64 + b'"}',
        lambda raw: b'{ "sig":"' + b"0" * 64 + b'","body":' + raw + b"}",
        lambda raw: b"",
        lambda raw: b"not-json{",
        lambda raw: b"[]",
    ],
    ids=["bare", "no-sig", "empty-sig", "reordered", "whitespace", "empty", "garbage", "array"],
)
def test_unsigned_or_misshapen_envelopes_are_refused(make: Any) -> None:
    body = body_for()
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(make(orjson.dumps(body)), Signer([KEY]), job_id=body["uuid"])


def test_id_mismatch_is_refused() -> None:
    _, env = sealed()
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(env, Signer([KEY]), job_id=uuid.uuid4().hex)


# -- wrong shape (B2): correctly signed, still refused ---------------------------------------

WRONG: list[tuple[str, Any]] = [
    ("uuid", 123),
    ("displayName", None),
    ("job", ["a"]),
    ("maxTries", "3"),
    ("maxTries", True),
    ("maxTries", 3.5),
    ("maxExceptions", "1"),
    ("timeout", "30"),
    ("retryUntil", "tomorrow"),
    ("pushedAt", None),
    ("chain", {}),
    ("backoff", "fast"),
    ("backoff", ["x"]),
    ("backoff", {"exp": "1"}),
    ("chainCatch", "x"),
]


@pytest.mark.parametrize(("name", "value"), WRONG, ids=lambda v: repr(v))
def test_wrong_field_types_are_refused(name: str, value: Any) -> None:
    body = body_for()
    body[name] = value  # type: ignore[literal-required]
    raw = orjson.dumps(body)
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_raw(raw), Signer([KEY]), job_id=body["uuid"])


@pytest.mark.parametrize(
    "name",
    [
        "uuid",
        "displayName",
        "job",
        "data",
        "maxTries",
        "maxExceptions",
        "backoff",
        "timeout",
        "retryUntil",
        "pushedAt",
        "chain",
        "chainCatch",
    ],
)
def test_missing_fields_are_refused(name: str) -> None:
    body: dict[str, Any] = dict(body_for())
    job_id = body["uuid"]
    del body[name]
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_raw(orjson.dumps(body)), Signer([KEY]), job_id=job_id)


WRONG_WIRE: list[tuple[str, Any]] = [
    ("j", ["a"]),
    ("j", None),
    ("n", 1),
    ("t", "now"),
    ("t", True),
    ("t", None),
    ("f", [1]),
    ("o", "x"),
    ("maxTries", "3"),
    ("maxTries", True),
    ("timeout", "30"),
    ("retryUntil", "tomorrow"),
    ("chain", {}),
    ("chain", None),
    ("backoff", "fast"),
    ("backoff", {"exp": "1"}),
    ("backoff", {"exp": 1.0, "f": 2.0}),
    ("backoff", {"exp": 1.0, "f": 2.0, "max": True}),
    ("backoff", {"exp": 1.0, "f": None, "max": 60.0}),
    ("backoff", [1.0, False]),
    ("chainCatch", "x"),
    ("uuid", 123),
]


@pytest.mark.parametrize(("name", "value"), WRONG_WIRE, ids=lambda v: repr(v))
def test_wrong_wire_member_types_are_refused(name: str, value: Any) -> None:
    body = body_for()
    members = to_wire(body)
    if name == "o":
        members.pop("f")
    members[name] = value
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_wire(members, body["uuid"]), Signer([KEY]), job_id=body["uuid"])


@pytest.mark.parametrize("drop", [("j",), ("t",), ("f",)], ids=str)
def test_missing_wire_members_are_refused(drop: tuple[str, ...]) -> None:
    body = body_for()
    members = {k: v for k, v in to_wire(body).items() if k not in drop}
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_wire(members, body["uuid"]), Signer([KEY]), job_id=body["uuid"])


def test_two_data_members_are_refused() -> None:
    body = body_for()
    members = {**to_wire(body), "d": 1}
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_wire(members, body["uuid"]), Signer([KEY]), job_id=body["uuid"])


def test_a_tagged_rest_that_is_not_json_is_refused() -> None:
    rest = b'"j":"a:B",}'
    env = b'{"s":"' + tag_for(rest, "x" * 32) + b'",' + rest
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(env, Signer([KEY]), job_id="x" * 32)


def test_tags_match_a_plain_hmac_sha256_truncated() -> None:
    for key in (b"k" * 16, b"k" * 64, b"k" * 65, bytes(range(200))):
        signer = Signer([key, OTHER])
        for message in (b"", b"a", b"b" * 1000):
            want = base64.urlsafe_b64encode(
                hmac.new(key, b"ctx" + message, hashlib.sha256).digest()[:16]
            ).rstrip(b"=")
            assert signer.tag(message, b"ctx") == want
            assert signer.verify_tag(message, want, b"ctx")
            assert not signer.verify_tag(message + b"x", want, b"ctx")
        assert Signer([OTHER, key]).verify_tag(b"m", Signer([key]).tag(b"m"))


@pytest.mark.parametrize("raw", [b"[1,2]", b'"text"', b"null", b"{bad json", b"123"])
def test_signed_non_object_bodies_are_refused(raw: bytes) -> None:
    with pytest.raises(PayloadRejected, match="malformed payload"):
        open_envelope(sign_raw(raw), Signer([KEY]), job_id="x" * 32)


# -- property: any mutation of a valid envelope is refused -----------------------------------

_ID, _ENV = sealed(body_for(data={"n": 1, "nested": [[], {}], "s": "\u00e9/"}))

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(_ENV) - 1), st.integers(1, 255)),
    st.tuples(st.just("delete"), st.integers(0, len(_ENV) - 1), st.integers(1, 8)),
    st.tuples(st.just("insert"), st.integers(0, len(_ENV)), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, len(_ENV) - 1), st.just(0)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=8), st.just(0)),
)


def _mutate(env: bytes, m: tuple[Any, ...]) -> bytes:
    kind = m[0]
    if kind == "append":
        return env + m[1]
    at = m[1] % max(1, len(env))  # earlier mutations may have shortened it
    if kind == "flip":
        if not env:
            return env
        b = bytearray(env)
        b[at] ^= m[2]
        return bytes(b)
    if kind == "delete":
        return env[:at] + env[at + m[2] :]
    if kind == "insert":
        return env[:at] + m[2] + env[at:]
    return env[:at]


@settings(
    max_examples=400, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(mutation, min_size=1, max_size=3))
def test_random_mutations_are_each_refused(mutations: list[tuple[Any, ...]]) -> None:
    env = _ENV
    for m in mutations:
        env = _mutate(env, m)
    if env == _ENV:  # mutations that cancel out leave the original, which is valid
        return
    with pytest.raises(PayloadRejected):
        open_envelope(env, Signer([KEY]), job_id=_ID)


def test_signer_matches_a_plain_hmac_sha256_and_is_reusable() -> None:
    """The cached keyed HMAC is copied per message: signatures stay the textbook
    HMAC-SHA256 and one message never leaks into the next."""
    signer = Signer([KEY, OTHER])
    for body in (b"a", b"b" * 1000, b""):
        expected = hmac.new(KEY, body, hashlib.sha256).hexdigest()
        assert signer.sign(body) == expected
        assert signer.verify(body, expected.encode())
        assert signer.verify(body, hmac.new(OTHER, body, hashlib.sha256).hexdigest().encode())


def test_job_ids_are_unique_in_forked_children() -> None:
    """The id generator is reseeded after fork: a parent and its child never repeat."""
    import os

    from tidings.jobs.compose import new_id

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, "".join(new_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parent = {new_id() for _ in range(100)}
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    child = {data[i : i + 32].decode() for i in range(0, len(data), 32)}
    assert len(child) == 100 and len(parent) == 100
    assert not parent & child
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in parent | child)
