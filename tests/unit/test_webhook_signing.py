"""Standard Webhooks signing and verification (RELIABILITY B18).

The cases follow ``standard-webhooks/libraries/python/tests/test_webhooks.py``.
"""

from __future__ import annotations

import time

import pytest

from tidings.errors import ConfigurationError
from tidings.notifications.webhooks import (
    WebhookVerificationError,
    decode_secret,
    sign,
    verify_webhook,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
BODY = b'{"test": 2432232314}'
KAT_TIMESTAMP = 1614265330
KAT_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers_at(timestamp: int, secret: str = SECRET) -> dict[str, str]:
    return {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, MSG_ID, timestamp, BODY),
    }


def test_known_answer_vector() -> None:
    assert sign(SECRET, MSG_ID, KAT_TIMESTAMP, BODY) == KAT_SIGNATURE
    assert sign(SECRET, MSG_ID, str(KAT_TIMESTAMP), BODY) == KAT_SIGNATURE


def test_known_answer_vector_verifies_at_its_time() -> None:
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(KAT_TIMESTAMP),
        "webhook-signature": KAT_SIGNATURE,
    }
    assert verify_webhook(SECRET, headers, BODY, now=KAT_TIMESTAMP + 10) == {"test": 2432232314}


def test_valid_signature_returns_json() -> None:
    assert verify_webhook(SECRET, headers_at(int(time.time())), BODY)["test"] == 2432232314


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header_raises(missing: str) -> None:
    headers = headers_at(int(time.time()))
    del headers[missing]
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, BODY)


def test_header_names_are_case_insensitive() -> None:
    headers = {k.title(): v for k, v in headers_at(int(time.time())).items()}
    assert verify_webhook(SECRET, headers, BODY) == {"test": 2432232314}


@pytest.mark.parametrize("text", ["hello", "", "12.5", "1e9"])
def test_invalid_timestamp_raises(text: str) -> None:
    headers = headers_at(int(time.time()))
    headers["webhook-timestamp"] = text
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, BODY)


@pytest.mark.parametrize("offset", [-301, 301])
def test_timestamp_outside_tolerance_raises(offset: int) -> None:
    now = 1_700_000_000
    with pytest.raises(WebhookVerificationError, match=r"too (old|new)"):
        verify_webhook(SECRET, headers_at(now + offset), BODY, now=now)


@pytest.mark.parametrize("offset", [-299, 0, 299])
def test_timestamp_inside_tolerance_passes(offset: int) -> None:
    now = 1_700_000_000
    assert verify_webhook(SECRET, headers_at(now + offset), BODY, now=now)


def test_invalid_signature_raises() -> None:
    headers = headers_at(int(time.time()))
    headers["webhook-signature"] = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
    with pytest.raises(WebhookVerificationError, match="no matching"):
        verify_webhook(SECRET, headers, BODY)


def test_tampered_body_raises() -> None:
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers_at(int(time.time())), b'{"test": 2432232315}')


def test_multi_signature_with_one_valid_passes() -> None:
    headers = headers_at(int(time.time()))
    headers["webhook-signature"] = " ".join(
        [
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            headers["webhook-signature"],
            "garbage",
            "v1,not-base64!!",
        ]
    )
    assert verify_webhook(SECRET, headers, BODY)["test"] == 2432232314


def test_secret_with_and_without_prefix() -> None:
    headers = headers_at(int(time.time()))
    assert verify_webhook(SECRET.removeprefix("whsec_"), headers, BODY)
    assert verify_webhook(SECRET, headers, BODY)
    assert decode_secret(SECRET) == decode_secret(SECRET.removeprefix("whsec_"))


def test_other_secret_fails() -> None:
    headers = headers_at(int(time.time()), secret="whsec_" + "QUFBQUFBQUFBQUFBQUFBQQ==")
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, BODY)


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!!!"])
def test_bad_secret_is_a_configuration_error(secret: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        sign(secret, MSG_ID, KAT_TIMESTAMP, BODY)
    assert "!!!!" not in str(info.value)


def test_non_json_body_raises_after_valid_signature() -> None:
    now = int(time.time())
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(now),
        "webhook-signature": sign(SECRET, MSG_ID, now, b"not json"),
    }
    with pytest.raises(WebhookVerificationError, match="JSON"):
        verify_webhook(SECRET, headers, b"not json")
