"""No control character from job data or a remote reaches the terminal.

Text carrying an OSC 52 clipboard write, ``ESC[2K``, the 8-bit CSI ``\\x9b``, NEL,
DEL, a carriage return and a bidi override goes through every CLI output path: the
worker's own lines and log (a real ``notify-worker`` process), ``failed list`` (plain
and ``--json``), ``failed show``, ``monitor`` and ``batches list/show`` (plain and
``--json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests.integration.hostile_app import Hostile
from tidings import App

NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
ROOT = str(Path(__file__).resolve().parents[2])
KEY = "cli-escaping-test-key-0123456789abc"
EVIL = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\x9b2J\x85\x7f\rfake prompt $ \u202etxt.exe\x00"
#: Characters that must never reach the terminal (tab and line feed are allowed).
FORBIDDEN = {chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}
FORBIDDEN |= {"\u202e", "\u202a", "\u2066", "\u200f"}


def bad_chars(text: str) -> set[str]:
    return {c for c in text if c in FORBIDDEN}


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NOTIFY_WORKER, "-A", "tests.integration.hostile_app:app", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=timeout,
    )


def test_control_characters_are_escaped_on_every_cli_path(redis_url: str, prefix: str) -> None:
    env = {
        **os.environ,
        "TIDINGS_REDIS_URL": redis_url,
        "TIDINGS_KEY": KEY,
        "TIDINGS_PREFIX": prefix,
        "PYTHONUNBUFFERED": "1",
    }
    app = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=__name__)
    try:
        job_id = Hostile(EVIL).dispatch()
        r: redis.Redis = app.queue_for(None).client
        # A record written by hand: control characters in the id, name, queue and text.
        k = app.queue_for(None).keys("default")
        forged = "forged\x1b[31m"
        r.zadd(k.failed, {forged: 1000})
        info = {"name": f"Name{EVIL}", "queue": f"q{EVIL}", "exception": EVIL, "attempts": 1}
        r.hset(k.failed_info, forged, json.dumps(info))
        r.hset(k.failed_body, forged, EVIL.encode())
        # A queue whose name carries the sequences (monitor lists it).
        r.hset(app.queue_for(None).keys(f"evil{EVIL}").jobs, "x", "y")
        # And one whose name is not UTF-8 at all.
        r.hset(prefix.encode() + b":queue:{bad\xff\x9b}:jobs", "x", "y")

        from tidings.workflows.batch import batch

        batch_id = batch([Hostile("in a batch")]).name(f"batch{EVIL}").allow_failures().dispatch()
        worker = cli(env, "--stop-when-empty", "--sleep", "0.2")
        assert worker.returncode == 0, worker.stderr
        outputs = {"worker stdout": worker.stdout, "worker log": worker.stderr}
        assert job_id in worker.stdout and "Failed" in worker.stdout
        assert "hook says" in worker.stderr  # the failed() hook's traceback was logged
        for args in (
            ["failed", "list"],
            ["failed", "list", "--json"],
            ["failed", "show", job_id],
            ["failed", "show", forged],
            ["monitor"],
            ["monitor", "--json"],
            ["batches", "list"],
            ["batches", "list", "--json"],
            ["batches", "show", batch_id],
        ):
            done = cli(env, *args)
            assert done.returncode == 0, (args, done.stderr)
            outputs[" ".join(args)] = done.stdout + done.stderr
        for path, text in outputs.items():
            assert not bad_chars(text), (path, sorted(bad_chars(text)))
        # Escaped, not dropped: the operator still sees what was there.
        assert "\\x1b]52;c;" in outputs["failed show " + job_id]
        assert "\\u202e" in outputs["failed list"]
        # JSON output escapes the same characters and still decodes to the exact data.
        listed = json.loads(outputs["failed list --json"])
        assert any(EVIL in rec["exception"] for rec in listed)
        sizes = json.loads(outputs["monitor --json"])
        assert f"evil{EVIL}" in sizes
    finally:
        for key in app.queue_for(None).client.scan_iter(match=f"{prefix}:*"):
            app.queue_for(None).client.delete(key)
        app.close()


def test_a_worker_without_an_app_refuses_to_start_and_consumes_nothing(
    redis_url: str, prefix: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(TIDINGS_REDIS_URL=redis_url, TIDINGS_KEY=KEY, TIDINGS_PREFIX=prefix)
    app = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=__name__)
    try:
        Hostile("x").dispatch()
        done = subprocess.run(
            [NOTIFY_WORKER, "--stop-when-empty"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 78
        assert "-A" in done.stderr and "TIDINGS_ALLOWED_MODULES" in done.stderr
        assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 1
        assert app.queue_for(None).failed() == []
    finally:
        for key in app.queue_for(None).client.scan_iter(match=f"{prefix}:*"):
            app.queue_for(None).client.delete(key)
        app.close()


def test_a_forged_heartbeat_reaches_workers_plain_and_json_escaped(
    redis_url: str, prefix: str
) -> None:
    """``workers`` and ``workers --json`` print a heartbeat written by a Redis writer:
    its bidi isolates and overrides, 8-bit CSI and DEL come out as visible escapes (the
    JSON still decodes to the exact data)."""
    env = {**os.environ, "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY,
           "TIDINGS_PREFIX": prefix}  # fmt: skip
    evil = f"\u202e\u2066\x9b\x7f{EVIL}\u2069\u202a"  # the table cuts at 24 characters
    r = redis.Redis.from_url(redis_url)
    try:
        beat = {"id": "w1", "host": f"h{evil}", "pid": 7, "queues": [f"q{evil}"],
                "concurrency": 1, "running": 0, "processed": 0, "started_at": time.time(),
                "beat_at": time.time(), "rss_mb": 1.0, "version": f"v{evil}"}  # fmt: skip
        r.set(f"{prefix}:worker:w1", json.dumps(beat), ex=60)
        r.zadd(f"{prefix}:workers", {"w1": int(time.time() * 1000)})
        plain, as_json = cli(env, "workers"), cli(env, "workers", "--json")
        assert plain.returncode == 0 and as_json.returncode == 0, (plain.stderr, as_json.stderr)
        assert "1 live worker" in plain.stdout
        for name, out in (("workers --json", as_json.stdout), ("workers", plain.stdout)):
            assert not bad_chars(out), (name, sorted(bad_chars(out)))
        assert "\\u202e" in plain.stdout and "\\u2066" in plain.stdout
        [listed] = json.loads(as_json.stdout)
        assert listed["host"] == f"h{evil}" and listed["queues"] == [f"q{evil}"]
        assert listed["version"] == f"v{evil}"
    finally:
        for key in r.scan_iter(match=f"{prefix}:*"):
            r.delete(key)
        r.close()
