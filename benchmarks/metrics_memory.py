"""Redis memory the metrics keep: measured after real jobs, and the steady-state bound.

    python benchmarks/metrics_memory.py [--jobs 100000] [--queues 3] [--classes 10]

1. ``--jobs`` lifecycle events go through a
   :class:`~tidings.observability.metrics.Meter` exactly as a worker's would (start +
   outcome per job) and are flushed once a simulated second, all in the current minute;
   the bytes of every metrics key are summed (``MEMORY USAGE``).
2. The steady state of a busy deployment: every queue x class active in every minute of
   the retention window (120 minute buckets; per-job timings at their cap in each of the
   last 60 minutes). This is the most the metrics can hold, whatever the job count, so
   the figure for a million (or a billion) jobs an hour is the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from benchmarks._redis import bench_redis
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobProcessing
from tidings.observability.metrics import JOB_TIMING_CAP, RETAIN_S, Meter


def stats_bytes(client: redis.Redis, prefix: str) -> tuple[int, int]:
    total = keys = 0
    for key in client.scan_iter(match=f"{prefix}:stats:*", count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
        keys += 1
    return total, keys


def feed(m: Meter, client: redis.Redis, n: int, queues: int, classes: int, now: float) -> None:
    per_flush = 5000  # a worker at 5k jobs/s flushes 5,000 jobs' sums at a time
    for start in range(0, n, per_flush):
        for i in range(start, min(n, start + per_flush)):
            q, c = f"queue{i % queues}", f"app.jobs:Job{(i // queues) % classes}"
            jid = f"{i:032x}"
            m.observe(JobProcessing(jid, q, c, 1, 0.003 + (i % 7) / 1000))
            if i % 50 == 0:
                m.observe(JobFailed(jid, q, c, 1, "E: x", 0.01))
            else:
                m.observe(JobProcessed(jid, q, c, 1, 0.002 + (i % 13) / 1000))
        pipe: Any = client.pipeline(transaction=False)
        m._commands(pipe, now, beat=False)
        replies = pipe.execute()
        m._timing_room = max(0, JOB_TIMING_CAP - int(replies[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--queues", type=int, default=3)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    with bench_redis() as server:
        client = redis.Redis.from_url(server.url)
        prefix = f"tmem{os.getpid()}"
        t0 = time.perf_counter()
        m = Meter(prefix)
        feed(m, client, args.jobs, args.queues, args.classes, time.time())
        took = time.perf_counter() - t0
        used, keys = stats_bytes(client, prefix)
        print(
            f"{args.jobs:,} jobs over {args.queues} queues x {args.classes} classes, one minute:"
            f" {used / 1024:.0f} KiB in {keys} keys ({took:.1f}s to record and flush)"
        )
        # steady state: every minute of the window busy, timings at their cap
        prefix2 = prefix + "s"
        m2 = Meter(prefix2)
        now = time.time()
        minutes = RETAIN_S // 60
        per_minute = max(args.queues * args.classes * 2, JOB_TIMING_CAP + 10)
        for k in range(minutes):
            m2._timing_minute = -1
            t = now - (minutes - 1 - k) * 60
            if k < minutes - 60:  # timings live an hour: only the last 60 minutes keep them
                m2._timing_room = 0
                m2._timing_minute = int(t // 60)
            feed(m2, client, per_minute, args.queues, args.classes, t)
        used2, keys2 = stats_bytes(client, prefix2)
        print(
            f"steady state (all {args.queues * args.classes} queue/class pairs busy in each of "
            f"{minutes} minutes, {JOB_TIMING_CAP} timings/min kept 60 min): "
            f"{used2 / 1024 / 1024:.2f} MiB in {keys2} keys: the bound for any job count"
        )
        for p in (prefix, prefix2):
            for key in client.scan_iter(match=f"{p}:*", count=1000):
                client.delete(key)


if __name__ == "__main__":
    main()
