"""Queued notifications end to end: real Redis, an in-process worker, aiosmtpd, an SMS stub
and a webhook receiver on loopback.

Covers the fan-out (one SendQueuedNotification per notifiable per channel, each with a
stable delivery id: Message-ID, ``I-Twilio-Idempotency-Token``, ``webhook-id``), a
failing channel retrying alone, and L6 at CI size (200 notifiables, not 1,000).
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.integration.notify_support import (
    SECRET,
    SID,
    SMS_FROM,
    TOKEN,
    InvoicePaid,
    Servers,
    form,
    parse,
    parts,
    work,
)
from tests.support.smtp import Recorder, SmtpServer
from tidings import App
from tidings.notifications import verify_webhook
from tidings.observability.lifecycle import JobReleased

AppFactory = Callable[..., App]


def figure(text: str) -> None:
    print(f"\nFIGURE {text}")


def test_three_users_three_channels_nine_jobs(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    users = [s.user(i) for i in range(1, 4)]
    ids = app.notify(users, InvoicePaid("INV-7"))
    assert len(ids) == 9 and len(set(ids)) == 9
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 9

    work(app)

    # mail: one message per user, right To/Subject, both parts, Message-ID = delivery id
    assert len(s.smtp.messages) == 3
    by_to = {m.rcpt_tos[0]: parse(m) for m in s.smtp.messages}
    assert set(by_to) == {u.email for u in users}
    message_ids = set()
    for u in users:
        msg = by_to[u.email]
        assert msg["To"] == u.email
        assert msg["Subject"] == "Invoice INV-7 paid"
        assert msg["From"] == "Acme Billing <billing@example.org>"
        body = parts(msg)
        assert set(body) == {"text/plain", "text/html"}
        assert f"Hi {u.name}" in body["text/plain"] and f"Hi {u.name}" in body["text/html"]
        assert "https://example.org/invoices/INV-7" in body["text/html"]
        mid = msg["Message-ID"]
        assert mid.startswith("<") and mid.endswith("@tidings>")
        message_ids.add(mid[1 : -len("@tidings>")])
    assert len(message_ids) == 3
    assert 1 <= s.smtp.sessions <= 3  # concurrent jobs share the worker's SMTP pool (?pool=4)

    # sms: three Twilio-shaped form posts, basic auth, idempotency token
    assert len(s.sms.hits) == 3
    tokens = set()
    for hit in s.sms.hits:
        assert hit.method == "POST"
        assert hit.path == f"/2010-04-01/Accounts/{SID}/Messages.json"
        assert hit.headers["content-type"] == "application/x-www-form-urlencoded"
        assert hit.headers["authorization"].startswith("Basic ")
        f = form(hit)
        assert f["From"] == SMS_FROM and f["Body"] == "Invoice INV-7 paid"
        tokens.add(hit.headers["i-twilio-idempotency-token"])
    assert {form(h)["To"] for h in s.sms.hits} == {u.phone for u in users}
    assert len(tokens) == 3

    # webhooks: three signed requests, verified with the receiver helper
    assert len(s.hooks.hits) == 3
    webhook_ids = set()
    for hit in s.hooks.hits:
        payload = verify_webhook(SECRET, hit.headers, hit.body)
        assert payload["type"] == "invoice.paid"
        assert payload["data"]["invoice"] == "INV-7"
        assert hit.path == f"/hooks/{payload['data']['user']}"
        webhook_ids.add(hit.headers["webhook-id"])
    assert len(webhook_ids) == 3

    # one delivery id per (notifiable, channel): never shared between channels
    assert len(message_ids | tokens | webhook_ids) == 9
    assert app.queue_for(None).sizes(["default"])["default"] == {
        "ready": 0,
        "delayed": 0,
        "reserved": 0,
        "failed": 0,
    }
    assert all(app.job_status(i) == "done" for i in ids)
    assert TOKEN not in repr(s.sms.hits[0].body)


def test_failing_channel_retries_alone(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    user = s.user(1)
    s.sms.fail_once.add(user.phone)
    released: list[str] = []
    app.listen(JobReleased, lambda e: released.append(e.name))

    app.notify(user, InvoicePaid("INV-8"))
    work(app)

    assert released == ["InvoicePaid (sms)"]
    assert len(s.smtp.messages) == 1  # mail not re-sent by the SMS retry
    assert len(s.hooks.hits) == 1
    first, second = s.sms.hits
    assert (
        first.headers["i-twilio-idempotency-token"] == second.headers["i-twilio-idempotency-token"]
    )
    assert form(first) == form(second)
    assert app.queue_for(None).failed() == []


def test_l6_fan_out_200_users(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    users = [s.user(i) for i in range(200)]
    flaky = {u.phone for u in users[::10]}  # 10 %
    s.sms.fail_once |= flaky

    t0 = time.monotonic()
    ids = app.notify(users, InvoicePaid("INV-L6"))
    assert len(ids) == 600
    work(app, concurrency=32)
    elapsed = time.monotonic() - t0

    # mail: exactly 200, no re-send caused by SMS retries
    assert len(s.smtp.messages) == 200
    assert sorted(m.rcpt_tos[0] for m in s.smtp.messages) == sorted(u.email for u in users)
    assert len({parse(m)["Message-ID"] for m in s.smtp.messages}) == 200

    # webhooks: 200 unique webhook-ids, all verified
    assert len(s.hooks.hits) == 200
    assert len({h.headers["webhook-id"] for h in s.hooks.hits}) == 200
    for hit in s.hooks.hits:
        verify_webhook(SECRET, hit.headers, hit.body)

    # sms: 200 + one retry per flaky number, the retry carrying its original key
    by_number: dict[str, list[str]] = collections.defaultdict(list)
    for hit in s.sms.hits:
        by_number[form(hit)["To"]].append(hit.headers["i-twilio-idempotency-token"])
    assert len(s.sms.hits) == 200 + len(flaky) == 220
    assert set(by_number) == {u.phone for u in users}
    for number, tokens in by_number.items():
        assert len(tokens) == (2 if number in flaky else 1)
        assert len(set(tokens)) == 1
    assert len({t[0] for t in by_number.values()}) == 200

    assert app.queue_for(None).failed() == []
    figure(
        f"L6 200 notifiables x 3 channels: 200 mails, 200 webhook-ids, "
        f"{len(s.sms.hits)} SMS requests (20 retried with their key) in {elapsed:.2f}s"
    )


def test_job_carries_delivery_id_fixed_at_dispatch(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    app.notify([s.user(1), s.user(2)], InvoicePaid("INV-9", channels=("mail",)))
    rq = app.queue_for(None)
    raw: list[bytes] = list(rq.client.hvals(rq.keys("default").jobs))  # type: ignore[arg-type]
    queued = {m.decode() for r in raw for m in re.findall(rb'"delivery_id":"([0-9a-f]{32})"', r)}
    assert len(queued) == 2
    work(app)
    sent = {parse(m)["Message-ID"] for m in s.smtp.messages}
    assert sent == {f"<{d}@tidings>" for d in queued}


@dataclass
class QuitRecorder(Recorder):
    quits: int = 0

    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> str:
        self.quits += 1
        return "221 Bye"


def test_worker_closes_its_channels_on_exit(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    recorder = QuitRecorder()
    with SmtpServer(recorder) as smtp:
        app = app_factory(s, mail_url=f"smtp://127.0.0.1:{smtp.port}?tls=off")
        app.notify([s.user(1), s.user(2)], InvoicePaid("Q", channels=("mail",)))
        work(app)
        assert len(smtp.messages) == 2 and 1 <= smtp.sessions <= 2
        assert recorder.quits == smtp.sessions  # every pooled session was closed politely


def test_notifiables_from_any_iterable(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    users = (s.user(i) for i in range(3))  # a generator, like an ORM queryset
    assert len(app.notify(users, InvoicePaid("G", channels=("mail",)))) == 3
    work(app)
    assert len(s.smtp.messages) == 3
