"""Webhook transport: a signed JSON POST that cannot be turned against the network inside.

Request::

    POST <url>
    content-type: application/json
    webhook-id: <delivery_id>          same on every retry, so receivers de-duplicate
    webhook-timestamp: <unix seconds>  fresh per attempt
    webhook-signature: v1,<base64>     fresh per attempt (Standard Webhooks)

    {"type": "...", "timestamp": "2026-01-01T00:00:00Z", "data": {...}}

Before any connect the URL is vetted, resolved once and pinned (see
:mod:`tidings.notifications.net`). Redirects are never followed. One deadline covers
the whole attempt — connect, send, headers and body — and at most
``max_response_bytes`` of the body are read (undecoded, so a gzip bomb stays small)
before the connection is closed.

Outcomes: ``2xx`` delivered; ``410`` :class:`WebhookGoneError` (permanent, the
endpoint should be disabled); ``429``/``5xx``/``408`` transient with ``Retry-After``;
``3xx`` and other ``4xx`` permanent; connect failures and timeouts transient.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import ssl
import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from tidings import _clock
from tidings.errors import (
    ChannelError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.notifications.channels.base import (
    DeliveryResult,
    find_cause,
    parse_retry_after,
    redact,
    shorten,
)
from tidings.notifications.messages import WebhookMessage
from tidings.notifications.net import (
    PinnedTransport,
    Resolver,
    SystemResolver,
    check_url,
    pinned,
    read_capped,
    resolve_target,
)
from tidings.notifications.validation import validate_delivery_id, validate_header
from tidings.notifications.webhooks import decode_secret, sign
from tidings.observability import redaction

__all__ = ["WebhookGoneError", "WebhookTransport"]

_log = logging.getLogger("tidings.webhook")
_USER_AGENT = "tidings-webhooks/1"


def _settle_sniffio() -> None:
    """Make a missing ``sniffio`` cheap to find missing, again and again.

    httpcore asks ``import sniffio`` each time it sets up a lock, event or semaphore —
    about ten times per request. Recent anyio and httpx no longer install sniffio, and
    Python does not remember a failed import, so each of those walks ``sys.path``
    (~0.2 ms per request, a third of a webhook's CPU). ``None`` in ``sys.modules`` is
    Python's own "known missing" mark: ``import sniffio`` still raises ImportError and
    httpcore still falls back to asyncio, now at once. A no-op when sniffio is installed.
    """
    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


_settle_sniffio()


class WebhookGoneError(PermanentChannelError):
    """The endpoint answered ``410 Gone``: stop sending to it (``disabled`` is True)."""

    disabled = True


def _encode(message: WebhookMessage) -> bytes:
    if not isinstance(message.data, dict):
        raise ValidationError("webhook data must be a dict", field="data")
    event_type = validate_header(message.type or "notification", "type")
    now = datetime.fromtimestamp(_clock.now(), UTC).isoformat().replace("+00:00", "Z")
    payload = {"type": event_type, "timestamp": now, "data": message.data}
    try:
        return orjson.dumps(payload, default=_json_default)
    except TypeError as exc:
        raise ValidationError(
            f"webhook data is not JSON-serializable: {exc}", field="data"
        ) from None


def _json_default(value: Any) -> Any:
    # Decimal and other number-like values keep their exact text.
    if type(value).__name__ == "Decimal":
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(type(value).__name__)


class WebhookTransport:
    """POSTs :class:`WebhookMessage` payloads through a pinned, guarded httpx client."""

    def __init__(
        self,
        *,
        secret: str | None,
        allow_private: bool,
        resolver: Resolver | None = None,
        deadline_s: float = 10.0,
        max_response_bytes: int = 65536,
        connect_timeout_s: float = 5.0,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Configure the transport; no connection is made until the first send.

        Args:
            secret: ``whsec_…`` signing secret; None sends unsigned (with a warning).
            allow_private: allow private, loopback and link-local targets.
            resolver: DNS resolver (default: the system's, via the event loop).
            deadline_s: bound on one whole attempt.
            max_response_bytes: most response-body bytes read.
            connect_timeout_s: bound on DNS and on the TCP/TLS connect.
            verify: TLS verification; an ``SSLContext`` trusts a private CA.

        Raises:
            ConfigurationError: the secret is not valid base64.
        """
        self._key = decode_secret(secret) if secret else None
        self._secrets: list[str | None] = [secret]
        self._endpoint_keys: dict[str, bytes] = {}
        redaction.register(*self._secrets)  # every log line and CLI line redacts them
        self._allow_private = allow_private
        self._resolver: Resolver = resolver or SystemResolver()
        self._deadline_s, self._cap = deadline_s, max_response_bytes
        self._connect_timeout_s = connect_timeout_s
        self._warned = False
        timeout = httpx.Timeout(deadline_s, connect=connect_timeout_s)
        self._transport = PinnedTransport(verify=verify)
        # The client only builds requests (URL, default headers, timeouts) and owns the
        # pool; requests go straight to the transport (see send()).
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
        )

    async def send(
        self, url: str, message: WebhookMessage, delivery_id: str, *, secret: str | None = None
    ) -> DeliveryResult:
        """POST ``message`` to ``url`` (the caller picks ``message.url`` over the route).

        ``secret`` signs this delivery instead of the transport's own (per-endpoint
        secrets); the transport's is the fallback.

        Raises:
            ValidationError: forbidden or malformed URL, or unserializable data.
            WebhookGoneError: the endpoint answered 410.
            TransientChannelError: 429, 5xx, 408, timeouts, connect failures, DNS.
            PermanentChannelError: 3xx, other 4xx, unknown host.
        """
        if self._client.is_closed:
            raise RuntimeError("the webhook transport has been closed")
        validate_delivery_id(delivery_id)
        target = check_url(url, self._allow_private)
        key = self._key_for(secret)
        body = _encode(message)
        ip = await resolve_target(
            target,
            self._resolver,
            allow_private=self._allow_private,
            timeout_s=self._connect_timeout_s,
        )
        request = self._client.build_request(
            "POST", url, content=body, headers=self._headers(delivery_id, body, key)
        )
        status: int | None = None
        headers: httpx.Headers | None = None
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self._deadline_s):
                with pinned(target.host, target.port, ip):
                    # Not client.send(): its cookie jar would keep what one endpoint sets
                    # and send it to the next delivery on that host (another tenant's
                    # endpoint, perhaps), and its auth/redirect/cookie layers cost more
                    # per request than the HTTP exchange itself. Redirects were never
                    # followed; deliveries are now stateless.
                    response = await self._transport.handle_async_request(request)
                try:
                    status, headers = response.status_code, response.headers
                    await read_capped(response, self._cap, chunks)
                finally:
                    await response.aclose()
        except TimeoutError:
            if status is None:
                raise self._error(
                    TransientChannelError,
                    f"{target.host} did not answer within {self._deadline_s:g}s "
                    "(the request may have been delivered)",
                ) from None
            # Headers arrived in time; only the body trickled. The status decides.
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, target.host, status) from None
        assert status is not None and headers is not None
        return self._outcome(status, headers, b"".join(chunks), delivery_id)

    def _key_for(self, secret: str | None) -> bytes | None:
        """The signing key of one endpoint's secret (decoded once), else the app's."""
        if not secret:
            return self._key
        key = self._endpoint_keys.get(secret)
        if key is None:
            key = decode_secret(secret)
            redaction.register(secret)  # never in a log line or the failed store
            if len(self._endpoint_keys) >= 1024:
                self._endpoint_keys.clear()
            self._endpoint_keys[secret] = key
        return key

    def _headers(self, delivery_id: str, body: bytes, key: bytes | None) -> dict[str, str]:
        timestamp = str(int(_clock.now()))
        headers = {
            "content-type": "application/json",
            "user-agent": _USER_AGENT,
            "accept-encoding": "identity",
            "webhook-id": delivery_id,
            "webhook-timestamp": timestamp,
        }
        if key is not None:
            headers["webhook-signature"] = sign(key, delivery_id, timestamp, body)
        elif not self._warned:
            self._warned = True
            _log.warning("webhook secret not set: webhooks are sent unsigned")
        return headers

    def _error(
        self,
        kind: type[ChannelError],
        text: str,
        code: int | None = None,
        retry: float | None = None,
    ) -> ChannelError:
        return kind(redact(text, self._secrets), channel="webhook", code=code, retry_after_s=retry)

    def _transport_error(self, exc: httpx.HTTPError, host: str, status: int | None) -> ChannelError:
        name = type(exc).__name__
        if status is not None:
            # The response had started: the delivery happened; only reading failed.
            return self._error(
                TransientChannelError, f"reading the reply from {host} failed ({name})"
            )
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            text = f"cannot connect to {host} ({name}: {shorten(str(exc), 120)})"
            cert = find_cause(exc, ssl.SSLCertVerificationError) is not None
            kind: type[ChannelError] = PermanentChannelError if cert else TransientChannelError
            return self._error(kind, text)
        return self._error(
            TransientChannelError, f"request to {host} failed ({name}); it may have been delivered"
        )

    def _outcome(
        self, status: int, headers: httpx.Headers, body: bytes, delivery_id: str
    ) -> DeliveryResult:
        # Redact the whole body first, then cut: a secret across the cut must not survive.
        excerpt = redaction.clean(body.decode("utf-8", "replace"), 300, self._secrets)
        if 200 <= status < 300:
            return DeliveryResult("webhook", delivery_id, excerpt or f"HTTP {status}", None, status)
        text = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
        if status == 410:
            raise self._error(WebhookGoneError, f"HTTP 410: endpoint gone; {excerpt}", 410)
        if status in (408, 429) or 500 <= status < 600:
            retry = parse_retry_after(headers.get("retry-after"))
            raise self._error(TransientChannelError, text, status, retry)
        if 300 <= status < 400:
            raise self._error(
                PermanentChannelError, f"HTTP {status} (redirects are not followed)", status
            )
        raise self._error(PermanentChannelError, text, status)

    async def close(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()
