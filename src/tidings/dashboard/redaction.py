"""The one place the dashboard removes secrets from job data before showing it.

Swap :func:`redact_text` for the project's central redaction helper when there is one;
everything the dashboard shows from a payload, an exception or a worker passes here.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from tidings.notifications.channels.base import REDACTED, redact

# Keys whose values are credentials whatever they hold (matched case-insensitively,
# anywhere in the key: ``smtp_password``, ``X-Api-Key``, ``access_token``...).
SECRET_KEYS = re.compile(
    r"(?i)(pass(word|wd)?|secret|token|api[-_]?key|auth|credential|private[-_]?key|cookie|"
    r"session|signature|\bsig\b|otp|pin\b|card|cvv|iban|ssn)"
)


_QUERY_SECRET = re.compile(r"(?i)((?:pass(?:word)?|secret|token|key|auth|sid)[^=&]*=)[^&]*")


def app_secrets(app: Any) -> list[str]:
    """Secrets of the App's own settings (the signing key, transport passwords)."""
    s = app.settings
    out = [s.key, s.webhook_secret]
    for url in (s.redis_url, s.mail_url, s.sms_url, *s.connections.values()):
        try:
            parts = urlsplit(url)
        except ValueError:
            continue
        out += [parts.password, parts.username and parts.password and parts.username]
    return [x for x in out if x and len(x) >= 4]


def redact_text(text: str, secrets: list[str]) -> str:
    """``text`` without the secrets and anything that looks like a credential."""
    return redact(text, secrets)


def redact_value(value: Any, secrets: list[str], depth: int = 0) -> Any:
    """A JSON value with credential-named keys blanked and secrets removed from strings."""
    if depth > 50:
        return REDACTED
    if isinstance(value, dict):
        return {
            k: (REDACTED if SECRET_KEYS.search(str(k)) else redact_value(v, secrets, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_value(v, secrets, depth + 1) for v in value]
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


def mask_url(url: str) -> str:
    """A URL with its password (and query secrets) masked, for banners and pages."""
    try:
        parts = urlsplit(url)
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
