"""The App and queued listeners that ``notify-worker -A tests.e2e.events_app:app`` runs.

The App is built on first access of ``app`` (a module ``__getattr__``) from the
environment: ``TIDINGS_REDIS_URL``, ``TIDINGS_KEY``, ``TIDINGS_PREFIX`` (and
``TIDINGS_ALLOWED_MODULES``, default ``tests``), and :func:`register` adds the listeners.
The test process imports the events and :func:`register` only, and dispatches with its
own App on the same Redis and prefix.

Listeners record, on the App's own Redis under ``<prefix>:test:*``:

    received   hash listener name (``RecordWildcard:<event name>``) -> JSON {"args":
               the call args re-encoded with the tidings serializer, "pid": the worker's pid}
    failed     hash listener name -> JSON {"args": ..., "exception": "Type: text"}
    calls      hash listener name -> handle() calls
    lifecycle  list of "<Event> <job id> <name>" from app listeners of the queue's events
    accounts   hash account id -> name, what Account.__queue_load__ reads at run time
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import os
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from tidings import App, Event, Listener, ShouldQueue, queued
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobProcessing
from tidings.wire import serializer

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(
                allowed_modules=os.environ.get("TIDINGS_ALLOWED_MODULES") or "tests"
            )
            register(_app)
        return _app
    raise AttributeError(name)


def key(name: str) -> str:
    """The name of a recording key, under the current App's prefix."""
    return f"{App.current().settings.prefix}:test:{name}"


def register(app: App) -> None:
    """The listeners, registered the same way by the worker and the test process."""
    app.listen(OrderPlaced, [RecordOrder, AsyncRecordOrder, record_order_fn])
    app.listen("order.*", RecordWildcard)
    app.listen(Ping, FailsAlways)
    app.listen(JobProcessing, lifecycle)
    app.listen(JobProcessed, lifecycle)
    app.listen(JobFailed, lifecycle)


# -- events ---------------------------------------------------------------------------------


class Tier(enum.Enum):
    FREE = "free"
    PRO = "pro"


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


class Account:
    """A model: only its id travels; the worker reloads its name from Redis."""

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
        raw = App.current().queue_for(None).client.hget(key("accounts"), str(data["id"]))
        return cls(data["id"], raw.decode() if isinstance(raw, bytes) else "?")


@dataclass
class OrderPlaced(Event):
    order_id: uuid.UUID
    placed_at: dt.datetime
    total: Decimal
    tier: Tier
    address: Address
    items: list[LineItem]
    by_sku: dict[str, LineItem]
    account: Account
    window: dt.timedelta
    raw: bytes
    pair: tuple[int, str]
    by_id: dict[int, Tier]
    big: int = 2**70
    note: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ping:
    n: int


# -- listeners ------------------------------------------------------------------------------


def _hset(name: str, what: str, value: dict[str, Any]) -> None:
    App.current().queue_for(None).client.hset(key(what), name, orjson.dumps(value))


def record(name: str, args: tuple[Any, ...]) -> None:
    """What a listener received, re-encoded, with the pid it ran in."""
    _hset(name, "received", {"args": serializer.encode(args), "pid": os.getpid()})


class RecordOrder(Listener, ShouldQueue):
    def handle(self, event: OrderPlaced) -> None:
        record("RecordOrder", (event,))


class AsyncRecordOrder(Listener, ShouldQueue):
    queue = "events"

    async def handle(self, event: OrderPlaced) -> None:
        await asyncio.sleep(0)
        record("AsyncRecordOrder", (event,))


@queued
def record_order_fn(event: OrderPlaced) -> None:
    record("record_order_fn", (event,))


class RecordWildcard(Listener, ShouldQueue):
    def handle(self, name: str, *args: Any) -> None:
        record(f"RecordWildcard:{name}", (name, *args))


class FailsAlways(Listener, ShouldQueue):
    tries = 2

    def handle(self, event: Ping) -> None:
        App.current().queue_for(None).client.hincrby(key("calls"), "FailsAlways", 1)
        raise ValueError(f"no good {event.n}")

    def failed(self, event: Ping, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        _hset("FailsAlways", "failed", {"args": serializer.encode((event,)), "exception": text})


def lifecycle(e: JobProcessing | JobProcessed | JobFailed) -> None:
    """An app listener of the queue's lifecycle events (runs in the worker)."""
    entry = f"{type(e).__name__} {e.job_id} {e.name}"
    App.current().queue_for(None).client.rpush(key("lifecycle"), entry)
