"""Results, priorities, cancel and result wake-up (issue 23): figures beside baselines.

    python -m benchmarks.control [--jobs 5000] [--rounds 3] [--topology plain|cluster|sentinel|all]

One throwaway redis-server (``benchmarks/_redis.py``), one in-process
:class:`~tidings.worker.worker.Worker` (``--concurrency 16``, no per-job output). Each
pair is measured in interleaved rounds and the medians printed side by side:

* drain of no-op jobs returning a small dict, results kept vs not (goal >= 0.85);
* drain of a queue where every job has a random priority vs a plain queue (goal >= 0.8),
  and the enqueue of the same (``dispatch_many``, batches of 1,000);
* cancel latency of a running async job: from ``app.cancel`` to the handler seeing
  ``CancelledError``, p50/p99 over 200 cancels (goal p99 <= 1 s);
* ``app.result()`` wake-up after the job finished (ack to the waiter's return),
  p50/p99 (goal p99 <= 5 ms on loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from benchmarks._redis import bench_redis, delete_prefix
from tidings import App, Job
from tidings.worker.worker import Worker, WorkerOptions

CANCEL_SEEN: dict[str, float] = {}
STARTED: dict[str, threading.Event] = {}


@dataclass
class Plain(Job):
    n: int

    async def handle(self) -> dict[str, int]:
        return {"n": self.n, "ok": 1}


@dataclass
class Kept(Plain):
    store_result = True


@dataclass
class Sleeper(Job):
    tag: str

    async def handle(self) -> None:
        STARTED.setdefault(self.tag, threading.Event()).set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            CANCEL_SEEN[self.tag] = time.perf_counter()
            raise


def drain(app: App, *, concurrency: int = 16) -> float:
    async def main() -> float:
        w = Worker(app, WorkerOptions(concurrency=concurrency, stop_when_empty=True, sleep_s=0.2))
        t0 = time.perf_counter()
        await w.run()
        return time.perf_counter() - t0

    return asyncio.run(main())


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def run(url: str, jobs: int, rounds: int, samples: int = 200) -> None:
    prefix = f"bench23-{os.getpid()}"
    app = App(env=False, redis_url=url, key="bench-key-0123456789abcdef0123456789",
              prefix=prefix, allowed_modules="benchmarks", metrics=False)  # fmt: skip
    client = app.queue_for(None).client
    rng = random.Random(7)
    res: dict[str, list[float]] = {k: [] for k in ("plain", "kept", "prio", "pe", "pp")}
    for _ in range(rounds):
        for case in ("plain", "kept", "prio") if jobs else ():
            delete_prefix(client, prefix)
            if case == "kept":
                batch = [Kept(i) for i in range(jobs)]
            elif case == "prio":
                batch = [Plain(i).with_priority(rng.randint(-100, 100)) for i in range(jobs)]
            else:
                batch = [Plain(i) for i in range(jobs)]
            t0 = time.perf_counter()
            app.dispatch_many(batch)
            enq = time.perf_counter() - t0
            if case == "plain":
                res["pe"].append(jobs / enq)
            elif case == "prio":
                res["pp"].append(jobs / enq)
            res[case].append(jobs / drain(app))
    med = {k: statistics.median(v) if v else 1.0 for k, v in res.items()}
    if jobs:
        _throughputs(med)
    _latencies(app, client, prefix, samples)


def _throughputs(med: dict[str, float]) -> None:
    print(f"drain, results not kept   {med['plain']:>10,.0f} jobs/s (baseline)")
    print(f"drain, results kept       {med['kept']:>10,.0f} jobs/s  "
          f"ratio {med['kept'] / med['plain']:.2f} (goal >= 0.85)")  # fmt: skip
    print(f"drain, random priorities  {med['prio']:>10,.0f} jobs/s  "
          f"ratio {med['prio'] / med['plain']:.2f} (goal >= 0.8)")  # fmt: skip
    print(f"enqueue, plain            {med['pe']:>10,.0f} jobs/s (baseline)")
    print(f"enqueue, random priority  {med['pp']:>10,.0f} jobs/s  "
          f"ratio {med['pp'] / med['pe']:.2f} (goal >= 0.8)")  # fmt: skip


def _latencies(app: App, client: Any, prefix: str, samples: int) -> None:
    CANCEL_SEEN.clear()  # one run per topology: tags repeat
    STARTED.clear()
    ACKED.clear()
    # -- cancel latency: one running async job at a time, 200 cancels -----------------------
    delete_prefix(client, prefix)
    lat: list[float] = []

    async def cancels() -> None:
        w = Worker(app, WorkerOptions(concurrency=4, sleep_s=0.2))
        task = asyncio.create_task(w.run())
        await asyncio.sleep(0.5)  # the worker is up and listening for cancels
        for i in range(samples):
            tag = f"s{i}"
            STARTED[tag] = threading.Event()
            job_id = await Sleeper(tag).dispatch_async()
            assert job_id is not None
            while not STARTED[tag].is_set():
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()
            await app.acancel(job_id)
            while tag not in CANCEL_SEEN:
                await asyncio.sleep(0.0005)
            lat.append(CANCEL_SEEN[tag] - t0)
        w.stop()
        await task

    asyncio.run(cancels())
    print(f"cancel latency ({len(lat)})  p50 {pct(lat, 50) * 1000:.2f} ms  "
          f"p99 {pct(lat, 99) * 1000:.2f} ms (goal p99 <= 1000 ms)")  # fmt: skip

    # -- result wake-up: a waiter blocked in app.result(); the ack publishes -----------------
    delete_prefix(client, prefix)
    wake: list[float] = []
    for _ in range(samples):
        job_id = Kept(1).dispatch()
        assert job_id is not None
        got: list[float] = []

        def wait(jid: str = job_id, got: list[float] = got) -> None:
            app.result(jid, timeout_s=10)
            got.append(time.perf_counter())

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.005)  # the waiter is subscribed
        drain(app, concurrency=1)
        t.join(10)
        # The ack's time is on Redis's clock: measure from the worker's ack instead.
        wake.append(got[0] - ACKED[-1] if ACKED else float("nan"))
    print(f"result wake-up ({len(wake)})  p50 {pct(wake, 50) * 1000:.2f} ms  "
          f"p99 {pct(wake, 99) * 1000:.2f} ms (goal p99 <= 5 ms)")  # fmt: skip
    delete_prefix(client, prefix)
    app.close()


ACKED: list[float] = []


def _patch_ack_clock() -> None:
    """Note when each ack batch came back (the result is written in that script)."""
    from tidings.moves.consume import Broker

    original = Broker.ack

    async def ack(self: Broker, *args: Any, **kwargs: Any) -> list[str]:
        out = await original(self, *args, **kwargs)
        ACKED.append(time.perf_counter())
        return out

    Broker.ack = ack  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=200, help="cancels and result waits")
    p.add_argument("--topology", default="plain", choices=("plain", "cluster", "sentinel", "all"),
                   help="also (or only) on a 6-node Redis Cluster / a Sentinel group on "
                   "loopback (tests/support/topology.py); --jobs 0 for the latencies only")
    a = p.parse_args()
    _patch_ack_clock()
    wanted = ("plain", "cluster", "sentinel") if a.topology == "all" else (a.topology,)
    for topology in wanted:
        print(f"== {topology}")
        if topology == "plain":
            with bench_redis() as server:
                print(f"redis {server.version}, {a.jobs} jobs a drain, "
                      f"medians of {a.rounds} rounds")  # fmt: skip
                run(server.url, a.jobs, a.rounds, a.samples)
            continue
        import shutil
        import tempfile
        from pathlib import Path

        from tests.support.topology import ClusterGroup, SentinelGroup

        base = Path(tempfile.mkdtemp(prefix="tidings-bench-control-"))
        group = ClusterGroup if topology == "cluster" else SentinelGroup
        try:
            with group(base / topology) as g:
                run(g.url, a.jobs, a.rounds, a.samples)
        finally:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    # Run as benchmarks.control, not __main__: the worker resolves the job classes by
    # that name, and their STARTED / CANCEL_SEEN must be the ones the loops wait on (run
    # as __main__, the cancel loop waited forever for a start it could not see).
    from benchmarks import control

    control.main()
