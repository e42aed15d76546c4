"""Redis memory per queued job (issue 28, goal 6), beside huey's and BullMQ's.

For each system, on one throwaway Redis (``FLUSHALL`` between them: a private server
only), the ``used_memory`` delta over N queued no-op jobs divided by N. tidings queues
with ``app.dispatch_many`` (``benchmarks.bench_app:NoOpJob``, one int field), huey with
its task call (``huey_noop(i)``), BullMQ with ``Queue.addBulk`` (``node
anchors/bullmq_worker.mjs push N``; ``npm install`` in benchmarks/anchors first). A peer
that is not installed is skipped, and said so. ``--before DIR`` measures tidings from
another source tree too (a checkout's ``src``), in the same run::

    .venv/bin/python -m benchmarks.queued_memory --n 100000
    git worktree add /tmp/before <commit>  # or: git archive <commit> src | tar -x -C /tmp/before
    .venv/bin/python -m benchmarks.queued_memory --before /tmp/before/src --rounds 2

Each system runs in a child process of its own (one app, one import of tidings), so the
parent holds no connection that could allocate on the server during a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import redis

from benchmarks._redis import bench_redis

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = ROOT / "benchmarks" / "anchors"


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _child(system: str, url: str, n: int) -> None:
    """Queue n jobs with ``system`` and print the bytes per job (run in a child)."""
    client = redis.Redis.from_url(url)
    if system == "tidings":
        from benchmarks.bench_app import NoOpJob, app

        NoOpJob(0).dispatch()  # the queue's keys exist before the first reading
        before = _used(client)
        for start in range(0, n, 10_000):
            app.dispatch_many([NoOpJob(i) for i in range(start, min(n, start + 10_000))])
    elif system == "huey":
        from benchmarks import bench_app

        noop = bench_app.huey_noop
        noop(0)
        before = _used(client)
        for i in range(n):
            noop(i)
    else:
        raise SystemExit(f"unknown system {system!r}")
    print((_used(client) - before) / n)


def _run_child(system: str, url: str, n: int, src: str | None) -> float:
    env = dict(os.environ, TIDINGS_REDIS_URL=url, TIDINGS_KEY="k" * 40, TIDINGS_PREFIX="mem")
    paths = [str(ROOT)] if src is None else [src, str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.queued_memory", "--child", system, "--url", url,
         "--n", str(n)],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return float(out.strip().splitlines()[-1])


def _bullmq(url: str, n: int) -> float:
    node = shutil.which("node")
    if node is None or not (ANCHORS / "node_modules" / "bullmq").exists():
        raise FileNotFoundError("node or benchmarks/anchors/node_modules/bullmq")
    client = redis.Redis.from_url(url)
    env = dict(os.environ, TIDINGS_REDIS_URL=url, BULLMQ_QUEUE="mem")
    script = str(ANCHORS / "bullmq_worker.mjs")
    subprocess.run([node, script, "push", "1"], cwd=ANCHORS, env=env, check=True)
    before = _used(client)
    subprocess.run([node, script, "push", str(n)], cwd=ANCHORS, env=env, check=True)
    return (_used(client) - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="jobs queued per measurement")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--before", help="a tidings src tree measured beside this one")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.url, args.n)
        return
    with bench_redis() as server:
        if server.binary is None:
            raise SystemExit("needs a private Redis (it FLUSHALLs): unset TIDINGS_BENCH_REDIS_URL")
        client = redis.Redis.from_url(server.url)
        systems: list[tuple[str, str]] = [("tidings", "this tree")]
        if args.before:
            systems.append(("tidings", args.before))
        if importlib.util.find_spec("huey") is not None:
            systems.append(("huey", ""))
        else:
            print("huey: not installed (pip install -e '.[bench]'); skipped")
        systems.append(("bullmq", ""))
        figures: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved: every system once a round
            for system, tree in systems:
                client.flushall()
                label = f"tidings ({tree})" if system == "tidings" else system
                try:
                    if system == "bullmq":
                        value = _bullmq(server.url, args.n)
                    else:
                        src = tree if system == "tidings" and tree != "this tree" else None
                        value = _run_child(system, server.url, args.n, src)
                except FileNotFoundError as exc:
                    if label not in figures:
                        print(f"{label}: not installed ({exc}); skipped")
                    figures.setdefault(label, [])
                    continue
                figures.setdefault(label, []).append(value)
        client.flushall()
        print(f"\nRedis {server.version}, {args.n:,} queued no-op jobs, {args.rounds} round(s)")
        print(f"{'system':<40} {'bytes per queued job':>22}  spread")
        for label, values in figures.items():
            if values:
                spread = f"{min(values):.0f}-{max(values):.0f}"
                print(f"{label:<40} {statistics.median(values):>22.0f}  {spread}")


if __name__ == "__main__":
    main()
