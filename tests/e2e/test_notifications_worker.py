"""Notifications through ``notify-worker`` processes (RELIABILITY F2 on a real channel).

``TIDINGS_FAULT_POINT=before_ack`` makes the worker SIGKILL itself after the job's side
effect (the mail went out, the webhook was answered) and before the ack. The job's lease
runs out (retry_after 2 s), a normal worker runs it again, and the receiver sees the
delivery twice under the same Message-ID / ``webhook-id``: the delivery id is fixed at
dispatch, so downstream can de-duplicate.
"""

from __future__ import annotations

import email
import email.policy
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.notify_app import Customer, OrderShipped
from tests.support import Proc, wait_for
from tests.support.http import HttpServer
from tests.support.smtp import SmtpServer
from tidings import App
from tidings.notifications import verify_webhook

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
APP_SPEC = "tests.e2e.notify_app:app"
MODULE = "tests.e2e.notify_app"
KEY = "e2e-notify-key-0123456789abcdef-0123"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
RETRY_AFTER = 2.0

Spawn = Callable[..., Proc]


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


@pytest.fixture
def hooks() -> Iterator[HttpServer]:
    with HttpServer() as server:
        yield server


def _env(redis_url: str, prefix: str, smtp: SmtpServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_") and k != "REDIS_URL"}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        TIDINGS_REDIS_URL=redis_url,
        TIDINGS_KEY=KEY,
        TIDINGS_PREFIX=prefix,
        TIDINGS_RETRY_AFTER=str(RETRY_AFTER),
        TIDINGS_ALLOWED_MODULES=MODULE,
        TIDINGS_MAIL_URL=f"smtp://127.0.0.1:{smtp.port}?tls=off",
        TIDINGS_MAIL_FROM="shop@example.org",
        TIDINGS_WEBHOOK_SECRET=SECRET,
        TIDINGS_WEBHOOK_ALLOW_PRIVATE="1",
    )
    return env


def exited(proc: Proc, timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {proc.pid} still running after {timeout_s}s:\n{proc.tail()}")


@pytest.mark.parametrize("channel", ["mail", "webhook"])
@pytest.mark.topologies
def test_f2_before_ack_redelivers_with_the_same_delivery_id(
    redis_url: str,
    prefix: str,
    spawn_proc: Spawn,
    smtp: SmtpServer,
    hooks: HttpServer,
    channel: str,
) -> None:
    env = _env(redis_url, prefix, smtp)
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        retry_after=RETRY_AFTER,
        allowed_modules=MODULE,
        webhook_allow_private=True,  # routes are vetted at notify() time too
    )
    try:
        customer = Customer(7, "ada@example.org", f"{hooks.url}/orders")
        [job_id] = app.notify(customer, OrderShipped("O-1", channel=channel))
        worker = [NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1"]
        doomed = spawn_proc(
            worker,
            name="doomed",
            env=env,
            extra_env={"TIDINGS_FAULT_POINT": "before_ack"},
            cwd=ROOT,
        )
        assert exited(doomed, 20) == -signal.SIGKILL, doomed.tail()
        received = smtp.messages if channel == "mail" else hooks.hits
        assert len(received) == 1  # the side effect happened, the ack did not
        assert app.job_status(job_id) == "reserved"

        t0 = time.monotonic()
        rescuer = spawn_proc([*worker, "--stop-when-empty"], name="rescuer", env=env, cwd=ROOT)
        assert exited(rescuer, 20) == 0, rescuer.tail()
        wait_for(lambda: app.job_status(job_id) == "done", 5)
        print(
            f"\nFIGURE F2 before_ack ({channel}): re-delivered "
            f"{time.monotonic() - t0:.2f}s after the rescuer started"
        )

        if channel == "mail":
            first, second = (
                email.message_from_bytes(m.data, policy=email.policy.default) for m in smtp.messages
            )
            assert first["Message-ID"] == second["Message-ID"]
            assert first["Message-ID"].endswith("@tidings>")
            assert first["Subject"] == second["Subject"] == "Order O-1 shipped"
            assert hooks.hits == []
        else:
            one, two = hooks.hits
            assert one.headers["webhook-id"] == two.headers["webhook-id"]
            for hit in (one, two):
                assert verify_webhook(SECRET, hit.headers, hit.body)["data"] == {"order": "O-1"}
            assert smtp.messages == []
        assert app.queue_for(None).failed() == []
    finally:
        app.close()
