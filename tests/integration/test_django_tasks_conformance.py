"""Django's Tasks API, as Django documents it, on ``ImmediateBackend`` (the reference)
and on ``TidingsBackend`` with a real ``notify-worker``: the same assertions on both.

Django is configured once per process (``tests/integration/django_tasks_site``, with
the backport ``django-tasks`` on Django 5.2); cases that need a result store
(``get_result``), or that only a real queue can pass (defer, priority order, retries,
async enqueue on the loop) carry ``REAL_QUEUE`` and run on ``TidingsBackend`` only.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

try:
    import django.tasks  # noqa: F401  (Django >= 6)
except ImportError:
    pytest.importorskip("django_tasks", reason="neither django.tasks nor the backport")

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.integration.django_tasks_site.settings"
BACKENDS = ["immediate", "tidings"]
REAL_QUEUE = pytest.mark.parametrize("alias", ["tidings"])  # only a real queue passes
BOTH = pytest.mark.parametrize("alias", BACKENDS)
DEADLINE_S = 25.0


def _worker_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tidings.cli", *args]


@pytest.fixture(scope="module")
def site(
    plain_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Django set up on the site's settings; the env the worker subprocesses share."""
    from django.conf import settings

    if settings.configured and os.environ.get("DJANGO_SETTINGS_MODULE") != SETTINGS:
        pytest.skip("Django is configured for another project in this process")
    env = {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "TIDINGS_REDIS_URL": os.environ.get("TIDINGS_TEST_REDIS_URL") or plain_redis_url,
        "TIDINGS_KEY": "c" * 32,
        "TIDINGS_PREFIX": f"t{uuid4().hex[:10]}",
        "CONFORMANCE_DIR": str(tmp_path_factory.mktemp("conformance")),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import django

    django.setup()
    try:
        yield env
    finally:
        from tests.support.topology import client_for_url

        client = client_for_url(env["TIDINGS_REDIS_URL"])
        try:
            keys = list(client.scan_iter(match=f"*{env['TIDINGS_PREFIX']}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spawn_worker(site: dict[str, str], queues: str, log: Path, *extra: str) -> Any:
    from tests.support import spawn

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_")}
    env.update(site)
    env["PYTHONPATH"] = str(ROOT)
    return spawn(
        [
            str(Path(sys.executable).parent / "notify-worker"),
            "--queue",
            queues,
            "--sleep",
            "0.2",
            *extra,
        ],
        log_path=log,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def worker(site: dict[str, str]) -> Iterator[Any]:
    """One ``notify-worker`` on the default and emails queues for the module."""
    proc = _spawn_worker(site, "default,emails", Path(site["CONFORMANCE_DIR"]) / "worker.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def backend_of(site: dict[str, str], worker: Any) -> Callable[[Any, str], Any]:
    def bind(task: Any, alias: str) -> Any:
        return task.using(backend=alias)

    return bind


def finished(result: Any, worker: Any = None, deadline_s: float = DEADLINE_S) -> Any:
    """``result`` once finished: at once on ImmediateBackend, else refreshed until it is
    (or the deadline passes, with the worker's log in the message)."""
    if not result.task.get_backend().supports_get_result:
        assert result.is_finished
        return result
    end = time.monotonic() + deadline_s
    while not result.is_finished:
        assert time.monotonic() < end, (
            f"not finished: {result.status}\n{worker.tail() if worker else ''}"
        )
        time.sleep(0.05)
        result.refresh()
    return result


def signals_of(site: dict[str, str], result_id: str) -> list[str]:
    path = Path(site["CONFORMANCE_DIR"]) / "signals"
    if not path.exists():
        return []
    return [
        f"{name} {status}"
        for name, rid, status in (line.split() for line in path.read_text().splitlines())
        if rid == result_id
    ]


# -- the cases (Django's "Tasks" topic guide and reference) ------------------------------


@BOTH
def test_backend_features_are_as_documented(site: dict[str, str], alias: str) -> None:
    from tests.integration.django_tasks_site.api import task_backends

    backend = task_backends[alias]
    assert backend.supports_async_task is True
    assert backend.supports_priority is True
    if alias == "tidings":
        assert backend.supports_defer is True
        assert backend.supports_get_result is True


@BOTH
def test_enqueue_returns_a_result_naming_task_args_and_backend(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = backend_of(tasks.add, alias).enqueue(2, b=3)
    assert isinstance(result.id, str) and result.id
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.backend == alias
    assert result.task.func is tasks.add.func
    assert result.enqueued_at is not None


@BOTH
def test_a_successful_task_has_its_value_and_timestamps(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    result = finished(backend_of(tasks.add, alias).enqueue(2, 3), worker)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1 and result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


@BOTH
def test_values_are_normalised_to_json(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = finished(backend_of(tasks.echo, alias).enqueue((1, 2), k=(3,)), worker)
    assert result.args == [[1, 2]] and result.kwargs == {"k": [3]}
    assert result.return_value == {"args": [[1, 2]], "kwargs": {"k": [3]}}
    assert finished(backend_of(tasks.returns_tuple, alias).enqueue(), worker).return_value == [1, 2]


@BOTH
def test_a_failing_task_records_the_exception_class_and_traceback(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    result = finished(backend_of(tasks.fails, alias).enqueue("broken on purpose"), worker)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors and len(result.errors) == len(result.worker_ids)
    error = result.errors[-1]
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "broken on purpose" in error.traceback and "Traceback" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018


@BOTH
def test_takes_context_passes_the_result_and_attempt(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = finished(backend_of(tasks.context_info, alias).enqueue(), worker)
    assert result.return_value == {"id": result.id, "attempt": 1, "status": "RUNNING"}


@BOTH
def test_an_async_task_is_awaited(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    assert finished(backend_of(tasks.async_add, alias).enqueue(4, 5), worker).return_value == 9


@BOTH
def test_signals_are_sent_for_enqueue_start_and_finish(
    site: dict[str, str], backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = finished(backend_of(tasks.add, alias).enqueue(1, 1), worker)
    end = time.monotonic() + DEADLINE_S
    while len(signals_of(site, result.id)) < 3 and time.monotonic() < end:
        time.sleep(0.05)  # the worker's finish signal follows its record write
    seen = signals_of(site, result.id)
    # The producer sends task_enqueued after its push; a real worker may start, and even
    # finish, the task before that, so only the worker's two are ordered.
    assert sorted(seen) == ["enqueued READY", "finished SUCCESSFUL", "started RUNNING"]
    assert seen.index("started RUNNING") < seen.index("finished SUCCESSFUL")


@BOTH
def test_invalid_tasks_are_refused_as_the_base_backend_does(
    site: dict[str, str], alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import InvalidTaskError

    with pytest.raises(InvalidTaskError):
        tasks.add.using(backend=alias, priority=101)
    with pytest.raises(InvalidTaskError):
        tasks.add.using(backend=alias, queue_name="nowhere")
    if alias == "tidings":
        from datetime import datetime

        with pytest.raises(InvalidTaskError):
            tasks.add.using(backend=alias, run_after=datetime(2030, 1, 1))


@BOTH
def test_aenqueue_from_async_code(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = asyncio.run(backend_of(tasks.add, alias).aenqueue(20, 22))
    assert finished(result, worker).return_value == 42


# -- only a real queue (with a result store) passes these -------------------------------


@REAL_QUEUE
def test_get_result_by_id_in_another_process_view(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultDoesNotExist

    task = backend_of(tasks.add, alias)
    result = finished(task.enqueue(6, 7), worker)
    again = task.get_result(result.id)
    assert again.id == result.id and again.return_value == 13
    assert again.args == [6, 7] and again.worker_ids == result.worker_ids
    with pytest.raises(TaskResultDoesNotExist):
        task.get_result("no-such-task")


@REAL_QUEUE
def test_aenqueue_and_aget_result_on_the_loop(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    async def main() -> Any:
        task = backend_of(tasks.async_add, alias)
        result = await task.aenqueue(1, 2)
        end = time.monotonic() + DEADLINE_S
        while not result.is_finished:
            assert time.monotonic() < end, worker.tail()
            await asyncio.sleep(0.05)
            await result.arefresh()
        return await task.aget_result(result.id)

    fetched = asyncio.run(main())
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 3


@REAL_QUEUE
def test_a_retry_sees_the_next_attempt(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    result = finished(backend_of(tasks.attempt_of, alias).enqueue(fail_first=True), worker)
    assert result.return_value == 2
    assert len(result.worker_ids) == 2 and len(result.errors) == 1
    assert result.errors[0].exception_class is RuntimeError


@REAL_QUEUE
def test_run_after_defers_the_task(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from django.utils import timezone

    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    when = timezone.now() + timedelta(seconds=1.5)
    result = backend_of(tasks.add, alias).using(run_after=when).enqueue(1, 2)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    finished(result, worker)
    assert result.return_value == 3 and result.started_at >= when


@REAL_QUEUE
def test_higher_priority_runs_first_within_a_queue(
    site: dict[str, str], backend_of: Callable[[Any, str], Any], alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks

    task = backend_of(tasks.record, alias).using(queue_name="lanes")
    lane = f"lane-{uuid4().hex[:6]}"
    order = [("low", -50), ("zero-a", 0), ("top", 100), ("zero-b", 0), ("high", 10)]
    results = [task.using(priority=p).enqueue(lane, label) for label, p in order]
    log = Path(site["CONFORMANCE_DIR"]) / f"{lane}.log"
    proc = _spawn_worker(site, "lanes", log, "--concurrency", "1")
    try:
        for result in results:
            finished(result, proc)
    finally:
        proc.stop()
    ran = (Path(site["CONFORMANCE_DIR"]) / lane).read_text().split()
    assert ran == ["top", "high", "zero-a", "zero-b", "low"]


@REAL_QUEUE
def test_a_cancelled_waiting_task_is_failed_and_never_runs(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from django.utils import timezone

    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus
    from tidings.contrib.django import get_app

    result = (
        backend_of(tasks.add, alias)
        .using(run_after=timezone.now() + timedelta(seconds=30))
        .enqueue(1, 1)
    )
    assert get_app().cancel(result.id) == "cancelled"
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.worker_ids == []


def test_unknown_options_are_refused(site: dict[str, str]) -> None:
    from tidings.contrib.django.tasks import TidingsBackend
    from tidings.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="retries"):
        TidingsBackend("x", {"OPTIONS": {"retries": 3}})


def test_after_commit_holds_the_task_until_the_transaction_commits(
    backend_of: Callable[[Any, str], Any], worker: Any
) -> None:
    from django.db import transaction

    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultDoesNotExist

    task = backend_of(tasks.add, "on_commit")
    with transaction.atomic():
        kept = task.enqueue(1, 2)
        with pytest.raises(TaskResultDoesNotExist):
            task.get_result(kept.id)  # nothing reaches Redis before the commit
    assert finished(kept, worker).return_value == 3
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = task.enqueue(3, 4)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        task.get_result(dropped.id)


@REAL_QUEUE
def test_progress_reported_by_a_task_shows_in_job_status(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tidings.contrib.django import get_app

    result = finished(backend_of(tasks.reports_progress, alias).enqueue(3), worker)
    status = get_app().job_status(result.id, "default")
    assert status == "done"
    assert status.progress is not None
    assert (status.progress.done, status.progress.total, status.progress.note) == (3, 3, "step 3")


@REAL_QUEUE
def test_failed_retry_runs_a_failed_task_again(
    backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus
    from tidings.contrib.django import get_app

    task = backend_of(tasks.attempt_of, "on_commit")  # OPTIONS without tries: one run
    result = finished(task.enqueue(fail_first=True), worker)
    assert result.status == TaskResultStatus.FAILED and len(result.errors) == 1
    assert get_app().queue_for(None).retry([result.id]) == 1
    end = time.monotonic() + DEADLINE_S
    while result.status != TaskResultStatus.SUCCESSFUL:
        assert time.monotonic() < end, worker.tail()
        time.sleep(0.05)
        result.refresh()
    assert result.return_value == 2 and len(result.worker_ids) == 2


@REAL_QUEUE
def test_a_task_past_its_timeout_option_fails_with_the_timeout_recorded(
    site: dict[str, str], backend_of: Callable[[Any, str], Any], worker: Any, alias: str
) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    result = finished(backend_of(tasks.sleeps, "short").enqueue(5), worker)
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1 and len(result.worker_ids) == 1
    assert "Timeout" in result.errors[0].exception_class_path
    end = time.monotonic() + DEADLINE_S
    while "finished FAILED" not in signals_of(site, result.id):
        assert time.monotonic() < end, signals_of(site, result.id)
        time.sleep(0.05)


# -- tidings extensions: per-task options (not Django's API; TidingsBackend only) --------


def test_task_keyword_options_reach_the_worker(backend_of: Callable[[Any, str], Any]) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus
    from tidings.contrib.django.tasks import TidingsTask

    assert isinstance(tasks.third_time_lucky, TidingsTask)
    assert tasks.third_time_lucky.tidings_options() == {"tries": 3, "backoff": 0}
    # "on_commit" has no tries in OPTIONS (one run); the task's own tries=3 wins.
    result = finished(tasks.third_time_lucky.enqueue(uuid4().hex[:8]))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert len(result.errors) == 2 and len(result.worker_ids) == 3


def test_stacked_tidings_options_set_the_timeout(backend_of: Callable[[Any, str], Any]) -> None:
    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultStatus

    # "on_commit" has no timeout: the decorator's 0.5 s fails the 5 s sleep.
    task = backend_of(tasks.sleeps_with_own_timeout, "on_commit")
    t0 = time.monotonic()
    result = finished(task.enqueue(5))
    assert result.status == TaskResultStatus.FAILED
    assert "Timeout" in result.errors[0].exception_class_path
    assert time.monotonic() - t0 < 4.5


def test_per_task_after_commit_and_result_ttl(
    site: dict[str, str], backend_of: Callable[[Any, str], Any]
) -> None:
    from django.db import transaction

    from tests.integration.django_tasks_site import tasks
    from tests.integration.django_tasks_site.api import TaskResultDoesNotExist
    from tidings.contrib.django import get_app

    task = backend_of(tasks.add_after_commit, "tidings")  # OPTIONS: no after_commit
    with transaction.atomic():
        held = task.enqueue(2, 3)
        with pytest.raises(TaskResultDoesNotExist):
            task.get_result(held.id)
    assert finished(held).return_value == 5
    rq = get_app().queue_for(None)
    ttl_ms = rq.client.pttl(rq.keys("default").result(held.id))
    assert 0 < ttl_ms <= 120_000  # the task's result_ttl_s, not the alias's 600


def test_bad_per_task_options_are_refused_naming_the_option(site: dict[str, str]) -> None:
    from tests.integration.django_tasks_site.api import task
    from tidings.contrib.django.tasks import tidings_options
    from tidings.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="retries"):
        tidings_options(retries=3)
    with pytest.raises(ConfigurationError, match="tries=0"):
        task(backend="tidings", tries=0)(_module_level_add)
    with pytest.raises(ConfigurationError, match="above @task"):
        tidings_options(tries=2)(_module_level_add)


def _module_level_add(a: int, b: int) -> int:
    return a + b


class _Text(str):
    """A ``str`` subclass: Django's normalising keeps it as it is."""


def test_the_backends_shortcuts_give_what_djangos_normalising_and_constructor_give(
    site: dict[str, str],
) -> None:
    """``enqueue`` normalises flat plain arguments itself and builds its ``TaskResult``
    (and the worker its RUNNING one) without the constructor's second pass: every field
    equals what Django's own ``TaskResult(...)`` gives, and anything else is left to
    Django (which refuses what JSON cannot hold)."""
    from datetime import UTC, datetime

    from tests.integration.django_tasks_site import tasks
    from tidings.contrib.django import tasks as backend
    from tidings.contrib.django._tasks_api import TaskResult, TaskResultStatus, normalize_json

    flat = [((1, "a", None, True, 2.5), {"x": 1, "y": "z"}), ([], {})]
    for args, kwargs in flat:
        plain = backend._plain_json(args, kwargs)
        assert plain == (normalize_json(args), normalize_json(kwargs))
        assert plain is not None and type(plain[0]) is list and type(plain[1]) is dict
        assert [type(v) for v in plain[0]] == [type(v) for v in normalize_json(args)]
    others: list[tuple[Any, Any]] = [
        ((b"x",), {}), (([1],), {}), ((), {1: 2}), ((), {"k": (1,)}), ((_Text("s"),), {}),
        ((object(),), {}), ((1,), {"k": object()}),
    ]  # fmt: skip
    for args, kwargs in others:
        assert backend._plain_json(args, kwargs) is None  # left to Django
    at = datetime(2026, 11, 26, tzinfo=UTC)
    fields = {
        "task": tasks.add, "id": "abc", "status": TaskResultStatus.RUNNING, "enqueued_at": at,
        "started_at": at, "finished_at": None, "last_attempted_at": at, "args": [1, [2]],
        "kwargs": {"b": 3}, "backend": "tidings", "errors": [], "worker_ids": ["h:1"],
    }  # fmt: skip
    fast = backend._json_result(
        tasks.add, TaskResultStatus.RUNNING, at, at, at, [1, [2]], {"b": 3}, "tidings",
        ["h:1"], [], "abc",
    )  # fmt: skip
    assert backend._RESULT_FAST  # the TaskResult this Django has is the one it was written for
    made = TaskResult(**fields)  # type: ignore[arg-type]
    for name in [*fields, "_return_value"]:
        assert getattr(fast, name) == getattr(made, name), name
    assert fast == made and not fast.is_finished
    with pytest.raises(ValueError, match="not finished"):
        fast.return_value  # noqa: B018
