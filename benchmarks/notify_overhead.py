"""A queued notification on a channel that does nothing, beside a bare async no-op job.

Issue 28, goal 4: a queued notification should drain at >= 0.9x a bare job. Both are
drained by the same in-process :class:`~tidings.worker.worker.Worker` (concurrency 16,
no per-job output listeners), N jobs a round, rounds interleaved in alternating order
(bare, notification, notification, bare, ...: neither kind always drains second, after
the other's garbage) after one warm-up round, on one throwaway Redis, medians and spreads
printed::

    .venv/bin/python -m benchmarks.notify_overhead --n 5000 --rounds 5

What a notification pays on top of the job: a bigger body to check and decode (the
notifiable and the notification: ``notify_stages.py`` times each step), ``should_send``,
the channel's caller, the NotificationSending/Sent announcements (skipped when nobody
listens), the channel's rate limit (skipped when the app sets none). On a shared machine
the CPU figures spread by +-15 %; ``instructions.py --case bare --case notification``
counts instructions, which the load does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from benchmarks._redis import bench_redis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with bench_redis() as server:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "notify-overhead-benchmark-key-0123456789abcdef")
        os.environ["TIDINGS_PREFIX"] = f"tbench{os.getpid()}"
        from benchmarks import notify_overhead_app as bench

        rates: dict[str, list[float]] = {"bare": [], "notification": []}
        cpu: dict[str, list[float]] = {"bare": [], "notification": []}
        for r in range(args.rounds + 1):
            for kind in list(rates) if r % 2 == 0 else reversed(rates):  # ABBA: no kind
                bench.fill(kind, args.n)  # always drains second (after the other's garbage)
                started, c = time.perf_counter(), time.process_time()
                asyncio.run(bench.drain())
                if r:  # round 0 warms up
                    rates[kind].append(args.n / (time.perf_counter() - started))
                    cpu[kind].append((time.process_time() - c) / args.n * 1e6)
        print(
            f"N = {args.n:,} a round, {args.rounds} interleaved rounds (order alternating, "
            f"one warm-up round), Redis {server.version}, load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        for kind, values in rates.items():
            print(
                f"  {kind:<13} {statistics.median(values):8,.0f}/s "
                f"[{min(values):,.0f}-{max(values):,.0f}]"
            )
        for kind, values in cpu.items():
            print(
                f"  {kind:<13} {statistics.median(values):8.1f} us CPU/job "
                f"[{min(values):.1f}-{max(values):.1f}] (this process: worker side only)"
            )
        cratios = [b / n for n, b in zip(cpu["notification"], cpu["bare"], strict=True)]
        print(
            f"  CPU ratio (bare CPU/job / notification CPU/job): {statistics.median(cratios):.2f} "
            f"[{min(cratios):.2f}-{max(cratios):.2f}]"
        )
        ratios = [n / b for n, b in zip(rates["notification"], rates["bare"], strict=True)]
        print(
            f"  ratio (goal >= 0.9): {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] (per round, notification / bare)"
        )


if __name__ == "__main__":
    main()
