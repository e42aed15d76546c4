"""SMS transports: Twilio and Vonage over their HTTP APIs, or the log.

DSNs (Symfony Notifier style; ``base_url`` points a provider at another host)::

    twilio://ACCOUNT_SID:AUTH_TOKEN@default?from=+15551234567
    vonage://API_KEY:API_SECRET@default?from=Acme
    log://

The recipient is checked as E.164 before any request. Twilio gets the delivery id as
``I-Twilio-Idempotency-Token`` and Vonage as ``client-ref``, so a retry after an
ambiguous failure (a 5xx or a timeout once the request was sent) can be recognised;
those errors say "possible duplicate". ``429`` honours ``Retry-After``; ``401`` and
other ``4xx`` are permanent. Credentials never appear in an error, even when the
provider echoes them back.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any, Protocol

import httpx

from tidings.errors import (
    ChannelError,
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.notifications.channels.base import (
    DeliveryResult,
    parse_query,
    parse_retry_after,
    redact,
    safe_cause,
    shorten,
)
from tidings.notifications.messages import SmsMessage
from tidings.notifications.validation import (
    validate_delivery_id,
    validate_e164,
    validate_header,
)
from tidings.observability import redaction

__all__ = [
    "HttpSmsTransport",
    "LogSmsTransport",
    "SmsTransport",
    "sms_transport_from_url",
]

_log = logging.getLogger("tidings.sms")
_MAX_CONTENT = 1600  # Twilio's limit; Vonage splits long texts itself
# Vonage answers HTTP 200 with a per-message status; these codes are worth retrying
# (throttled, internal error, too many binds). All others are permanent.
_VONAGE_TRANSIENT = {"1", "5", "10"}


class SmsTransport(Protocol):
    """Sends text messages; one instance is shared by a worker's jobs."""

    async def send(self, to: str, message: SmsMessage, delivery_id: str) -> DeliveryResult:
        """Send ``message`` to the E.164 number ``to``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def _check(to: str, message: SmsMessage, sender: str | None) -> str:
    validate_e164(to, "to")
    if not isinstance(message.content, str) or not message.content.strip():
        raise ValidationError("message is empty", field="content")
    if len(message.content) > _MAX_CONTENT:
        raise ValidationError(f"message is longer than {_MAX_CONTENT} chars", field="content")
    if "\x00" in message.content:
        raise ValidationError("message contains a NUL character", field="content")
    chosen = message.sender or sender
    if not chosen:
        raise ValidationError("no sender: set ?from= in the SMS URL", field="from")
    validate_header(chosen, "from")
    if not chosen.startswith("+") and not (chosen.isascii() and chosen.replace(" ", "").isalnum()):
        raise ValidationError("sender must be E.164 or alphanumeric", field="from")
    if chosen.startswith("+"):
        validate_e164(chosen, "from")
    return chosen


class HttpSmsTransport:
    """Twilio or Vonage through one reused ``httpx.AsyncClient``."""

    def __init__(
        self,
        provider: str,
        *,
        key: str,
        secret: str,
        sender: str | None,
        base_url: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """Configure the provider; no connection is made until the first send.

        Args:
            provider: ``twilio`` or ``vonage``.
            key: Twilio account SID or Vonage API key.
            secret: Twilio auth token or Vonage API secret.
            sender: default ``From``.
            base_url: provider API root (tests point it at a local stub).
            timeout_s: bound on a whole request, connect to last byte.
        """
        if provider not in ("twilio", "vonage"):
            raise ConfigurationError(f"unknown SMS provider {provider!r}")
        default = "https://api.twilio.com" if provider == "twilio" else "https://rest.nexmo.com"
        base = (base_url or default).rstrip("/")
        if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
            raise ConfigurationError("SMS base_url must be http or https")
        self._provider, self._key, self._secret = provider, key, secret
        self._sender, self._base, self._timeout_s = sender, base, timeout_s
        self._secrets = [secret, f"{key}:{secret}"]
        redaction.register(*self._secrets)  # every log line and CLI line redacts them
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s), trust_env=False, follow_redirects=False
        )

    async def send(self, to: str, message: SmsMessage, delivery_id: str) -> DeliveryResult:
        """Send one text.

        Raises:
            ValidationError: bad number, sender or content (no request is made).
            TransientChannelError: 429, 5xx, timeouts, connection failures.
            PermanentChannelError: 401 and other 4xx, or a Vonage rejection.
        """
        validate_delivery_id(delivery_id)
        sender = _check(to, message, self._sender)
        if self._provider == "twilio":
            url = f"{self._base}/2010-04-01/Accounts/{urllib.parse.quote(self._key)}/Messages.json"
            request = self._client.build_request(
                "POST",
                url,
                data={"To": to, "From": sender, "Body": message.content},
                headers={"I-Twilio-Idempotency-Token": delivery_id},
            )
            auth: httpx.BasicAuth | None = httpx.BasicAuth(self._key, self._secret)
        else:
            fields = {
                "api_key": self._key,
                "api_secret": self._secret,
                "from": sender.lstrip("+"),
                "to": to.lstrip("+"),
                "text": message.content,
                "client-ref": delivery_id,
            }
            request = self._client.build_request("POST", f"{self._base}/sms/json", data=fields)
            auth = None
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client.send(request, auth=auth)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            error = TransientChannelError(f"cannot reach {self._provider}: {type(exc).__name__}")
            raise self._clean(error) from safe_cause(exc, self._secrets)
        except (httpx.HTTPError, TimeoutError) as exc:
            text = (
                f"{self._provider} request failed after it was sent ({type(exc).__name__}); "
                "possible duplicate"
            )
            raise self._clean(TransientChannelError(text)) from safe_cause(exc, self._secrets)
        return self._result(response, delivery_id)

    def _clean(self, exc: ChannelError) -> ChannelError:
        clean = type(exc)(
            redact(str(exc), self._secrets),
            channel="sms",
            code=exc.code,
            retry_after_s=exc.retry_after_s,
        )
        return clean

    def _result(self, response: httpx.Response, delivery_id: str) -> DeliveryResult:
        status = response.status_code
        body = _json(response)
        if status == 429:
            retry = parse_retry_after(response.headers.get("Retry-After"))
            error: ChannelError = TransientChannelError(
                f"{self._provider} HTTP 429: rate limited", code=429, retry_after_s=retry
            )
            raise self._clean(error)
        if status >= 500:
            text = f"{self._provider} HTTP {status}: {_detail(body, response)}; possible duplicate"
            raise self._clean(TransientChannelError(text, code=status))
        if status >= 300:
            kind = "credentials rejected" if status in (401, 403) else _detail(body, response)
            raise self._clean(
                PermanentChannelError(f"{self._provider} HTTP {status}: {kind}", code=status)
            )
        if self._provider == "twilio":
            sid = body.get("sid") if isinstance(body, dict) else None
            return DeliveryResult("sms", delivery_id, f"HTTP {status}", _str(sid), status)
        messages = body.get("messages") if isinstance(body, dict) else None
        first = messages[0] if isinstance(messages, list) and messages else None
        if not isinstance(first, dict):
            first = {}
        code = str(first.get("status", ""))
        if code != "0":
            text = f"vonage status {code or '?'}: {shorten(str(first.get('error-text', '')), 120)}"
            error_type = (
                TransientChannelError if code in _VONAGE_TRANSIENT else PermanentChannelError
            )
            raise self._clean(error_type(text, code=status))
        return DeliveryResult("sms", delivery_id, "status 0", _str(first.get("message-id")), status)

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _str(value: Any) -> str | None:
    return str(value) if value is not None else None


def _detail(body: Any, response: httpx.Response) -> str:
    if isinstance(body, dict):
        parts = [str(body[k]) for k in ("message", "code", "error-text", "title") if k in body]
        if parts:
            return shorten(" ".join(parts), 160)
    return shorten(response.text, 160) or "no body"


class LogSmsTransport:
    """Logs each text on the ``tidings.sms`` logger (development)."""

    def __init__(self, *, sender: str | None = None, logger: logging.Logger | None = None) -> None:
        """Log through ``logger`` (default ``tidings.sms``)."""
        self._sender, self._log = sender, logger or _log

    async def send(self, to: str, message: SmsMessage, delivery_id: str) -> DeliveryResult:
        """Validate like a real provider would, then log."""
        validate_e164(to, "to")
        if not isinstance(message.content, str) or not message.content.strip():
            raise ValidationError("message is empty", field="content")
        self._log.info("sms %s to=%s content=%r", delivery_id, to, message.content)
        return DeliveryResult("sms", delivery_id, "logged")

    async def close(self) -> None:
        """Nothing to release."""


def sms_transport_from_url(url: str, *, timeout_s: float = 10.0) -> SmsTransport:
    """Build the transport a ``TIDINGS_SMS_URL`` names.

    Raises:
        ConfigurationError: unknown provider or missing credentials (the message
            never repeats the DSN).
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    params = parse_query(parts.query)
    if scheme == "log":
        return LogSmsTransport(sender=params.get("from"))
    if scheme not in ("twilio", "vonage"):
        raise ConfigurationError(f"unsupported SMS URL scheme {scheme!r}")
    if not parts.username or not parts.password:
        raise ConfigurationError(f"{scheme}:// SMS URL needs KEY:SECRET@")
    base_url = params.get("base_url")
    host = parts.hostname or "default"
    if base_url is None and host != "default":
        base_url = f"https://{parts.netloc.rsplit('@', 1)[-1]}"
    return HttpSmsTransport(
        scheme,
        key=urllib.parse.unquote(parts.username),
        secret=urllib.parse.unquote(parts.password),
        sender=params.get("from"),
        base_url=base_url,
        timeout_s=timeout_s,
    )
