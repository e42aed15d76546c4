"""Operator commands and worker start-up as real processes (issue 22, items 1, 2, 3, 10).

Operator commands never start an embedded Redis and name the Redis they read; the
embedded directory follows the app, not the current directory; a worker warns of a new
empty embedded Redis and of mail going to files on a real Redis; ``monitor --watch``
prints lines into a pipe; a worker stopped by ``restart`` says why. Every process
started here is stopped by pid (embedded servers by their pid file, in our tmp dirs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.e2e.test_notify_worker import APP_SPEC, NOTIFY_WORKER, ROOT, _env_for
from tests.support import Proc

Spawn = Callable[..., Proc]

OPS = [
    ["monitor"],
    ["failed", "list"],
    ["failed", "retry", "--all"],
    ["workers"],
    ["batches", "list"],
    ["clear", "--queue", "default"],
    ["restart"],
    ["dashboard", "--port", "1"],
    ["db", "upgrade"],
]

MYAPP = """
from dataclasses import dataclass
from tidings import App, Job

app = App()


@dataclass
class Hello(Job):
    n: int

    def handle(self) -> None:
        print("hello", self.n, flush=True)
"""


def _clean_env(**extra: str) -> dict[str, str]:
    dropped = ("REDIS_URL", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIDINGS_", "DJANGO_")) and k not in dropped}  # fmt: skip
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # fmt: skip


def _stop_embedded(home: Path) -> None:
    """Stop the redis-server started on ``home`` (ours: its command line names it)."""
    pid_file = home / "redis.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().strip())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return
    if str(home).encode() not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)


def test_ops_commands_never_start_an_embedded_redis(tmp_path: Path) -> None:
    for args in OPS:
        done = _run([NOTIFY_WORKER, *args], tmp_path, _clean_env())
        assert done.returncode == 78, (args, done.stdout, done.stderr)
        for name in ("-A", "TIDINGS_APP", "TIDINGS_REDIS_URL", "DJANGO_SETTINGS_MODULE"):
            assert name in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tidings").exists()


def test_an_app_whose_embedded_redis_is_not_running_is_not_given_one(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "myapp.py").write_text(MYAPP)
    done = _run([NOTIFY_WORKER, "-A", "myapp:app", "failed", "list"], project, _clean_env())
    assert done.returncode == 78, done
    assert f"no embedded Redis runs in {project / '.tidings'}" in done.stderr
    assert not (project / ".tidings" / "redis.pid").exists()


def test_every_command_says_which_redis_it_reads(redis_url: str, prefix: str) -> None:
    env = _env_for(redis_url, prefix)
    for args in OPS[:7]:
        done = _run([NOTIFY_WORKER, "-A", APP_SPEC, *args], ROOT, env)
        assert done.returncode == 0, (args, done.stderr)
        first = done.stdout.splitlines()[0]
        assert first == (f"Redis: {redis_url} (from the environment variable "
                         f"TIDINGS_REDIS_URL, prefix {prefix})"), (args, first)  # fmt: skip
    as_json = _run([NOTIFY_WORKER, "-A", APP_SPEC, "monitor", "--json"], ROOT, env)
    assert as_json.stdout.startswith("{")  # JSON output stays JSON


def test_the_embedded_directory_follows_the_app_not_the_current_directory(
    tmp_path: Path, spawn_proc: Spawn
) -> None:
    project, elsewhere, fresh = tmp_path / "proj", tmp_path / "elsewhere", tmp_path / "fresh"
    project.mkdir()
    elsewhere.mkdir()
    (project / "myapp.py").write_text(MYAPP)
    home = project / ".tidings"
    try:
        pushed = _run([sys.executable, "-c", "import myapp; print(myapp.Hello(1).dispatch())"],
                      project, _clean_env())  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        assert (home / "redis.sock").exists()
        env = _clean_env(PYTHONPATH=str(project))
        worker = _run([NOTIFY_WORKER, "-A", "myapp:app", "--stop-when-empty", "--sleep", "0.5"],
                      elsewhere, env)  # fmt: skip
        assert worker.returncode == 0, worker.stderr
        assert "hello 1" in worker.stdout and "Processed" in worker.stdout
        assert f"directory {home}" in worker.stdout and "WARNING" not in worker.stdout
        listed = _run([NOTIFY_WORKER, "-A", "myapp:app", "monitor"], elsewhere, env)
        assert listed.returncode == 0 and f"embedded in {home}" in listed.stdout
        assert not (elsewhere / ".tidings").exists()

        # A worker that starts a new, empty embedded Redis says so in its banner.
        lonely = _run([NOTIFY_WORKER, "-A", "myapp:app", "--stop-when-empty", "--sleep", "0.5"],
                      elsewhere, {**env, "TIDINGS_HOME": str(fresh)})  # fmt: skip
        assert lonely.returncode == 0, lonely.stderr
        assert "WARNING:" in lonely.stdout and "new, empty embedded Redis" in lonely.stdout
        assert "TIDINGS_HOME" in lonely.stdout
    finally:
        _stop_embedded(home)
        _stop_embedded(fresh)


def test_a_worker_on_a_real_redis_warns_that_mail_goes_to_files(
    redis_url: str, prefix: str
) -> None:
    env = _env_for(redis_url, prefix)
    args = [NOTIFY_WORKER, "-A", APP_SPEC, "--stop-when-empty", "--sleep", "0.5"]
    done = _run(args, ROOT, env)
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stderr and "mail is written to files" in done.stderr
    assert "TIDINGS_MAIL_URL" in done.stderr
    quiet = _run(args, ROOT, {**env, "TIDINGS_MAIL_URL": "log://"})
    assert "mail is written to files" not in quiet.stderr


def test_monitor_watch_prints_a_line_per_interval_into_a_pipe(
    redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    env = _env_for(redis_url, prefix)
    proc = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "monitor", "--watch", "--interval", "0.3"],
                      name="watch", env=env, cwd=ROOT)  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.output().count("default ready=") < 3:
        time.sleep(0.1)
    proc.stop()
    lines = [ln for ln in proc.output().splitlines() if "default ready=" in ln]
    assert len(lines) >= 3, proc.output()
    assert "delayed=" in lines[0] and "failed=" in lines[0]


def test_an_unsupervised_worker_says_why_it_exits_after_restart(
    redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    env = _env_for(redis_url, prefix)
    worker = spawn_proc([NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "0.5"], name="w", env=env,
                        cwd=ROOT)  # fmt: skip
    deadline = time.monotonic() + 20
    while "queues:" not in worker.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)  # its upkeep has read the restart key once
    done = _run([NOTIFY_WORKER, "-A", APP_SPEC, "restart"], ROOT, env)
    assert done.returncode == 0 and "supervisor" in done.stdout
    assert worker.wait(20) == 0
    assert "worker stopping: restart requested" in worker.output(), worker.output()
    assert "without one it stays down" in worker.output()


def test_the_banner_names_where_the_redis_url_came_from(redis_url: str, prefix: str) -> None:
    env = _env_for(redis_url, prefix)
    done = _run([NOTIFY_WORKER, "-A", APP_SPEC, "--stop-when-empty", "--sleep", "0.5"], ROOT, env)
    assert "(from the environment variable TIDINGS_REDIS_URL)" in done.stdout
