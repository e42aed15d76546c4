"""Django's Tasks API on tidings beside tidings' own dispatch (issue 24).

    python -m benchmarks.django_tasks [--tasks 10000] [--rounds 3]

One throwaway redis-server (``benchmarks/_redis.py``), Django 5.2 with the
``django-tasks`` backport configured in this process, one in-process
:class:`~tidings.worker.worker.Worker` (``--concurrency 16``). Each round measures, in
turn, for N no-op bodies:

* enqueue: ``noop.enqueue(i)`` through ``TidingsBackend`` (one push)
  vs ``Noop(i).with_result().dispatch()`` (a push);
* drain: the worker emptying each queue (a task's outcome is its job result, written by
  the ack; the dispatch path keeps its result too: ``with_result()``).

Enqueue alternates between the two paths every 500 bodies (the tasks go to their own
queue, ``tasks``), so both meet the same load on a busy machine; each queue is then
drained alone, the rounds alternating which goes first. Medians, spreads (min-max) and
the ratio of each round are printed side by side (goal: >= 0.9 both ways), then the CPU
time per body (``time.process_time``: this process, every thread), steadier on a busy
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks._redis import bench_redis, delete_prefix
from tidings import Job
from tidings.worker.worker import Worker, WorkerOptions

TASK_QUEUE = "tasks"
CHUNK = 500  # enqueue alternates between the two paths every CHUNK bodies


def noop(n: int) -> int:
    """The body of both paths."""
    return n


@dataclass
class Noop(Job):
    n: int

    def handle(self) -> int:
        return noop(self.n)


def setup_django(url: str, prefix: str) -> Any:
    import django
    from django.conf import settings

    settings.configure(
        USE_TZ=True,
        INSTALLED_APPS=["django_tasks", "tidings.contrib.django"],
        TIDINGS={
            "redis_url": url,
            "key": "bench-key-0123456789abcdef0123456789",
            "prefix": prefix,
            "allowed_modules": ["benchmarks"],
            "metrics": False,
        },
        TASKS={
            "default": {
                "BACKEND": "tidings.contrib.django.tasks.TidingsBackend",
                "QUEUES": ["default", TASK_QUEUE],
            }
        },
    )
    django.setup()
    from django_tasks import task

    from tidings.contrib.django import get_app

    here = importlib.import_module("benchmarks.django_tasks")  # not __main__: importable
    # The tasks on their own queue, so enqueue can alternate with dispatch in chunks and
    # each path still drains alone.
    return get_app(), task(here.noop).using(queue_name=TASK_QUEUE), here.Noop


def drain(app: Any, queue: str = "default") -> tuple[float, float]:
    """Run a worker until ``queue`` is empty: (wall seconds, CPU seconds of this
    process, every thread)."""

    async def main() -> tuple[float, float]:
        options = WorkerOptions(concurrency=16, stop_when_empty=True, sleep_s=0.2, queues=[queue])
        w = Worker(app, options)
        t0, c0 = time.perf_counter(), time.process_time()
        await w.run()
        return time.perf_counter() - t0, time.process_time() - c0

    return asyncio.run(main())


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):9.0f}/s ({min(values):.0f}-{max(values):.0f})"


def _us(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} us ({min(values):.1f}-{max(values):.1f})"


def report(figures: dict[str, list[float]], n: int, rounds: int, names: tuple[str, str]) -> None:
    """Medians with spreads (min-max over rounds) and the ratio of medians, and of each
    round (the rounds alternate, so a round's ratio compares neighbours in time); then
    the CPU time per body (``time.process_time``, steadier than wall time on a busy
    machine) and its ratio (dispatch / task: above 1 is the task path cheaper)."""
    task, base = names
    print(f"{n} no-op bodies, {rounds} rounds alternating, one worker (concurrency 16)")
    for what in ("enq", "drain"):
        t, j = figures[f"t_{what}"], figures[f"j_{what}"]
        per_round = [a / b for a, b in zip(t, j, strict=True)]
        print(
            f"{what:>7}: {task} {_spread(t)}   {base} {_spread(j)}   "
            f"ratio of medians {statistics.median(t) / statistics.median(j):.2f}, per round "
            + " ".join(f"{r:.2f}" for r in per_round)
            + " (goal >= 0.9)"
        )
    for what in ("enq", "drain"):
        t, j = figures[f"t_{what}_cpu"], figures[f"j_{what}_cpu"]
        per_round = [b / a for a, b in zip(t, j, strict=True)]
        print(
            f"{what + ' cpu':>9}: {task} {_us(t)}   {base} {_us(j)}   "
            f"ratio {statistics.median(j) / statistics.median(t):.2f}, per round "
            + " ".join(f"{r:.2f}" for r in per_round)
        )


def run(url: str, n: int, rounds: int) -> None:
    prefix = f"bench24-{os.getpid()}"
    app, noop_task, noop_job = setup_django(url, prefix)
    names = ("t_enq", "j_enq", "t_drain", "j_drain")
    figures: dict[str, list[float]] = {k: [] for k in (*names, *(f"{k}_cpu" for k in names))}
    try:
        for i in range(200):  # warm up: imports, connections, the worker's first start
            noop_task.enqueue(i)
            noop_job(i).with_result().dispatch()
        drain(app, TASK_QUEUE)
        drain(app)
        for r in range(rounds):
            # Enqueue alternates between the paths every CHUNK bodies (a drift in the
            # machine's load hits both alike); each then drains alone, in turn.
            spent = {k: 0.0 for k in ("t", "j", "t_cpu", "j_cpu")}
            for c, start in enumerate(range(0, n, CHUNK)):
                for who in ("j", "t") if (r + c) % 2 == 0 else ("t", "j"):
                    t0, c0 = time.perf_counter(), time.process_time()
                    if who == "j":
                        for i in range(start, min(n, start + CHUNK)):
                            noop_job(i).with_result().dispatch()
                    else:
                        for i in range(start, min(n, start + CHUNK)):
                            noop_task.enqueue(i)
                    spent[f"{who}_cpu"] += time.process_time() - c0
                    spent[who] += time.perf_counter() - t0
            for who in ("t", "j"):
                figures[f"{who}_enq"].append(n / spent[who])
                figures[f"{who}_enq_cpu"].append(spent[f"{who}_cpu"] / n * 1e6)
            for who in ("j", "t") if r % 2 == 0 else ("t", "j"):
                wall, cpu = drain(app, TASK_QUEUE if who == "t" else "default")
                figures[f"{who}_drain"].append(n / wall)
                figures[f"{who}_drain_cpu"].append(cpu / n * 1e6)
    finally:
        delete_prefix(app.queue_for(None).client, prefix)
    report(figures, n, rounds, ("django.tasks", "tidings dispatch"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    with bench_redis() as server:
        run(server.url, a.tasks, a.rounds)


if __name__ == "__main__":
    main()
