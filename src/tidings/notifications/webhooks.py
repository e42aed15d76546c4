"""Standard Webhooks v1 signatures: sign what we send, verify what a receiver gets.

The scheme (https://www.standardwebhooks.com/): the secret is ``whsec_`` followed by
base64 key bytes; the signed content is ``{webhook-id}.{webhook-timestamp}.{body}``;
the signature is ``v1,`` + base64(HMAC-SHA256(key, content)). A receiver accepts a
message when the timestamp is within the tolerance of its clock and any of the
space-separated ``v1,…`` entries in ``webhook-signature`` matches (several entries
allow key rotation). ``verify_webhook`` agrees with the reference implementation's
test-suite, including the known-answer vector.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from tidings import _clock
from tidings.errors import ConfigurationError, TidingsError

__all__ = ["WebhookVerificationError", "decode_secret", "sign", "verify_webhook"]

_PREFIX = "whsec_"


class WebhookVerificationError(TidingsError):
    """A received webhook is missing headers, too old or new, or its signature is wrong."""

    permanent = True


def decode_secret(secret: str | bytes) -> bytes:
    """Turn a ``whsec_<base64>`` secret (prefix optional) or raw bytes into the HMAC key.

    Raises:
        ConfigurationError: the secret is empty or not base64 (the secret itself is
            never put in the message).
    """
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret.strip()
        text = text.removeprefix(_PREFIX).rstrip("=")
        try:
            # Unpadded secrets are common: restore exactly the padding base64 needs.
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError("webhook secret is not valid base64") from None
    if not key:
        raise ConfigurationError("webhook secret is empty")
    return key


def sign(secret: str | bytes, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """Sign one message.

    Args:
        secret: ``whsec_…`` secret (prefix optional) or the raw key bytes.
        msg_id: the ``webhook-id`` header value.
        timestamp: the ``webhook-timestamp`` header value (Unix seconds).
        body: the exact request body bytes.

    Returns:
        The ``webhook-signature`` entry, ``v1,<base64>``.
    """
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(decode_secret(secret), to_sign, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return ""


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: float = 300,
    now: float | None = None,
) -> Any:
    """Verify a received webhook and return its parsed JSON body.

    Args:
        secret: the shared ``whsec_…`` secret (prefix optional).
        headers: the request headers; names are matched case-insensitively.
        body: the raw request body, exactly as received.
        tolerance_s: how far the timestamp may be from ``now``, either way.
        now: the receiver's clock in Unix seconds (defaults to the system clock).

    Returns:
        ``json.loads(body)``.

    Raises:
        WebhookVerificationError: a header is missing, the timestamp is not a number
            or outside the tolerance, or no ``v1`` signature matches.
    """
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookVerificationError("missing required webhook headers")
    timestamp = timestamp.strip()
    # ASCII digits only: int() would also take "+1700000000", "1_700_000_000"
    # and non-ASCII digits, which other verifiers refuse.
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 15):
        raise WebhookVerificationError("invalid webhook-timestamp header")
    sent_at = int(timestamp)
    current = _clock.now() if now is None else now
    if sent_at < current - tolerance_s:
        raise WebhookVerificationError("message timestamp too old")
    if sent_at > current + tolerance_s:
        raise WebhookVerificationError("message timestamp too new")

    expected = base64.b64decode(sign(secret, msg_id, timestamp, body)[3:])
    for entry in signatures.split(" "):
        version, _, encoded = entry.partition(",")
        if version != "v1" or not encoded:
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, candidate):
            try:
                return json.loads(body)
            except ValueError:
                raise WebhookVerificationError("body is not valid JSON") from None
    raise WebhookVerificationError("no matching signature found")
