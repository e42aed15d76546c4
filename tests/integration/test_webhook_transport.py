"""Webhook transport against HTTP servers on loopback (RELIABILITY F18, F19, F21, B14-B17)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpcore
import pytest

from tests.support.http import HttpServer, Reply
from tests.support.procs import free_port
from tidings import _clock
from tidings.errors import PermanentChannelError, TransientChannelError, ValidationError
from tidings.notifications.channels.base import DeliveryResult
from tidings.notifications.channels.webhook import WebhookGoneError, WebhookTransport
from tidings.notifications.messages import WebhookMessage
from tidings.notifications.webhooks import verify_webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGE = WebhookMessage({"invoice": 7, "amount": "12.50"}, type="invoice.paid")


class FakeResolver:
    """Answers per call from ``answers`` (the last repeats), or raises; records calls."""

    def __init__(self, *answers: list[str] | BaseException) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every TCP connect httpx makes, as (ip, port); the real connect still happens."""
    seen: list[tuple[str, int]] = []
    real = httpcore.AnyIOBackend.connect_tcp

    async def record(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        seen.append((host, port))
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", record)
    yield seen


def transport(**kwargs: Any) -> WebhookTransport:
    options: dict[str, Any] = {"secret": SECRET, "allow_private": True, "deadline_s": 2.0}
    return WebhookTransport(**{**options, **kwargs})


def send(
    t: WebhookTransport, url: str, *ids: str, message: WebhookMessage = MESSAGE
) -> list[DeliveryResult]:
    async def go() -> list[DeliveryResult]:
        try:
            return [await t.send(url, message, d) for d in ids]
        finally:
            await t.close()

    return asyncio.run(go())


def test_signed_delivery() -> None:
    with HttpServer([Reply(200, b'{"ok": true}')]) as server:
        [result] = send(transport(), server.url + "/hooks?x=1", "msg_1")
    assert (result.status, result.response, result.delivery_id) == (200, '{"ok": true}', "msg_1")
    [hit] = server.hits
    assert hit.path == "/hooks?x=1" and hit.headers["content-type"] == "application/json"
    assert hit.headers["webhook-id"] == "msg_1"
    payload = verify_webhook(SECRET, hit.headers, hit.body)
    assert payload["type"] == "invoice.paid" and payload["data"] == MESSAGE.data
    assert payload["timestamp"].endswith("Z")


def test_retries_keep_the_id_and_refresh_timestamp_and_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([1_700_000_000.0 + i for i in range(0, 100, 10)])
    monkeypatch.setattr(_clock, "now", lambda: next(clock))
    with HttpServer([Reply(503), Reply(200)]) as server:
        t = transport()

        async def attempts() -> None:
            try:
                with pytest.raises(TransientChannelError):
                    await t.send(server.url, MESSAGE, "stable-id")
                await t.send(server.url, MESSAGE, "stable-id")
            finally:
                await t.close()

        asyncio.run(attempts())
    first, second = server.hits
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == "stable-id"
    assert first.headers["webhook-timestamp"] != second.headers["webhook-timestamp"]
    assert first.headers["webhook-signature"] != second.headers["webhook-signature"]
    for hit in (first, second):
        now = float(hit.headers["webhook-timestamp"])
        assert verify_webhook(SECRET, hit.headers, hit.body, now=now)


def test_unsigned_delivery_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tidings.webhook")
    with HttpServer() as server:
        send(transport(secret=None), server.url, "a", "b")
    assert all("webhook-signature" not in hit.headers for hit in server.hits)
    assert caplog.text.count("unsigned") == 1


def test_410_disables_the_endpoint() -> None:
    with (
        HttpServer([Reply(410, b"unsubscribed")]) as server,
        pytest.raises(WebhookGoneError, match="gone") as info,
    ):
        send(transport(), server.url, "d")
    assert info.value.permanent and info.value.disabled and info.value.code == 410
    assert isinstance(info.value, PermanentChannelError)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408])
def test_server_errors_are_transient(status: int) -> None:
    with (
        HttpServer([Reply(status)]) as server,
        pytest.raises(TransientChannelError, match=f"HTTP {status}") as info,
    ):
        send(transport(), server.url, "d")
    assert info.value.code == status and info.value.channel == "webhook"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_permanent(status: int) -> None:
    with HttpServer([Reply(status)]) as server, pytest.raises(PermanentChannelError) as info:
        send(transport(), server.url, "d")
    assert info.value.code == status


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [("7", 7, 7), ("junk", None, None), ("864000", 3600, 3600), ("date", 25, 31)],
)
def test_429_honours_retry_after(header: str, low: float | None, high: float | None) -> None:
    value = formatdate(time.time() + 30, usegmt=True) if header == "date" else header
    with (
        HttpServer([Reply(429, headers={"Retry-After": value})]) as server,
        pytest.raises(TransientChannelError) as info,
    ):
        send(transport(), server.url, "d")
    retry = info.value.retry_after_s
    assert (retry is None) if low is None else (low <= retry <= high)  # type: ignore[operator]


def test_redirects_are_not_followed(connects: list[tuple[str, int]]) -> None:
    with (
        HttpServer() as canary,
        HttpServer(
            [
                Reply(302, headers={"Location": canary.url + "/"}),
                Reply(307, headers={"Location": "http://169.254.169.254/"}),
            ]
        ) as server,
    ):
        t = transport()
        for _ in range(2):
            with pytest.raises(PermanentChannelError, match=r"HTTP 30[27]"):
                send(t, server.url, "d")
            t = transport()
        assert canary.hits == []
    assert {port for _, port in connects} == {server.port}


def test_slow_server_hits_the_deadline() -> None:
    with HttpServer([Reply(200, delay_s=10)]) as server:
        started = time.monotonic()
        with pytest.raises(TransientChannelError, match="may have been delivered"):
            send(transport(deadline_s=1.0), server.url, "d")
        assert time.monotonic() - started < 1.5


def test_dripping_body_is_cut_at_the_deadline() -> None:
    with HttpServer([Reply(200, b"x" * 30, drip_s=1.0)]) as server:
        started = time.monotonic()
        [result] = send(transport(deadline_s=1.0), server.url, "d")
        assert time.monotonic() - started < 1.5
    assert result.status == 200 and len(result.response) < 30


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, endless=True),
        Reply(200, content_length=100 * 1024 * 1024),
        Reply(500, endless=True),
    ],
    ids=["endless-chunked", "huge-content-length", "endless-500"],
)
def test_response_body_is_capped(reply: Reply) -> None:
    with HttpServer([reply]) as server:
        t = transport(deadline_s=5.0, max_response_bytes=4096)
        started = time.monotonic()
        try:
            [result] = send(t, server.url, "d")
            assert result.status == 200 and len(result.response) <= 300
        except TransientChannelError as exc:
            assert exc.code == 500 and len(str(exc)) <= 400
        # Stopping at the cap, long before the deadline, is what bounds memory here.
        assert time.monotonic() - started < 2.0


INTERNAL = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://10.0.0.1/",
    "http://100.64.0.1/",
    "http://[::ffff:169.254.169.254]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[2002:a9fe:a9fe::1]/",
    "http://[fd00:ec2::254]/",
    "http://2852039166/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://0251.0376.0251.0376/",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "http://user:pw@example.org/",
    "http://example.org:6379/",
]


@pytest.mark.parametrize("url", INTERNAL)
def test_internal_targets_are_refused_before_connect(
    url: str, connects: list[tuple[str, int]]
) -> None:
    resolver = FakeResolver(["93.184.216.34"])
    with pytest.raises(ValidationError) as info:
        send(transport(allow_private=False, resolver=resolver), url, "d")
    assert info.value.field == "url"
    assert connects == [] and resolver.calls == []


def test_loopback_canary_is_never_hit(connects: list[tuple[str, int]]) -> None:
    with HttpServer() as canary:
        with pytest.raises(ValidationError):
            send(transport(allow_private=False), f"http://127.0.0.1:{canary.port}/", "d")
        assert canary.hits == [] and connects == []


@pytest.mark.parametrize("answers", [["169.254.169.254"], ["93.184.216.34", "127.0.0.1"]])
def test_names_resolving_to_internal_addresses_are_refused(
    answers: list[str], connects: list[tuple[str, int]]
) -> None:
    resolver = FakeResolver(answers)
    with pytest.raises(ValidationError, match="resolves to"):
        send(transport(allow_private=False, resolver=resolver), "http://evil.example.org/", "d")
    assert resolver.calls == ["evil.example.org"] and connects == []


def test_dns_rebinding_connects_to_the_vetted_address(connects: list[tuple[str, int]]) -> None:
    with (
        HttpServer(host="127.0.0.2") as vetted,
        HttpServer(host="127.0.0.1", port=vetted.port) as canary,
    ):
        resolver = FakeResolver(["127.0.0.2"], ["127.0.0.1"])
        url = f"http://rebind.example.org:{vetted.port}/hook"
        [result] = send(transport(resolver=resolver), url, "d")
        assert result.status == 200
        assert len(vetted.hits) == 1 and canary.hits == []
    assert vetted.hits[0].headers["host"] == f"rebind.example.org:{vetted.port}"
    assert resolver.calls == ["rebind.example.org"]
    assert connects == [("127.0.0.2", vetted.port)]


@pytest.mark.parametrize(
    ("errno", "error"),
    [(socket.EAI_AGAIN, TransientChannelError), (socket.EAI_NONAME, PermanentChannelError)],
)
def test_dns_failures_are_classified(
    errno: int, error: type[Exception], connects: list[tuple[str, int]]
) -> None:
    resolver = FakeResolver(socket.gaierror(errno, "fake"))
    with pytest.raises(error, match="resolve"):
        send(transport(resolver=resolver), "https://hooks.example.org/", "d")
    assert connects == []


def test_connection_refused_is_transient() -> None:
    with pytest.raises(TransientChannelError, match="cannot connect"):
        send(transport(), f"http://127.0.0.1:{free_port()}/", "d")


def test_unserializable_data_is_refused_before_connect(connects: list[tuple[str, int]]) -> None:
    with HttpServer() as server:
        with pytest.raises(ValidationError):
            send(transport(), server.url, "d", message=WebhookMessage({"x": object()}))
        assert server.hits == [] and connects == []


def tls_context_trusting(ca_path: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_path)


def issue(tmp_path: Path, *names: str) -> tuple[ssl.SSLContext, str]:
    import trustme

    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    ca_path = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(ca_path)
    return context, ca_path


def test_https_pinned_connect_verifies_the_host_name(tmp_path: Path) -> None:
    server_context, ca_path = issue(tmp_path, "hooks.example.org")
    with HttpServer(tls_context=server_context) as server:
        resolver = FakeResolver(["127.0.0.1"])
        t = transport(resolver=resolver, verify=tls_context_trusting(ca_path))
        [result] = send(t, f"https://hooks.example.org:{server.port}/in", "d")
    assert (
        result.status == 200
        and server.hits[0].headers["host"] == f"hooks.example.org:{server.port}"
    )


def test_https_certificate_for_another_name_is_permanent(tmp_path: Path) -> None:
    server_context, ca_path = issue(tmp_path, "other.example.org")
    with HttpServer(tls_context=server_context) as server:
        t = transport(resolver=FakeResolver(["127.0.0.1"]), verify=tls_context_trusting(ca_path))
        with pytest.raises(PermanentChannelError, match="cannot connect"):
            send(t, f"https://hooks.example.org:{server.port}/in", "d")
        assert server.hits == []


def test_invalid_delivery_id_makes_no_request(connects: list[tuple[str, int]]) -> None:
    with HttpServer() as server, pytest.raises(ValidationError):
        send(transport(), server.url, "id\r\nX-Injected: 1")
    assert server.hits == [] and connects == []
