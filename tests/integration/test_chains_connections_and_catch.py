"""Chains: later links, ``catch`` and unique unlocks stay on the connection the
chain or job was dispatched on; ``catch`` takes a module-level function. Real Redis (two
databases), real ``notify-worker`` subprocesses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.integration.breakable_jobs import Mendable, chain_failed, chain_failed_queued
from tests.integration.two_connections_app import make_app
from tests.integration.workflows_app import Fail, Record, UniqueUntilStart
from tests.integration.workflows_support import ROOT, execs, order, stop_all, wait_until
from tests.support import Proc, python_cmd
from tidings import App
from tidings.errors import ConfigurationError, PayloadRejected
from tidings.workflows.chain import CallFunction, chain

APP = "tests.integration.two_connections_app:app"


@pytest.fixture
def other_url(redis_url: str, prefix: str) -> Iterator[str]:
    """Database 1 of the test Redis; this test's keys there are deleted afterwards."""
    url = redis_url.rsplit("/", 1)[0] + "/1"
    yield url
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def app(redis_url: str, prefix: str, other_url: str) -> Iterator[App]:
    a = make_app(redis_url, prefix, other_url)
    try:
        yield a
    finally:
        a.close()


def _worker(
    spawn_proc: Callable[..., Proc], redis_url: str, prefix: str, other_url: str, *args: str
) -> Proc:
    env = {
        "WF_REDIS_URL": redis_url,
        "WF_PREFIX": prefix,
        "WF_OTHER_URL": other_url,
        "WF_RETRY_AFTER": "2",
        "PYTHONUNBUFFERED": "1",
    }
    cmd = python_cmd("-m", "tidings.cli", "-A", APP, "--sleep", "1", *args)
    return spawn_proc(cmd, name="worker", extra_env=env, cwd=ROOT)


def test_chain_on_a_named_connection_stays_there(
    app: App, redis_url: str, other_url: str, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    other = redis.Redis.from_url(other_url)
    default = redis.Redis.from_url(redis_url)
    try:
        chain(Record("a"), Record("b"), Record("c")).on_connection("other").dispatch()
        chain(Fail("x"), Record("never")).on_connection("other").catch(Record("caught")).dispatch()
        w = _worker(spawn_proc, redis_url, prefix, other_url, "--connection", "other")
        try:
            # The jobs record on the worker's default connection (database 0).
            wait_until(lambda: execs(default, prefix).get("c") == 1, 20, "link c ran", w)
            wait_until(lambda: execs(default, prefix).get("caught") == 1, 20, "catch ran", w)
        finally:
            stop_all(w)
        assert [t for t in order(default, prefix) if t in "abc"] == ["a", "b", "c"]
        assert "never" not in execs(default, prefix)
        # Nothing was pushed on the default connection's queues.
        assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 0
    finally:
        other.close()
        default.close()


def test_unique_until_processing_unlocks_on_its_connection(
    app: App, redis_url: str, other_url: str, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    default = redis.Redis.from_url(redis_url)
    try:
        assert UniqueUntilStart("u", 1).on_connection("other").dispatch() is not None
        assert UniqueUntilStart("u", 2).on_connection("other").dispatch() is None
        w = _worker(spawn_proc, redis_url, prefix, other_url, "--connection", "other")
        try:
            wait_until(lambda: default.get(f"{prefix}:test:started:u:1"), 20, "u:1 started", w)
            # The lock was freed as the job started, on the connection it lives on.
            assert UniqueUntilStart("u", 3).on_connection("other").dispatch() is not None
            wait_until(lambda: execs(default, prefix).get("u:3") == 1, 20, "u:3 ran", w)
        finally:
            stop_all(w)
    finally:
        default.close()


def test_catch_takes_a_module_level_function(
    app: App, redis_url: str, other_url: str, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """Before, ``catch(fn)`` raised AttributeError at dispatch."""
    default = redis.Redis.from_url(redis_url)
    try:
        default.set(f"{prefix}:test:broken:f", 1)
        chain(Mendable("f"), Record("after-f")).catch(chain_failed).dispatch()
        default.set(f"{prefix}:test:broken:g", 1)
        chain(Mendable("g")).catch(chain_failed_queued).dispatch()  # a @queued function
        w = _worker(spawn_proc, redis_url, prefix, other_url)
        try:
            wait_until(lambda: execs(default, prefix).get("catch-fn") == 1, 20, "catch fn", w)
            wait_until(lambda: execs(default, prefix).get("catch-queued") == 1, 20, "queued", w)
            time.sleep(0.3)
        finally:
            stop_all(w)
        assert "after-f" not in execs(default, prefix)
        assert execs(default, prefix)["catch-fn"] == 1
    finally:
        default.close()


def test_catch_refuses_what_a_worker_cannot_import(app: App) -> None:
    with pytest.raises(ConfigurationError):
        chain(Record("a")).catch(lambda: None)
    with pytest.raises(TypeError):
        chain(Record("a")).catch("not callable")  # type: ignore[arg-type]
    c = chain(Record("a")).catch(chain_failed)
    assert c._catch == CallFunction("tests.integration.breakable_jobs:chain_failed")


def test_call_function_imports_only_allowed_functions(app: App) -> None:
    app.make_current()
    with pytest.raises(PayloadRejected, match="unknown job type"):
        CallFunction("os:getcwd").handle()
    with pytest.raises(PayloadRejected, match="not a function"):
        CallFunction("tests.integration.breakable_jobs:Mendable").handle()
    assert CallFunction("tests.integration.breakable_jobs:chain_failed").display_name() == (
        "chain_failed"
    )
