"""Batches against real Redis and ``notify-worker`` subprocesses.

Guarantees: counters add up (total = processed + failed + pending), progress, cancel,
jobs adding jobs to their own batch, and each callback firing exactly once - with
failures, cancellation, two workers racing on the last jobs, and workers SIGKILLed
mid-batch (re-delivered jobs are not counted twice).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis

from tests.integration.workflows_app import Callback, Item, Sturdy, make_app
from tests.integration.workflows_support import ROOT, execs, start_worker, stop_all, wait_until
from tests.support import Proc
from tests.support.topology import client_for_url
from tidings import App
from tidings.jobs.compose import new_id
from tidings.redis.keys import BatchKeys
from tidings.redis.scripts import BATCH_CREATE, BATCH_RECORD
from tidings.workflows.batch import BatchInfo, batch, failed_job_ids


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _callbacks(r: redis.Redis, prefix: str) -> dict[str, int]:
    raw: Any = r.hgetall(f"{prefix}:test:callbacks")
    return {k.decode(): int(v) for k, v in raw.items()}


def _finished(app: App, batch_id: str) -> BatchInfo | None:
    info: BatchInfo | None = app.find_batch(batch_id)
    return info if info is not None and info.finished else None


def _full(jobs: int, failing: set[int] | None = None, **kw: Any) -> list[Item]:
    return [Item(f"i{i}", fails=i in (failing or set()), **kw) for i in range(jobs)]


@pytest.mark.topologies
def test_hundreds_of_jobs_with_allowed_failures(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    url = app.settings.redis_url
    failing = {7, 70, 150, 299}
    bid = (
        batch(_full(300, failing))
        .then(Callback("then"))
        .catch(Callback("catch"))
        .finally_(Callback("finally"))
        .allow_failures()
        .name("import")
        .dispatch()
    )
    workers = [start_worker(spawn_proc, url, prefix, name=f"w{i}") for i in range(2)]
    info = wait_until(lambda: _finished(app, bid), 25, "batch finished", *workers)
    assert (info.total, info.processed, info.failed, info.pending) == (300, 296, 4, 0)
    assert info.progress == 100.0 and info.name == "import" and not info.cancelled
    assert info.finished_at is not None and info.created_at <= info.finished_at
    wait_until(lambda: "finally" in _callbacks(redis_client, prefix), 10, "finally", *workers)
    time.sleep(0.5)
    assert _callbacks(redis_client, prefix) == {"catch": 1, "finally": 1}
    assert redis_client.hget(f"{prefix}:test:callback-batch", "finally") == bid.encode()
    assert set(execs(redis_client, prefix).values()) == {1}
    assert len(execs(redis_client, prefix)) == 300
    stop_all(*workers)


def test_first_failure_cancels_the_rest(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    jobs = [Item("boom", fails=True), *_full(150, sleep=0.01)]
    bid = (
        batch(jobs)
        .then(Callback("then"))
        .catch(Callback("catch"))
        .finally_(Callback("finally"))
        .dispatch()
    )
    w = start_worker(spawn_proc, app.settings.redis_url, prefix, "--concurrency", "2")
    info = wait_until(lambda: _finished(app, bid), 25, "batch finished", w)
    assert info.cancelled and info.failed == 1 and info.processed == 150 and info.pending == 0
    wait_until(lambda: "finally" in _callbacks(redis_client, prefix), 10, "finally", w)
    assert _callbacks(redis_client, prefix) == {"catch": 1, "finally": 1}
    ran = len(execs(redis_client, prefix))
    assert ran < 151, "jobs after the failure should have been skipped"
    stop_all(w)


def test_cancel_skips_jobs_not_started(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    bid = (
        batch(_full(200, sleep=0.02))
        .then(Callback("then"))
        .finally_(Callback("finally"))
        .dispatch()
    )
    w = start_worker(spawn_proc, app.settings.redis_url, prefix, "--concurrency", "2")
    wait_until(lambda: len(execs(redis_client, prefix)) >= 20, 15, "20 jobs ran", w)
    assert app.cancel_batch(bid) is True
    assert app.cancel_batch(bid) is False
    info = wait_until(lambda: _finished(app, bid), 20, "batch finished", w)
    assert info.cancelled and info.total == 200 and info.processed == 200 and info.failed == 0
    wait_until(lambda: "finally" in _callbacks(redis_client, prefix), 10, "finally", w)
    assert _callbacks(redis_client, prefix) == {"finally": 1}
    assert len(execs(redis_client, prefix)) < 100
    stop_all(w)


@pytest.mark.topologies
def test_worker_sigkilled_mid_batch_callbacks_fire_once(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """w1 SIGKILLs itself right after recording i40 (before its ack); w2 is SIGKILLed from
    outside mid-batch; w3 finishes. Re-delivered jobs are not counted twice."""
    url = app.settings.redis_url
    bid = (
        batch([Sturdy(f"i{i}", sleep=0.004) for i in range(300)])
        .then(Callback("then"))
        .catch(Callback("catch"))
        .finally_(Callback("finally"))
        .dispatch()
    )
    kill = {"WF_KILL_AFTER_SUCCESS": "Sturdy", "WF_KILL_TAG": "i40"}
    w1 = start_worker(spawn_proc, url, prefix, "--tries", "3", name="w1", env=kill)
    wait_until(lambda: w1.returncode is not None, 20, "w1 killed itself after i40", w1)
    assert w1.returncode == -signal.SIGKILL
    w2 = start_worker(spawn_proc, url, prefix, "--tries", "3", name="w2")
    w3 = start_worker(spawn_proc, url, prefix, "--tries", "3", name="w3")
    wait_until(lambda: len(execs(redis_client, prefix)) >= 150, 20, "150 ran", w2, w3)
    w2.kill()
    info = wait_until(lambda: _finished(app, bid), 25, "batch finished", w3)
    assert (info.total, info.processed, info.failed, info.pending) == (300, 300, 0, 0)
    wait_until(lambda: "finally" in _callbacks(redis_client, prefix), 10, "finally", w3)
    time.sleep(2.5)  # past retry_after: any straggling re-delivery has happened
    assert _callbacks(redis_client, prefix) == {"then": 1, "finally": 1}
    seen = execs(redis_client, prefix)
    assert len(seen) == 300
    extra = sum(n - 1 for n in seen.values())
    assert extra <= 2 * 16, f"extra executions {extra}"  # in flight in the two killed workers
    print(f"\nbatch kill: extra executions {extra}, callbacks {_callbacks(redis_client, prefix)}")
    assert seen["i40"] in (1, 2)
    stop_all(w3)


def test_worker_killed_after_recording_a_failure_leaves_the_member_failed(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """w1 counts a member's final failure in its batch (catch fired), then dies before
    moving the job to the failed store; w2 gets the job back after the lease. The job
    must end in the failed store, as the batch counted it, not acked as done (found by
    the fault-schedule checker's batches: processed/failed against the stores)."""
    url = app.settings.redis_url
    bid = (
        batch([Item("fine"), Item("bad", fails=True)])
        .allow_failures()
        .then(Callback("then"))
        .catch(Callback("catch"))
        .finally_(Callback("finally"))
        .dispatch()
    )
    kill = {"WF_KILL_AFTER_FAILURE": "Item"}
    # One slot: w1 cannot take the catch it pushed before it dies (that run would be
    # cut short and run again, at least once, as any job on a killed worker).
    w1 = start_worker(spawn_proc, url, prefix, "--concurrency", "1", name="w1", env=kill)
    wait_until(lambda: w1.returncode is not None, 20, "w1 killed itself after the failure", w1)
    assert w1.returncode == -signal.SIGKILL
    bad = failed_job_ids(app, bid)
    assert len(bad) == 1  # counted before the worker died
    w2 = start_worker(spawn_proc, url, prefix, name="w2")
    wait_until(lambda: app.job_status(bad[0]) in ("done", "failed"), 20, "bad settled", w2)
    info = wait_until(lambda: _finished(app, bid), 20, "batch finished", w2)
    assert app.job_status(bad[0]) == "failed"
    assert [f.id for f in app.queue_for(None).failed()] == bad
    assert (info.total, info.processed, info.failed, info.pending) == (2, 1, 1, 0)
    wait_until(lambda: "finally" in _callbacks(redis_client, prefix), 10, "finally", w2)
    time.sleep(0.5)
    assert _callbacks(redis_client, prefix) == {"catch": 1, "finally": 1}
    assert execs(redis_client, prefix)["bad"] == 1  # failed again, not run again
    stop_all(w2)


def test_jobs_add_jobs_to_their_own_batch(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    bid = batch([Item(f"p{i}", add=2) for i in range(5)]).then(Callback("then")).dispatch()
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    info = wait_until(lambda: _finished(app, bid), 15, "batch finished", w)
    assert (info.total, info.processed) == (15, 15)
    wait_until(lambda: "then" in _callbacks(redis_client, prefix), 10, "then", w)
    assert _callbacks(redis_client, prefix) == {"then": 1}
    assert len(execs(redis_client, prefix)) == 15
    stop_all(w)


def test_empty_batch_finishes_at_once(app: App, redis_client: redis.Redis, prefix: str) -> None:
    bid = batch([]).then(Callback("then")).finally_(Callback("finally")).dispatch()
    info = app.find_batch(bid)
    assert info is not None and info.finished and info.total == 0 and info.progress == 100.0
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 2
    assert app.find_batch(new_id()) is None


def test_record_counts_once_and_fires_once_under_races(app: App) -> None:
    """16 threads record 40 jobs (each twice, as re-deliveries would): the counters add up
    and exactly one call gets then/finally - or the same call again for a repeat."""
    rq = app.queue_for(None)
    bid = new_id()
    k = BatchKeys.build(rq.prefix, bid)
    ids = [new_id() for _ in range(40)]
    fields = ["cb:then:q", "default", "cb:then:b", "T", "cb:finally:q", "default", "cb:finally:b"]
    BATCH_CREATE.call(rq.client, [k.info, k.members], [bid, 4, *fields, "F", *ids])
    fired: list[tuple[str, int, list[str]]] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def work(n: int) -> None:
        client = client_for_url(app.settings.redis_url)
        start.wait()
        for job_id in ids[n::16] + ids[n::16]:
            raw = BATCH_RECORD.call(client, [k.info, k.finished, k.failed], [job_id, "ok", 60000])
            kinds = [x.decode() for x in raw[1::3]]
            if kinds:
                with lock:
                    fired.append((job_id, int(raw[0]), kinds))
        client.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = app.find_batch(bid)
    assert info is not None and (info.processed, info.pending, info.total) == (40, 0, 40)
    counted = [f for f in fired if f[1] == 1]
    assert len(counted) == 1 and counted[0][2] == ["then", "finally"]
    # Only the finisher's own repeat (a re-delivery) gets them again.
    assert all(f[0] == counted[0][0] for f in fired)


def test_batches_cli(app: App, redis_client: redis.Redis, prefix: str) -> None:
    bid = batch(_full(3)).name("cli").dispatch()
    env = {
        **os.environ,
        "WF_REDIS_URL": app.settings.redis_url,
        "WF_PREFIX": prefix,
    }
    base = [sys.executable, "-m", "tidings.cli", "-A", "tests.integration.workflows_app:app"]

    def cli(*args: str) -> str:
        out = subprocess.run(
            [*base, "batches", *args], env=env, cwd=ROOT, capture_output=True, timeout=30
        )
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout.decode()

    listed = orjson.loads(cli("list", "--json"))
    assert [(b["id"], b["name"], b["total"], b["pending"]) for b in listed] == [(bid, "cli", 3, 3)]
    assert "pending:   3" in cli("show", bid)
    assert "Deleted 0 batches" in cli("prune", "--hours", "0")
    assert "Cancelled" in cli("cancel", bid)
    assert "Deleted 1 batch " in cli("prune", "--hours", "0", "--unfinished")
    assert app.find_batch(bid) is None
