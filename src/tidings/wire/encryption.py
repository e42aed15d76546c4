"""Encrypted payloads: a job's ``data`` sealed with AES-256-GCM before it is signed.

A job, queued listener or notification that inherits :class:`ShouldBeEncrypted` (or
every job, with ``App(encrypt=True)`` / ``TIDINGS_ENCRYPT=1``) travels with its
``data`` field replaced by::

    {"__t": "enc", "k": "<key id>", "v": "<base64: 12-byte nonce | ciphertext | tag>"}

so Redis, its replicas, its RDB/AOF files and the failed store never hold the job's
arguments in clear. The other body fields (id, class name, options) stay readable:
the worker needs them before it can decrypt, and they hold no user data.

Keys: ``TIDINGS_ENCRYPTION_KEY`` (comma-separated, ``base64:`` allowed; the first
encrypts, every one decrypts, so keys rotate without failing queued jobs), else keys
derived from ``TIDINGS_KEY`` with HKDF-SHA256 (one per signing key, same rotation
rule). The associated data binds the ciphertext to its job id and class, so a sealed
``data`` cannot be moved into another job. A payload that fails to decrypt (tampered,
or sealed under a key no longer listed) is refused as a
:class:`~tidings.errors.PayloadRejected` and lands in the failed store with the reason,
still encrypted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Sequence
from typing import Any

import orjson

from tidings import _current
from tidings.errors import ConfigurationError, PayloadRejected
from tidings.wire.envelope import read_body

__all__ = [
    "Keyring",
    "ShouldBeEncrypted",
    "encrypted_key_id",
    "is_encrypted",
    "keyring_from_settings",
    "wants_encryption",
]

_TAG = "enc"
_INFO = b"tidings payload encryption v1"
_NONCE = 12


class ShouldBeEncrypted:
    """Marker: this job's (listener's, notification's) queued data is encrypted."""


def _derive(secret: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret)


def _key_id(key: bytes) -> str:
    # Public, short, and useless to an attacker: a MAC of a constant under the key.
    return hmac.new(key, b"tidings key id", hashlib.sha256).hexdigest()[:8]


def parse_encryption_keys(spec: str) -> list[bytes]:
    """``TIDINGS_ENCRYPTION_KEY`` text to raw secrets (each then run through HKDF).

    Raises:
        ConfigurationError: empty, or a key shorter than 16 bytes.
    """
    keys: list[bytes] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            keys.append(
                base64.b64decode(part[7:], validate=True)
                if part.startswith("base64:")
                else part.encode()
            )
        except ValueError:
            raise ConfigurationError(
                "TIDINGS_ENCRYPTION_KEY: a base64: key is not base64"
            ) from None
    if not keys or any(len(k) < 16 for k in keys):
        raise ConfigurationError(
            "TIDINGS_ENCRYPTION_KEY must hold at least one key of 16 or more bytes"
        )
    return keys


class Keyring:
    """AES-256-GCM keys: the first seals, any of them opens."""

    __slots__ = ("_aeads", "_first")

    def __init__(self, secrets: Sequence[bytes]) -> None:
        """Derive one AES-256 key per secret (HKDF-SHA256).

        Raises:
            ConfigurationError: no secrets, or the ``cryptography`` package is missing.
        """
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # pragma: no cover - cryptography is a core dependency
            raise ConfigurationError(
                "encrypted payloads need the cryptography package: pip install cryptography"
            ) from None
        if not secrets:
            raise ConfigurationError("no encryption key: set TIDINGS_ENCRYPTION_KEY or TIDINGS_KEY")
        self._aeads: dict[str, Any] = {}
        first = ""
        for secret in secrets:
            key = _derive(secret)
            kid = _key_id(key)
            first = first or kid
            self._aeads.setdefault(kid, AESGCM(key))
        self._first = first

    @property
    def key_id(self) -> str:
        """The id of the key that seals (shown by ``failed show``)."""
        return self._first

    def seal(self, data: Any, aad: bytes) -> dict[str, str]:
        """Encrypt the JSON-ready ``data`` into an ``enc`` object."""
        nonce = os.urandom(_NONCE)
        sealed = self._aeads[self._first].encrypt(nonce, orjson.dumps(data), aad)
        return {"__t": _TAG, "k": self._first, "v": base64.b64encode(nonce + sealed).decode()}

    def open(self, sealed: dict[str, Any], aad: bytes) -> Any:
        """Decrypt an ``enc`` object back to the encoded job.

        Raises:
            PayloadRejected: malformed, tampered, or sealed under an unknown key.
        """
        from cryptography.exceptions import InvalidTag

        kid, text = sealed.get("k"), sealed.get("v")
        if not isinstance(kid, str) or not isinstance(text, str):
            raise PayloadRejected("encrypted payload is malformed")
        try:
            raw = binascii.a2b_base64(text, strict_mode=True)
        except (ValueError, binascii.Error):
            raise PayloadRejected("encrypted payload is malformed (not base64)") from None
        if len(raw) < _NONCE + 16:
            raise PayloadRejected("encrypted payload is malformed (too short)")
        aead = self._aeads.get(kid)
        if aead is None:
            raise PayloadRejected(
                f"cannot decrypt payload: it was encrypted with key {kid[:8]!r}, which is not "
                "among this worker's keys (list the old key in TIDINGS_ENCRYPTION_KEY, "
                "after the new one)"
            )
        try:
            plain = aead.decrypt(raw[:_NONCE], raw[_NONCE:], aad)
        except InvalidTag:
            raise PayloadRejected(
                "cannot decrypt payload: verification failed (the ciphertext was altered, "
                "or moved from another job)"
            ) from None
        try:
            return orjson.loads(plain)
        except orjson.JSONDecodeError:
            raise PayloadRejected("encrypted payload is malformed (not JSON)") from None


def keyring_from_settings(encryption_key: str | None, signing_keys: Sequence[bytes]) -> Keyring:
    """The app's keyring: ``TIDINGS_ENCRYPTION_KEY``, else keys derived from TIDINGS_KEY."""
    if encryption_key:
        return Keyring(parse_encryption_keys(encryption_key))
    # HKDF with its own info string: the AES key is independent of the HMAC key.
    return Keyring(list(signing_keys))


def aad_for(job_id: str, job_path: str) -> bytes:
    """Associated data: the ciphertext belongs to this job id and class."""
    return f"tidings:{job_id}:{job_path}".encode()


def wants_encryption(job: Any, app_wide: bool) -> bool:
    """Whether ``job`` is sealed: the app says so, or the job or its option source is
    a ``ShouldBeEncrypted`` (a queued listener's listener, a notification)."""
    if app_wide or isinstance(job, ShouldBeEncrypted):
        return True
    source = getattr(job, "option_source", None)
    return source is not None and isinstance(source(), ShouldBeEncrypted)


def is_encrypted(data: Any) -> bool:
    """Whether a body's ``data`` is an ``enc`` object."""
    return isinstance(data, dict) and data.get("__t") == _TAG


def encrypted_key_id(envelope: bytes) -> str | None:
    """The key id of an envelope whose data is sealed (None: not sealed, or unreadable).
    Reads without verifying: for display only (``failed show``, dashboards)."""
    body = read_body(envelope)
    data = body.get("data") if body is not None else None
    if not isinstance(data, dict) or not is_encrypted(data):
        return None
    kid = data.get("k")
    return kid[:16] if isinstance(kid, str) and kid.isalnum() else "?"


def seal_data(data: Any, job: Any, job_id: str, job_path: str) -> Any:
    """``data`` sealed when ``job`` wants it (uses the current App's keyring)."""
    app = _current._current  # None before any App exists: nothing app-wide then
    settings = getattr(app, "settings", None)
    app_wide = bool(getattr(settings, "encrypt", False))
    if not wants_encryption(job, app_wide):
        return data
    if app is None:
        raise ConfigurationError("encrypted jobs need an App (its keys): create one first")
    keyring: Keyring = app.keyring
    return keyring.seal(data, aad_for(job_id, job_path))


def open_data(body: Any, host: Any) -> Any:
    """A body's ``data``, decrypted when sealed.

    Raises:
        PayloadRejected: sealed but this host has no keyring, or decryption failed.
    """
    data = body["data"]
    if not is_encrypted(data):
        return data
    keyring: Keyring | None = getattr(host, "keyring", None)
    if keyring is None:
        raise PayloadRejected("encrypted payload, but this worker has no encryption keys")
    return keyring.open(data, aad_for(body["uuid"], body["job"]))
