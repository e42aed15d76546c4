"""The keyring of encrypted payloads: sealing, rotation, and every way a sealed value can
be malformed (each a PayloadRejected with a reason, never a crash)."""

from __future__ import annotations

import base64

import pytest

from tidings.errors import ConfigurationError, PayloadRejected
from tidings.wire.encryption import (
    Keyring,
    aad_for,
    encrypted_key_id,
    keyring_from_settings,
    parse_encryption_keys,
)

AAD = aad_for("a" * 32, "m:Job")
DATA = {"__t": "dc", "c": "m:Job", "f": {"email": "x@example.org", "n": [1, 2.5, None]}}


def test_round_trip_hides_the_data_and_binds_it_to_the_job() -> None:
    ring = Keyring([b"k" * 32])
    sealed = ring.seal(DATA, AAD)
    assert set(sealed) == {"__t", "k", "v"} and sealed["k"] == ring.key_id
    assert b"example.org" not in base64.b64decode(sealed["v"])
    assert ring.open(sealed, AAD) == DATA
    assert ring.seal(DATA, AAD)["v"] != sealed["v"]  # a fresh nonce every time
    with pytest.raises(PayloadRejected, match="verification failed"):
        ring.open(sealed, aad_for("b" * 32, "m:Job"))


def test_rotation_and_unknown_keys() -> None:
    old, new = Keyring([b"old-key-0123456789"]), Keyring([b"new-key-0123456789"])
    both = Keyring([b"new-key-0123456789", b"old-key-0123456789"])
    assert both.key_id == new.key_id
    assert both.open(old.seal(DATA, AAD), AAD) == DATA
    with pytest.raises(PayloadRejected, match="not among this worker's keys"):
        new.open(old.seal(DATA, AAD), AAD)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda s: {**s, "v": "not base64 !!"},
        lambda s: {**s, "v": base64.b64encode(b"short").decode()},
        lambda s: {**s, "k": 7},
        lambda s: {"__t": "enc"},
        lambda s: {**s, "v": s["v"][:-4] + ("AAAA" if s["v"][-4:] != "AAAA" else "BBBB")},
    ],
)
def test_malformed_sealed_values_are_rejected_with_a_reason(mangle: object) -> None:
    ring = Keyring([b"k" * 32])
    bad = mangle(ring.seal(DATA, AAD))  # type: ignore[operator]
    with pytest.raises(PayloadRejected):
        ring.open(bad, AAD)


def test_key_settings() -> None:
    assert parse_encryption_keys(
        " a-long-enough-key-1 , base64:" + base64.b64encode(b"x" * 16).decode()
    ) == [
        b"a-long-enough-key-1",
        b"x" * 16,
    ]
    for bad in ("", "short", "base64:***"):
        with pytest.raises(ConfigurationError, match="TIDINGS_ENCRYPTION_KEY"):
            parse_encryption_keys(bad)
    derived = keyring_from_settings(None, [b"signing-key-0123456789"])
    explicit = keyring_from_settings("signing-key-0123456789", [b"other-signing-key-000"])
    assert derived.key_id == explicit.key_id  # same HKDF of the same secret
    assert (
        encrypted_key_id(b'{"sig":"x","body":{"data":{"__t":"enc","k":"ab12","v":""}}}') == "ab12"
    )
    assert encrypted_key_id(b'{"sig":"x","body":{"data":[1]}}') is None
    assert encrypted_key_id(b"garbage") is None
