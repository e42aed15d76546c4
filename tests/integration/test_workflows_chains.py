"""Chains against real Redis and ``notify-worker`` subprocesses.

Guarantees: links run in order, each after the previous one succeeded; a final failure
runs ``catch`` once and nothing after it; a worker SIGKILLed mid-link or between
advancing the chain and its ack never makes a later link run twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from tests.integration.workflows_app import (
    Callback,
    Fail,
    KillOnce,
    Noted,
    NoteListener,
    Record,
    make_app,
)
from tests.integration.workflows_support import execs, order, start_worker, stop_all, wait_until
from tests.support import Proc
from tidings import App, CallQueuedListener, chain
from tidings.jobs.compose import new_id
from tidings.moves.push_once import push_once


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _idle(app: App) -> bool:
    s = app.queue_for(None).sizes(["default"])["default"]
    return s["ready"] == 0 and s["delayed"] == 0 and s["reserved"] == 0


@pytest.mark.topologies
def test_links_run_in_order_once_each(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    w = start_worker(spawn_proc, app.settings.redis_url, prefix, "--concurrency", "4")
    chain(Record("a"), Record("b"), Record("c"), Record("d")).dispatch()
    wait_until(lambda: len(order(redis_client, prefix)) == 4, 15, "4 links", w)
    assert order(redis_client, prefix) == ["a", "b", "c", "d"]
    stop_all(w)


def test_a_queued_listener_can_be_a_link(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    link = CallQueuedListener.for_target(NoteListener, (Noted("listener"),))
    chain(Record("a"), link, Record("c")).dispatch()
    wait_until(lambda: len(order(redis_client, prefix)) == 3, 15, "3 links", w)
    assert order(redis_client, prefix) == ["a", "listener", "c"]
    stop_all(w)


@pytest.mark.topologies
def test_final_failure_runs_catch_once_and_stops_the_chain(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    chain(Record("a"), Fail("b"), Record("c")).catch(Callback("catch")).dispatch()
    wait_until(lambda: redis_client.hget(f"{prefix}:test:callbacks", "catch"), 15, "catch ran", w)
    wait_until(lambda: _idle(app), 10, "queue drained", w)
    assert order(redis_client, prefix) == ["a", "b"]
    assert redis_client.hget(f"{prefix}:test:callbacks", "catch") == b"1"
    failed = app.queue_for(None).failed(["default"])
    assert [f.name for f in failed] == ["Fail"]
    stop_all(w)


@pytest.mark.topologies
def test_worker_killed_mid_link_reruns_only_that_link(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    url = app.settings.redis_url
    w1 = start_worker(spawn_proc, url, prefix, name="w1")
    chain(Record("a"), KillOnce("b"), Record("c")).catch(Callback("catch")).dispatch()
    wait_until(lambda: w1.returncode is not None, 15, "w1 killed by link b", w1)
    w2 = start_worker(spawn_proc, url, prefix, "--tries", "3", name="w2")
    wait_until(lambda: execs(redis_client, prefix).get("c"), 20, "link c ran", w2)
    wait_until(lambda: _idle(app), 10, "queue drained", w2)
    seen = execs(redis_client, prefix)
    # a's ack may still have been in the worker's ack batch when b killed it: then a is
    # re-delivered too (at least once), but it cannot push b a second time.
    assert seen["b"] == 2 and seen["c"] == 1 and seen["a"] in (1, 2)
    assert redis_client.hget(f"{prefix}:test:callbacks", "catch") is None
    stop_all(w2)


def test_redelivered_link_does_not_push_the_next_one_again(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """w1 dies after link a pushed link b but before a's ack: a is re-delivered and runs
    again (at least once), but b - already run and acknowledged by then - and c run once."""
    url = app.settings.redis_url
    kill = {"WF_KILL_AFTER_SUCCESS": "Record", "WF_KILL_TAG": "a"}
    w1 = start_worker(spawn_proc, url, prefix, name="w1", env=kill)
    chain(Record("a"), Record("b"), Record("c")).dispatch()
    wait_until(lambda: w1.returncode is not None, 15, "w1 killed after advancing", w1)
    w2 = start_worker(spawn_proc, url, prefix, "--tries", "3", name="w2")
    # a comes back after its lease (retry_after = 2 s) expires. b runs at once, or, when
    # w1's idle wait had already reserved it as w1 died (a wake-up carries a pop, see
    # tidings.worker.wakeup), after the same lease: either way once, and before c.
    wait_until(lambda: execs(redis_client, prefix).get("a") == 2, 20, "a re-delivered", w2)
    wait_until(lambda: _idle(app), 10, "queue drained", w2)
    assert execs(redis_client, prefix) == {"a": 2, "b": 1, "c": 1}
    ran = order(redis_client, prefix)
    assert ran[0] == "a" and ran.index("b") < ran.index("c")
    stop_all(w2)


def test_push_once_refuses_an_id_queued_or_already_done(app: App) -> None:
    rq = app.queue_for(None)
    job_id = new_id()
    assert push_once(rq, "default", job_id, b"{}") is True
    assert push_once(rq, "default", job_id, b"{}") is False
    # Gone from the queue (as after an ack): the marker still refuses it.
    k = rq.keys("default")
    rq.client.delete(k.ready, k.jobs)
    assert push_once(rq, "default", job_id, b"{}") is False
    assert rq.client.llen(k.ready) == 0
