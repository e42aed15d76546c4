"""Queued listeners run by a ``notify-worker`` subprocess.

The test process dispatches events with its own App; ``notify-worker -A
tests.e2e.events_app:app --stop-when-empty`` runs the queued listeners, which record
what they received in Redis (re-encoded with the tidings serializer, see events_app.py).
The test decodes those records and compares them with what it dispatched (``==``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from tests.e2e.events_app import (
    Account,
    Address,
    LineItem,
    OrderPlaced,
    Ping,
    Tier,
    register,
)
from tests.support import Proc
from tidings import App
from tidings.wire import serializer

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
KEY = "e2e-events-key-0123456789abcdef-0123"

Spawn = Callable[..., Proc]


class Env:
    """One Redis + prefix: the test's App, the worker's environment, the recordings."""

    def __init__(self, url: str, prefix: str, spawn: Spawn) -> None:
        self.prefix = prefix
        self.spawn = spawn
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("TIDINGS_") and k != "REDIS_URL"
        }
        self.env.update(
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            TIDINGS_REDIS_URL=url,
            TIDINGS_KEY=KEY,
            TIDINGS_PREFIX=prefix,
            TIDINGS_RETRY_AFTER="3",
        )
        self.app = App(
            env=False, redis_url=url, key=KEY, prefix=prefix, allowed_modules="tests", retry_after=3
        )
        register(self.app)
        self.r: redis.Redis = self.app.queue_for(None).client

    def run_worker(self, *queues: str) -> str:
        """Run a worker until the queues are empty; returns its output."""
        cmd = [NOTIFY_WORKER, "-A", "tests.e2e.events_app:app", "--stop-when-empty"]
        cmd += ["--sleep", "1", "--queue", ",".join(queues or ("default",))]
        proc = self.spawn(cmd, name="worker", env=self.env, cwd=ROOT)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker still running after 15s:\n{proc.tail()}")
        assert code == 0, proc.tail()
        return proc.output()

    def received(self, name: str) -> tuple[tuple[Any, ...], int]:
        """(the args listener ``name`` received, the pid it ran in)."""
        raw = self.r.hget(f"{self.prefix}:test:received", name)
        assert isinstance(raw, bytes), f"{name} did not run"
        record = orjson.loads(raw)
        args = serializer.decode(record["args"], self.app.resolve_class)
        assert isinstance(args, tuple)
        return args, int(record["pid"])

    def lifecycle(self) -> list[str]:
        raw: list[bytes] = self.r.lrange(f"{self.prefix}:test:lifecycle", 0, -1)  # type: ignore[assignment]
        return [x.decode() for x in raw]


@pytest.fixture
def e(redis_url: str, prefix: str, spawn_proc: Spawn) -> Iterator[Env]:
    env = Env(redis_url, prefix, spawn_proc)
    try:
        yield env
    finally:
        env.app.close()


def order(e: Env) -> OrderPlaced:
    e.r.hset(f"{e.prefix}:test:accounts", "1", "Ada")
    when = dt.datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    items = [LineItem("A-1", Decimal("99.95"), 1), LineItem("B-2", Decimal("24.975"), 2)]
    return OrderPlaced(
        order_id=uuid.uuid4(),
        placed_at=when,
        total=Decimal("149.90"),
        tier=Tier.PRO,
        address=Address("1 Analytical St", "London", dt.date(2020, 1, 31)),
        items=items,
        by_sku={i.sku: i for i in items},
        account=Account(1, "Ada"),
        window=dt.timedelta(days=2, microseconds=7),
        raw=b"\x00\xff",
        pair=(7, "seven"),
        by_id={1: Tier.FREE, 2: Tier.PRO},
        meta={"nested": {"list": [1, 2.5, "x", None, True]}, "empty": []},
    )


@pytest.mark.topologies
def test_queued_listeners_in_the_worker_receive_an_equal_event(e: Env) -> None:
    sent = order(e)
    sync_id, async_id, fn_id = e.app.dispatch(sent)
    # The model is reloaded when the job runs, not frozen at dispatch.
    e.r.hset(f"{e.prefix}:test:accounts", "1", "Ada Lovelace")

    out = e.run_worker("default", "events")

    expected = (OrderPlaced(**{**vars(sent), "account": Account(1, "Ada Lovelace")}),)
    for name in ("RecordOrder", "AsyncRecordOrder", "record_order_fn"):
        got, pid = e.received(name)
        assert got == expected, name
        assert pid != os.getpid()  # ran in the worker
    [got_event] = e.received("RecordOrder")[0]
    assert isinstance(got_event.tier, Tier) and isinstance(got_event.address, Address)
    assert str(got_event.items[1].price) == "24.975" and got_event.big == 2**70
    # The worker's own output lines and the app's listeners heard the lifecycle events.
    for job_id, name in [
        (sync_id, "RecordOrder"),
        (async_id, "AsyncRecordOrder"),
        (fn_id, "record_order_fn"),
    ]:
        assert any(job_id in ln and "Processing" in ln and name in ln for ln in out.splitlines())
        assert any(job_id in ln and "Processed" in ln for ln in out.splitlines()), out
        assert [x for x in e.lifecycle() if job_id in x] == [
            f"JobProcessing {job_id} {name}",
            f"JobProcessed {job_id} {name}",
        ]
    assert e.app.job_status(async_id, "events") == "done"


def test_string_events_and_dispatch_async_reach_the_worker(e: Env) -> None:
    [id1] = e.app.dispatch("order.shipped", 7, Decimal("12.50"), {"at": dt.date(2024, 1, 2)})
    [id2] = asyncio.run(e.app.dispatch_async("order.refunded", uuid.UUID(int=5)))
    assert id1 != id2

    e.run_worker()

    shipped, _ = e.received("RecordWildcard:order.shipped")
    assert shipped == ("order.shipped", 7, Decimal("12.50"), {"at": dt.date(2024, 1, 2)})
    refunded, _ = e.received("RecordWildcard:order.refunded")
    assert refunded == ("order.refunded", uuid.UUID(int=5))
    for job_id in (id1, id2):
        kinds = [x.split()[0] for x in e.lifecycle() if job_id in x]
        assert kinds == ["JobProcessing", "JobProcessed"]


def test_failed_runs_once_in_the_worker_after_the_last_try(e: Env) -> None:
    [job_id] = e.app.dispatch(Ping(9))

    out = e.run_worker()

    assert e.r.hget(f"{e.prefix}:test:calls", "FailsAlways") == b"2"
    raw = e.r.hget(f"{e.prefix}:test:failed", "FailsAlways")
    assert isinstance(raw, bytes)
    record = orjson.loads(raw)
    assert serializer.decode(record["args"], e.app.resolve_class) == (Ping(9),)
    assert record["exception"] == "ValueError: no good 9"
    assert [x.split()[0] for x in e.lifecycle()] == [
        "JobProcessing",
        "JobProcessing",
        "JobFailed",
    ]
    assert any(job_id in ln and "Failed" in ln for ln in out.splitlines()), out
    [failed] = e.app.queue_for(None).failed(["default"])
    assert failed.id == job_id and failed.name == "FailsAlways" and failed.attempts == 2
