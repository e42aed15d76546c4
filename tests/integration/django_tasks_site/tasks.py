"""Module-level tasks of the conformance suite (bound to the ``default`` alias; each test
runs them ``.using(backend=...)``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tests.integration.django_tasks_site.api import (
    TaskContext,
    task,
    task_enqueued,
    task_finished,
    task_started,
)
from tidings.contrib.django.tasks import tidings_options


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task()
def returns_tuple() -> tuple[int, int]:
    return (1, 2)


@task()
def fails(message: str) -> None:
    raise ValueError(message)


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def attempt_of(context: TaskContext, fail_first: bool) -> int:
    if fail_first and context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return context.attempt


@task(takes_context=True)
def context_info(context: TaskContext) -> dict[str, Any]:
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "status": str(result.status)}


@task()
def reports_progress(total: int) -> int:
    from tidings.contrib.django.tasks import progress

    for done in range(1, total + 1):
        progress(done, total, note=f"step {done}")
    return total


@task()
async def sleeps(seconds: float) -> None:
    await asyncio.sleep(seconds)


@task()
def record(lane: str, label: str) -> str:
    """Append ``label`` to the file ``lane`` names (the order the worker ran them in)."""
    with open(os.path.join(os.environ["CONFORMANCE_DIR"], lane), "a") as out:
        out.write(label + "\n")
    return label


# -- per-task tidings options (tidings extensions) ----------------------------------------


@task(backend="on_commit", tries=3, backoff=0)  # the backport passes these to TidingsTask
def third_time_lucky(context_free: str) -> int:
    """Fails on its first two runs (counted in a file), succeeds on the third."""
    path = os.path.join(os.environ["CONFORMANCE_DIR"], f"lucky-{context_free}")
    with open(path, "a") as out:
        out.write("x")
    with open(path) as counted:
        runs = len(counted.read())
    if runs < 3:
        raise RuntimeError(f"run {runs} fails")
    return runs


@tidings_options(timeout=0.5)  # Django 6's @task takes no extra keywords: stack this
@task()
async def sleeps_with_own_timeout(seconds: float) -> None:
    await asyncio.sleep(seconds)


@tidings_options(after_commit=True, result_ttl_s=120)
@task()
def add_after_commit(a: int, b: int) -> int:
    return a + b


def _note_signal(name: str) -> Any:
    def receiver(sender: type[Any], task_result: Any, **kwargs: Any) -> None:
        folder = os.environ.get("CONFORMANCE_DIR")
        if folder:
            with open(os.path.join(folder, "signals"), "a") as out:
                out.write(f"{name} {task_result.id} {task_result.status.value}\n")

    return receiver


_receivers = [_note_signal(n) for n in ("enqueued", "started", "finished")]
task_enqueued.connect(_receivers[0], weak=False)
task_started.connect(_receivers[1], weak=False)
task_finished.connect(_receivers[2], weak=False)
