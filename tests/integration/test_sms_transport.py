"""SMS transports against Twilio- and Vonage-shaped HTTP stubs on 127.0.0.1 (F20, B19)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import traceback
import urllib.parse
from email.utils import formatdate

import pytest

from tests.support.http import Hit, HttpServer, Reply
from tests.support.procs import free_port
from tidings.errors import (
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.notifications.channels.base import DeliveryResult
from tidings.notifications.channels.sms import SmsTransport, sms_transport_from_url
from tidings.notifications.messages import SmsMessage

SID, TOKEN = "AC0123456789abcdef", "tok_9f8e7d6c5b4a"
KEY, SECRET = "vonage-key", "vonage-secret-77"
TO = "+15557654321"


def twilio(
    server: HttpServer | None = None, port: int | None = None, timeout_s: float = 2.0
) -> SmsTransport:
    base = server.url if server else f"http://127.0.0.1:{port}"
    url = f"twilio://{SID}:{TOKEN}@default?from=+15551234567&base_url={urllib.parse.quote(base)}"
    return sms_transport_from_url(url, timeout_s=timeout_s)


def vonage(server: HttpServer) -> SmsTransport:
    return sms_transport_from_url(
        f"vonage://{KEY}:{SECRET}@default?from=Acme&base_url={server.url}"
    )


def send(
    t: SmsTransport, *attempts: str, to: str = TO, message: SmsMessage | None = None
) -> list[DeliveryResult]:
    async def go() -> list[DeliveryResult]:
        try:
            return [
                await t.send(to, message or SmsMessage("Your code is 123456"), d) for d in attempts
            ]
        finally:
            await t.close()

    return asyncio.run(go())


def form(hit: Hit) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(hit.body.decode()))


def test_twilio_success() -> None:
    with HttpServer(
        [Reply(201, json.dumps({"sid": "SM42", "status": "queued"}).encode())]
    ) as server:
        [result] = send(twilio(server), "delivery-1")
    assert result == DeliveryResult("sms", "delivery-1", "HTTP 201", "SM42", 201)
    [hit] = server.hits
    assert hit.method == "POST" and hit.path == f"/2010-04-01/Accounts/{SID}/Messages.json"
    assert form(hit) == {"To": TO, "From": "+15551234567", "Body": "Your code is 123456"}
    assert (
        hit.headers["authorization"]
        == "Basic " + base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    )
    assert hit.headers["i-twilio-idempotency-token"] == "delivery-1"


def test_message_sender_overrides_the_configured_one() -> None:
    with HttpServer([Reply(201, b'{"sid": "SM1"}')]) as server:
        send(twilio(server), "d", message=SmsMessage("hi", sender="Acme"))
    assert form(server.hits[0])["From"] == "Acme"


def test_vonage_success() -> None:
    body = {"message-count": "1", "messages": [{"status": "0", "message-id": "0A00000123"}]}
    with HttpServer([Reply(200, json.dumps(body).encode())]) as server:
        [result] = send(vonage(server), "delivery-2")
    assert result.provider_id == "0A00000123" and result.status == 200
    [hit] = server.hits
    assert hit.path == "/sms/json"
    assert form(hit) == {
        "api_key": KEY,
        "api_secret": SECRET,
        "from": "Acme",
        "to": TO.lstrip("+"),
        "text": "Your code is 123456",
        "client-ref": "delivery-2",
    }


@pytest.mark.parametrize(
    ("status", "error"), [("1", TransientChannelError), ("4", PermanentChannelError)]
)
def test_vonage_per_message_status(status: str, error: type[Exception]) -> None:
    body = {"messages": [{"status": status, "error-text": f"Bad Credentials {SECRET}"}]}
    with (
        HttpServer([Reply(200, json.dumps(body).encode())]) as server,
        pytest.raises(error) as info,
    ):
        send(vonage(server), "d")
    assert f"vonage status {status}" in str(info.value) and SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        (None, None),
        ("junk", None),
        ("864000", 3600.0),  # ten days, capped at an hour
    ],
)
def test_429_honours_retry_after(header: str | None, expected: float | None) -> None:
    headers = {"Retry-After": header} if header is not None else {}
    with (
        HttpServer([Reply(429, b'{"message": "Too Many Requests"}', headers)]) as server,
        pytest.raises(TransientChannelError) as info,
    ):
        send(twilio(server), "d")
    assert info.value.code == 429 and info.value.retry_after_s == expected


def test_429_with_http_date() -> None:
    header = formatdate(time.time() + 30, usegmt=True)
    with (
        HttpServer([Reply(429, b"", {"Retry-After": header})]) as server,
        pytest.raises(TransientChannelError) as info,
    ):
        send(twilio(server), "d")
    assert info.value.retry_after_s is not None and 25 <= info.value.retry_after_s <= 31


def test_500_is_transient_and_retries_reuse_the_idempotency_key() -> None:
    with HttpServer([Reply(500, b"oops")]) as server:
        t = twilio(server)

        async def two_attempts() -> list[str]:
            messages = []
            try:
                for _ in range(2):
                    with pytest.raises(TransientChannelError) as info:
                        await t.send(TO, SmsMessage("hi"), "same-delivery")
                    messages.append(str(info.value))
            finally:
                await t.close()
            return messages

        messages = asyncio.run(two_attempts())
    assert all("possible duplicate" in m for m in messages)
    assert [h.headers["i-twilio-idempotency-token"] for h in server.hits] == ["same-delivery"] * 2


def test_401_echoing_credentials_is_permanent_and_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # httpcore's own DEBUG trace prints raw response headers; workers log at INFO.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="tidings")

    def echo(hit: Hit) -> Reply:
        body = {"message": f"bad auth: Authorization: {hit.headers['authorization']} token={TOKEN}"}
        return Reply(
            401, json.dumps(body).encode(), {"WWW-Authenticate": hit.headers["authorization"]}
        )

    with HttpServer(echo) as server, pytest.raises(PermanentChannelError) as info:
        send(twilio(server), "d")
    assert info.value.code == 401 and info.value.channel == "sms"
    basic = base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    text = "".join(traceback.format_exception(info.value)) + caplog.text + repr(info.value)
    assert TOKEN not in text and basic not in text


def test_other_4xx_is_permanent_with_provider_detail() -> None:
    body = {"code": 21211, "message": "The 'To' number is not a valid phone number.", "status": 400}
    with (
        HttpServer([Reply(400, json.dumps(body).encode())]) as server,
        pytest.raises(PermanentChannelError, match="21211") as info,
    ):
        send(twilio(server), "d")
    assert info.value.code == 400


def test_redirects_are_not_followed() -> None:
    with HttpServer() as canary, HttpServer([Reply(302, b"", {"Location": canary.url})]) as server:
        with pytest.raises(PermanentChannelError, match="HTTP 302"):
            send(twilio(server), "d")
        assert canary.hits == []


def test_timeout_is_transient_and_bounded() -> None:
    with HttpServer([Reply(201, b"{}", delay_s=5)]) as server:
        started = time.monotonic()
        with pytest.raises(TransientChannelError, match="possible duplicate"):
            send(twilio(server, timeout_s=1.0), "d")
        assert time.monotonic() - started < 2.0


def test_connection_refused_is_transient_and_not_a_duplicate() -> None:
    with pytest.raises(TransientChannelError) as info:
        send(twilio(port=free_port()), "d")
    assert "possible duplicate" not in str(info.value)


@pytest.mark.parametrize("to", ["5557654321", "+1 555 765 4321", "+15557654321\r\nX: y", ""])
def test_invalid_numbers_make_no_request(to: str) -> None:
    with HttpServer() as server, pytest.raises(ValidationError):
        send(twilio(server), "d", to=to)
    assert server.hits == []


@pytest.mark.parametrize(
    "message", [SmsMessage(""), SmsMessage("x" * 1601), SmsMessage("hi", sender="Bad\nSender")]
)
def test_invalid_messages_make_no_request(message: SmsMessage) -> None:
    with HttpServer() as server, pytest.raises(ValidationError):
        send(twilio(server), "d", message=message)
    assert server.hits == []


def test_log_transport(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidings.sms")
    [result] = send(sms_transport_from_url("log://"), "d-log")
    assert result.response == "logged" and "d-log" in caplog.text and TO in caplog.text
    with pytest.raises(ValidationError):
        send(sms_transport_from_url("log://"), "d", to="12345")


@pytest.mark.parametrize(
    "url",
    [
        "plivo://id:s3cr3t-value@default",
        "twilio://@default?from=+15551234567",
        "twilio://sid@default?from=+15551234567",
        "twilio://sid:s3cr3t-value@default?base_url=ftp://x",
    ],
)
def test_bad_dsns_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        sms_transport_from_url(url)
    assert "s3cr3t-value" not in str(info.value)


def test_invalid_delivery_id_makes_no_request() -> None:
    with HttpServer() as server, pytest.raises(ValidationError):
        send(twilio(server), "id\r\nX-Injected: 1")
    assert server.hits == []
