"""Worker instructions per drained job, counted by valgrind: a figure the load cannot move.

On the shared 2-core machine the same loop's CPU time swings by up to 2x from one
second to the next (a busy sibling, steal), so wall rates and even CPU per job spread
wider than a 5-10 % effect. The number of instructions the worker process executes is
the same whoever else runs. This drains the jobs of ``notify_overhead_app`` in a child
process run under ``valgrind --tool=cachegrind`` (the parent fills the queue at full
speed, outside valgrind) and reads its instruction count (``I refs``); the child is run
with two sizes and the difference divided by the difference in jobs, so interpreter
start-up, imports and the worker's start and stop cancel out::

    .venv/bin/python -m benchmarks.instructions --case bare --case notification
    .venv/bin/python -m benchmarks.instructions --case bare --case bare-metrics-off
    .venv/bin/python -m benchmarks.instructions --base /tmp/base/src --case notification

``--base DIR`` runs every case with ``PYTHONPATH=DIR`` too (a copy of another tree's
``src``), beside this tree's. Each run takes ~30 s (valgrind runs Python ~50x slower),
so 4 runs a case. Caveats: under valgrind the worker is ~50x slower than Redis, so its
pops come back fuller than in a real drain, and the once-a-second timers (metrics flush,
heartbeat) run ~50x more often per job: they are counted, inflated; and the metrics keep
a per-job timing for the first 1,000 jobs of each minute, which under valgrind is most
jobs, at real speed (thousands a second) almost none. ``bare-metrics-steady`` counts
what metrics cost a job at real speed: the per-job hot path, with the flush put off to
the worker's exit (which cancels out) and no per-job timings.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from benchmarks._redis import bench_redis

HERE = Path(__file__).resolve().parent.parent
CASES = {
    "bare": ("bare", {}),
    "notification": ("notification", {}),
    "bare-metrics-off": ("bare", {"TIDINGS_METRICS": "0"}),
    "bare-metrics-steady": ("bare", {"BENCH_METRICS_STEADY": "1"}),
    "notification-metrics-off": ("notification", {"TIDINGS_METRICS": "0"}),
}
CHILD = """
import asyncio, os
if os.environ.get("BENCH_METRICS_STEADY"):  # the per-job part only (see the docstring)
    import tidings.observability.metrics as m
    m.FLUSH_EVERY_S, m.JOB_TIMING_CAP = 3600.0, 0
from benchmarks import notify_overhead_app as b
asyncio.run(b.drain())
"""


def counted(args: list[str], env: dict[str, str]) -> int:
    """Instructions of ``python <args>`` under cachegrind, run in the repository."""
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, *args],
        env=env, cwd=HERE, capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    m = re.search(r"I\s+refs:\s+([0-9,]+)", out)
    if m is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(m.group(1).replace(",", ""))


def instructions(env: dict[str, str]) -> int:
    """Instructions of one child drain under cachegrind."""
    return counted(["-c", CHILD], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), required=True)
    parser.add_argument("--n", type=int, nargs=2, default=[200, 1200], metavar=("SMALL", "BIG"))
    parser.add_argument("--base", help="another tree's src directory, run beside this one")
    args = parser.parse_args()
    trees = {"this tree": str(HERE / "src")}
    if args.base:
        trees = {"base": str(Path(args.base).resolve()), **trees}
    with bench_redis() as server:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "notify-overhead-benchmark-key-0123456789abcdef")
        os.environ["TIDINGS_PREFIX"] = f"tbench{os.getpid()}"
        from benchmarks import notify_overhead_app as bench

        small, big = args.n
        per_job: dict[tuple[str, str], float] = {}
        for case in args.case:
            kind, extra = CASES[case]
            for tree, src in trees.items():
                env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{HERE}", **extra)
                counts = []
                for n in (small, big):
                    bench.fill(kind, n)
                    counts.append(instructions(env))
                per_job[case, tree] = (counts[1] - counts[0]) / (big - small)
                print(
                    f"  {case:<26} {tree:<10} {per_job[case, tree]:10,.0f} instructions/job "
                    f"({counts[0]:,} at {small}, {counts[1]:,} at {big})",
                    flush=True,
                )
        print(f"valgrind (cachegrind), worker concurrency 16, Redis {server.version}")
        first = args.case[0]
        for case in args.case:
            for tree in trees:
                v = per_job[case, tree]
                line = f"  {case:<26} {tree:<10} {v:10,.0f} instructions/job"
                if case != first:
                    line += f"   {v / per_job[first, tree]:.3f}x {first}"
                if tree != "base" and "base" in trees:
                    line += f"   {v / per_job[case, 'base']:.3f}x base"
                print(line)


if __name__ == "__main__":
    main()
