"""What the per-job metrics cost a worker, measured two ways in one process.

Issue 28, goal 5: metrics cost <= 5 %, shown with enough interleaved rounds that the
spread is smaller than the effect. Wall-clock drains on a shared machine swing by 2x;
two figures that move less:

1. **CPU per drained job** of this process (``time.process_time``) over an in-process
   :class:`~tidings.worker.worker.Worker` drain of N async no-op jobs (concurrency 16,
   no per-job output), ``App.settings.metrics`` on and off taking turns every round; the
   per-round ratio (on / off, the two drains of one round back to back) with its spread.
2. **The metrics' own hot path**: ``Meter.observe`` of the two events every job emits
   (JobProcessing, JobProcessed), timed in a loop beside the same loop without it, as
   microseconds per job and as a share of (1)'s CPU per job with metrics off. The
   once-a-second flush (one pipeline) is not in it: its share shrinks as the rate grows.

The per-round ratios are summed up by their median, their range, and a 95 % confidence
interval of the median (distribution-free: order statistics of the binomial, so a few
rounds hit by another process's burst widen it only as much as their number says). The
goal is shown met when that interval lies under 1.05; more rounds narrow it. CPU comes
from ``resource.getrusage`` (user + system of this process: the worker's, the queue is
filled outside the measured span); ``benchmarks/instructions.py --case bare --case
bare-metrics-off`` counts instructions instead, which the load does not move at all.

    .venv/bin/python -m benchmarks.metrics_cost --n 3000 --rounds 24
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import statistics
import time

from benchmarks._redis import bench_redis

N_OBSERVE = 200_000


def observe_us_per_job() -> float:
    """µs a job spends in ``Meter.observe`` (two events), loop overhead subtracted."""
    from tidings.observability.lifecycle import JobProcessed, JobProcessing
    from tidings.observability.metrics import Meter

    meter = Meter("tbench-observe")
    start = [JobProcessing(f"id{i}", "default", "NoOpJob", 1, 0.001) for i in range(1000)]
    done = [JobProcessed(f"id{i}", "default", "NoOpJob", 1, 0.0002) for i in range(1000)]
    pairs = list(zip(start, done, strict=True)) * (N_OBSERVE // 1000)
    observe = meter.observe

    def bare(_: object) -> None:
        return None

    timings = []
    for fn in (observe, bare):
        t = time.perf_counter()
        for a, b in pairs:
            fn(a)
            fn(b)
        timings.append(time.perf_counter() - t)
    return (timings[0] - timings[1]) / len(pairs) * 1e6


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    ``k`` and ``n + 1 - k`` with the largest ``k`` whose binomial tail is within
    ``(1 - confidence) / 2`` (the whole range when there are too few values)."""
    xs, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while True:
        tail += math.comb(n, k) / 2**n  # P(fewer than k + 1 of n fall below the median)
        if tail > (1 - confidence) / 2:
            break
        k += 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=24)
    args = parser.parse_args()
    with bench_redis() as server:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "metrics-cost-benchmark-key-0123456789abcdef")
        os.environ["TIDINGS_PREFIX"] = f"tbench{os.getpid()}"
        from benchmarks import notify_overhead_app as bench

        app = bench.app
        cpu: dict[bool, list[float]] = {True: [], False: []}
        wall: dict[bool, list[float]] = {True: [], False: []}
        hot: list[float] = []
        for r in range(args.rounds + 1):
            order = (True, False) if r % 2 == 0 else (False, True)
            for metrics in order:
                app.settings.metrics = metrics
                bench.fill("bare", args.n)
                c, w = cpu_s(), time.perf_counter()
                asyncio.run(bench.drain())
                c, w = cpu_s() - c, time.perf_counter() - w
                if r:  # round 0 warms up
                    cpu[metrics].append(c / args.n * 1e6)
                    wall[metrics].append(args.n / w)
            if r:
                hot.append(observe_us_per_job())
        app.settings.metrics = True
        print(
            f"N = {args.n:,} async no-op jobs a drain, {args.rounds} rounds (on/off order "
            f"alternating), Redis {server.version}, load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} CPUs"
        )
        for metrics in (True, False):
            c, w = cpu[metrics], wall[metrics]
            print(
                f"  metrics {'on ' if metrics else 'off'}  CPU/job {statistics.median(c):6.1f} us "
                f"[{min(c):.1f}-{max(c):.1f}]   drain {statistics.median(w):7,.0f}/s "
                f"[{min(w):,.0f}-{max(w):,.0f}]"
            )
        rc = sorted(a / b for a, b in zip(cpu[True], cpu[False], strict=True))
        rw = sorted(b / a for a, b in zip(wall[True], wall[False], strict=True))
        q = len(rc) // 4
        for label, r in (("CPU/job (getrusage)", rc), ("drain time", rw)):
            lo, hi = median_ci(r)
            print(
                f"  on / off per round, {label:<19} median {statistics.median(r):.3f}x, 95 % CI "
                f"of the median {lo:.3f}-{hi:.3f} [range {r[0]:.3f}-{r[-1]:.3f}, middle half "
                f"{r[q]:.3f}-{r[-1 - q]:.3f}]"
            )
        lo, hi = median_ci(rc)
        verdict = "shown" if hi <= 1.05 else "not shown (more rounds, or a quieter machine)"
        print(f"  drain-level metrics cost <= 5 % by CPU: {verdict} (CI upper bound {hi:.3f}x)")
        off = statistics.median(cpu[False])
        h = statistics.median(hot)
        print(
            f"  Meter.observe, 2 events a job: {h:.2f} us/job [{min(hot):.2f}-{max(hot):.2f}] "
            f"= {h / off:.1%} of the CPU/job with metrics off (goal <= 5 %)"
        )


if __name__ == "__main__":
    main()
