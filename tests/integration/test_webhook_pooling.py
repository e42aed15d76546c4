"""Webhook transport: pooled keep-alive connections, stateless deliveries, cheap sniffio miss."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from typing import Any

import httpcore
import pytest

from tests.support.http import HttpServer, Reply
from tidings.notifications.channels import webhook
from tidings.notifications.channels.webhook import WebhookTransport
from tidings.notifications.messages import WebhookMessage

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGE = WebhookMessage({"invoice": 7}, type="invoice.paid")


def _send_all(t: WebhookTransport, urls: list[str]) -> None:
    async def go() -> None:
        try:
            for i, url in enumerate(urls):
                await t.send(url, MESSAGE, f"d{i}")
        finally:
            await t.close()

    asyncio.run(go())


def test_deliveries_reuse_one_pooled_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    connects: list[tuple[str, int]] = []
    real = httpcore.AnyIOBackend.connect_tcp

    async def record(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        connects.append((host, port))
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", record)
    with HttpServer() as server:
        _send_all(WebhookTransport(secret=SECRET, allow_private=True), [server.url + "/h"] * 5)
    assert len(server.hits) == 5
    assert len(connects) == 1


def test_cookies_an_endpoint_sets_are_not_sent_with_later_deliveries() -> None:
    # Two endpoints on one host (two tenants of a hook service, say): what the first
    # answers with must not travel with the next delivery, to it or to the other one.
    reply = Reply(200, b"ok", headers={"Set-Cookie": "sid=tenant-a; Path=/"})
    with HttpServer([reply]) as server:
        urls = [server.url + "/tenant-a", server.url + "/tenant-b", server.url + "/tenant-a"]
        _send_all(WebhookTransport(secret=SECRET, allow_private=True), urls)
    assert len(server.hits) == 3
    assert [hit.headers.get("cookie") for hit in server.hits] == [None, None, None]


def test_a_closed_transport_refuses_to_send() -> None:
    t = WebhookTransport(secret=SECRET, allow_private=True)

    async def go() -> None:
        await t.close()
        with pytest.raises(RuntimeError, match="closed"):
            await t.send("http://127.0.0.1:9/", MESSAGE, "d1")

    asyncio.run(go())


def _sniffio_installed() -> bool:
    if "sniffio" in sys.modules and sys.modules["sniffio"] is None:
        return False  # marked missing: only done when find_spec found nothing
    return importlib.util.find_spec("sniffio") is not None


@pytest.mark.skipif(_sniffio_installed(), reason="sniffio is installed")
def test_missing_sniffio_is_marked_known_missing() -> None:
    # httpcore imports sniffio per lock/event; a missing one must fail fast, and the
    # async library must still be detected as asyncio.
    assert "sniffio" in sys.modules and sys.modules["sniffio"] is None
    with pytest.raises(ImportError):
        import sniffio  # noqa: F401

    from httpcore._synchronization import current_async_library

    async def detect() -> str:
        return current_async_library()

    assert asyncio.run(detect()) == "asyncio"


def test_an_installed_sniffio_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "sniffio", raising=False)
    spec = importlib.util.spec_from_loader("sniffio", loader=None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    webhook._settle_sniffio()
    assert "sniffio" not in sys.modules
