"""The Slack channel: incoming webhooks and the Web API (``chat.postMessage``).

``TIDINGS_SLACK_URL`` (Symfony Notifier's DSN style; ``base_url`` points the API at
another host)::

    slack://xoxb-BOT-TOKEN@default?channel=C0123456789   Web API, bot token, default channel
    https://hooks.slack.com/services/T000/B000/XXXX       an incoming webhook
    log://                                               log each message (development)

A notifiable's ``slack`` route (``route_notification_for_slack()``, else its
``slack_channel`` attribute) is a channel id/name for the Web API, or an incoming
webhook URL of its own (``https://…``), which then wins over the DSN. A
``SlackMessage.to(channel)`` wins over both for the channel.

Webhook URLs are user data, so they pass the same SSRF guard as webhooks
(:mod:`tidings.notifications.net`: vetted, resolved once, connect pinned). Outcomes:
2xx with ``ok`` delivered; ``429`` and ``ok: false, error: ratelimited`` retry after
``Retry-After``; 5xx, timeouts and connection failures retry ("possible duplicate": Slack
has no idempotency key); other errors (``invalid_auth``, ``channel_not_found``, 4xx) fail
at once. The bot token and webhook URLs never appear in an error, log line or failed
record.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import httpx
import orjson

from tidings.errors import (
    ChannelError,
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.hosts import AppHost
from tidings.notifications.channels.base import (
    DeliveryResult,
    message_for,
    parse_query,
    parse_retry_after,
    redact,
    shorten,
)
from tidings.notifications.net import (
    PinnedTransport,
    SystemResolver,
    check_url,
    pinned,
    read_capped,
    resolve_target,
)
from tidings.observability.redaction import clean

__all__ = ["SlackChannel", "SlackMessage", "SlackTransport", "slack_transport_from_url"]

_log = logging.getLogger("tidings.slack")
_T = TypeVar("_T")
_API = "https://slack.com/api"
# ``ok: false`` errors worth retrying; every other one is permanent.
_TRANSIENT = {
    "ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable",
    "request_timeout", "team_added_to_org",
}  # fmt: skip


def _limit(value: str, limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"slack {what} must be a string", field=what)
    if len(value) > limit:
        raise ValidationError(f"slack {what} is longer than {limit} characters", field=what)
    return value


def _mrkdwn(text: str, limit: int, what: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _limit(text, limit, what)}


class SlackMessage:
    """A Slack message with Block Kit blocks, built fluently::

        SlackMessage("Invoice 42 paid")           # the notification text (fallback)
            .header("Invoice paid")
            .section("*Acme* paid *$12.50*", fields={"Invoice": "42", "Due": "today"})
            .button("View", "https://example.org/invoices/42", style="primary")
            .context("Sent by billing")

    ``text`` is what notifications and screen readers show; Slack wants it even when
    blocks are given.
    """

    def __init__(self, text: str = "") -> None:
        self._text = text
        self._blocks: list[dict[str, Any]] = []
        self._extra: dict[str, Any] = {}
        self.channel: str | None = None

    def text(self, text: str) -> Self:
        """The message's text (the fallback shown in notifications)."""
        self._text = text
        return self

    def to(self, channel: str) -> Self:
        """Post to this channel (id or ``#name``) instead of the route's."""
        self.channel = channel
        return self

    def username(self, name: str) -> Self:
        """Post under another name (needs the ``chat:write.customize`` scope)."""
        self._extra["username"] = _limit(name, 80, "username")
        return self

    def emoji(self, emoji: str) -> Self:
        """The icon as an emoji, e.g. ``:ghost:``."""
        self._extra["icon_emoji"] = _limit(emoji, 100, "emoji")
        return self

    def image(self, url: str) -> Self:
        """The icon as an image URL."""
        self._extra["icon_url"] = _limit(url, 3000, "image")
        return self

    def thread(self, ts: str) -> Self:
        """Reply in the thread of message ``ts``."""
        self._extra["thread_ts"] = _limit(ts, 64, "thread")
        return self

    def unfurl_links(self, on: bool = True) -> Self:
        """Let Slack unfurl links (off by default for bots)."""
        self._extra["unfurl_links"] = bool(on)
        return self

    def header(self, text: str) -> Self:
        """A header block (plain text, at most 150 characters)."""
        self._blocks.append(
            {"type": "header", "text": {"type": "plain_text", "text": _limit(text, 150, "header")}}
        )
        return self

    def section(
        self, text: str | None = None, *, fields: dict[str, str] | list[str] | None = None
    ) -> Self:
        """A section: mrkdwn text and/or up to 10 fields (``{"Label": "value"}`` pairs
        become ``*Label*\\nvalue``)."""
        block: dict[str, Any] = {"type": "section"}
        if text is not None:
            block["text"] = _mrkdwn(text, 3000, "section")
        if fields:
            items = (
                [f"*{k}*\n{v}" for k, v in fields.items()] if isinstance(fields, dict) else fields
            )
            if len(items) > 10:
                raise ValidationError("a slack section holds at most 10 fields", field="fields")
            block["fields"] = [_mrkdwn(str(item), 2000, "field") for item in items]
        if len(block) == 1:
            raise ValidationError("a slack section needs text or fields", field="section")
        self._blocks.append(block)
        return self

    def fields(self, fields: dict[str, str] | list[str]) -> Self:
        """A section of fields only."""
        return self.section(fields=fields)

    def button(
        self,
        text: str,
        url: str,
        *,
        style: str | None = None,
        action_id: str | None = None,
    ) -> Self:
        """A link button; buttons added one after another share one actions block."""
        if style not in (None, "primary", "danger"):
            raise ValidationError("slack button style is primary or danger", field="style")
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme not in ("http", "https", "mailto", "slack"):
            raise ValidationError("slack button url must be http(s)", field="url")
        element: dict[str, Any] = {
            "type": "button",
            "text": {"type": "plain_text", "text": _limit(text, 75, "button")},
            "url": _limit(url, 3000, "url"),
        }
        if style:
            element["style"] = style
        if action_id:
            element["action_id"] = _limit(action_id, 255, "action_id")
        last = self._blocks[-1] if self._blocks else None
        if last is not None and last["type"] == "actions" and len(last["elements"]) < 25:
            last["elements"].append(element)
        else:
            self._blocks.append({"type": "actions", "elements": [element]})
        return self

    def context(self, *texts: str) -> Self:
        """A context block: small grey mrkdwn lines (at most 10)."""
        if not texts or len(texts) > 10:
            raise ValidationError("a slack context holds 1 to 10 texts", field="context")
        self._blocks.append(
            {"type": "context", "elements": [_mrkdwn(t, 3000, "context") for t in texts]}
        )
        return self

    def divider(self) -> Self:
        """A divider line."""
        self._blocks.append({"type": "divider"})
        return self

    def block(self, block: dict[str, Any]) -> Self:
        """Any raw Block Kit block."""
        if not isinstance(block, dict) or "type" not in block:
            raise ValidationError("a slack block is a dict with a type", field="block")
        self._blocks.append(block)
        return self

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The blocks so far."""
        return list(self._blocks)

    def to_payload(self, channel: str | None = None) -> dict[str, Any]:
        """The JSON body for ``chat.postMessage`` (or a webhook, with no channel).

        Raises:
            ValidationError: no text and no blocks, or more than 50 blocks.
        """
        if not self._text and not self._blocks:
            raise ValidationError("slack message is empty: give text or blocks", field="text")
        if len(self._blocks) > 50:
            raise ValidationError("a slack message holds at most 50 blocks", field="blocks")
        payload: dict[str, Any] = {}
        if channel:
            payload["channel"] = channel
        if self._text:
            payload["text"] = _limit(self._text, 40000, "text")
        if self._blocks:
            payload["blocks"] = self._blocks
        payload.update(self._extra)
        return payload


def as_message(value: Any) -> SlackMessage:
    """What ``to_slack`` may return: a SlackMessage or plain text."""
    if isinstance(value, SlackMessage):
        return value
    if isinstance(value, str):
        return SlackMessage(value)
    raise ValidationError("to_slack() must return a SlackMessage or a str", field="slack")


def _is_url(route: str) -> bool:
    return route.lower().startswith(("https://", "http://"))


class SlackTransport:
    """Posts to the Web API with a bot token, or to incoming webhooks (guarded)."""

    def __init__(
        self,
        *,
        token: str | None = None,
        channel: str | None = None,
        webhook_url: str | None = None,
        base_url: str | None = None,
        allow_private: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        """Configure; nothing connects until the first send.

        Args:
            token: a bot token (``xoxb-…``) for ``chat.postMessage``.
            channel: the default channel for the Web API.
            webhook_url: the default incoming webhook.
            base_url: the Web API root (tests point it at a local server).
            allow_private: let webhook URLs reach private and loopback addresses.
            timeout_s: bound on one whole request.
        """
        self._token, self._channel, self._webhook = token, channel, webhook_url
        self._base = (base_url or _API).rstrip("/")
        if urllib.parse.urlsplit(self._base).scheme not in ("http", "https"):
            raise ConfigurationError("slack base_url must be http or https")
        self._allow_private, self._timeout_s = allow_private, timeout_s
        self._secrets: list[str | None] = [token, webhook_url]
        timeout = httpx.Timeout(timeout_s)
        self._api = httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False)
        # Webhook requests go straight to the pinned transport (as in the webhook channel):
        # the client's INFO log line would print the URL, which is the credential, and its
        # cookie jar would carry what one endpoint sets to the next. The client only builds
        # requests and owns the pool.
        self._hook_transport = PinnedTransport()
        self._hooks = httpx.AsyncClient(
            transport=self._hook_transport,
            timeout=timeout,
            trust_env=False,
            follow_redirects=False,
        )
        self._resolver = SystemResolver()

    def _error(
        self,
        kind: type[ChannelError],
        text: str,
        code: int | None = None,
        retry: float | None = None,
        url: str | None = None,
    ) -> ChannelError:
        text = redact(text, [*self._secrets, url])
        return kind(text, channel="slack", code=code, retry_after_s=retry)

    async def send(
        self, message: SlackMessage, route: str | None, delivery_id: str
    ) -> DeliveryResult:
        """Post ``message``: to ``route`` when it is a webhook URL, else through the Web
        API to ``message.channel`` / ``route`` / the DSN's channel, else to the DSN's
        webhook.

        Raises:
            ValidationError: a bad message, a forbidden webhook URL, or nowhere to post.
            TransientChannelError: 429, 5xx, ``ratelimited``, timeouts, connect failures.
            PermanentChannelError: other Slack errors (``invalid_auth`` ...), other 4xx.
        """
        if route and _is_url(route):
            return await self._webhook_post(route, message.to_payload(), delivery_id)
        channel = message.channel or route or self._channel
        if self._token is not None:
            if not channel:
                raise ValidationError(
                    "no slack channel: give the notifiable a slack route or set "
                    "?channel= in TIDINGS_SLACK_URL",
                    field="slack",
                )
            return await self._api_post(message.to_payload(channel), delivery_id)
        if self._webhook is not None:
            return await self._webhook_post(self._webhook, message.to_payload(), delivery_id)
        raise ValidationError(
            "no slack destination: set TIDINGS_SLACK_URL (slack://TOKEN@default or a "
            "webhook URL) or give the notifiable a webhook URL as its slack route",
            field="slack",
        )

    async def _api_post(self, payload: dict[str, Any], delivery_id: str) -> DeliveryResult:
        request = self._api.build_request(
            "POST",
            f"{self._base}/chat.postMessage",
            content=orjson.dumps(payload),
            headers={
                "authorization": f"Bearer {self._token}",
                "content-type": "application/json; charset=utf-8",
            },
        )
        response = await self._exchange(lambda: self._api.send(request), "slack.com")
        status = response.status_code
        body = _json(response.content)
        self._check_status(status, response.headers, body)
        if not isinstance(body, dict) or body.get("ok") is not True:
            error = str(body.get("error", "unknown")) if isinstance(body, dict) else "not JSON"
            kind = TransientChannelError if error in _TRANSIENT else PermanentChannelError
            retry = parse_retry_after(response.headers.get("retry-after"))
            raise self._error(kind, f"slack API error: {shorten(error, 120)}", status, retry)
        ts = body.get("ts")
        return DeliveryResult(
            "slack", delivery_id, f"ok {body.get('channel', '')}".strip(), _str(ts), status
        )

    async def _webhook_post(
        self, url: str, payload: dict[str, Any], delivery_id: str
    ) -> DeliveryResult:
        target = check_url(url, self._allow_private)
        ip = await resolve_target(
            target, self._resolver, allow_private=self._allow_private, timeout_s=self._timeout_s
        )
        request = self._hooks.build_request(
            "POST", url, content=orjson.dumps(payload), headers={"content-type": "application/json"}
        )
        with pinned(target.host, target.port, ip):
            status, headers, content = await self._exchange_direct(request, target.host, url)
        text = content[:512].decode("utf-8", "replace")
        self._check_status(status, headers, None, text, url)
        reply = clean(text, 300, [*self._secrets, url]) or "ok"
        return DeliveryResult("slack", delivery_id, reply, None, status)

    async def _exchange_direct(
        self, request: httpx.Request, host: str, url: str
    ) -> tuple[int, httpx.Headers, bytes]:
        async def go() -> tuple[int, httpx.Headers, bytes]:
            response = await self._hook_transport.handle_async_request(request)
            chunks: list[bytes] = []
            try:
                await read_capped(response, 65536, chunks)  # at most this much of a reply
            finally:
                await response.aclose()
            return response.status_code, response.headers, b"".join(chunks)

        return await self._exchange(go, host, url)

    async def _exchange(
        self, call: Callable[[], Awaitable[_T]], host: str, url: str | None = None
    ) -> _T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call()
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise self._error(
                TransientChannelError, f"cannot connect to {host} ({type(exc).__name__})", url=url
            ) from None
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._error(
                TransientChannelError,
                f"request to {host} failed after it was sent ({type(exc).__name__}); "
                "possible duplicate",
                url=url,
            ) from None

    def _check_status(
        self,
        status: int,
        headers: httpx.Headers,
        body: Any,
        text: str = "",
        url: str | None = None,
    ) -> None:
        if 200 <= status < 300:
            return
        detail = text or (str(body.get("error", "")) if isinstance(body, dict) else "")
        detail = shorten(detail, 120)
        if status == 429:
            retry = parse_retry_after(headers.get("retry-after"))
            raise self._error(
                TransientChannelError, "slack HTTP 429: rate limited", 429, retry, url
            )
        if status >= 500:
            text = f"slack HTTP {status}: {detail}; possible duplicate"
            raise self._error(TransientChannelError, text, status, None, url)
        text = f"slack HTTP {status}: {detail}"
        raise self._error(PermanentChannelError, text, status, None, url)

    async def close(self) -> None:
        """Close both HTTP clients."""
        await self._api.aclose()
        await self._hooks.aclose()


class LogSlackTransport:
    """Logs each message on the ``tidings.slack`` logger (development)."""

    async def send(
        self, message: SlackMessage, route: str | None, delivery_id: str
    ) -> DeliveryResult:
        """Build the payload as a real post would, then log it (webhook routes hidden)."""
        where = "webhook" if route and _is_url(route) else (message.channel or route or "-")
        payload = message.to_payload(None)
        _log.info("slack %s to=%s %s", delivery_id, where, orjson.dumps(payload).decode()[:2000])
        return DeliveryResult("slack", delivery_id, "logged")

    async def close(self) -> None:
        """Nothing to release."""


def slack_transport_from_url(url: str | None, *, allow_private: bool = False) -> Any:
    """Build the transport ``TIDINGS_SLACK_URL`` names (None: webhook routes only).

    Raises:
        ConfigurationError: an unknown scheme or no token (never repeating the URL).
    """
    if not url:
        return SlackTransport(allow_private=allow_private)
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "log":
        return LogSlackTransport()
    if scheme in ("http", "https"):
        check_url(url, allow_private)
        return SlackTransport(webhook_url=url, allow_private=allow_private)
    if scheme != "slack":
        raise ConfigurationError(
            f"unsupported TIDINGS_SLACK_URL scheme {scheme!r} (slack://TOKEN@default?channel=…, "
            "an https:// webhook URL, or log://)"
        )
    token = urllib.parse.unquote(parts.username or "")
    if parts.password:
        token = f"{token}:{urllib.parse.unquote(parts.password)}" if token else token
    if not token:
        raise ConfigurationError("slack:// URL needs the bot token: slack://xoxb-…@default")
    params = parse_query(parts.query)
    base_url = params.get("base_url")
    host = parts.hostname or "default"
    if base_url is None and host != "default":
        base_url = f"https://{parts.netloc.rsplit('@', 1)[-1]}/api"
    return SlackTransport(
        token=token, channel=params.get("channel"), base_url=base_url, allow_private=allow_private
    )


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def _str(value: Any) -> str | None:
    return str(value) if value is not None else None


class SlackChannel:
    """The ``slack`` channel: ``to_slack(notifiable) -> SlackMessage | str``."""

    def __init__(self, app: AppHost) -> None:
        s = app.settings
        self.transport = slack_transport_from_url(
            s.slack_url, allow_private=s.webhook_allow_private
        )

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> DeliveryResult:
        message = as_message(message_for(notification, "slack", notifiable))
        route = notifiable.route_notification_for("slack", notification)
        result: DeliveryResult = await self.transport.send(
            message, str(route) if route else None, delivery_id
        )
        return result

    async def close(self) -> None:
        await self.transport.close()
