"""HMAC-SHA256 signing of payload bodies with the app key.

``TIDINGS_KEY`` may hold several keys separated by commas: the first signs, all verify,
so a key can be rotated without failing the jobs already queued. A key written as
``base64:...`` is decoded first.

A :class:`Signer` belongs to one App and knows that App's Redis key prefix
(``TIDINGS_PREFIX``): envelopes bind it into what is signed (see
:mod:`tidings.wire.envelope`), so two apps sharing one Redis and one key do not run each
other's jobs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from tidings.errors import ConfigurationError


def parse_keys(spec: str) -> list[bytes]:
    """Turn ``TIDINGS_KEY`` text into the list of key bytes."""
    keys: list[bytes] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        keys.append(base64.b64decode(part[7:]) if part.startswith("base64:") else part.encode())
    if not keys or any(len(k) < 16 for k in keys):
        raise ConfigurationError("TIDINGS_KEY must hold at least one key of 16 or more bytes")
    return keys


class Signer:
    """Signs with the first key; verifies against any.

    Args:
        keys: the key bytes, the signing key first.
        prefix: the Redis key prefix of the App whose envelopes this signer seals and
            opens (bound into every envelope signature).
    """

    __slots__ = ("_macs", "prefix")

    def __init__(self, keys: Sequence[bytes], *, prefix: str = "tidings") -> None:
        self.prefix = prefix
        # One keyed HMAC per key, copied per message: the key schedule and the digest
        # lookup are paid once, not on every job (which, on a cold CPU after an idle
        # wait, is most of a signature's cost).
        self._macs = [hmac.new(k, digestmod=hashlib.sha256) for k in keys]

    def sign(self, body: bytes, context: bytes = b"") -> str:
        """Hex HMAC-SHA256 of ``context`` followed by ``body``.

        ``context`` binds the signature to where the body may be used (an envelope
        passes the key prefix and the queue name), without copying the body.
        """
        return _hex(self._macs[0], body, context)

    def verify(self, body: bytes, signature: bytes, context: bytes = b"") -> bool:
        """Constant-time check of ``signature`` (hex) against every key."""
        ok = False
        for base in self._macs:
            ok |= hmac.compare_digest(_hex(base, body, context).encode(), signature)
        return ok


def _hex(base: hmac.HMAC, body: bytes, context: bytes = b"") -> str:
    mac = base.copy()
    if context:
        mac.update(context)
    mac.update(body)
    return mac.hexdigest()
