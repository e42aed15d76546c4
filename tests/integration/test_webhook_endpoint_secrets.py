"""Each webhook endpoint may have its own secret (as Stripe and Svix give).

One app-wide secret for every receiver lets one tenant forge deliveries another
tenant's receiver accepts. A ``WebhookEndpoint`` route or ``WebhookMessage(secret=)``
signs with the endpoint's own secret; the app's ``TIDINGS_WEBHOOK_SECRET`` stays the
fallback.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from tests.support.http import Hit, HttpServer
from tidings import App, ShouldQueue
from tidings.notifications import (
    Notifiable,
    Notification,
    WebhookEndpoint,
    WebhookMessage,
    route,
    verify_webhook,
)
from tidings.notifications.webhooks import WebhookVerificationError
from tidings.worker.worker import Worker, WorkerOptions

MODULE = __name__
KEY = "endpoint-secrets-key-0123456789abcdef"
APP_SECRET = "whsec_" + base64.b64encode(b"app-wide-secret-for-every-hook!!").decode()
TENANT_A = "whsec_" + base64.b64encode(b"tenant-a-own-secret-32-bytes!!!!").decode()
TENANT_B = "whsec_" + base64.b64encode(b"tenant-b-own-secret-32-bytes!!!!").decode()
MESSAGE_SECRET = "whsec_" + base64.b64encode(b"one-message-own-secret-32-bytes!").decode()


@dataclass
class Tenant(Notifiable):
    url: str
    secret: str | None

    def route_notification_for_webhook(self, notification: Any) -> Any:
        # Resolved in the worker: the secret never enters Redis.
        return WebhookEndpoint(self.url, secret=self.secret) if self.secret else self.url


@dataclass
class Ping(Notification, ShouldQueue):
    own_secret: bool = False
    tries: ClassVar[int | None] = 1

    def via(self, notifiable: Any) -> list[str]:
        return ["webhook"]

    def to_webhook(self, notifiable: Any) -> WebhookMessage:
        return WebhookMessage({"ping": 1}, secret=MESSAGE_SECRET if self.own_secret else None)


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        webhook_secret=APP_SECRET,
        webhook_allow_private=True,
    )
    try:
        yield a
    finally:
        a.close()


def accepts(secret: str, hit: Hit) -> bool:
    try:
        verify_webhook(secret, hit.headers, hit.body)
    except WebhookVerificationError:
        return False
    return True


def test_each_endpoint_is_signed_with_its_own_secret(app: App) -> None:
    with HttpServer() as server:
        Tenant(f"{server.url}/a", TENANT_A).notify(Ping())
        Tenant(f"{server.url}/b", TENANT_B).notify(Ping())
        Tenant(f"{server.url}/plain", None).notify(Ping())
        Tenant(f"{server.url}/msg", TENANT_A).notify(Ping(own_secret=True))
        route("webhook", WebhookEndpoint(f"{server.url}/ondemand", secret=TENANT_B)).notify(Ping())

        async def run() -> int:
            worker = Worker(app, WorkerOptions(sleep_s=0.1, stop_when_empty=True))
            return await asyncio.wait_for(worker.run(), 30)

        assert asyncio.run(run()) == 0
        hits = {h.path: h for h in server.hits}
    assert set(hits) == {"/a", "/b", "/plain", "/msg", "/ondemand"}
    secrets = {
        "/a": TENANT_A,
        "/b": TENANT_B,
        "/plain": APP_SECRET,
        "/msg": MESSAGE_SECRET,
        "/ondemand": TENANT_B,
    }
    for path, hit in hits.items():
        for secret in (APP_SECRET, TENANT_A, TENANT_B, MESSAGE_SECRET):
            # Each receiver accepts its own secret's signature, and no other.
            assert accepts(secret, hit) is (secret == secrets[path]), (path, secret[:12])
    assert app.queue_for(None).failed() == []


def test_endpoint_secrets_are_hidden_from_repr() -> None:
    assert TENANT_A not in repr(WebhookEndpoint("https://example.org/h", secret=TENANT_A))
    assert TENANT_A not in repr(WebhookMessage({}, secret=TENANT_A))
