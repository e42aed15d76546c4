"""The full-size load and soak runs (RELIABILITY L1, L2, L3, L7), with per-job accounting.

    .venv/bin/python benchmarks/soak.py                        # L1: 100k jobs, 10 workers
    .venv/bin/python benchmarks/soak.py --kills 3              # L2: + 3 random SIGKILLs
    .venv/bin/python benchmarks/soak.py --restart-redis        # L3: + Redis SHUTDOWN at 50 %
    .venv/bin/python benchmarks/soak.py --rate 500 --duration 900 --kill-every 60   # L7

Burst mode (the default) enqueues ``--jobs`` up front, starts ``--workers``
``notify-worker`` processes and, with ``--kills K``, SIGKILLs K random workers at random
moments of the run, each replaced at once. Steady mode (``--rate``) produces at that
rate for ``--duration`` seconds and SIGKILLs a random worker every ``--kill-every``
seconds. Either way it prints: jobs, lost (dispatched, never executed), extra runs
(sum of count - 1), duration and jobs/s, worker RSS at warm-up and at the end (workers
that lived through the run), and Redis memory before and after the drain.

Starts its own redis-server (AOF, ``appendfsync always``) on a free loopback port and
stops it by PID at the end. Never run by the test suite (``pytest -m soak`` runs a
shortened L7 through it). Exit status 1 when anything was lost.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tidings import App, Job  # noqa: E402

KEY = "soak-key-0123456789abcdef0123456789"
_app: App | None = None


def __getattr__(name: str) -> Any:
    """``app`` for ``notify-worker -A benchmarks.soak:app`` (built from TIDINGS_*)."""
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(allowed_modules="benchmarks.soak")
        return _app
    raise AttributeError(name)


@dataclass
class SoakJob(Job):
    """The side effect: ``HINCRBY <prefix>:soak:exec <id> 1``."""

    id: int
    tries = 0  # a run cut short by a kill is retried, never failed

    async def handle(self) -> None:
        a = App.current()
        client = a.queue_for(None).aclient()
        await client.hincrby(f"{a.settings.prefix}:soak:exec", str(self.id), 1)


# -- the harness side ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Redis:
    """A private redis-server, AOF always, restartable on the same port and dir."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.port = _free_port()
        self.binary = shutil.which("redis-server") or "redis-server"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--appendonly", "yes",
            "--appendfsync", "always",
        ]  # fmt: skip
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(redis.RedisError):
            redis.Redis(port=self.port).shutdown(nosave=True)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # by PID: the server started here
            self.proc.wait()
        self.proc = None


class Workers:
    """``notify-worker`` processes started here, killed only by their own PIDs."""

    def __init__(self, env: dict[str, str], logdir: Path, concurrency: int) -> None:
        self.env = env
        self.logdir = logdir
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: list[int] = []
        self.n = 0

    def start(self) -> subprocess.Popen[bytes]:
        exe = str(Path(sys.executable).parent / "notify-worker")
        cmd = [exe, "-A", "benchmarks.soak:app", "--concurrency", str(self.concurrency),
               "--sleep", "1"]  # fmt: skip
        self.n += 1
        with open(self.logdir / f"worker-{self.n}.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=log, env=self.env, cwd=ROOT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill_random(self, rng: random.Random) -> int:
        victim = rng.choice(self.alive())
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        self.killed.append(victim.pid)
        self.start()
        return victim.pid

    def stop_all(self) -> None:
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000, help="burst mode: jobs enqueued up front")
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kills", type=int, default=0, help="burst mode: random SIGKILLs")
    ap.add_argument("--restart-redis", action="store_true", help="SHUTDOWN Redis at 50 %%")
    ap.add_argument("--rate", type=float, default=0.0, help="steady mode: jobs/s produced")
    ap.add_argument("--duration", type=float, default=900.0, help="steady mode: seconds")
    ap.add_argument("--kill-every", type=float, default=60.0, help="steady mode: kill period")
    ap.add_argument("--retry-after", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    # Run as a script this module is __main__; workers import the job by its real path.
    from benchmarks import soak

    job = soak.SoakJob

    workdir = Path(tempfile.mkdtemp(prefix="tidings-soak-"))
    server = Redis(workdir)
    server.start()
    prefix = "soak"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(
        TIDINGS_REDIS_URL=server.url, TIDINGS_KEY=KEY, TIDINGS_PREFIX=prefix,
        TIDINGS_RETRY_AFTER=str(args.retry_after), PYTHONPATH=str(ROOT),
    )  # fmt: skip
    app = App(env=False, redis_url=server.url, key=KEY, prefix=prefix,
              retry_after=args.retry_after, allowed_modules="benchmarks.soak")  # fmt: skip
    r = redis.Redis(port=server.port)
    exec_key = f"{prefix}:soak:exec"
    workers = Workers(env, workdir, args.concurrency)
    dispatched = 0
    mem_before = int(r.info("memory")["used_memory_dataset"])
    rss_warm: dict[int, float] = {}
    try:
        t0 = time.monotonic()
        if args.rate <= 0:
            for start in range(0, args.jobs, 10_000):
                stop = min(args.jobs, start + 10_000)
                app.dispatch_many([job(i) for i in range(start, stop)])
            dispatched = args.jobs
            enqueue_s = time.monotonic() - t0
            print(f"enqueued {args.jobs} jobs in {enqueue_s:.2f}s", flush=True)
            t_run = time.monotonic()
            for _ in range(args.workers):
                workers.start()
            kill_at = sorted(rng.uniform(0.1, 0.8) * args.jobs for _ in range(args.kills))
            restart_at = args.jobs // 2 if args.restart_redis else None
            while (done := int(r.hlen(exec_key))) < args.jobs:
                if not rss_warm and done >= args.jobs // 10:
                    rss_warm = {p.pid: _rss_mb(p.pid) or 0.0 for p in workers.alive()}
                if kill_at and done >= kill_at[0]:
                    kill_at.pop(0)
                    pid = workers.kill_random(rng)
                    print(f"SIGKILL worker {pid} at {done} done", flush=True)
                if restart_at is not None and done >= restart_at:
                    restart_at = None
                    print(f"Redis SHUTDOWN at {done} done; restart in 2 s", flush=True)
                    server.stop()
                    time.sleep(2)
                    server.start()
                    r = redis.Redis(port=server.port)
                time.sleep(0.05)
            duration = time.monotonic() - t_run
        else:
            for _ in range(args.workers):
                workers.start()
            t_run = time.monotonic()
            next_kill = t_run + args.kill_every
            n = 0
            while (now := time.monotonic()) - t_run < args.duration:
                want = int((now - t_run) * args.rate)
                if want > n:
                    app.dispatch_many([job(i) for i in range(n, want)])
                    n = want
                if not rss_warm and now - t_run > min(60.0, args.duration / 5):
                    rss_warm = {p.pid: _rss_mb(p.pid) or 0.0 for p in workers.alive()}
                if now >= next_kill:
                    next_kill += args.kill_every
                    pid = workers.kill_random(rng)
                    print(f"{now - t_run:6.0f}s SIGKILL worker {pid}", flush=True)
                time.sleep(0.02)
            dispatched = n
            deadline = time.monotonic() + 120
            while int(r.hlen(exec_key)) < dispatched and time.monotonic() < deadline:
                time.sleep(0.1)
            duration = time.monotonic() - t_run
        rss_end = {p.pid: _rss_mb(p.pid) for p in workers.alive()}
        counts = {int(k): int(v) for k, v in r.hgetall(exec_key).items()}
        lost = sum(1 for i in range(dispatched) if i not in counts)
        extra = sum(c - 1 for c in counts.values() if c > 1)
        k = app.queue_for(None).keys("default")
        time.sleep(1.0)
        left = {
            "ready": r.llen(k.ready),
            "delayed": r.zcard(k.delayed),
            "reserved": r.zcount(k.reserved, "-inf", "(+inf"),  # not the skiplist mark
            "failed": r.zcard(k.failed),
        }
        r.delete(exec_key, k.done)
        mem_after = int(r.info("memory")["used_memory_dataset"])
        keys_left = sorted(k.decode() for k in r.scan_iter(count=1000))
        growth = [
            (rss_end[pid] or 0.0) / warm - 1 for pid, warm in rss_warm.items()
            if warm and rss_end.get(pid)
        ]  # fmt: skip
        print(f"jobs        {dispatched}")
        print(f"lost        {lost}")
        print(
            f"extra runs  {extra}  (kills {len(workers.killed)}, bound "
            f"{len(workers.killed) * args.concurrency} + in flight at a Redis restart)"
        )
        print(f"duration    {duration:.2f}s  ({dispatched / duration:.0f} jobs/s)")
        print(f"queue left  {left}")
        if growth:
            print(
                f"worker RSS  growth after warm-up: max {max(growth) * 100:+.1f}% "
                f"(median {sorted(growth)[len(growth) // 2] * 100:+.1f}%, "
                f"{len(growth)} workers that lived through the run)"
            )
        print(
            f"redis data  {mem_before / 1e6:.2f} MB before, {mem_after / 1e6:.2f} MB after "
            f"the drain (accounting deleted); keys left: {keys_left}"
        )
        return 1 if lost else 0
    finally:
        workers.stop_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
