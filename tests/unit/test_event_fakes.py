"""fake_events: record instead of run, assertions with useful messages, only=, restore."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from tidings.events import Dispatcher, FakeDispatcher, Listener, fake_events
from tidings.events.listener import queued


@dataclass
class OrderPlaced:
    order_id: int


@dataclass
class PriorityOrderPlaced(OrderPlaced):
    pass


@dataclass
class OrderShipped:
    order_id: int


class Owner:
    """Stands in for the App: anything with an ``events`` Dispatcher."""

    def __init__(self) -> None:
        self.events = Dispatcher()


class Reserve(Listener):
    def handle(self, event: OrderPlaced) -> None:
        return None


@queued
def queued_ship(event: OrderShipped) -> None:
    return None


@pytest.fixture
def owner() -> Owner:
    return Owner()


def test_fake_events_swaps_the_dispatcher_runs_nothing_and_restores(owner: Owner) -> None:
    ran: list[object] = []
    real = owner.events
    real.listen(OrderPlaced, ran.append)
    with fake_events(owner) as events:
        assert owner.events is events and isinstance(events, FakeDispatcher)
        assert owner.events.dispatch(OrderPlaced(1)) == []
        assert owner.events.until(OrderPlaced(2)) is None
        assert owner.events.dispatch("order.exported", "csv") == []
    assert owner.events is real
    assert ran == []
    assert events.dispatched(OrderPlaced) == [OrderPlaced(1), OrderPlaced(2)]
    assert events.dispatched("order.exported") == [("csv",)]


def test_the_real_dispatcher_is_restored_when_the_block_raises(owner: Owner) -> None:
    real = owner.events
    with pytest.raises(RuntimeError), fake_events(owner):
        raise RuntimeError("test failed inside the block")
    assert owner.events is real


def test_assert_dispatched_with_predicate_and_times(owner: Owner) -> None:
    with fake_events(owner) as events:
        owner.events.dispatch(OrderPlaced(1))
        owner.events.dispatch(PriorityOrderPlaced(2))
        owner.events.dispatch(OrderShipped(1))
    events.assert_dispatched(OrderPlaced)
    events.assert_dispatched(OrderPlaced, times=2)  # a subclass instance counts
    events.assert_dispatched(PriorityOrderPlaced, times=1)
    events.assert_dispatched(OrderPlaced, lambda e: e.order_id == 2, times=1)
    events.assert_not_dispatched(OrderPlaced, lambda e: e.order_id == 3)
    with pytest.raises(AssertionError) as info:
        events.assert_dispatched(OrderShipped, times=2)
    message = str(info.value)
    assert "Expected OrderShipped to be dispatched 2 times, but it was dispatched once" in message
    assert "OrderPlaced(order_id=1)" in message and "PriorityOrderPlaced(order_id=2)" in message


def test_assert_not_dispatched_and_nothing_dispatched_fail_with_the_list(owner: Owner) -> None:
    with fake_events(owner) as events:
        events.assert_nothing_dispatched()
        events.assert_not_dispatched(OrderPlaced)
        owner.events.dispatch(OrderPlaced(7))
    with pytest.raises(AssertionError, match=r"(?s)not to be dispatched.*once.*order_id=7"):
        events.assert_not_dispatched(OrderPlaced)
    with pytest.raises(AssertionError, match=r"(?s)no events.*1 were.*order_id=7"):
        events.assert_nothing_dispatched()
    with pytest.raises(AssertionError, match=r"matching the predicate.*dispatched 0 times"):
        events.assert_dispatched(OrderPlaced, lambda e: e.order_id == 8)


def test_the_failure_message_lists_at_most_twenty_events(owner: Owner) -> None:
    with fake_events(owner) as events:
        for i in range(25):
            owner.events.dispatch(OrderPlaced(i))
    with pytest.raises(AssertionError) as info:
        events.assert_nothing_dispatched()
    assert "order_id=19" in str(info.value) and "order_id=20" not in str(info.value)
    assert "and 5 more" in str(info.value)


def test_string_events_match_by_name_and_by_wildcard(owner: Owner) -> None:
    with fake_events(owner) as events:
        owner.events.dispatch("user.created", 1, "ada")
        owner.events.dispatch("user.deleted", 2)
    events.assert_dispatched("user.created", lambda user_id, name: name == "ada")
    assert events.dispatched("user.*") == [("user.created", 1, "ada"), ("user.deleted", 2)]
    events.assert_dispatched("user.*", lambda name, *args: name == "user.deleted", times=1)
    events.assert_not_dispatched("order.created")
    with pytest.raises(AssertionError, match=r"'order\.created'"):
        events.assert_dispatched("order.created")


def test_only_fakes_the_listed_events_and_runs_the_others(owner: Owner) -> None:
    ran: list[object] = []
    owner.events.listen(OrderPlaced, ran.append)
    owner.events.listen(OrderShipped, ran.append)

    def on_created(n: int) -> str:
        ran.append(n)
        return "ran"

    owner.events.listen("user.created", on_created)
    with fake_events(owner, only=[OrderPlaced, "audit.logged"]) as events:
        assert owner.events.dispatch(PriorityOrderPlaced(1)) == []
        assert owner.events.dispatch(OrderShipped(2)) == [None]
        assert owner.events.dispatch("user.created", 3) == ["ran"]
        owner.events.dispatch("audit.logged")
    assert ran == [OrderShipped(2), 3]
    events.assert_dispatched(PriorityOrderPlaced)
    events.assert_dispatched("audit.logged")
    events.assert_not_dispatched(OrderShipped)  # it ran; only faked events are recorded


def test_dispatch_async_is_recorded_or_forwarded(owner: Owner) -> None:
    async def on_shipped(event: OrderShipped) -> str:
        return "async ran"

    owner.events.listen(OrderShipped, on_shipped)
    with fake_events(owner, only=[OrderPlaced]) as events:
        assert asyncio.run(owner.events.dispatch_async(OrderPlaced(1))) == []
        assert asyncio.run(owner.events.dispatch_async(OrderPlaced(1), halt=True)) is None
        assert asyncio.run(owner.events.dispatch_async(OrderShipped(2))) == ["async ran"]
    events.assert_dispatched(OrderPlaced, times=2)


def test_registration_goes_to_the_real_dispatcher_and_assert_listening_checks_it(
    owner: Owner,
) -> None:
    real = owner.events
    with fake_events(owner) as events:
        owner.events.listen(OrderPlaced, Reserve)
        owner.events.listen(OrderShipped, queued_ship)

        @owner.events.listener("user.*")
        def on_user(name: str) -> None:
            return None

        events.assert_listening(OrderPlaced, Reserve)
        events.assert_listening(PriorityOrderPlaced, Reserve)  # heard through the base
        events.assert_listening(OrderShipped, queued_ship)
        events.assert_listening(OrderShipped, queued_ship.fn)
        events.assert_listening("user.created", on_user)
        with pytest.raises(AssertionError, match=r"Reserve to listen to OrderShipped.*queued"):
            events.assert_listening(OrderShipped, Reserve)
        with pytest.raises(AssertionError, match="its listeners: none"):
            events.assert_listening("nothing.here", Reserve)
        owner.events.forget(OrderShipped)
        assert owner.events.listeners_for(OrderPlaced) == [Reserve]
    assert real.listeners_for(OrderPlaced) == [Reserve]
    assert real.listeners_for(OrderShipped) == []


def test_has_listeners_is_true_for_faked_events_so_they_get_recorded(owner: Owner) -> None:
    owner.events.listen("user.created", print)
    with fake_events(owner, only=[OrderPlaced]) as events:
        assert events.has_listeners(OrderPlaced)
        assert events.has_listeners(PriorityOrderPlaced(1))
        assert not events.has_listeners(OrderShipped)
        assert events.has_listeners("user.created")
    with fake_events(owner) as events:
        assert events.has_listeners(OrderShipped) and events.has_listeners("any.name")


def test_subscribe_and_discover_are_forwarded(owner: Owner) -> None:
    class Subscriber:
        def subscribe(self, dispatcher: Dispatcher) -> dict[Any, Any]:
            return {OrderPlaced: Reserve}

    with fake_events(owner) as events:
        events.subscribe(Subscriber)
        assert events.discover("tidings.events.listener") == []
    assert owner.events.listeners_for(OrderPlaced) == [Reserve]


def test_the_fake_overrides_every_public_dispatcher_method() -> None:
    # A method the fake forgot would act on its own empty registry, silently.
    public = {
        name
        for name, member in inspect.getmembers(Dispatcher)
        if not name.startswith("_") and callable(member)
    }
    missing = {name for name in public if name not in vars(FakeDispatcher)}
    assert missing == set()
