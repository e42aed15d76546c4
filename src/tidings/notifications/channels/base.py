"""What every transport shares: the delivery result, secret redaction, Retry-After.

Transports know nothing about notifiables or the queue: they take a finished message
and a ``delivery_id`` (stable across retries, so a receiver can de-duplicate) and
either return a :class:`DeliveryResult` or raise a
:class:`~tidings.errors.TransientChannelError` (retry) /
:class:`~tidings.errors.PermanentChannelError` (give up). Every error message passes
through :func:`redact` first, because messages end up in logs and the failed store.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from tidings import _clock
from tidings.errors import ConfigurationError
from tidings.observability import redaction as _redaction
from tidings.observability.redaction import REDACTED

__all__ = [
    "MAX_RETRY_AFTER_S",
    "REDACTED",
    "DeliveryResult",
    "find_cause",
    "message_for",
    "parse_query",
    "parse_retry_after",
    "redact",
    "safe_cause",
    "shorten",
]

#: Longest delay a peer's ``Retry-After`` may impose (a "10 days" header is capped).
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What a transport reports after handing a message over.

    Attributes:
        channel: ``mail``, ``sms`` or ``webhook``.
        delivery_id: the stable id the message carried (Message-ID, webhook-id,
            idempotency key).
        response: the peer's reply, shortened and redacted (for SMTP it also lists
            recipients the server refused).
        provider_id: the provider's id for the message (Twilio SID, Vonage id).
        status: SMTP reply code or HTTP status, when there is one.
    """

    channel: str
    delivery_id: str
    response: str
    provider_id: str | None = None
    status: int | None = None


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove secrets from ``text`` before it is logged or raised.

    The one redaction helper, :func:`tidings.observability.redaction.redact`: ``secrets`` plus every
    secret registered in the process, verbatim, URL-encoded, hex and base64 (also inside
    a longer base64 run, as in SMTP ``AUTH PLAIN``), and whatever looks like an
    Authorization value, a Basic/Bearer token, a ``whsec_`` secret or URL userinfo.
    """
    return _redaction.redact(text, secrets)


def safe_cause(exc: BaseException, secrets: Iterable[str | None]) -> BaseException | None:
    """Return ``exc`` to chain (``raise … from``) only if no exception in its chain
    carries a secret.

    Chained exceptions are printed in tracebacks and failed-store records, so a chain
    any of whose messages would need redacting is dropped instead.
    """
    secrets = list(secrets)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        text = f"{current!s} {current!r}"
        if redact(text, secrets) != text:
            return None
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return exc


def find_cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """Return the first exception of type ``kind`` in ``exc``'s cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def shorten(text: str, limit: int = 300) -> str:
    """Redact the registered secrets, then collapse whitespace and cut to ``limit``.

    Redacting first matters: a secret straddling the cut would otherwise survive in part.
    """
    return _redaction.clean(text, limit)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Parse a ``Retry-After`` header: delay-seconds or an HTTP-date.

    Args:
        value: the header value, or None when absent.
        now: current Unix time, for HTTP-dates (defaults to the clock).

    Returns:
        Seconds to wait, between 0 and :data:`MAX_RETRY_AFTER_S`; None when the
        header is absent or junk (the caller's own backoff applies then).
    """
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = _clock.now() if now is None else now
    delay = (when - datetime.fromtimestamp(current, UTC)).total_seconds()
    return min(max(delay, 0.0), MAX_RETRY_AFTER_S)


def parse_query(query: str) -> dict[str, str]:
    """Parse a DSN query string, keeping ``+`` literal (``?from=+15551234567``).

    ``urllib.parse.parse_qs`` would turn that ``+`` into a space, as HTML forms do.
    """
    params: dict[str, str] = {}
    for pair in query.split("&"):
        if pair:
            key, _, value = pair.partition("=")
            params[urllib.parse.unquote(key)] = urllib.parse.unquote(value)
    return params


def message_for(notification: Any, channel: str, notifiable: Any) -> Any:
    """The message ``notification.to_<channel>(notifiable)`` returns.

    Raises:
        ConfigurationError: the notification has no ``to_<channel>``.
    """
    method = getattr(notification, f"to_{channel}", None)
    if method is None:
        raise ConfigurationError(
            f"{type(notification).__qualname__} has no to_{channel}(notifiable)"
        )
    return method(notifiable)
