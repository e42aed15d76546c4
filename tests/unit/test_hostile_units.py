"""Hostile input, the parts that need no server: redaction, terminal escaping, webhook
timestamps, attachment limits, the embedded default's file modes and key race."""

from __future__ import annotations

import base64
import os
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tidings.errors import ValidationError
from tidings.notifications.channels.base import shorten
from tidings.notifications.messages import MAX_ATTACHMENT_BYTES, MailMessage, RenderedMail
from tidings.notifications.mime import MAX_MESSAGE_BYTES, build_email
from tidings.notifications.webhooks import WebhookVerificationError, sign, verify_webhook
from tidings.observability import redaction
from tidings.observability.terminal import escape, escape_json

SECRET = "unit-redaction-secret-Zq9!x/y"


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    redaction.register(SECRET)


# -- redaction -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        SECRET,
        urllib.parse.quote(SECRET, safe=""),
        urllib.parse.quote_plus(SECRET),
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
        base64.b64encode(SECRET.encode()).decode(),
        base64.urlsafe_b64encode(SECRET.encode()).decode(),
        base64.b64encode(SECRET.encode()).decode().rstrip("="),
        urllib.parse.quote(SECRET, safe="").replace("%2F", "%2f"),
        "".join(f"%{b:02x}" for b in SECRET.encode()),
    ],
    ids=[
        "plain",
        "quote",
        "quote-plus",
        "hex",
        "HEX",
        "b64",
        "b64url",
        "b64-nopad",
        "quote-lower",
        "every-byte",
    ],
)
def test_each_form_of_a_registered_secret_is_removed(form: str) -> None:
    out = redaction.redact(f"server said: {form} (end)")
    assert form not in out and "[REDACTED]" in out and out.endswith("(end)")


@pytest.mark.parametrize("user", ["", "a", "ab", "ada@example.org", "x" * 40])
def test_auth_plain_blob_with_any_user_name_is_removed_whole(user: str) -> None:
    blob = base64.b64encode(f"{user}\0{user}\0{SECRET}".encode()).decode()
    out = redaction.redact(f"535 5.7.8 {blob} rejected")
    assert out == "535 5.7.8 [REDACTED] rejected"


def test_secret_at_every_offset_inside_a_base64_stream_is_caught() -> None:
    for before in range(6):
        for after in range(4):
            raw = b"p" * before + SECRET.encode() + b"s" * after
            encoded = base64.b64encode(raw).decode()
            assert "[REDACTED]" in redaction.redact(encoded), (before, after)


def test_redact_first_then_shorten_leaves_no_piece_of_a_secret_across_the_cut() -> None:
    text = "x" * 290 + " " + SECRET + " tail"
    old_way = redaction.redact(redaction.shorten(text, 300), [SECRET])
    assert SECRET[:8] in old_way  # cut before redacting: a partial secret survives
    for cut in (295, 300, 305):
        out = redaction.clean(text, cut)
        assert not any(SECRET[i : i + 6] in out for i in range(len(SECRET) - 5))
    assert SECRET[:8] not in shorten(text, 300)  # the channels' shorten redacts first


def test_short_values_are_not_treated_as_secrets() -> None:
    redaction.register("abc", None, "")
    assert redaction.redact("abc abcdef") == "abc abcdef"


def test_undecodable_key_bytes_are_registered_by_hex_and_base64() -> None:
    key = b"\xff\xfe" + os.urandom(16)
    redaction.register(key)
    assert redaction.redact(key.hex()) == "[REDACTED]"
    assert redaction.redact(base64.b64encode(key).decode()) == "[REDACTED]"


def test_credential_shapes_are_removed_without_being_registered() -> None:
    out = redaction.redact(
        "Authorization: Basic dXNlcjpwYXNz\nBearer abc.def-123 whsec_QUJDREVGR0g= "
        "redis://user:hunter2@host:6379/0"
    )
    for piece in ("dXNlcjpwYXNz", "abc.def-123", "QUJDREVGR0g", "hunter2"):
        assert piece not in out


# -- terminal escaping ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sequence",
    ["\x1b]52;c;aGk=\x07", "\x1b[2K", "\x9b2J", "\x85", "\x7f", "\r", "\x00", "\u202e", "\u2066"],
)
def test_escape_turns_control_and_bidi_characters_into_visible_text(sequence: str) -> None:
    out = escape(f"a{sequence}b")
    assert out.isprintable() and out.startswith("a") and out.endswith("b")
    assert "\\x" in out or "\\u" in out


def test_escape_keeps_newlines_only_in_multiline_mode() -> None:
    assert escape("a\nb\tc") == "a\\x0ab\\x09c"
    assert escape("a\nb\tc\x1b", multiline=True) == "a\nb\tc\\x1b"
    assert escape("\udcff") == "\\udcff"  # a surrogate from undecodable bytes


def test_escape_json_keeps_the_data_and_drops_the_raw_characters() -> None:
    import json

    import orjson

    data = {"k\x9b": "v\x1b\u202e\x85"}
    encoded = escape_json(orjson.dumps(data).decode())
    assert not any(c in encoded for c in "\x9b\x1b\u202e\x85")
    assert json.loads(encoded) == data


# -- verify_webhook: ASCII digits only --------------------------------------------------------

WH_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.mark.parametrize(
    "spelling",
    ["+{t}", "{a}_{b}", "{arabic}", "{t}\u0660", "-0{t}", " {t}x"],
    ids=["plus", "underscore", "arabic-indic", "trailing-non-ascii", "minus", "junk"],
)
def test_verify_webhook_accepts_ascii_digits_only(spelling: str) -> None:
    now = int(time.time())
    arabic = "".join(chr(0x660 + int(c)) for c in str(now))
    text = spelling.format(t=now, a=str(now)[:4], b=str(now)[4:], arabic=arabic)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": text,
        "webhook-signature": sign(WH_SECRET, "msg_1", text, b"{}"),
    }
    with pytest.raises(WebhookVerificationError, match="invalid webhook-timestamp"):
        verify_webhook(WH_SECRET, headers, b"{}", now=now)


# -- attachment limits -------------------------------------------------------------------------


def test_byte_attachments_have_the_file_limit() -> None:
    with pytest.raises(ValidationError, match="25 MiB"):
        MailMessage().attach(b"\0" * (MAX_ATTACHMENT_BYTES + 1), "big.bin")
    MailMessage().attach(b"\0" * 1024, "small.bin")


def test_the_whole_message_has_a_limit() -> None:
    part = b"\0" * (MAX_ATTACHMENT_BYTES - 1)
    message = MailMessage().attach(part, "a.bin").attach(part, "b.bin")
    with pytest.raises(ValidationError, match="MiB with its attachments"):
        build_email(
            RenderedMail("s", "<p>h</p>", "h"),
            to="a@example.org",
            mail_from="noreply@example.org",
            message_id="m1",
            attachments=message.attachments,
        )
    assert MAX_MESSAGE_BYTES < 2 * MAX_ATTACHMENT_BYTES


# -- the embedded default ----------------------------------------------------------------------


def test_the_key_file_is_created_once_under_a_race(tmp_path: Path) -> None:
    from tidings.ops.embedded import embedded_key

    for round_ in range(40):
        home = tmp_path / f"r{round_}"
        barrier = threading.Barrier(8)
        keys: list[str] = []
        errors: list[BaseException] = []

        def start(
            barrier: threading.Barrier = barrier,
            home: Path = home,
            keys: list[str] = keys,
            errors: list[BaseException] = errors,
        ) -> None:
            barrier.wait()
            try:
                keys.append(embedded_key(home))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(set(keys)) == 1 and len(keys[0]) >= 32
        assert stat.S_IMODE((home / "key").stat().st_mode) == 0o600
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert [p.name for p in home.iterdir()] == ["key"]  # no temporary file left


def test_an_existing_world_readable_home_is_tightened(tmp_path: Path) -> None:
    from tidings.ops.embedded import embedded_key

    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    embedded_key(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


# -- queue and key prefix binding, and the legacy window ---------------------------------------


def _body(pushed_at: float) -> dict[str, object]:
    return {
        "uuid": "a" * 32,
        "displayName": "J",
        "job": "app:J",
        "data": {},
        "maxTries": None,
        "maxExceptions": None,
        "backoff": None,
        "timeout": None,
        "retryUntil": None,
        "pushedAt": pushed_at,
        "chain": [],
        "chainCatch": None,
    }


def test_signatures_bind_the_queue_and_legacy_ones_expire() -> None:
    import hashlib
    import hmac

    import orjson

    from tidings.errors import PayloadRejected
    from tidings.wire.envelope import LEGACY_SIGNATURE_WINDOW_S, open_envelope, seal
    from tidings.wire.signing import Signer

    key = b"k" * 32
    signer = Signer([key])
    body = _body(time.time())
    env = seal(body, signer, max_bytes=1 << 20, queue="emails")  # type: ignore[arg-type]
    assert open_envelope(env, signer, job_id="a" * 32, queue="emails")["uuid"] == "a" * 32
    for other in ("default", "emails2", "email", ""):
        with pytest.raises(PayloadRejected, match="for queue"):
            open_envelope(env, signer, job_id="a" * 32, queue=other)

    def legacy(pushed_at: float) -> bytes:
        raw = orjson.dumps(_body(pushed_at))
        sig = hmac.new(key, raw, hashlib.sha256).hexdigest().encode()
        return b'{"sig":"' + sig + b'","body":' + raw + b"}"

    # Queued by a version before the binding: runs on any queue while recent ...
    assert open_envelope(legacy(time.time() - 60), signer, job_id="a" * 32, queue="x")
    # ... and is refused once older than the window.
    old = time.time() - LEGACY_SIGNATURE_WINDOW_S - 60
    with pytest.raises(PayloadRejected, match="older tidings"):
        open_envelope(legacy(old), signer, job_id="a" * 32, queue="x")


def test_signatures_bind_the_key_prefix_and_queue_bound_ones_expire() -> None:
    import hashlib
    import hmac

    import orjson

    from tidings.errors import PayloadRejected
    from tidings.wire.envelope import LEGACY_SIGNATURE_WINDOW_S, open_envelope, seal
    from tidings.wire.signing import Signer

    key = b"k" * 32
    ours, theirs = Signer([key], prefix="app-a"), Signer([key], prefix="app-b")
    body: Any = _body(time.time())
    env = seal(body, ours, max_bytes=1 << 20, queue="emails")
    assert open_envelope(env, ours, job_id="a" * 32, queue="emails")["uuid"] == "a" * 32
    # Another app on the same Redis with the same key, under its own prefix: refused.
    for prefix in ("app-b", "app-a:", "app", "tidings", ""):
        with pytest.raises(PayloadRejected, match="under key prefix"):
            open_envelope(env, Signer([key], prefix=prefix), job_id="a" * 32, queue="emails")
    # Names are length-prefixed: moving a character from the prefix to the queue fails.
    shifted = seal(body, Signer([key], prefix="ab"), max_bytes=1 << 20, queue="c")
    with pytest.raises(PayloadRejected, match="bad signature"):
        open_envelope(shifted, Signer([key], prefix="a"), job_id="a" * 32, queue="bc")

    def queue_bound(pushed_at: float, queue: str) -> bytes:
        raw = orjson.dumps(_body(pushed_at))
        bound = b"tidings:queue:%d:%s\n" % (len(queue), queue.encode())
        sig = hmac.new(key, bound + raw, hashlib.sha256).hexdigest().encode()
        return b'{"sig":"' + sig + b'","body":' + raw + b"}"

    # Queued by a version that bound the queue but not the prefix: runs under any
    # prefix, on its own queue only, while recent ...
    recent = queue_bound(time.time() - 60, "emails")
    assert open_envelope(recent, theirs, job_id="a" * 32, queue="emails")
    with pytest.raises(PayloadRejected, match="for queue"):
        open_envelope(recent, theirs, job_id="a" * 32, queue="default")
    # ... and is refused once older than the same window as body-only envelopes.
    old = queue_bound(time.time() - LEGACY_SIGNATURE_WINDOW_S - 60, "emails")
    with pytest.raises(PayloadRejected, match=r"without the key prefix binding \(an older"):
        open_envelope(old, ours, job_id="a" * 32, queue="emails")
