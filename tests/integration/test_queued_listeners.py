"""Queued listeners through a real Redis and an in-process Worker.

An event dispatched to a queued listener (a ``Listener`` with ``ShouldQueue``, or a
``queued`` function) becomes a ``CallQueuedListener`` job; here a real ``Worker`` runs it
(``asyncio.run``, ``stop_when_empty``) and the listener records what it received in
``RECEIVED``. The tests compare that with what was dispatched (``==``), and check that
the listener's options reach the payload and act: queue, connection, delay, tries,
backoff, timeout, retry_until, max_exceptions, the ``should_queue`` veto and the
``failed(event, exc)`` hook.

Everything the worker imports is defined at module level here, allowed by
``allowed_modules="tests"``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
import redis

from tidings import App, Event, Listener, ShouldQueue, queued
from tidings.errors import JobTimeout, MaxAttemptsExceeded, SerializationError
from tidings.events.call_queued import CallQueuedListener
from tidings.jobs.job import PendingDispatch
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobProcessing, JobQueued
from tidings.wire.envelope import JobBody, open_envelope
from tidings.worker.worker import Worker, WorkerOptions

KEY = "x" * 32
RECEIVED: list[tuple[str, tuple[Any, ...]]] = []
"""(listener name, the arguments it was called with), appended in the worker."""
CALLS: dict[str, int] = {}
"""handle() calls per listener name, failing ones included."""
FAILED: list[tuple[str, tuple[Any, ...], BaseException]] = []
"""(listener name, event args, exception) per failed() call."""
ACCOUNTS: dict[int, str] = {}
"""The "database" Account.__queue_load__ reads at run time."""


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RECEIVED.clear()
    CALLS.clear()
    FAILED.clear()
    ACCOUNTS.clear()
    yield


# -- rich events ----------------------------------------------------------------------------


class Tier(enum.Enum):
    FREE = "free"
    PRO = "pro"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Address:
    street: str
    city: str
    since: dt.date


@dataclass
class LineItem:
    sku: str
    price: Decimal
    qty: int
    added: dt.datetime


class Account:
    """A model: only its id travels; the worker reloads it from ACCOUNTS at run time."""

    def __init__(self, id: int, name: str) -> None:
        self.id = id
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Account) and (self.id, self.name) == (other.id, other.name)

    def __hash__(self) -> int:
        return hash((self.id, self.name))

    def __repr__(self) -> str:
        return f"Account({self.id}, {self.name!r})"

    def __queue_dump__(self) -> dict[str, Any]:
        return {"id": self.id}

    @classmethod
    def __queue_load__(cls, data: dict[str, Any]) -> Account:
        return cls(data["id"], ACCOUNTS[data["id"]])


@dataclass
class OrderPlaced(Event):
    order_id: uuid.UUID
    placed_at: dt.datetime
    total: Decimal
    tier: Tier
    priority: Priority
    address: Address
    items: list[LineItem]
    by_sku: dict[str, LineItem]
    account: Account
    accounts: list[Account]
    window: dt.timedelta
    opens_at: dt.time
    raw: bytes
    tags: frozenset[str]
    pair: tuple[int, str]
    by_id: dict[int, Tier]
    big: int = 2**70
    note: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def make_order(total: str = "149.90") -> OrderPlaced:
    ACCOUNTS.setdefault(1, "Ada")
    ACCOUNTS.setdefault(2, "Grace")
    when = dt.datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=dt.UTC)
    items = [
        LineItem("A-1", Decimal("99.95"), 1, when),
        LineItem("B-2", Decimal("24.975"), 2, when + dt.timedelta(minutes=3)),
    ]
    return OrderPlaced(
        order_id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        placed_at=when.astimezone(dt.timezone(dt.timedelta(hours=2))),
        total=Decimal(total),
        tier=Tier.PRO,
        priority=Priority.HIGH,
        address=Address("1 Analytical St", "London", dt.date(2020, 1, 31)),
        items=items,
        by_sku={i.sku: i for i in items},
        account=Account(1, ACCOUNTS[1]),
        accounts=[Account(1, ACCOUNTS[1]), Account(2, ACCOUNTS[2])],
        window=dt.timedelta(days=2, seconds=5, microseconds=7),
        opens_at=dt.time(8, 0, 30),
        raw=b"\x00\xffbinary",
        tags=frozenset({"gift", "express"}),
        pair=(7, "seven"),
        by_id={1: Tier.FREE, 2: Tier.PRO},
        note=None,
        meta={"nested": {"list": [1, 2.5, "x", None, True]}, "empty": [], "e": {}},
    )


@dataclass
class Ping:
    n: int


# -- listeners ------------------------------------------------------------------------------


def _record(name: str, *args: Any) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1
    RECEIVED.append((name, args))


def _count(name: str) -> int:
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name]


class RecordOrder(Listener, ShouldQueue):
    def handle(self, event: OrderPlaced) -> None:
        _record("RecordOrder", event)


class AsyncRecordOrder(Listener, ShouldQueue):
    async def handle(self, event: OrderPlaced) -> None:
        await asyncio.sleep(0)
        _record("AsyncRecordOrder", event)


@queued
def record_order_fn(event: OrderPlaced) -> None:
    _record("record_order_fn", event)


def audit(event: object) -> str:
    """A sync listener: runs at dispatch."""
    _record("audit", event)
    return "audited"


class Configured(Listener, ShouldQueue):
    queue = "mail"
    tries = 3
    backoff = (1, 2.5)
    timeout = 5.0
    retry_until = dt.timedelta(minutes=5)
    max_exceptions = 2

    def handle(self, event: Ping) -> None:
        _record("Configured", event)


@queued(queue="mail", tries=4, backoff=3, timeout=7, max_exceptions=1)
def configured_fn(event: Ping) -> None:
    _record("configured_fn", event)


class OnMail(Listener, ShouldQueue):
    queue = "mail"

    def handle(self, event: Ping) -> None:
        _record("OnMail", event)


class OnSecond(Listener, ShouldQueue):
    connection = "second"

    def handle(self, event: Ping) -> None:
        _record("OnSecond", event)


class Delayed(Listener, ShouldQueue):
    delay = 0.6

    def handle(self, event: Ping) -> None:
        _record("Delayed", event, time.time())


@queued(delay=dt.timedelta(seconds=0.6))
def delayed_fn(event: Ping) -> None:
    _record("delayed_fn", event, time.time())


class Flaky(Listener, ShouldQueue):
    """Fails twice, then succeeds: needs tries >= 3."""

    tries = 3
    backoff = 0.1

    def handle(self, event: Ping) -> None:
        if _count("Flaky") < 3:
            raise RuntimeError("flaky")
        RECEIVED.append(("Flaky", (event,)))

    def failed(self, event: Ping, exc: BaseException) -> None:
        FAILED.append(("Flaky", (event,), exc))


class AlwaysFails(Listener, ShouldQueue):
    tries = 2

    def handle(self, event: Ping) -> None:
        _count("AlwaysFails")
        raise ValueError(f"no good {event.n}")

    def failed(self, event: Ping, exc: BaseException) -> None:
        FAILED.append(("AlwaysFails", (event,), exc))


class TooManyExceptions(Listener, ShouldQueue):
    tries = 10
    max_exceptions = 2

    def handle(self, event: Ping) -> None:
        _count("TooManyExceptions")
        raise RuntimeError("again")

    async def failed(self, event: Ping, exc: BaseException) -> None:
        await asyncio.sleep(0)
        FAILED.append(("TooManyExceptions", (event,), exc))


class Slow(Listener, ShouldQueue):
    timeout = 0.3

    async def handle(self, event: Ping) -> None:
        _count("Slow")
        await asyncio.sleep(10)

    def failed(self, event: Ping, exc: BaseException) -> None:
        FAILED.append(("Slow", (event,), exc))


class Deadline(Listener, ShouldQueue):
    """Retries (no tries limit) until retry_until has passed."""

    retry_until = dt.timedelta(seconds=0.8)
    backoff = 0.2

    def handle(self, event: Ping) -> None:
        _count("Deadline")
        raise RuntimeError("not yet")

    def failed(self, event: Ping, exc: BaseException) -> None:
        FAILED.append(("Deadline", (event,), exc))


class Expired(Listener, ShouldQueue):
    retry_until = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)

    def handle(self, event: Ping) -> None:
        _count("Expired")

    def failed(self, event: Ping, exc: BaseException) -> None:
        FAILED.append(("Expired", (event,), exc))


class BigOrdersOnly(Listener, ShouldQueue):
    def should_queue(self, event: OrderPlaced) -> bool:
        return event.total > 100

    def handle(self, event: OrderPlaced) -> None:
        _record("BigOrdersOnly", event)


class OrderWildcard(Listener, ShouldQueue):
    def handle(self, name: str, *args: Any) -> None:
        _record("OrderWildcard", name, *args)


@queued
def order_shipped_fn(order_id: int, amount: Decimal) -> None:
    _record("order_shipped_fn", order_id, amount)


smuggled = queued(json.dumps)
"""A queued function from outside the allowed modules, imported into an allowed one."""


# -- helpers --------------------------------------------------------------------------------


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules="tests",
        retry_after=3,
    )
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def r(app: App) -> redis.Redis:
    return app.queue_for(None).client


def work(app: App, **options: Any) -> Worker:
    """Run an in-process worker until its queues are empty (delayed jobs included)."""
    options.setdefault("stop_when_empty", True)
    options.setdefault("sleep_s", 0.5)
    worker = Worker(app, WorkerOptions(**options))
    code = asyncio.run(asyncio.wait_for(worker.run(), 15))
    assert code == 0
    return worker


def sizes(app: App, queue: str = "default", connection: str | None = None) -> dict[str, int]:
    return app.queue_for(connection).sizes([queue])[queue]


def body_of(app: App, job_id: str, queue: str = "default") -> JobBody:
    rq = app.queue_for(None)
    envelope = rq.client.hget(rq.keys(queue).jobs, job_id)
    assert isinstance(envelope, bytes), f"no envelope for {job_id} on {queue}"
    return open_envelope(envelope, app.signer, job_id=job_id, queue=queue)


def received(name: str) -> list[tuple[Any, ...]]:
    return [args for who, args in RECEIVED if who == name]


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and len(value) == 32 and int(value, 16) >= 0


# -- round trips ----------------------------------------------------------------------------


def test_a_queued_listener_receives_an_equal_rich_event(app: App) -> None:
    app.listen(OrderPlaced, RecordOrder)
    sent = make_order()
    [job_id] = app.dispatch(sent)
    assert is_job_id(job_id)
    assert RECEIVED == []  # queued: nothing ran at dispatch
    body = body_of(app, job_id)
    assert body["job"] == "tidings.events.call_queued:CallQueuedListener"
    assert body["displayName"] == "RecordOrder"
    assert body["data"]["f"]["listener"] == f"{__name__}:RecordOrder"

    work(app)

    [(got,)] = received("RecordOrder")
    assert got == sent
    assert got is not sent
    # Types survive, not only values (== alone would accept 2 == 2.0, a str for an Enum...).
    assert isinstance(got.tier, Tier) and isinstance(got.priority, Priority)
    assert isinstance(got.address, Address) and isinstance(got.items[1], LineItem)
    assert got.items[1].price == Decimal("24.975") and str(got.items[1].price) == "24.975"
    assert got.placed_at.utcoffset() == dt.timedelta(hours=2)
    assert isinstance(got.pair, tuple) and isinstance(got.tags, frozenset)
    assert got.big == 2**70 and got.raw == b"\x00\xffbinary"
    assert list(got.by_id) == [1, 2] and got.meta["empty"] == [] and got.meta["e"] == {}
    assert app.job_status(job_id) == "done"


def test_a_model_is_reloaded_at_run_time(app: App) -> None:
    app.listen(OrderPlaced, RecordOrder)
    sent = make_order()
    app.dispatch(sent)
    ACCOUNTS[1] = "Ada Lovelace"  # changed between dispatch and run

    work(app)

    [(got,)] = received("RecordOrder")
    assert got.account == Account(1, "Ada Lovelace")
    assert got.accounts == [Account(1, "Ada Lovelace"), Account(2, "Grace")]
    assert got == dataclasses.replace(
        sent,
        account=Account(1, "Ada Lovelace"),
        accounts=[Account(1, "Ada Lovelace"), Account(2, "Grace")],
    )


def test_async_handle_is_awaited_and_queued_functions_run(app: App) -> None:
    app.listen(OrderPlaced, [AsyncRecordOrder, record_order_fn])
    sent = make_order()
    ids = app.dispatch(sent)
    assert len(ids) == 2 and all(is_job_id(i) for i in ids)
    assert [body_of(app, i)["displayName"] for i in ids] == ["AsyncRecordOrder", "record_order_fn"]
    assert body_of(app, ids[1])["data"]["f"]["listener"] == f"{__name__}:record_order_fn"

    work(app)

    assert received("AsyncRecordOrder") == [(sent,)]
    assert received("record_order_fn") == [(sent,)]


def test_sync_listeners_run_at_dispatch_and_queued_ones_return_job_ids(app: App) -> None:
    seen: list[JobQueued] = []
    app.listen(JobQueued, seen.append)
    app.listen(OrderPlaced, [audit, RecordOrder, record_order_fn])
    sent = make_order()

    results = app.dispatch(sent)

    assert results[0] == "audited"
    assert received("audit") == [(sent,)]  # ran now, with the very object
    assert RECEIVED[0][1][0] is sent
    assert all(is_job_id(i) for i in results[1:]) and len(set(results[1:])) == 2
    assert [app.job_status(i) for i in results[1:]] == ["pending", "pending"]
    assert [(e.job_id, e.name) for e in seen] == [
        (results[1], "RecordOrder"),
        (results[2], "record_order_fn"),
    ]
    assert sizes(app)["ready"] == 2

    work(app)

    assert received("RecordOrder") == [(sent,)] and received("record_order_fn") == [(sent,)]
    assert received("audit") == [(sent,)]  # not run again by the worker
    assert [app.job_status(i) for i in results[1:]] == ["done", "done"]


def test_dispatch_async_pushes_through_the_async_client(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.listen(OrderPlaced, [audit, RecordOrder, AsyncRecordOrder])
    rq = app.queue_for(None)

    def no_sync_push(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("dispatch_async used the sync client")

    monkeypatch.setattr(rq, "push", no_sync_push)
    sent = make_order()

    results = asyncio.run(app.dispatch_async(sent))

    assert results[0] == "audited" and all(is_job_id(i) for i in results[1:])
    monkeypatch.undo()
    assert sizes(app)["ready"] == 2
    work(app)
    assert received("RecordOrder") == [(sent,)] and received("AsyncRecordOrder") == [(sent,)]


def test_event_dispatch_method_and_module_helper_use_the_current_app(app: App) -> None:
    from tidings import event

    app.listen(OrderPlaced, RecordOrder)
    first, second = make_order("1"), make_order("2")
    [id1] = first.dispatch()
    [id2] = event(second)
    assert is_job_id(id1) and is_job_id(id2)
    work(app)
    assert received("RecordOrder") == [(first,), (second,)]


def test_string_events_reach_queued_wildcard_and_exact_listeners(app: App) -> None:
    app.listen("order.*", OrderWildcard)
    app.listen("order.shipped", order_shipped_fn)
    app.listen("user.*", OrderWildcard)  # does not match

    ids = app.dispatch("order.shipped", 7, Decimal("12.50"))

    assert len(ids) == 2 and all(is_job_id(i) for i in ids)
    work(app)
    assert received("OrderWildcard") == [("order.shipped", 7, Decimal("12.50"))]
    assert received("order_shipped_fn") == [(7, Decimal("12.50"))]


def test_a_value_with_no_queued_form_fails_at_dispatch_and_pushes_nothing(app: App) -> None:
    app.listen(Ping, OnMail)
    with pytest.raises(SerializationError, match="args"):
        app.dispatch(Ping(object()))  # type: ignore[arg-type]
    assert sizes(app, "mail") == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}


# -- options --------------------------------------------------------------------------------


def test_listener_class_options_reach_the_payload(app: App) -> None:
    app.listen(Ping, Configured)
    before = time.time()
    [job_id] = app.dispatch(Ping(1))

    assert sizes(app, "mail")["ready"] == 1 and sizes(app)["ready"] == 0
    body = body_of(app, job_id, "mail")
    assert body["maxTries"] == 3
    assert body["backoff"] == [1.0, 2.5]
    assert body["timeout"] == 5.0
    assert body["maxExceptions"] == 2
    assert body["retryUntil"] is not None
    assert before + 300 - 1 < body["retryUntil"] < time.time() + 300 + 1


def test_queued_function_options_reach_the_payload(app: App) -> None:
    app.listen(Ping, configured_fn)
    [job_id] = app.dispatch(Ping(1))
    body = body_of(app, job_id, "mail")
    assert (body["maxTries"], body["backoff"], body["timeout"], body["maxExceptions"]) == (
        4,
        [3.0],
        7,
        1,
    )
    assert body["retryUntil"] is None


def test_the_queue_option_routes_the_job(app: App) -> None:
    app.listen(Ping, OnMail)
    app.dispatch(Ping(1))
    work(app, queues=["default"])
    assert received("OnMail") == []  # not on the default queue
    work(app, queues=["mail"])
    assert received("OnMail") == [(Ping(1),)]


def test_the_connection_option_pushes_to_that_connection(redis_url: str, prefix: str) -> None:
    second_url = redis_url.rsplit("/", 1)[0] + "/1"
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules="tests",
        retry_after=3,
        connections={"second": second_url},
    )
    second = app.queue_for("second")
    try:
        app.listen(Ping, OnSecond)
        [job_id] = app.dispatch(Ping(5))
        assert sizes(app, connection="second")["ready"] == 1
        assert sizes(app)["ready"] == 0
        work(app)
        assert received("OnSecond") == []
        work(app, connection="second")
        assert received("OnSecond") == [(Ping(5),)]
        assert second.status(job_id, ["default"]) == "done"
    finally:
        for key in list(second.client.scan_iter(match=f"{prefix}:*")):
            second.client.delete(key)
        app.close()
        second.close()


@pytest.mark.parametrize("listener", [Delayed, delayed_fn], ids=["class", "function"])
def test_the_delay_option_delays_the_job(app: App, listener: Any) -> None:
    app.listen(Ping, listener)
    t0 = time.time()
    [job_id] = app.dispatch(Ping(1))
    assert app.job_status(job_id) == "delayed"
    assert sizes(app) == {"ready": 0, "delayed": 1, "reserved": 0, "failed": 0}

    work(app)

    [(event, ran_at)] = received(listener.__name__)
    assert event == Ping(1)
    assert ran_at - t0 >= 0.5


def test_tries_and_backoff_retry_a_failing_listener(app: App) -> None:
    app.listen(Ping, Flaky)
    app.dispatch(Ping(3))
    work(app)
    assert CALLS["Flaky"] == 3
    assert received("Flaky") == [(Ping(3),)]
    assert FAILED == []
    assert sizes(app)["failed"] == 0


def test_failed_runs_once_with_the_event_and_exception_on_final_failure(app: App) -> None:
    processing: list[str] = []
    app.listen(JobProcessing, lambda e: processing.append(e.job_id))
    app.listen(Ping, AlwaysFails)
    [job_id] = app.dispatch(Ping(9))

    work(app)

    assert CALLS["AlwaysFails"] == 2
    assert len(processing) == 2
    [(name, args, exc)] = FAILED
    assert (name, args) == ("AlwaysFails", (Ping(9),))
    assert isinstance(exc, ValueError) and str(exc) == "no good 9"
    [record] = app.queue_for(None).failed(["default"])
    assert record.id == job_id and record.name == "AlwaysFails"
    assert "ValueError: no good 9" in record.exception
    assert app.job_status(job_id) == "failed"


def test_max_exceptions_stops_retries_and_an_async_failed_is_awaited(app: App) -> None:
    app.listen(Ping, TooManyExceptions)
    app.dispatch(Ping(1))
    work(app)
    assert CALLS["TooManyExceptions"] == 2
    [(name, args, exc)] = FAILED
    assert (name, args, str(exc)) == ("TooManyExceptions", (Ping(1),), "again")


def test_the_timeout_option_fails_a_slow_async_listener(app: App) -> None:
    app.listen(Ping, Slow)
    t0 = time.monotonic()
    app.dispatch(Ping(1))
    work(app)
    assert time.monotonic() - t0 < 5
    assert CALLS["Slow"] == 1
    [(name, _, exc)] = FAILED
    assert name == "Slow" and isinstance(exc, JobTimeout)


def test_retry_until_keeps_retrying_then_fails(app: App) -> None:
    app.listen(Ping, Deadline)
    app.dispatch(Ping(1))
    work(app)
    assert CALLS["Deadline"] >= 2  # more than the worker's default of 1 try
    [(name, _, exc)] = FAILED
    # The last attempt's own error, or (when the deadline passed while the job waited
    # out its backoff) MaxAttemptsExceeded from the worker's check before running it.
    assert name == "Deadline"
    assert str(exc) == "not yet" or isinstance(exc, MaxAttemptsExceeded)


def test_a_past_retry_until_fails_without_running(app: App) -> None:
    app.listen(Ping, Expired)
    app.dispatch(Ping(1))
    work(app)
    assert "Expired" not in CALLS
    [(name, args, exc)] = FAILED
    assert (name, args) == ("Expired", (Ping(1),)) and isinstance(exc, MaxAttemptsExceeded)


def test_should_queue_can_veto(app: App) -> None:
    app.listen(OrderPlaced, [audit, BigOrdersOnly])

    small = app.dispatch(make_order("99.99"))
    assert small == ["audited", None]
    assert sizes(app)["ready"] == 0

    big = make_order("100.01")
    results = app.dispatch(big)
    assert results[0] == "audited" and is_job_id(results[1])
    work(app)
    assert received("BigOrdersOnly") == [(big,)]


def test_should_queue_veto_in_dispatch_async(app: App) -> None:
    app.listen(OrderPlaced, BigOrdersOnly)
    assert asyncio.run(app.dispatch_async(make_order("5"))) == [None]
    assert sizes(app)["ready"] == 0


# -- lifecycle events -----------------------------------------------------------------------


def test_lifecycle_events_reach_app_listeners_in_order(app: App) -> None:
    seen: list[tuple[str, str, str, int]] = []

    def on(kind: str) -> Any:
        def listener(e: Any) -> None:
            seen.append((kind, e.job_id, e.name, e.attempts))

        return listener

    app.listen(JobProcessing, on("processing"))
    app.listen(JobProcessed, on("processed"))
    app.listen(JobFailed, on("failed"))
    app.listen(Ping, [RecordOrder, AlwaysFails])  # RecordOrder ignores the event type

    ok_id, bad_id = app.dispatch(Ping(1))
    work(app, concurrency=1)

    assert [s for s in seen if s[1] == ok_id] == [
        ("processing", ok_id, "RecordOrder", 1),
        ("processed", ok_id, "RecordOrder", 1),
    ]
    assert [s for s in seen if s[1] == bad_id] == [
        ("processing", bad_id, "AlwaysFails", 1),
        ("processing", bad_id, "AlwaysFails", 2),
        ("failed", bad_id, "AlwaysFails", 2),
    ]
    assert [s[0] for s in seen] == [
        "processing",
        "processed",
        "processing",
        "processing",
        "failed",
    ]


def test_a_raising_lifecycle_listener_does_not_break_the_job(app: App) -> None:
    def broken(e: object) -> None:
        raise RuntimeError("listener bug")

    app.listen(JobProcessing, broken)
    app.listen(JobProcessed, broken)
    app.listen(JobQueued, broken)
    app.listen(Ping, OnMail)

    [job_id] = app.dispatch(Ping(2))  # JobQueued's listener raised after the push

    assert is_job_id(job_id)
    work(app, queues=["mail"])
    assert received("OnMail") == [(Ping(2),)]
    assert app.job_status(job_id, "mail") == "done"


# -- what the worker refuses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (f"{__name__}:Ping", "is not a listener"),
        (f"{__name__}:smuggled", "outside the allowed modules"),
        ("json:dumps", "not under the allowed modules"),
        (f"{__name__}:Missing", "unknown job type"),
    ],
    ids=["not-a-listener", "smuggled-function", "outside-module", "missing"],
)
def test_the_worker_refuses_a_listener_path_it_may_not_run(
    app: App, path: str, reason: str
) -> None:
    # A signed payload naming something other than an allowed listener: fails at once,
    # never retried, and runs nothing.
    job = CallQueuedListener.for_target(RecordOrder, (Ping(1),))
    job.listener = path
    job_id = app.push_pending(PendingDispatch(job))
    assert job_id is not None

    work(app, tries=3)

    assert RECEIVED == []
    [record] = app.queue_for(None).failed(["default"])
    assert record.id == job_id and record.attempts == 1
    assert "PayloadRejected" in record.exception and reason in record.exception
