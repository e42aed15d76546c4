"""The one place the dashboard removes secrets from job data before showing it.

Text goes through the project's one redaction helper,
:func:`tidings.observability.redaction.redact`; JSON values (keys and values alike)
through :func:`tidings.observability.redaction.redact_json`, which the CLI uses too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tidings.observability.redaction import SECRET_KEYS as SECRET_KEYS  # re-exported
from tidings.observability.redaction import mask_url as mask_url  # re-exported (older imports)
from tidings.observability.redaction import redact_json


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
    """A JSON value with credential-named keys blanked and secrets removed from strings
    and keys (:func:`tidings.observability.redaction.redact_json`)."""
    return redact_json(value, secrets)
