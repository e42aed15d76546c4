"""Concurrent producers in one process: 8 threads, and 64 asyncio tasks, dispatching.

Issue 28, goal 7: concurrent producers coalesce into pipelines (group commit,
:mod:`tidings.moves.coalesce`), enqueue >= 3x huey's with the same 8 threads. Each round
runs, interleaved on one throwaway Redis: tidings with coalescing (the default), tidings
with it switched off (``RedisQueue.coalesce = False``: the code before), huey's
``task()`` calls from the same 8 threads (when huey is installed), and the same two
tidings settings from 64 asyncio tasks. Medians and spreads (min-max over rounds), and
beside each rate the process's CPU (user + system, ``getrusage``) and context switches
(voluntary + involuntary) per job, medians over rounds: on a busy machine these move
less than the rates, and they say where the time goes (the system part is mostly
thread wake-ups: futexes and the GIL)::

    .venv/bin/python -m benchmarks.concurrent_enqueue --n 8000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from benchmarks._redis import bench_redis

THREADS = 8
TASKS = 64

Figure = tuple[float, float, float]
"""Jobs per second, CPU µs per job, context switches per job."""


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def _figure(jobs: int, seconds: float, before: tuple[float, int]) -> Figure:
    cpu, switches = _usage()
    return jobs / seconds, (cpu - before[0]) / jobs * 1e6, (switches - before[1]) / jobs


def threaded(n: int, send: Callable[[int], Any]) -> Figure:
    """Jobs per second (and CPU, switches) with ``send(i)`` called from THREADS threads,
    n jobs in all."""
    per = n // THREADS
    go = threading.Barrier(THREADS + 1)

    def producer(base: int) -> None:
        go.wait()
        for i in range(base, base + per):
            send(i)

    threads = [threading.Thread(target=producer, args=(t * per,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    go.wait()
    usage = _usage()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return _figure(per * THREADS, time.perf_counter() - started, usage)


def tasks(n: int, send: Callable[[int], Any]) -> Figure:
    """Jobs per second (and CPU, switches) with ``await send(i)`` from TASKS asyncio
    tasks, n jobs in all."""
    per = n // TASKS

    async def producer(base: int) -> None:
        for i in range(base, base + per):
            await send(i)

    async def main() -> Figure:
        usage = _usage()
        started = time.perf_counter()
        await asyncio.gather(*(producer(t * per) for t in range(TASKS)))
        return _figure(per * TASKS, time.perf_counter() - started, usage)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with bench_redis() as server:
        os.environ["TIDINGS_REDIS_URL"] = server.url
        os.environ.setdefault("TIDINGS_KEY", "concurrent-enqueue-benchmark-key-0123456789abcd")
        os.environ["TIDINGS_PREFIX"] = f"tbench{os.getpid()}"
        from benchmarks import bench_app as b

        rq = b.app.queue_for()
        raw = redis.Redis.from_url(server.url)

        def clean() -> None:
            raw.flushdb()

        try:
            huey_noop: Any = b.huey_noop
        except Exception:
            huey_noop = None

        def tidings_threads(coalesce: bool) -> Callable[[], Figure]:
            def run() -> float:
                clean()
                rq.coalesce = coalesce
                return threaded(args.n, lambda i: b.NoOpJob(i).dispatch())

            return run

        def tidings_tasks(coalesce: bool) -> Callable[[], Figure]:
            def run() -> float:
                clean()
                rq.coalesce = coalesce
                return tasks(args.n, lambda i: b.NoOpJob(i).dispatch_async())

            return run

        def huey_threads() -> Figure:
            clean()
            return threaded(args.n, lambda i: huey_noop(i))

        runs: dict[str, Callable[[], Figure]] = {
            "tidings, 8 threads, coalesced": tidings_threads(True),
            "tidings, 8 threads, direct (coalesce off)": tidings_threads(False),
        }
        if huey_noop is not None:
            runs["huey, 8 threads"] = huey_threads
        runs["tidings, 64 tasks, coalesced"] = tidings_tasks(True)
        runs["tidings, 64 tasks, direct (coalesce off)"] = tidings_tasks(False)
        for run in runs.values():  # warm-up: connections, script cache
            run()
        figures: dict[str, list[Figure]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                figures[name].append(run())
        rates = {name: [f[0] for f in values] for name, values in figures.items()}
        clean()
        print(
            f"N = {args.n:,} a round, {args.rounds} interleaved rounds, Redis {server.version}, "
            f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f})"
        )
        for name, values in rates.items():
            cpu = statistics.median(f[1] for f in figures[name])
            switches = statistics.median(f[2] for f in figures[name])
            print(
                f"  {name:<36} {statistics.median(values):8,.0f}/s "
                f"[{min(values):,.0f}-{max(values):,.0f}]  "
                f"CPU {cpu:5.1f} µs/job, {switches:4.2f} switches/job"
            )

        def ratio(a: str, b_: str) -> str:
            r = [x / y for x, y in zip(rates[a], rates[b_], strict=True)]
            return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"

        print(f"  coalesced / direct, 8 threads: {ratio(runs_names(runs)[0], runs_names(runs)[1])}")
        if huey_noop is not None:
            print(
                f"  coalesced / huey, 8 threads (goal >= 3): "
                f"{ratio('tidings, 8 threads, coalesced', 'huey, 8 threads')}"
            )
            print(
                f"  direct / huey, 8 threads: "
                f"{ratio('tidings, 8 threads, direct (coalesce off)', 'huey, 8 threads')}"
            )
        print(
            f"  coalesced / direct, 64 tasks: "
            f"{ratio('tidings, 64 tasks, coalesced', 'tidings, 64 tasks, direct (coalesce off)')}"
        )
        raw.close()


def runs_names(runs: dict[str, Any]) -> list[str]:
    return list(runs)


if __name__ == "__main__":
    main()
