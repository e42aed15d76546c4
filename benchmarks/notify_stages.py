"""Where a queued notification's extra worker time goes, stage by stage, beside a bare job.

Issue 28, goal 4. ``notify_overhead.py`` gives the whole-drain ratio; wall clock and
even CPU per job move by +-15 % on a shared machine, more than the gap itself. This
times each step the worker takes for one job (``worker/execute.py``), on the very
envelopes ``notify_overhead_app.fill`` queues, in tight loops (no Redis round trip in
the loop), bare and notification taking turns every round; the figure of a round is the
mean of a batch, and the minimum and median over rounds are printed (the minimum is what
the code costs, the median how the load moved it)::

    .venv/bin/python -m benchmarks.notify_stages --rounds 15

Stages: ``open_envelope`` (signature check, JSON parse, field checks),
``serializer.decode`` (the job object from its tagged fields), ``job.middleware()``,
``await job.handle()`` (for a notification: the sender, the channel lookup, the send).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from benchmarks._redis import bench_redis

KINDS = ("bare", "notification")


def _batch(fn: Callable[[], Any], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


async def _abatch(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args()
    with bench_redis() as server:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "notify-overhead-benchmark-key-0123456789abcdef")
        os.environ["TIDINGS_PREFIX"] = f"tbench{os.getpid()}"
        from benchmarks import notify_overhead_app as bench
        from tidings.wire import serializer
        from tidings.wire.envelope import open_envelope

        app = bench.app
        jobs_key = f"{app.settings.prefix}:queue:{{default}}:jobs"
        client = redis.Redis.from_url(server.url)
        for kind in KINDS:
            bench.fill(kind, 1)
        envelopes: dict[str, tuple[str, bytes]] = {}
        for jid, env in client.hgetall(jobs_key).items():
            envelopes["notification" if b"Hello" in env else "bare"] = (jid.decode(), env)
        client.delete(jobs_key, jobs_key.removesuffix(":jobs"))

        stages: dict[str, dict[str, Callable[[], Any]]] = {}
        for kind in KINDS:
            jid, env = envelopes[kind]
            body = open_envelope(env, app.signer, job_id=jid)
            job = serializer.decode(body["data"], app.resolve_class)
            stages[kind] = {
                "open_envelope": lambda e=env, j=jid: open_envelope(e, app.signer, job_id=j),
                "serializer.decode": lambda d=body["data"]: serializer.decode(d, app.resolve_class),
                "job.middleware()": job.middleware,
                "await job.handle()": job.handle,
            }
        names = list(stages["bare"])
        took: dict[str, dict[str, list[float]]] = {k: {s: [] for s in names} for k in KINDS}

        async def rounds() -> None:
            for r in range(args.rounds + 1):
                for kind in KINDS if r % 2 == 0 else reversed(KINDS):
                    for name, fn in stages[kind].items():
                        if name.startswith("await"):
                            us = await _abatch(fn, args.batch)
                        else:
                            us = _batch(fn, args.batch)
                        if r:  # round 0 warms up
                            took[kind][name].append(us)

        asyncio.run(rounds())
        print(
            f"{args.rounds} interleaved rounds of {args.batch:,} calls a stage, load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; envelope bytes: bare "
            f"{len(envelopes['bare'][1])}, notification {len(envelopes['notification'][1])}"
        )
        print(f"  {'us per job: min / median':<26}{'bare':>16}{'notification':>16}{'extra':>16}")
        extra_min = extra_med = 0.0
        for name in names:
            b, n = took["bare"][name], took["notification"][name]
            dmin, dmed = min(n) - min(b), statistics.median(n) - statistics.median(b)
            extra_min, extra_med = extra_min + dmin, extra_med + dmed
            print(
                f"  {name:<26}{min(b):7.2f} / {statistics.median(b):6.2f}"
                f"{min(n):7.2f} / {statistics.median(n):6.2f}{dmin:7.2f} / {dmed:6.2f}"
            )
        print(f"  {'notification extra, all':<26}{'':>32}{extra_min:7.2f} / {extra_med:6.2f}")


if __name__ == "__main__":
    main()
