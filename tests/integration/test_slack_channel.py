"""The Slack channel against loopback HTTP servers that check each request's shape: the
Web API with a bot token, incoming webhooks behind the SSRF guard, 429 + Retry-After,
Slack's ``ok: false`` errors, and a token that never shows up in an error or failed record."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from tests.integration.notify_support import make_app, work
from tests.support.http import Hit, HttpServer, Reply
from tidings import ShouldQueue
from tidings.errors import (
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.notifications import Notifiable, Notification, SlackMessage
from tidings.notifications.channels.slack import SlackTransport, slack_transport_from_url

TOKEN = "xoxb-1234567890-0987654321-SeCrEtSlAcKtOkEn"
HOOK_PATH = "/services/T0001/B0002/hookSecretPart42"


def api_url(server: HttpServer, channel: str = "C0DEFAULT") -> str:
    base = urllib.parse.quote(server.url + "/api", safe="")
    return f"slack://{TOKEN}@default?channel={channel}&base_url={base}"


def ok(hit: Hit) -> Reply:
    body = json.loads(hit.body)
    answer = {"ok": True, "ts": "1700.0001", "channel": body["channel"]}
    return Reply(200, json.dumps(answer).encode())


def send(transport: Any, message: SlackMessage, route: str | None = None) -> Any:
    async def go() -> Any:
        try:
            return await transport.send(message, route, "d" * 32)
        finally:
            await transport.close()

    return asyncio.run(go())


def rich() -> SlackMessage:
    return (
        SlackMessage("Invoice 42 paid")
        .header("Invoice paid")
        .section("*Acme* paid *$12.50*", fields={"Invoice": "42", "Due": "today"})
        .button("View", "https://example.org/invoices/42", style="primary")
        .button("Refund", "https://example.org/refund/42", style="danger", action_id="refund")
        .context("Sent by billing")
        .divider()
    )


def test_web_api_post_has_the_token_channel_and_block_kit_shape() -> None:
    with HttpServer(ok) as server:
        result = send(slack_transport_from_url(api_url(server)), rich())
    [hit] = server.hits
    assert (hit.method, hit.path) == ("POST", "/api/chat.postMessage")
    assert hit.headers["authorization"] == f"Bearer {TOKEN}"
    assert hit.headers["content-type"] == "application/json; charset=utf-8"
    body = json.loads(hit.body)
    assert body["channel"] == "C0DEFAULT" and body["text"] == "Invoice 42 paid"
    assert [b["type"] for b in body["blocks"]] == [
        "header", "section", "actions", "context", "divider"
    ]  # fmt: skip
    assert body["blocks"][0]["text"] == {"type": "plain_text", "text": "Invoice paid"}
    section = body["blocks"][1]
    assert section["text"] == {"type": "mrkdwn", "text": "*Acme* paid *$12.50*"}
    assert section["fields"] == [
        {"type": "mrkdwn", "text": "*Invoice*\n42"}, {"type": "mrkdwn", "text": "*Due*\ntoday"}
    ]  # fmt: skip
    buttons = body["blocks"][2]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["View", "Refund"]
    assert buttons[0] == {
        "type": "button", "text": {"type": "plain_text", "text": "View"},
        "url": "https://example.org/invoices/42", "style": "primary",
    }  # fmt: skip
    assert buttons[1]["action_id"] == "refund"
    assert body["blocks"][3]["elements"] == [{"type": "mrkdwn", "text": "Sent by billing"}]
    assert (result.channel, result.provider_id, result.status) == ("slack", "1700.0001", 200)


def test_route_and_message_channel_override_the_default() -> None:
    with HttpServer(ok) as server:
        send(slack_transport_from_url(api_url(server)), SlackMessage("a"), "#ops")
        send(slack_transport_from_url(api_url(server)), SlackMessage("b").to("C9"), "#ops")
    assert [json.loads(h.body)["channel"] for h in server.hits] == ["#ops", "C9"]


@pytest.mark.parametrize(
    ("reply", "kind", "retry"),
    [
        (Reply(429, b"", {"Retry-After": "7"}), TransientChannelError, 7.0),
        (Reply(200, b'{"ok": false, "error": "ratelimited"}', {"Retry-After": "3"}),
         TransientChannelError, 3.0),
        (Reply(503, b"upstream"), TransientChannelError, None),
        (Reply(200, b'{"ok": false, "error": "channel_not_found"}'), PermanentChannelError, None),
        (Reply(200, b'{"ok": false, "error": "invalid_auth"}'), PermanentChannelError, None),
        (Reply(400, b"invalid_payload"), PermanentChannelError, None),
    ],
)  # fmt: skip
def test_outcomes(reply: Reply, kind: type[Exception], retry: float | None) -> None:
    with HttpServer([reply]) as server, pytest.raises(kind) as info:
        send(slack_transport_from_url(api_url(server)), SlackMessage("x"))
    assert getattr(info.value, "retry_after_s", None) == retry


def test_an_echoed_token_is_redacted_everywhere() -> None:
    def echo(hit: Hit) -> Reply:
        text = f"bad token {hit.headers['authorization']} / {TOKEN}"
        return Reply(500, json.dumps({"ok": False, "error": text}).encode())

    with HttpServer(echo) as server, pytest.raises(TransientChannelError) as info:
        send(slack_transport_from_url(api_url(server)), SlackMessage("x"))
    text = f"{info.value!s} {info.value!r}"
    assert "SeCrEtSlAcKtOkEn" not in text and "[REDACTED]" in text
    assert info.value.__cause__ is None and info.value.__context__ is None


def test_incoming_webhook_from_the_dsn_and_its_errors() -> None:
    def reply(hit: Hit) -> Reply:
        return Reply(200, b"ok") if b"fine" in hit.body else Reply(404, b"no_service")

    with HttpServer(reply) as server:
        url = server.url + HOOK_PATH
        transport = slack_transport_from_url(url, allow_private=True)
        result = send(transport, rich().text("fine"))
        with pytest.raises(PermanentChannelError) as info:
            send(slack_transport_from_url(url, allow_private=True), SlackMessage("gone"))
    assert server.hits[0].path == HOOK_PATH
    body = json.loads(server.hits[0].body)
    assert "channel" not in body and body["blocks"][0]["type"] == "header"
    assert result.status == 200 and result.response == "ok"
    assert "no_service" in str(info.value) and "hookSecretPart42" not in str(info.value)


def test_webhook_routes_pass_the_ssrf_guard() -> None:
    with HttpServer([Reply(200, b"ok")]) as canary:
        guarded = SlackTransport(token=TOKEN, allow_private=False)
        for url in (
            "http://169.254.169.254/latest/meta-data",
            f"{canary.url}{HOOK_PATH}",
            "http://2852039166/x",
        ):
            with pytest.raises(ValidationError):
                send(SlackTransport(token=TOKEN, allow_private=False), SlackMessage("x"), url)
        asyncio.run(guarded.close())
    assert canary.hits == []


def test_bad_configuration_and_messages_are_refused_up_front() -> None:
    with pytest.raises(ConfigurationError) as info:
        slack_transport_from_url("slack://@default?channel=C1")
    assert "bot token" in str(info.value)
    with pytest.raises(ConfigurationError) as bad_scheme:
        slack_transport_from_url(f"smtp://{TOKEN}@x")
    assert TOKEN not in str(bad_scheme.value)
    with pytest.raises(ValidationError):
        SlackMessage().to_payload("C1")
    with pytest.raises(ValidationError):
        SlackMessage("x").button("go", "javascript:alert(1)")
    with pytest.raises(ValidationError):
        SlackMessage("x").section(fields=[str(i) for i in range(11)])
    with pytest.raises(ValidationError):
        SlackMessage("x").header("h" * 151)


# -- through the queue -------------------------------------------------------------------


@dataclass
class Ops(Notifiable):
    id: int
    slack_channel: str = "#ops"


@dataclass
class Deployed(Notification, ShouldQueue):
    version: str
    tries: ClassVar[int | None] = 3

    def via(self, notifiable: Any) -> list[str]:
        return ["slack"]

    def to_slack(self, notifiable: Any) -> SlackMessage:
        return SlackMessage(f"Deployed {self.version}").section(f"*{self.version}* is live")


def test_queued_notification_honours_retry_after_then_delivers(redis_url: str, prefix: str) -> None:
    stamps: list[float] = []

    def script(hit: Hit) -> Reply:
        stamps.append(time.monotonic())
        if len(stamps) == 1:
            return Reply(429, b"", {"Retry-After": "1"})
        return ok(hit)

    with HttpServer(script) as server:
        app = make_app(redis_url, prefix, None, slack_url=api_url(server))
        try:
            Ops(1).notify(Deployed("v1.2.3"))
            work(app)
            assert app.queue_for(None).failed() == []
        finally:
            app.close()
    assert len(server.hits) == 2 and stamps[1] - stamps[0] >= 0.9
    body = json.loads(server.hits[1].body)
    assert body["channel"] == "#ops" and body["text"] == "Deployed v1.2.3"


def test_failed_record_never_holds_the_token(redis_url: str, prefix: str) -> None:
    def echo(hit: Hit) -> Reply:
        return Reply(401, f"invalid_auth for {hit.headers['authorization']}".encode())

    with HttpServer(echo) as server:
        app = make_app(redis_url, prefix, None, slack_url=api_url(server))
        try:
            Ops(1).notify(Deployed("v2"))
            work(app)
            [record] = app.queue_for(None).failed()
        finally:
            app.close()
    assert record.attempts == 1 and "slack HTTP 401" in record.exception
    assert "SeCrEtSlAcKtOkEn" not in record.exception + record.payload.decode()


def test_webhook_url_stays_out_of_logs_and_a_huge_reply_is_capped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with HttpServer([Reply(200, b"ok", content_length=10**9)]) as server:
        url = server.url + HOOK_PATH
        result = send(slack_transport_from_url(url, allow_private=True), SlackMessage("x"))
    assert result.status == 200 and len(result.response) <= 300
    assert caplog.records  # httpx/httpcore did log (so the check below means something)
    assert "hookSecretPart42" not in caplog.text


def test_a_forbidden_webhook_route_is_refused_at_notify_time(redis_url: str, prefix: str) -> None:
    app = make_app(redis_url, prefix, None, slack_url="log://", webhook_allow_private=False)
    try:
        with pytest.raises(ValidationError):
            Ops(1, slack_channel="http://169.254.169.254/latest").notify(Deployed("v3"))
        assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 0
        assert Ops(1, slack_channel="#fine").notify(Deployed("v3"))  # a channel name is queued
    finally:
        app.close()
