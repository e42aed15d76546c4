"""The notification API through the real queue: should_send at send time, per-channel
queues and delays, notify_now, on-demand routes, app.notify, the async twins, the
Sending veto, Sent/Failed events and a custom channel (``app.extend_channel``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.notify_support import (
    GATE,
    HOOKS,
    SLACK,
    Gated,
    InvoicePaid,
    InvoicePaidNow,
    Routed,
    Servers,
    SlackChannel,
    ToSlack,
    form,
    options,
    parse,
    work,
)
from tests.support.http import Reply
from tidings import App
from tidings.errors import PermanentChannelError
from tidings.notifications import (
    NotificationFailed,
    NotificationSending,
    NotificationSent,
    route,
)
from tidings.notifications.channels.base import DeliveryResult
from tidings.worker.worker import Worker

AppFactory = Callable[..., App]


def sizes(app: App, *queues: str) -> dict[str, dict[str, int]]:
    result: dict[str, dict[str, int]] = app.queue_for(None).sizes(list(queues))
    return result


def test_should_send_is_asked_in_the_worker(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    ids = app.notify(s.user(1), Gated("INV-1"))
    assert len(ids) == 3
    assert HOOKS == []  # not asked at notify() time
    GATE["sms"] = False  # changes after queueing, before sending
    work(app)
    assert sorted(h[1] for h in HOOKS if h[0] == "should_send") == ["mail", "sms", "webhook"]
    assert len(s.smtp.messages) == 1 and len(s.hooks.hits) == 1
    assert s.sms.hits == []
    assert all(app.job_status(i) == "done" for i in ids)  # skipped, not failed


def test_via_queues_and_with_delay(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    t0 = time.monotonic()
    app.notify(s.user(1), Routed("INV-2"))
    got = sizes(app, "mail", "sms", "default")
    assert got["mail"]["ready"] == 1
    assert got["sms"] == {"ready": 0, "delayed": 1, "reserved": 0, "failed": 0}
    assert got["default"]["ready"] == 1  # webhook: the notification's own queue

    work(app, queues=["mail", "sms", "default"])
    [sms] = s.sms.stamped
    assert sms.at - t0 >= 2.0 - 0.05
    assert len(s.smtp.messages) == 1 and len(s.hooks.hits) == 1
    assert s.hooks.stamped[0].at < sms.at


def test_notify_now_sends_at_once_even_when_queued(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    user = s.user(1)
    results = user.notify_now(InvoicePaid("INV-3"))
    assert [r.channel for r in results] == ["mail", "sms", "webhook"]
    assert all(isinstance(r, DeliveryResult) for r in results)
    assert len(s.smtp.messages) == 1 and len(s.sms.hits) == 1 and len(s.hooks.hits) == 1
    assert sizes(app, "default")["default"]["ready"] == 0  # nothing queued
    # only some channels
    [only] = user.notify_now(InvoicePaid("INV-3b"), channels=["sms"])
    assert only.channel == "sms" and len(s.sms.hits) == 2 and len(s.smtp.messages) == 1


def test_notification_without_should_queue_is_sent_by_notify(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    assert s.user(1).notify(InvoicePaidNow("INV-4")) == []
    assert len(s.smtp.messages) == 1 and len(s.sms.hits) == 1
    assert sizes(app, "default")["default"]["ready"] == 0


def test_on_demand_routes(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    ids = (
        route("mail", "guest@example.org")
        .route("sms", "+15550002222")
        .route("webhook", f"{s.hooks.url}/guest")
        .notify(InvoicePaid("INV-5"))
    )
    assert len(ids) == 3
    work(app)
    [m] = s.smtp.messages
    assert m.rcpt_tos == ["guest@example.org"]
    assert [form(h)["To"] for h in s.sms.hits] == ["+15550002222"]
    assert [h.path for h in s.hooks.hits] == ["/guest"]


def test_app_notify_one_and_many(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    one = app.notify(s.user(1), InvoicePaid("INV-6", channels=("mail",)))
    many = app.notify([s.user(2), s.user(3)], InvoicePaid("INV-6", channels=("mail", "sms")))
    assert len(one) == 1 and len(many) == 4
    work(app)
    assert sorted(m.rcpt_tos[0] for m in s.smtp.messages) == [
        "user1@example.org",
        "user2@example.org",
        "user3@example.org",
    ]
    assert len(s.sms.hits) == 2


def test_async_twins(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    u1, u2, u3 = s.user(1), s.user(2), s.user(3)

    async def main() -> None:
        ids = await u1.notify_async(InvoicePaid("A1", channels=("mail",)))
        ids += await app.notify_async([u2, u3], InvoicePaid("A2", channels=("sms",)))
        assert len(ids) == 3
        now = await u1.notify_now_async(InvoicePaid("A3", channels=("webhook",)))
        assert [r.status for r in now] == [200]
        assert len(s.hooks.hits) == 1 and s.smtp.messages == []
        # the sync API refuses to block a running loop
        with pytest.raises(RuntimeError, match="notify_now_async"):
            u1.notify_now(InvoicePaid("A4"))
        assert await Worker(app, options()).run() == 0
        await app.notifications.channels.close_loop()

    asyncio.run(main())
    assert [m.rcpt_tos for m in s.smtp.messages] == [["user1@example.org"]]
    assert sorted(form(h)["To"] for h in s.sms.hits) == [u2.phone, u3.phone]


def test_sending_veto_sent_response_and_failed_events(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    u1, u2 = s.user(1), s.user(2)
    s.sms.always[u2.phone] = Reply(401, b'{"message": "Authenticate", "code": 20003}')
    sending: list[tuple[int, str]] = []
    sent: dict[tuple[int, str], Any] = {}
    failed: list[NotificationFailed] = []

    def veto(e: NotificationSending) -> bool | None:
        sending.append((e.notifiable.id, e.channel))
        return False if (e.notifiable.id, e.channel) == (1, "webhook") else None

    app.listen(NotificationSending, veto)
    app.listen(NotificationSent, lambda e: sent.__setitem__((e.notifiable.id, e.channel), e))
    app.listen(NotificationFailed, failed.append)

    ids = app.notify([u1, u2], InvoicePaid("INV-E"))
    work(app)

    assert sorted(sending) == sorted((u, c) for u in (1, 2) for c in ("mail", "sms", "webhook"))
    # veto: user 1's webhook never left; the job is done, not failed
    assert [h.path for h in s.hooks.hits] == ["/hooks/2"]
    assert (1, "webhook") not in sent
    # Sent carries the channel's response
    mail = sent[(1, "mail")]
    assert isinstance(mail.response, DeliveryResult)
    assert mail.response.status == 250 and "queued as 42" in mail.response.response
    assert mail.delivery_id == mail.response.delivery_id
    assert parse(s.smtp.messages[0])["Message-ID"] in {
        f"<{sent[(u, 'mail')].delivery_id}@tidings>" for u in (1, 2)
    }
    sms = sent[(1, "sms")]
    assert sms.response.provider_id.startswith("SM") and sms.response.status == 201
    assert sent[(2, "webhook")].response.status == 200
    # Failed: user 2's SMS (401, permanent) once, then the notification's failed() hook
    [f] = failed
    assert (f.notifiable.id, f.channel) == (2, "sms")
    assert isinstance(f.exception, PermanentChannelError) and f.exception.code == 401
    assert [("failed", "sms", "PermanentChannelError", str(f.exception))] == HOOKS
    [record] = app.queue_for(None).failed()
    assert record.name == "InvoicePaid (sms)" and record.attempts == 1
    assert sum(app.job_status(i) == "done" for i in ids) == 5


def test_custom_channel(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    app.extend_channel("slack", SlackChannel)
    responses: list[tuple[str, Any]] = []
    app.listen(NotificationSent, lambda e: responses.append((e.channel, e.response)))

    ids = app.notify([s.user(1), s.user(2, slack_channel="#ops")], ToSlack("deploy done"))
    assert len(ids) == 4
    work(app)
    assert sorted(SLACK) == [("#ops", "deploy done"), ("#user-1", "deploy done")]
    assert sorted(r for c, r in responses if c == "slack") == ["slack ok #ops", "slack ok #user-1"]
    assert len(s.smtp.messages) == 2
    # and synchronously
    s.user(3).notify_now(ToSlack("now"), channels=["slack"])
    assert SLACK[-1] == ("#user-3", "now")


def test_async_listeners_and_a_raising_sent_listener(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    seen: list[str] = []

    async def veto_sms(e: NotificationSending) -> bool | None:
        await asyncio.sleep(0)
        return False if e.channel == "sms" else None

    async def on_sent(e: NotificationSent) -> None:
        await asyncio.sleep(0)
        seen.append(e.channel)

    def broken(e: NotificationSent) -> None:
        raise RuntimeError("listener bug")

    app.listen(NotificationSending, veto_sms)
    app.listen(NotificationSent, on_sent)
    app.listen(NotificationSent, broken)
    ids = app.notify(s.user(1), InvoicePaid("INV-L"))
    work(app)
    assert sorted(seen) == ["mail", "webhook"]
    assert s.sms.hits == []
    # the delivery happened: a listener bug must not fail the job and send it again
    assert len(s.smtp.messages) == 1 and len(s.hooks.hits) == 1
    assert [app.job_status(i) for i in ids] == ["done"] * 3
