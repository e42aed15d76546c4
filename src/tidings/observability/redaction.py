"""Removing secrets from text before it reaches a log, a CLI line or the failed store.

Every exception text, provider reply and log message that may carry a credential passes
through :func:`redact` (or :func:`clean`, which redacts and *then* shortens: cutting
first could leave the part of a secret that straddles the cut). Dashboards, channels
and CLI code call the same functions.

The secrets it knows are the ones the process registered with :func:`register` (the App
registers ``TIDINGS_KEY``, the SMTP password, SMS tokens and webhook secrets; each
transport registers its own credentials) plus any passed in a call. Each is caught in
these forms:

* verbatim, URL-encoded (``quote``/``quote_plus``, lower-case escapes, every byte
  escaped), JSON- and ``repr``-escaped;
* hex (lower and upper case) of its UTF-8 bytes;
* base64 (standard and URL-safe alphabets), also *inside* a longer base64 run at any
  byte alignment, so the SMTP ``AUTH PLAIN`` blob ``base64("\\0user\\0password")`` and
  ``AUTH LOGIN``'s ``base64(password)`` are caught without knowing the user name; the
  whole base64 run is replaced.

Besides known secrets, anything shaped like a credential is removed: an echoed
``Authorization`` value, ``Basic``/``Bearer`` tokens, ``whsec_`` keys and URL userinfo.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from collections.abc import Iterable

__all__ = [
    "REDACTED",
    "SECRET_KEYS",
    "clean",
    "mask_url",
    "redact",
    "redact_json",
    "register",
    "registered",
    "shorten",
]

REDACTED = "[REDACTED]"

#: Secrets shorter than this are ignored: redacting "abc" everywhere would hide data
#: and protect nothing.
MIN_SECRET_LEN = 6
#: Shortest base64 fragment searched for inside a longer base64 run.
_MIN_CORE = 8

_PATTERNS = (
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*)[^\r\n]+"),
    re.compile(r"(?i)\b((?:basic|bearer)\s+)[A-Za-z0-9+/=._~-]{4,}"),
    re.compile(r"whsec_[A-Za-z0-9+/=]+"),
    re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]*:[^/\s@]*@"),
)
#: Every pattern above needs one of these (lower case) in the text: a cheap pre-check.
_TRIGGERS = ("authorization", "basic", "bearer", "whsec_", "://")
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")

_lock = threading.Lock()
_registered: set[str] = set()
_current: list[tuple[re.Pattern[str] | None, re.Pattern[str] | None] | None] = [None]
_cache: dict[frozenset[str], tuple[re.Pattern[str] | None, re.Pattern[str] | None]] = {}


def register(*secrets: str | bytes | None) -> None:
    """Make every later :func:`redact` call in this process remove ``secrets``.

    ``None`` and secrets shorter than :data:`MIN_SECRET_LEN` are ignored. Bytes are
    decoded as UTF-8 (undecodable keys are registered by their hex and base64 forms).
    """
    with _lock:
        for secret in secrets:
            if isinstance(secret, bytes):
                raw = secret
                try:
                    secret = raw.decode("utf-8")
                except UnicodeDecodeError:
                    _registered.add(raw.hex())
                    _registered.add(base64.b64encode(raw).decode("ascii"))
                    continue
            if secret and len(secret) >= MIN_SECRET_LEN:
                _registered.add(secret)
        _cache.clear()
        _current[0] = None


def registered() -> frozenset[str]:
    """The secrets registered so far (for tests and diagnostics; never log them)."""
    with _lock:
        return frozenset(_registered)


def _cores(raw: bytes) -> set[str]:
    """Base64 fragments that appear wherever ``raw`` sits inside a base64 stream."""
    cores: set[str] = set()
    for align in range(3):
        encoded = base64.b64encode(b"\0" * align + raw).decode("ascii")
        full = 4 * ((align + len(raw)) // 3)
        core = encoded[(4 if align else 0) : full]
        if len(core) >= _MIN_CORE:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


def _forms(secrets: frozenset[str]) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """One compiled alternation of every plain form, one of every base64 core."""
    cached = _cache.get(secrets)
    if cached is not None:
        return cached
    plain: set[str] = set()
    cores: set[str] = set()
    for secret in secrets:
        raw = secret.encode("utf-8", "surrogatepass")
        every_byte = "".join(f"%{b:02X}" for b in raw)  # percent-encoding of every byte
        plain |= {
            every_byte,
            every_byte.lower(),
            re.sub(
                "%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(secret, safe="")
            ),
            secret,
            urllib.parse.quote(secret, safe=""),
            urllib.parse.quote_plus(secret),
            json.dumps(secret)[1:-1],
            repr(secret)[1:-1],
            raw.hex(),
            raw.hex().upper(),
            base64.b64encode(raw).decode("ascii"),
            base64.urlsafe_b64encode(raw).decode("ascii"),
            base64.b64encode(raw).decode("ascii").rstrip("="),
        }
        cores |= _cores(raw)

    def alternation(forms: set[str]) -> re.Pattern[str] | None:
        # Longest first, so a secret that contains another is removed whole.
        ordered = sorted((f for f in forms if len(f) >= 4), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, ordered))) if ordered else None

    result = (alternation(plain), alternation(cores))
    if len(_cache) > 64:
        _cache.clear()
    _cache[secrets] = result
    return result


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove every known secret (registered and ``secrets``) from ``text``.

    Args:
        text: the message to clean.
        secrets: extra strings that must not appear; empty and short ones are ignored.

    Returns:
        ``text`` with each secret, in each encoding, replaced by ``[REDACTED]``.
    """
    if not isinstance(text, str):
        text = str(text)
    extra = {s for s in secrets if s and len(s) >= MIN_SECRET_LEN}
    with _lock:
        if extra - _registered:
            plain, cores = _forms(frozenset(_registered | extra))
        else:  # the common case: only registered secrets (compiled once per change)
            state = _current[0]
            if state is None:
                state = _current[0] = _forms(frozenset(_registered))
            plain, cores = state
    if cores is not None and cores.search(text):
        # A secret inside a longer base64 run (AUTH PLAIN): the whole run goes, user
        # name and all (before the plain pass, which would remove only the secret).
        found = cores
        text = _B64_RUN.sub(lambda m: REDACTED if found.search(m.group(0)) else m.group(0), text)
    if plain is not None:
        text = plain.sub(REDACTED, text)
    low = text.lower()
    if any(trigger in low for trigger in _TRIGGERS):
        for pattern in _PATTERNS:
            text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


#: Keys whose values are credentials whatever they hold (matched case-insensitively,
#: anywhere in the key: ``smtp_password``, ``X-Api-Key``, ``access_token``...).
SECRET_KEYS = re.compile(
    r"(?i)(pass(word|wd)?|secret|token|api[-_]?key|auth|credential|private[-_]?key|cookie|"
    r"session|signature|\bsig\b|otp|pin\b|card|cvv|iban|ssn)"
)


def redact_json(value: object, secrets: Iterable[str | None] = (), _depth: int = 0) -> object:
    """A decoded JSON value with its secrets removed, keys as well as values.

    Strings (keys included: ``{"https://bob:pw@h/": 1}`` carries a password in its key)
    go through :func:`redact`; the value of a key that names a credential (see
    :data:`SECRET_KEYS`) is replaced whole. Two keys that redact to the same text stay
    two entries (`` (2)`` is added). Nesting deeper than 50 levels is replaced.

    Args:
        value: what ``json.loads`` / ``orjson.loads`` returned.
        secrets: extra strings that must not appear (as for :func:`redact`).

    Returns:
        A new value of the same shape; ``value`` is not changed.
    """
    extra = tuple(secrets)
    if _depth > 50:
        return REDACTED
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            shown = redact(str(key), extra)
            if shown in out:
                n = 2
                while f"{shown} ({n})" in out:
                    n += 1
                shown = f"{shown} ({n})"
            secret_key = SECRET_KEYS.search(str(key)) is not None
            out[shown] = REDACTED if secret_key else redact_json(item, extra, _depth + 1)
        return out
    if isinstance(value, list):
        return [redact_json(item, extra, _depth + 1) for item in value]
    if isinstance(value, str):
        return redact(value, extra)
    return value


def shorten(text: str, limit: int = 300) -> str:
    """Collapse whitespace and cut ``text`` to ``limit`` characters (no redaction)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean(text: str, limit: int = 300, secrets: Iterable[str | None] = ()) -> str:
    """Redact, then shorten: the one way peer text becomes a message."""
    return shorten(redact(text, secrets), limit)


_QUERY_SECRET = re.compile(r"(?i)((?:pass(?:word)?|secret|token|key|auth|sid)[^=&]*=)[^&]*")


def mask_url(url: str) -> str:
    """A URL with its password (and query secrets) masked, for banners and pages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}" if user else f":***@{host}"
    query = _QUERY_SECRET.sub(r"\1***", parts.query)
    out = f"{parts.scheme}://{netloc}{parts.path}"
    return out + (f"?{query}" if query else "")
