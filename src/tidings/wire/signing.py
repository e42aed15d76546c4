"""HMAC-SHA256 signing of payload bodies with the app key.

Envelopes (:mod:`tidings.wire.envelope`) carry a *tag*: HMAC-SHA256 truncated to 128
bits (RFC 2104 section 5, NIST SP 800-107), written as 22 base64url characters.
:meth:`Signer.sign` (64 hex chars, the full MAC) still signs other records and verifies
envelopes queued by earlier versions.

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
import binascii
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
        frame: the envelope frame sealed envelopes are written in (both are opened).
    """

    __slots__ = ("_macs", "_pads", "frame", "prefix")

    def __init__(self, keys: Sequence[bytes], *, prefix: str = "tidings", frame: int = 2) -> None:
        self.prefix = prefix
        self.frame = frame
        """The envelope frame :func:`~tidings.wire.envelope.seal` writes (setting
        ``envelope_frame``): 2, the compact one; 1, the previous one."""
        # One keyed HMAC per key, copied per message: the key schedule and the digest
        # lookup are paid once, not on every job (which, on a cold CPU after an idle
        # wait, is most of a signature's cost).
        self._macs = [hmac.new(k, digestmod=hashlib.sha256) for k in keys]
        # The same HMAC on hashlib's own objects for tags (RFC 2104: H(K^opad, H(K^ipad,
        # m))): the inner and outer states keyed once, copied per message. Half the cost
        # of copying an ``hmac.HMAC`` (~1 us a job instead of ~2.3).
        self._pads = [_keyed_pads(k) for k in keys]

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

    def tag(self, message: bytes, context: bytes = b"") -> bytes:
        """The 22-char base64url HMAC-SHA256-128 tag of ``context`` followed by
        ``message`` (with the signing key)."""
        return _tag(self._pads[0], context, message)

    def verify_tag(self, message: bytes, tag: bytes, context: bytes = b"") -> bool:
        """Constant-time check of a :meth:`tag` against every key."""
        ok = False
        for pads in self._pads:
            ok |= hmac.compare_digest(_tag(pads, context, message), tag)
        return ok


_Pads = tuple["hashlib._Hash", "hashlib._Hash"]
_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _keyed_pads(key: bytes) -> _Pads:
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def _tag(pads: _Pads, context: bytes, message: bytes) -> bytes:
    inner = pads[0].copy()
    inner.update(context)
    inner.update(message)
    outer = pads[1].copy()
    outer.update(inner.digest())
    # 16 bytes are 24 base64 chars, the last two '=' padding: 22 kept.
    return binascii.b2a_base64(outer.digest()[:16], newline=False)[:22].translate(_URLSAFE)


def _hex(base: hmac.HMAC, body: bytes, context: bytes = b"") -> str:
    mac = base.copy()
    if context:
        mac.update(context)
    mac.update(body)
    return mac.hexdigest()
