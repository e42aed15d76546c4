"""Failure handling of queued notifications through the real queue and worker.

Rows: F14 (SMTP down: retried with the configured backoff, then failed "connection
refused"), F16 (550 fails at once, 451 retried up to tries), F19 (webhook 410 stops,
429 + Retry-After delays the next attempt), F20/B19 (SMS 401: one attempt, the token in
neither the failed store, the CLI nor the logs), B9 (template errors fail once), B10
(template-looking data rendered literally), B11/B12/B13 (bad addresses and CR/LF refused
at notify() and, injected straight into a job, failed on the first attempt with no SMTP
session), B14 (webhook to 169.254.169.254 refused at notify() and at delivery, no connect).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.notify_support import (
    HOOKS,
    KEY,
    SID,
    TOKEN,
    Hostile,
    InvoicePaid,
    RawSubject,
    Servers,
    SlowBackoff,
    Templated,
    TwoTries,
    failed_store,
    parse,
    parts,
    templates_dir,
    work,
)
from tests.support.http import Hit, Reply
from tests.support.procs import free_port
from tidings import App
from tidings.errors import ValidationError
from tidings.notifications import NotificationFailed, NotificationSending
from tidings.notifications.queued import SendQueuedNotification

AppFactory = Callable[..., App]
ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")


def figure(text: str) -> None:
    print(f"\nFIGURE {text}")


def attempt_times(app: App, channel: str) -> tuple[list[float], list[float]]:
    """When each attempt on ``channel`` started, and when each one failed."""
    started: list[float] = []
    failed: list[float] = []

    def start(e: NotificationSending) -> None:
        if e.channel == channel:
            started.append(time.monotonic())

    def fail(e: NotificationFailed) -> None:
        if e.channel == channel:
            failed.append(time.monotonic())

    app.listen(NotificationSending, start)
    app.listen(NotificationFailed, fail)
    return started, failed


# -- SMTP ----------------------------------------------------------------------------------


def test_smtp_550_fails_after_one_attempt(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    user = s.user(1)
    s.smtp.recorder.rcpt_replies[user.email] = "550 5.1.1 no such user"

    def broken(e: NotificationFailed) -> None:  # must not mask the 550 (and retry it)
        raise RuntimeError("listener bug")

    app.listen(NotificationFailed, broken)
    app.notify(user, InvoicePaid("X", channels=("mail",)))
    work(app)
    [record] = failed_store(app)
    assert record.attempts == 1 and record.name == "InvoicePaid (mail)"
    assert "550" in record.exception and "PermanentChannelError" in record.exception
    assert s.smtp.recorder.rcpts_seen == [user.email]
    assert s.smtp.messages == []
    assert [h[:2] for h in HOOKS] == [("failed", "mail")]


def test_smtp_451_is_retried_up_to_tries(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    user = s.user(1)
    s.smtp.recorder.rcpt_replies[user.email] = "451 4.3.0 try again later"
    app.notify(user, TwoTries("X", channels=("mail",)))
    work(app)
    [record] = failed_store(app)
    assert record.attempts == 2
    assert "451" in record.exception and "TransientChannelError" in record.exception
    assert s.smtp.recorder.rcpts_seen == [user.email, user.email]
    assert s.smtp.messages == []


def test_f14_smtp_down_retries_with_backoff_then_fails(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s, mail_url=f"smtp://127.0.0.1:{free_port()}?tls=off")
    times, failures = attempt_times(app, "mail")
    ids = app.notify(s.user(1), SlowBackoff("X", channels=("mail", "webhook")))
    work(app)
    assert len(times) == len(failures) == 3  # attempts = max tries
    # from the end of one attempt to the start of the next
    delays = [b - a for a, b in zip(failures, times[1:], strict=False)]
    # backoff +10 %, plus 50 ms: Redis checks BLPOP timeouts on its 100 ms (hz 10) tick,
    # so a worker blocked until a delayed job is due can wake up to ~0.1 s late.
    assert 1.0 <= delays[0] <= 1.1 + 0.05 and 2.0 <= delays[1] <= 2.2 + 0.05, delays
    [record] = failed_store(app)
    assert record.attempts == 3 and record.name == "SlowBackoff (mail)"
    assert "connection refused" in record.exception.lower(), record.exception
    # the other channel's job flowed meanwhile
    assert len(s.hooks.hits) == 1 and s.hooks.stamped[0].at < times[1]
    assert app.job_status(ids[1]) == "done"
    figure(
        f"F14 SMTP down: 3 attempts, delays {delays[0]:.3f}s and {delays[1]:.3f}s "
        "(backoff 1 s, 2 s), failed 'connection refused'"
    )


def test_b9_template_errors_fail_once_and_send_nothing(
    servers: Servers, app_factory: AppFactory, tmp_path: Path
) -> None:
    s = servers
    folder = templates_dir(
        tmp_path,
        {
            "undefined.html.j2": "<p>Hello</p>\n<p>{{ name }}</p>\n<p>{{ missing_var }}</p>\n",
            "syntax.html.j2": "<p>\n{% if %}\n</p>\n",
        },
    )
    app = app_factory(s, templates=folder)
    user = s.user(1)
    for template in ("undefined.html.j2", "syntax.html.j2", "absent.html.j2"):
        n = Templated("X", channels=("mail",), template=template, context={"name": "Ada"})
        app.notify(user, n)
    work(app)
    records = {r.exception.splitlines()[-1]: r for r in failed_store(app)}
    assert len(records) == 3
    assert all(r.attempts == 1 for r in records.values())
    text = "\n".join(records)
    assert "undefined.html.j2, line 3" in text and "missing_var" in text
    assert "syntax.html.j2, line 2" in text
    assert "template not found: absent.html.j2" in text
    assert s.smtp.messages == [] and s.smtp.sessions == 0


def test_b10_template_looking_data_is_rendered_literally(
    servers: Servers, app_factory: AppFactory, tmp_path: Path
) -> None:
    s = servers
    folder = templates_dir(tmp_path, {"hello.html.j2": "<p>Hello {{ name }}</p>\n"})
    app = app_factory(s, templates=folder)
    payload = "{{ 7*7 }} <script>alert(1)</script>"
    user = s.user(1)
    app.notify(user, Hostile("X", channels=("mail",), payload=payload))
    app.notify(
        user,
        Templated("X", channels=("mail",), template="hello.html.j2", context={"name": payload}),
    )
    work(app)
    assert len(s.smtp.messages) == 2
    for received in s.smtp.messages:
        msg = parse(received)
        body = parts(msg)
        html, text = body["text/html"], body["text/plain"]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
        assert "{{ 7*7 }}" in html and "{{ 7*7 }}" in text
        assert "<script>alert(1)</script>" in text
        assert "49" not in html and "49" not in text
        if msg["Subject"].startswith("About"):
            assert msg["Subject"] == f"About {payload}"
            assert "__mro__" in text and "&lt;class" not in html and "<class" not in text


BAD_ADDRESSES = [
    "no-at-sign",
    "a b@example.org",
    "a@b",
    "user@localhost",
    "x" * 65 + "@example.org",
    "alice@example.org)<bob@example.org>",  # B13
    "a@b.test\r\nRCPT TO:<x@y.test>",  # B12
    "a@example.org> AUTH=<x@example.org>",
    "bad\x00@example.org",
    "ud\udc80@example.org",
]


def test_b11_b12_bad_addresses_refused_at_notify_time(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    for address in BAD_ADDRESSES:
        with pytest.raises(ValidationError) as info:
            app.notify([s.user(1), s.user(2, email=address)], InvoicePaid("X"))
        assert info.value.field == "to"
    for phone in ("5551234", "+1 555 123", "+15551234567\r\nX: y"):
        with pytest.raises(ValidationError):
            s.user(3, phone=phone).notify(InvoicePaid("X"))
    # nothing was pushed, not even the valid user's jobs
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 0


def test_b11_b12_bad_mail_injected_into_jobs_fails_first_attempt_without_smtp(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    # (an unpaired surrogate cannot even be queued: JSON has no form for it)
    jobs = [
        SendQueuedNotification(s.user(i, email=a), InvoicePaid("X"), "mail", f"d{i}")
        for i, a in enumerate(BAD_ADDRESSES)
        if "\udc80" not in a
    ]
    jobs.append(
        SendQueuedNotification(
            s.user(99), RawSubject("X", subject="Hi\r\nBcc: victim@x.test"), "mail", "d99"
        )
    )
    ids = app.dispatch_many(jobs)
    work(app)
    records = failed_store(app)
    assert sorted(r.id for r in records) == sorted(ids)
    for record in records:
        assert record.attempts == 1, record.exception  # permanent, though tries = 3
        assert "ValidationError" in record.exception
    subject = next(r for r in records if r.id == ids[-1])
    assert "subject" in subject.exception.splitlines()[-1]
    assert s.smtp.sessions == 0 and s.smtp.recorder.rcpts_seen == []


# -- webhooks ------------------------------------------------------------------------------


def test_webhook_410_stops_after_one_attempt(servers: Servers, app_factory: AppFactory) -> None:
    s = servers
    app = app_factory(s)
    s.hooks.script = lambda i, hit: Reply(410, b"gone")
    app.notify(s.user(1), InvoicePaid("X", channels=("webhook",)))
    work(app)
    [record] = failed_store(app)
    assert record.attempts == 1 and "WebhookGoneError" in record.exception
    assert "410" in record.exception
    assert len(s.hooks.hits) == 1


def test_webhook_429_retry_after_delays_next_attempt(
    servers: Servers, app_factory: AppFactory
) -> None:
    s = servers
    app = app_factory(s)
    s.hooks.script = lambda i, hit: (
        Reply(429, b"slow down", {"Retry-After": "2"}) if i == 0 else Reply(200, b"ok")
    )
    app.notify(s.user(1), InvoicePaid("X", channels=("webhook",)))  # backoff 0.2 s
    work(app)
    first, second = s.hooks.stamped
    spacing = second.at - first.at
    assert 2.0 <= spacing < 2.6, spacing
    assert first.hit.headers["webhook-id"] == second.hit.headers["webhook-id"]
    assert failed_store(app) == []
    figure(f"429 Retry-After: 2 -> next attempt {spacing:.3f}s later (backoff alone: 0.2 s)")


def test_b14_webhook_to_metadata_address_refused_without_connecting(
    servers: Servers, app_factory: AppFactory, loopback_only: list[str]
) -> None:
    s = servers
    app = app_factory(s, webhook_allow_private=False)
    user = s.user(1, webhook_url="http://169.254.169.254/latest/meta-data/")
    with pytest.raises(ValidationError, match="url"):
        app.notify(user, InvoicePaid("X", channels=("webhook",)))
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 0
    # injected straight into a job: refused at delivery, before any connect
    [job_id] = app.dispatch_many([SendQueuedNotification(user, InvoicePaid("X"), "webhook", "d1")])
    work(app)
    [record] = failed_store(app)
    assert record.id == job_id and record.attempts == 1
    assert "ValidationError" in record.exception
    assert loopback_only == []  # the guard would have recorded (and raised on) a connect


# -- SMS -----------------------------------------------------------------------------------


def test_sms_401_fails_once_and_never_leaks_the_token(
    servers: Servers,
    app_factory: AppFactory,
    redis_url: str,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    s = servers
    app = app_factory(s)
    user = s.user(1)

    def echo(hit: Hit) -> Reply:  # a provider echoing the credentials back (B19)
        auth = hit.headers.get("authorization", "")
        return Reply(401, f'{{"message": "Authenticate {auth}", "code": 20003}}'.encode())

    s.sms.always[user.phone] = echo
    app.notify(user, InvoicePaid("X", channels=("sms",)))
    work(app)
    [record] = failed_store(app)
    assert record.attempts == 1 and "401" in record.exception
    assert len(s.sms.hits) == 1

    shown = subprocess.run(
        [NOTIFY_WORKER, "-A", "tests.e2e.jobs_app:app", "failed", "show", record.id],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")},
            "PYTHONPATH": str(ROOT),
            "TIDINGS_REDIS_URL": redis_url,
            "TIDINGS_KEY": KEY,
            "TIDINGS_PREFIX": prefix,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    assert "401" in shown.stdout
    basic = base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
    texts = {
        "failed store": record.exception + record.payload.decode(errors="replace"),
        "failed show": shown.stdout + shown.stderr,
        "logs": caplog.text + "\n".join(str(r.__dict__) for r in caplog.records),
        "hooks": repr(HOOKS),
    }
    for where, text in texts.items():
        assert TOKEN not in text, where
        assert basic not in text, where
