"""``notify-worker`` as an operator sees it: banner, --version, workers, failed list,
plurals, JSON logs in UTC, monitor --watch, supervised children's line prefixes.

Real processes on the test's Redis (about 10 s in all).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.observe.dash_app import Flaky, Quick
from tests.support import Proc, wait_for
from tidings import App
from tidings.cli.observe import plural
from tidings.dashboard.redaction import mask_url
from tidings.observability.terminal import escape

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
APP_SPEC = "tests.observe.dash_app:app"
MODULE = "tests.observe.dash_app"
KEY = "cli-observe-test-key-0123456789abcdef"
UTC_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z$")

Spawn = Callable[..., Proc]


def env_for(url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TIDINGS_REDIS_URL=url,
               TIDINGS_KEY=KEY, TIDINGS_PREFIX=prefix, TIDINGS_ALLOWED_MODULES=MODULE,
               TIDINGS_MAIL_URL="smtp://mailer:pa55word-smtp@127.0.0.1:2525",
               TIDINGS_SMS_URL="log://?token=sms-tok3n")  # fmt: skip
    return env


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([NOTIFY_WORKER, "-A", APP_SPEC, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


@pytest.fixture
def app(redis_url: str, prefix: str) -> App:
    return App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)


def test_unit_helpers() -> None:
    assert plural(1, "job") == "1 job" and plural(0, "job") == "0 jobs"
    assert mask_url("redis://:hunter2@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("smtp://u:p%40ss@h:25") == "smtp://u:***@h:25"
    assert mask_url("twilio://x?auth_token=abc&from=1") == "twilio://x?auth_token=***&from=1"
    # The CLI's tables escape through the one helper: bidi controls included.
    assert escape("a\x1b[31mred\x07\nb\u202e") == "a\\x1b[31mred\\x07\\x0ab\\u202e"


def test_version_banner_json_logs_failed_list_and_plurals(
    app: App, redis_url: str, prefix: str
) -> None:
    env = env_for(redis_url, prefix)
    version = cli(env, "--version").stdout
    assert re.match(r"notify-worker, version \d", version), version

    app.dispatch_many([Quick(1), Quick(2)])
    flaky = Flaky("f").dispatch()
    done = cli(env, "--stop-when-empty", "--sleep", "0.2", "--queue", "high,default",
               "--concurrency", "3")  # fmt: skip
    out = done.stdout
    assert re.search(r"tidings \S+ worker, pid \d+", out), out
    assert "queues:      high, default (in priority order)" in out
    assert "concurrency: 3   processes: 1" in out
    assert f"redis:       {redis_url}" in out
    assert "mailer:***@127.0.0.1:2525" in out and "pa55word-smtp" not in out
    assert "token=***" in out and "sms-tok3n" not in out
    assert f"modules:     {MODULE}, tidings" in out

    # JSON logs: every line an object with a UTC ISO-8601 time
    Quick(3).dispatch()
    done = cli(env, "--stop-when-empty", "--sleep", "0.2", "--json-logs")
    records = [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert records[0]["status"] == "Starting" and "pa55word" not in done.stdout
    assert {r["status"] for r in records} >= {"Starting", "Processing", "Processed"}
    assert all(UTC_ISO.match(r["time"]) for r in records), records

    # Human output opens with the Redis it reads (issue 22), then the answer.
    said = f"Redis: {redis_url} (from the environment variable TIDINGS_REDIS_URL, prefix {prefix})"
    listed = cli(env, "failed", "list").stdout.splitlines()
    assert listed[0] == said
    assert listed[1].split()[:5] == ["id", "failed", "at", "queue", "job"]
    assert len(listed) == 3 and flaky in listed[2]
    assert cli(env, "failed", "retry", flaky).stdout.splitlines()[1:] == [
        "Pushed 1 failed job back onto their queues."
    ]
    assert cli(env, "clear", "--queue", "default").stdout.splitlines()[1:] == [
        "Cleared 1 job from default."
    ]


def test_workers_command_and_watch(redis_url: str, prefix: str, spawn_proc: Spawn) -> None:
    env = env_for(redis_url, prefix)
    assert cli(env, "workers").stdout.splitlines()[1:] == ["No live workers."]
    w = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1", "--queue", "a,b"],
                   name="worker", env=env, cwd=ROOT)  # fmt: skip

    def listed() -> list[dict[str, object]]:
        beats: list[dict[str, object]] = orjson.loads(cli(env, "workers", "--json").stdout)
        return beats

    beats = wait_for(listed, 20, 0.2, message="the worker's heartbeat")
    assert beats[0]["pid"] == w.pid and beats[0]["queues"] == ["a", "b"]
    table = cli(env, "workers").stdout
    assert str(w.pid) in table and "1 live worker" in table

    watch = subprocess.Popen([NOTIFY_WORKER, "-A", APP_SPEC, "monitor", "--watch", "--interval",
                              "0.2", "--queue", "a,b"], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # fmt: skip
    try:
        out, err = watch.communicate(timeout=3)
    except subprocess.TimeoutExpired:
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=10)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, err
    # Into a pipe, a line per interval (issue 22) rather than a redrawn table.
    lines = [ln for ln in out.splitlines() if " a ready=" in ln and "| b ready=" in ln]
    assert len(lines) >= 2 and "reserved=" in lines[0], out

    w.terminate()
    assert w.wait(15) == 0
    assert cli(env, "workers").stdout.splitlines()[1:] == ["No live workers."]


def test_supervised_children_prefix_their_lines(
    redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    env = env_for(redis_url, prefix)
    sup = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1", "--processes", "2"],
                     name="supervisor", env=env, cwd=ROOT)  # fmt: skip
    tags = re.compile(r"^\[(\d):(\d+)\] tidings \S+ worker, pid (\d+)$", re.M)
    found = wait_for(lambda: len(tags.findall(sup.output())) >= 2 and tags.findall(sup.output()),
                     30, 0.2, message="two child banners")  # fmt: skip
    assert sorted(slot for slot, _, _ in found) == ["1", "2"]
    assert all(pid == banner_pid for _, pid, banner_pid in found)
    assert sup.output().count("processes: 2") == 2
    sup.terminate()
    assert sup.wait(40) == 0


def test_a_metrics_port_in_use_is_a_configuration_error(redis_url: str, prefix: str) -> None:
    import socket

    env = env_for(redis_url, prefix)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(env, "--stop-when-empty", "--metrics-port", str(port), check=False)
    assert done.returncode == 78  # EX_CONFIG: a supervisor does not restart-loop on it
    assert "--metrics-port" in done.stderr
