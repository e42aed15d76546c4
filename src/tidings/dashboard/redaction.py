"""The one place the dashboard removes secrets from job data before showing it.

Text goes through the project's one redaction helper,
:func:`tidings.observability.redaction.redact`;
:func:`redact_value` applies it to a JSON value and blanks credential-named keys.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from tidings.observability.redaction import REDACTED, redact
from tidings.observability.redaction import mask_url as mask_url  # re-exported (older imports)

# Keys whose values are credentials whatever they hold (matched case-insensitively,
# anywhere in the key: ``smtp_password``, ``X-Api-Key``, ``access_token``...).
SECRET_KEYS = re.compile(
    r"(?i)(pass(word|wd)?|secret|token|api[-_]?key|auth|credential|private[-_]?key|cookie|"
    r"session|signature|\bsig\b|otp|pin\b|card|cvv|iban|ssn)"
)


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
        return redact(value, secrets)
    return value
