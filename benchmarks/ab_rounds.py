"""Interleaved A/B rounds of any benchmark: the code before (a copy of another tree's
``src``) and this tree's, alternating, against the same Redis, medians and spreads.

    git archive main src | tar -x -C /tmp/base
    .venv/bin/python -m benchmarks.ab_rounds --base /tmp/base/src --rounds 6 \\
        --figure 'ratio=ratio \\(goal >= 0.9\\): ([0-9.]+)' \\
        -- -m benchmarks.notify_overhead --n 3000 --rounds 1

Each round runs the command once with ``PYTHONPATH=<base>`` (before) and once with this
tree's ``src`` (after), in alternating order (ABBA...), each against one Redis started
here (``TIDINGS_BENCH_REDIS_URL``), and reads every ``--figure NAME=REGEX`` (first
group, a number; commas ignored) from its output. The benchmark scripts themselves come
from this tree: pick ones that run on both.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks._redis import bench_redis

HERE = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the baseline tree's src directory")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--figure", action="append", required=True, help="NAME=REGEX")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = [a for a in args.command if a != "--"]
    figures = dict(f.split("=", 1) for f in args.figure)
    sides = {"before": str(Path(args.base).resolve()), "after": str(HERE / "src")}
    values: dict[str, dict[str, list[float]]] = {s: {f: [] for f in figures} for s in sides}
    with bench_redis() as server:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                env = dict(os.environ, PYTHONPATH=sides[side], TIDINGS_BENCH_REDIS_URL=server.url)
                out = subprocess.run(
                    [sys.executable, *command], env=env, cwd=HERE, capture_output=True,
                    text=True, check=True,
                ).stdout  # fmt: skip
                for name, pattern in figures.items():
                    m = re.search(pattern, out)
                    if m is None:
                        raise SystemExit(f"{name!r} not found in the {side} output:\n{out}")
                    values[side][name].append(float(m.group(1).replace(",", "")))
        print(
            f"{args.rounds} interleaved rounds of {' '.join(command)}, Redis {server.version}, "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
    for name in figures:
        for side in sides:
            v = values[side][name]
            print(f"  {name:<24} {side:<7} {statistics.median(v):10,.2f} "
                  f"[{min(v):,.2f}-{max(v):,.2f}]")  # fmt: skip
        ratios = [a / b for a, b in zip(values["after"][name], values["before"][name], strict=True)]
        print(f"  {name:<24} after/before per round {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]")  # fmt: skip


if __name__ == "__main__":
    main()
