"""Results, priorities, cancel and result wake-up (issue 23): figures beside baselines.

    python -m benchmarks.control [--jobs 5000] [--rounds 3]

One throwaway redis-server (``benchmarks/_redis.py``), one in-process
:class:`~tidings.worker.worker.Worker` (``--concurrency 16``, no per-job output). Each
pair is measured in interleaved rounds and the medians printed side by side:

* drain of no-op jobs returning a small dict, results kept vs not (goal >= 0.85);
* drain of a queue where every job has a random priority vs a plain queue (goal >= 0.8),
  and the enqueue of the same (``dispatch_many``, batches of 1,000; its own
  ``--enqueue-rounds``, 15 by default, alternating plain and random priorities);
* cancel latency of a running async job: from ``app.cancel`` to the handler seeing
  ``CancelledError``, p50/p99 over 200 cancels (goal p99 <= 1 s);
* ``app.result()`` wake-up after the job finished (its ack, which writes the result and
  publishes, ran on Redis: the done record's score, in ms) to the return of a waiter
  in another process, p50/p99 (goal p99 <= 5 ms on loopback).

Each wait is bounded: a section that cannot make progress stops with an error naming
what it waited for (it used to hang: see ``main``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import random
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from benchmarks._redis import bench_redis, delete_prefix
from tidings import App, Job
from tidings.worker.worker import Worker, WorkerOptions

KEY = "bench-key-0123456789abcdef0123456789"
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


def until(
    done: Callable[[], bool],
    what: str,
    worker: asyncio.Task[Any] | None = None,
    timeout_s: float = 30.0,
) -> Awaitable[None]:
    """Wait (polling every 0.5 ms) for ``done()``; a clear error after ``timeout_s``, or
    as soon as the ``worker`` task ended, instead of a benchmark that hangs."""

    async def wait() -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if worker is not None and worker.done():
                raise RuntimeError(f"the worker stopped ({worker!r}) before {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark stuck: {what} not seen in {timeout_s:g} s")
            await asyncio.sleep(0.0005)

    return wait()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def run(url: str, jobs: int, rounds: int, samples: int = 200, enqueue_rounds: int = 15) -> None:
    prefix = f"bench23-{os.getpid()}"
    app = App(env=False, redis_url=url, key=KEY,
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
            app.dispatch_many(batch)
            res[case].append(jobs / drain(app))
    # Enqueue alone, in more rounds (no drain between: cheap), alternating the two.
    for _ in range(enqueue_rounds if jobs else 0):
        for case in ("pe", "pp"):
            delete_prefix(client, prefix)
            if case == "pp":
                batch = [Plain(i).with_priority(rng.randint(-100, 100)) for i in range(jobs)]
            else:
                batch = [Plain(i) for i in range(jobs)]
            t0 = time.perf_counter()
            app.dispatch_many(batch)
            res[case].append(jobs / (time.perf_counter() - t0))
    med = {k: statistics.median(v) if v else 1.0 for k, v in res.items()}

    def spread(case: str, base: str) -> str:
        """The per-round ratios (each round's case over the same round's baseline)."""
        rs = [c / b for c, b in zip(res[case], res[base], strict=False)]
        return f"rounds {min(rs):.2f}..{max(rs):.2f}" if rs else ""

    if jobs:  # --jobs 0: the latencies only
        print(f"drain, results not kept   {med['plain']:>10,.0f} jobs/s (baseline)")
        print(f"drain, results kept       {med['kept']:>10,.0f} jobs/s  "
              f"ratio {med['kept'] / med['plain']:.2f} (goal >= 0.85)  "
              f"{spread('kept', 'plain')}")  # fmt: skip
        print(f"drain, random priorities  {med['prio']:>10,.0f} jobs/s  "
              f"ratio {med['prio'] / med['plain']:.2f} (goal >= 0.8)  "
              f"{spread('prio', 'plain')}")  # fmt: skip
        print(f"enqueue, plain            {med['pe']:>10,.0f} jobs/s (baseline)")
        print(f"enqueue, random priority  {med['pp']:>10,.0f} jobs/s  "
              f"ratio {med['pp'] / med['pe']:.2f} (goal >= 0.8)  "
              f"{spread('pp', 'pe')}")  # fmt: skip

    # -- cancel latency: one running async job at a time, 200 cancels -----------------------
    CANCEL_SEEN.clear()  # one run per topology: tags repeat
    STARTED.clear()
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
            await until(STARTED[tag].is_set, f"the start of cancel sample {i}", task)
            t0 = time.perf_counter()
            await app.acancel(job_id)
            await until(lambda tag=tag: tag in CANCEL_SEEN, f"the cancel of sample {i}", task)
            lat.append(CANCEL_SEEN[tag] - t0)
        w.stop()
        await task

    asyncio.run(cancels())
    print(f"cancel latency ({len(lat)})  p50 {pct(lat, 50) * 1000:.2f} ms  "
          f"p99 {pct(lat, 99) * 1000:.2f} ms (goal p99 <= 1000 ms)")  # fmt: skip

    # -- result wake-up: a waiter blocked in app.result(); the ack publishes -----------------
    # The waiter is another process (a thread here would wait for this process's GIL
    # while the worker winds down).
    delete_prefix(client, prefix)
    wake: list[float] = []
    done_key = app.queue_for(None).keys("default").done
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    waiter = ctx.Process(target=_waiter, args=(url, prefix, there), daemon=True)
    waiter.start()
    try:
        if not here.poll(60):
            raise RuntimeError("benchmark stuck: the waiter process did not start")
        here.recv()
        for _ in range(samples):
            job_id = Kept(1).dispatch()
            assert job_id is not None
            here.send(job_id)
            here.recv()  # the waiter is calling app.result()
            time.sleep(0.01)  # ... and subscribed, most likely (else its first look finds it)
            drain(app, concurrency=1)
            if not here.poll(15):
                raise RuntimeError("benchmark stuck: app.result() did not return")
            got = here.recv()
            if not isinstance(got, float):
                raise RuntimeError(f"app.result() in the waiter: {got!r}")
            # The job finished when its ack ran: the done record's score, Redis TIME in
            # ms (truncated: this reads up to 1 ms long). The waiter's return is on the
            # same machine's wall clock.
            wake.append(got - float(client.zscore(done_key, job_id) or "nan") / 1000)
        here.send(None)
        waiter.join(10)
    finally:
        if waiter.is_alive():
            waiter.kill()
    print(f"result wake-up ({len(wake)})  p50 {pct(wake, 50) * 1000:.2f} ms  "
          f"p99 {pct(wake, 99) * 1000:.2f} ms (goal p99 <= 5 ms; "
          "from the ack's Redis time, +0..1 ms)")  # fmt: skip
    delete_prefix(client, prefix)
    app.close()


def _waiter(url: str, prefix: str, conn: Connection) -> None:
    """The result waiter's process: for each job id sent, ``app.result()`` and the
    wall-clock time it returned at (or what it raised)."""
    app = App(env=False, redis_url=url, key=KEY, prefix=prefix, allowed_modules="benchmarks",
              metrics=False)  # fmt: skip
    conn.send("ready")
    while True:
        job_id = conn.recv()
        if job_id is None:
            break
        conn.send("waiting")
        try:
            app.result(job_id, timeout_s=10, queue="default")
            conn.send(time.time())
        except Exception as exc:  # reported to the parent, which stops
            conn.send(repr(exc))
    app.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=200, help="cancels and result waits")
    p.add_argument("--enqueue-rounds", type=int, default=15, help="enqueue-only rounds")
    p.add_argument(
        "--topology",
        default="plain",
        choices=("plain", "cluster", "sentinel", "all"),
        help="also (or only) on a 6-node Redis Cluster / a Sentinel group on "
        "loopback (tests/support/topology.py); --jobs 0 for the latencies only",
    )
    a = p.parse_args()
    # Every drain starts a worker, and each would warn that the throwaway Redis has no
    # persistence: said once here instead.
    logging.getLogger("tidings.health").setLevel(logging.ERROR)
    wanted = ("plain", "cluster", "sentinel") if a.topology == "all" else (a.topology,)
    for topology in wanted:
        print(f"== {topology}")
        if topology == "plain":
            with bench_redis() as server:
                print(f"redis {server.version}, {a.jobs} jobs a drain, medians of {a.rounds} "
                      f"rounds ({a.enqueue_rounds} for enqueue)")  # fmt: skip
                run(server.url, a.jobs, a.rounds, a.samples, a.enqueue_rounds)
            continue
        import shutil
        import tempfile
        from pathlib import Path

        from tests.support.topology import ClusterGroup, SentinelGroup

        base = Path(tempfile.mkdtemp(prefix="tidings-bench-control-"))
        group = ClusterGroup if topology == "cluster" else SentinelGroup
        try:
            with group(base / topology) as g:
                run(g.url, a.jobs, a.rounds, a.samples, a.enqueue_rounds)
        finally:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    # Run as ``python -m benchmarks.control``, this file is ``__main__``, but the jobs it
    # dispatches name ``benchmarks.control:Sleeper``: the in-process worker imported that
    # as a second copy of the module, whose STARTED and CANCEL_SEEN the cancel loop never
    # saw, so it waited forever on its first sample (the hang of the first closing note).
    # Run the importable module's main instead: the worker's jobs and the loop share one
    # module, hence one STARTED and CANCEL_SEEN.
    from benchmarks import control

    control.main()
