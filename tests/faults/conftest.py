"""Shared pieces of the fault and load tests.

A ``Rig`` ties together: the queue's Redis (a private, killable ``RedisServer`` or a
proxy in front of one), the accounting Redis (the session's shared server, which the
faults never touch), ``notify-worker`` subprocesses running
``tests.faults.fault_app:app``, and the accounting figures (lost, extra runs)::

    rig = Rig(queue_url, prefix, redis_url, spawn_proc)
    ids = rig.dispatch_records(3000)
    w = rig.worker("--concurrency", "4")
    rig.wait_executed(ids, 30)
    lost, extra = rig.figures(ids)

Every figure the tests assert on is also printed as a ``FIGURE`` line (``pytest -s``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from tests.faults.fault_app import Record, Work
from tests.support import Proc, wait_for
from tidings import App

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
APP_SPEC = "tests.faults.fault_app:app"
MODULE = "tests.faults.fault_app"
KEY = "faults-test-key-0123456789abcdef-0123"
RETRY_AFTER = 3.0

Spawn = Callable[..., Proc]


def figure(text: str) -> None:
    print(f"\nFIGURE {text}", flush=True)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Rig:
    """One queue Redis + prefix, an accounting Redis, and the workers of a test."""

    def __init__(
        self,
        queue_url: str,
        prefix: str,
        account_url: str,
        spawn: Spawn,
        *,
        retry_after: float = RETRY_AFTER,
        app_options: dict[str, object] | None = None,
    ) -> None:
        self.queue_url = queue_url
        self.prefix = prefix
        self.account_url = account_url
        self.account_prefix = f"{prefix}:acct"
        self.retry_after = retry_after
        self._spawn = spawn
        self.env = base_env()
        self.env.update(
            TIDINGS_REDIS_URL=queue_url,
            TIDINGS_KEY=KEY,
            TIDINGS_PREFIX=prefix,
            TIDINGS_RETRY_AFTER=str(retry_after),
            TIDINGS_ALLOWED_MODULES=MODULE,
            TIDINGS_TEST_ACCOUNT_URL=account_url,
            TIDINGS_TEST_ACCOUNT_PREFIX=self.account_prefix,
        )
        self.app = App(
            env=False,
            redis_url=queue_url,
            key=KEY,
            prefix=prefix,
            retry_after=retry_after,
            allowed_modules=MODULE,
            **(app_options or {}),
        )
        self.acct = redis.Redis.from_url(account_url)
        self.workers: list[Proc] = []

    def close(self) -> None:
        self.app.close()
        self.acct.close()

    # -- workers ----------------------------------------------------------------------

    def worker(
        self,
        *args: str,
        name: str = "worker",
        extra_env: dict[str, str] | None = None,
        prefix_cmd: Sequence[str] = (),
    ) -> Proc:
        cmd = [*prefix_cmd, NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1", *args]
        proc = self._spawn(cmd, name=name, env=self.env, extra_env=extra_env, cwd=ROOT)
        self.workers.append(proc)
        return proc

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [NOTIFY_WORKER, "-A", APP_SPEC, *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            start_new_session=True,
        )

    def logs(self) -> str:
        return "\n".join(w.output() for w in self.workers)

    # -- producing --------------------------------------------------------------------

    def dispatch_records(self, n: int, tag: str = "j", seconds: float = 0.0) -> list[str]:
        """Push ``n`` jobs (pipelined, 1,000 a round trip) and return their record ids:
        ``Record`` jobs, or ``Work`` jobs sleeping ``seconds`` when that is set."""
        names = [f"{tag}{i}" for i in range(n)]
        jobs = [Work(x, seconds) if seconds else Record(x) for x in names]
        self.app.dispatch_many(jobs)
        return names

    # -- accounting -------------------------------------------------------------------

    def hash(self, what: str) -> dict[str, int]:
        raw = self.acct.hgetall(f"{self.account_prefix}:{what}")
        return {k.decode(): int(v) for k, v in raw.items()}

    def count(self, what: str, name: str) -> int:
        raw = self.acct.hget(f"{self.account_prefix}:{what}", name)
        return int(raw) if raw else 0

    def executed(self) -> int:
        return int(self.acct.hlen(f"{self.account_prefix}:exec"))

    def wait_executed(self, names: Iterable[str], timeout_s: float) -> None:
        wanted = set(names)
        wait_for(
            lambda: len(wanted - set(self.hash("exec"))) == 0,
            timeout_s,
            0.2,
            message=f"all {len(wanted)} jobs executed",
        )

    def figures(self, names: Iterable[str]) -> tuple[int, int]:
        """(lost, extra runs) over ``names``; runs of other ids count as extra too."""
        counts = self.hash("exec")
        wanted = set(names)
        lost = len(wanted - set(counts))
        extra = sum(c - 1 for c in counts.values() if c > 1) + len(set(counts) - wanted)
        return lost, extra

    def sizes(self) -> dict[str, int]:
        return self.app.queue_for(None).sizes(["default"])["default"]

    def drained(self) -> bool:
        return self.sizes() == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}


class Sampler:
    """Samples the number of executed jobs every ``interval_s`` in a thread, so a test can
    compute throughput before a fault and after recovery."""

    def __init__(self, rig: Rig, interval_s: float = 0.1) -> None:
        self.rig = rig
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._client = redis.Redis.from_url(rig.account_url)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        key = f"{self.rig.account_prefix}:exec"
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), int(self._client.hlen(key))))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def rate(self, t0: float, t1: float) -> float:
        """Jobs/s between monotonic times t0 and t1 (nearest samples)."""
        inside = [(t, n) for t, n in self.samples if t0 <= t <= t1]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def first_time_at_least(self, count: int) -> float | None:
        return next((t for t, n in self.samples if n >= count), None)

    def recovery(self, t_back: float, baseline: float, window_s: float = 1.0) -> float | None:
        """Seconds after ``t_back`` until a ``window_s`` window runs at >= 50 % of
        ``baseline`` jobs/s (None: never, or the work ran out first)."""
        for t, _ in self.samples:
            if t < t_back:
                continue
            if self.rate(t, t + window_s) >= 0.5 * baseline:
                return t - t_back
        return None


@pytest.fixture
def make_rig(redis_url: str, prefix: str, spawn_proc: Spawn) -> Iterator[Callable[..., Rig]]:
    """``make_rig(queue_url, **Rig kwargs)``; accounting on the session Redis."""
    rigs: list[Rig] = []

    def make(queue_url: str, **kwargs: object) -> Rig:
        rig = Rig(queue_url, prefix, redis_url, spawn_proc, **kwargs)  # type: ignore[arg-type]
        rigs.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in rigs:
            rig.close()


def exited(proc: Proc, timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {proc.pid} still running after {timeout_s}s:\n{proc.tail()}")
