"""The examples run as a user would run them, so they cannot go stale.

Each runs in a fresh working directory (``tmp_path``) with only ``TIDINGS_HOME`` set to
``tmp_path/.tidings`` (the scripts live in the repository, and their embedded directory
would otherwise be the one beside them), so it starts its own embedded Redis there; the
test stops that server by the pid in ``.tidings/redis.pid`` afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_") and k != "REDIS_URL"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stop_embedded(home: Path) -> None:
    """Stop the embedded redis-server the example started under ``home``, by its pid."""
    pid_file = home / "redis.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().strip())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return  # already gone
    # Only the server whose socket lives in our own tmp dir: never another process.
    if str(home / "redis.sock").encode() not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:
        _stop_embedded(tmp_path / ".tidings")


def run_example(path: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / path)],
        cwd=cwd,
        env={**_env(), "TIDINGS_HOME": str(cwd / ".tidings")},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0, f"{path} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_events_example(workdir: Path) -> None:
    out = run_example("examples/events/app.py", workdir).stdout
    lines = out.splitlines()

    # The sync listeners ran at dispatch, in registration order, before the worker.
    dispatch = lines[: lines.index("--- notify-worker --queue receipts --stop-when-empty ---")]
    assert [ln for ln in dispatch if ln.startswith("[app]") and "event(" not in ln] == [
        "[app] reserve_stock: stock reserved for order 1001",
        "[app] log_order: order 1001 placed, total 42.50",
        "[app] OrderSubscriber.on_placed: order 1001",
        "[app] OrderSubscriber.on_shipped: order 1001 via UPS",
        "[app] audit: order.refunded (1001, Decimal('5.00'))",
    ]
    results = re.search(
        r"event\(OrderPlaced\) -> \['reserved', None, '([0-9a-f]{32})', None\]", out
    )
    assert results, out
    job_id = results.group(1)

    # The worker ran the queued listener with the event it was given, once.
    assert "[worker] SendReceipt: receipt for order 1001 (42.50) to ada@example.org" in lines
    worker_lines = lines[len(dispatch) :]
    assert [ln.split()[3] for ln in worker_lines if job_id in ln] == ["Processing", "Processed"]
    assert "[worker]" not in "\n".join(dispatch)
    assert lines[-1].startswith("OK:")
    assert (workdir / ".tidings" / "redis.sock").exists()  # the embedded default was used


def test_the_signup_example(workdir: Path) -> None:
    """The README's first command: event -> queued listener -> mail, SMS and webhook."""
    out = run_example("examples/signup/run.py", workdir).stdout
    assert "OK: event -> queued listener -> notification by mail, sms and webhook" in out
    emls = list((workdir / ".tidings" / "outbox").glob("*.eml"))
    assert len(emls) == 1
    assert "Subject: Welcome aboard, Ada!" in emls[0].read_text()
    assert re.search(r"^webhook verified id=\w+ payload=.*\"user.welcomed\"", out, re.M)
    assert re.search(r"^sms .*to=\+15551234567", out, re.M)


def test_the_inbox_example(workdir: Path) -> None:
    """Database channel, Slack and an encrypted payload, on the embedded defaults."""
    out = run_example("examples/inbox/run.py", workdir).stdout
    assert "[redis] the email address in clear: False" in out
    assert re.search(r"^\[inbox\] unread InvoicePaid .*\"invoice\": 42", out, re.M), out
    assert "[inbox] mark_all_as_read() -> 1; unread now 0" in out
    assert "[slack] #billing: Invoice 42 paid by Ada (4 blocks)" in out
    assert "OK: encrypted in Redis -> database row + Slack message" in out
    assert (workdir / ".tidings" / "notifications.sqlite3").exists()
