"""Run every benchmark with one command and print one table.

    .venv/bin/python benchmarks/run.py [--quick] [--n N] [--runs R] [--only SECTIONS]
    .venv/bin/python benchmarks/run.py --profile DIR [--n N]     # needs py-spy

SECTIONS (comma-separated): enqueue, bulk, drain, latency, memory, observe, peers, notify,
events.

Starts its own redis-server on a free 127.0.0.1 port (no persistence) and stops it at
the end, unless ``TIDINGS_BENCH_REDIS_URL`` names one; then only keys under a private
prefix are touched. Figures are printed beside baselines measured in the same run and
never asserted: see ``benchmarks/README.md`` for the recorded figures and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from benchmarks._redis import bench_redis  # noqa: E402
from benchmarks.bench_queue import ALL, Ctx, Row  # noqa: E402

SECTIONS = [*ALL, "peers", "notify", "events"]


def machine(server_version: str, binary: str | None) -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return [
        f"machine: {os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}",
        f"python {platform.python_version()}, redis-py {redis.__version__}, "
        f"Redis {server_version} ({binary or 'TIDINGS_BENCH_REDIS_URL'})",
    ]


def print_table(rows: list[Row]) -> None:
    head = Row("figure", "tidings", "baseline (same run)", "ratio", "goal (issue 7)")
    cols = [
        max(len(getattr(r, f)) for r in [head, *rows])
        for f in ("figure", "value", "baseline", "ratio")
    ]
    for i, r in enumerate([head, *rows]):
        print(
            f"{r.figure:<{cols[0]}}  {r.value:>{cols[1]}}  {r.baseline:<{cols[2]}}  "
            f"{r.ratio:>{cols[3]}}  {r.goal}".rstrip()
        )
        if i == 0:
            print("-" * (sum(cols) + 8 + len("goal (issue 7)")))


def run_events(quick: bool) -> None:
    """The event-dispatch figures (benchmarks/bench_events.py, owned separately)."""
    script = ROOT / "benchmarks" / "bench_events.py"
    if not script.exists():
        return
    print("\nevents (benchmarks/bench_events.py):", flush=True)
    argv = [sys.executable, str(script), *(["--number", "20000"] if quick else [])]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = subprocess.call(argv, cwd=ROOT, env=env)
    if code:
        print(f"  (bench_events.py exited with {code})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 5,000 and one run per drain")
    parser.add_argument(
        "--n", type=int, default=None, help="jobs per figure (20,000; 5,000 with --quick)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="runs per figure; the median is printed"
    )
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="instead: drain N jobs under py-spy and print where the time goes",
    )
    args = parser.parse_args()
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    n = args.n or (5_000 if args.quick else 20_000)

    with bench_redis() as server:
        prefix = f"tbench{os.getpid()}"
        os.environ.update(
            TIDINGS_REDIS_URL=server.url,
            TIDINGS_KEY=secrets.token_urlsafe(32),
            TIDINGS_PREFIX=prefix,
        )
        os.environ.pop("TIDINGS_BENCH_LATENCY", None)
        ctx = Ctx(server.url, prefix, n=n, runs=args.runs, quick=args.quick)
        header = machine(server.version, server.binary)
        header.append(
            f"N = {n:,} no-op jobs; medians of {args.runs} runs"
            + (" (drains: 1 run)" if args.quick else "")
        )
        for line in header:
            print(line, flush=True)
        if args.profile:
            from benchmarks.bench_queue import profile_drain

            out_dir = Path(args.profile)
            out_dir.mkdir(parents=True, exist_ok=True)
            try:
                for line in profile_drain(ctx, out_dir):
                    print(line)
            finally:
                ctx.clean()
            return
        rows: list[Row] = []
        t0 = time.monotonic()
        try:
            for name in wanted:
                if name not in ALL and name not in ("peers", "notify"):
                    continue
                print(f"  running {name} ...", file=sys.stderr, flush=True)
                try:
                    if name == "peers":
                        from benchmarks.peers import peer_rows

                        rows += peer_rows(ctx)
                    elif name == "notify":
                        from benchmarks.bench_notify import notify_rows

                        rows += notify_rows(ctx)
                    else:
                        rows += ALL[name](ctx)
                except Exception as exc:  # one broken figure must not hide the others
                    traceback.print_exc()
                    rows.append(Row(f"{name}: FAILED", type(exc).__name__, str(exc)[:80]))
        finally:
            ctx.clean()
            ctx.client.close()
        print()
        print_table(rows)
        for note in ctx.notes:
            print(f"note: {note}")
        print(f"({time.monotonic() - t0:.0f} s)")
    if "events" in wanted:
        run_events(args.quick)


if __name__ == "__main__":
    main()
