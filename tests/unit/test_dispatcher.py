"""The event dispatcher: order, matching, propagation, async, queued listeners, discovery."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tidings.events
from tidings.errors import ConfigurationError
from tidings.events import Dispatcher, Event, Listener, QueuedFunction, ShouldQueue
from tidings.events.dispatcher import current_dispatcher, set_current_dispatcher_provider
from tidings.events.listener import handled_events, queued


@dataclass
class UserEvent:
    user: str


@dataclass
class UserRegistered(UserEvent):
    pass


@dataclass
class AdminRegistered(UserRegistered):
    pass


class Audited:
    """A mixin base: listeners for it hear every event class that mixes it in."""


@dataclass
class UserDeleted(UserEvent, Audited):
    pass


@dataclass
class Pinged(Event):
    n: int = 0


def recorder() -> tuple[list[Any], Callable[[str], Callable[..., Any]]]:
    """A call log and a factory of listeners that append ``(tag, *args)`` to it."""
    calls: list[Any] = []

    def make(tag: str, result: Any = None) -> Callable[..., Any]:
        def listener(*args: Any) -> Any:
            calls.append((tag, *args))
            return result if result is not None else tag

        return listener

    return calls, make


# -- registration and order ------------------------------------------------------------


def test_a_plain_callable_hears_its_event_and_results_come_back_in_order() -> None:
    d = Dispatcher()
    calls, make = recorder()
    d.listen(UserRegistered, make("a"))
    d.listen(UserRegistered, [make("b"), make("c")])
    event = UserRegistered("ada")
    assert d.dispatch(event) == ["a", "b", "c"]
    assert calls == [("a", event), ("b", event), ("c", event)]


def test_global_registration_order_holds_across_an_event_class_and_its_bases() -> None:
    d = Dispatcher()
    _calls, make = recorder()
    d.listen(UserRegistered, make("registered-1"))
    d.listen(UserEvent, make("user-event"))
    d.listen(object, make("everything"))
    d.listen(AdminRegistered, make("admin"))
    d.listen(UserRegistered, make("registered-2"))
    assert d.dispatch(AdminRegistered("root")) == [
        "registered-1",
        "user-event",
        "everything",
        "admin",
        "registered-2",
    ]
    assert d.dispatch(UserEvent("x")) == ["user-event", "everything"]


def test_a_listener_for_a_base_hears_subclasses_but_not_the_reverse() -> None:
    d = Dispatcher()
    _calls, make = recorder()
    d.listen(Audited, make("audit"))
    d.listen(UserRegistered, make("registered"))
    assert d.dispatch(UserDeleted("x")) == ["audit"]
    assert d.dispatch(UserEvent("x")) == []
    assert d.dispatch(AdminRegistered("x")) == ["registered"]


def test_a_listener_class_is_instantiated_per_call_and_its_handle_called() -> None:
    instances: list[object] = []

    class Greet(Listener):
        def __init__(self) -> None:
            instances.append(self)

        def handle(self, event: UserRegistered) -> str:
            return f"hi {event.user}"

    d = Dispatcher()
    d.listen(UserRegistered, Greet)
    assert d.dispatch(UserRegistered("ada")) == ["hi ada"]
    assert d.dispatch(UserRegistered("bob")) == ["hi bob"]
    assert len(instances) == 2 and instances[0] is not instances[1]


def test_the_decorator_registers_and_returns_the_function_unchanged() -> None:
    d = Dispatcher()

    @d.listener(UserRegistered)
    def audit(event: UserRegistered) -> str:
        return event.user

    assert audit(UserRegistered("direct")) == "direct"
    assert d.dispatch(UserRegistered("ada")) == ["ada"]
    assert d.listeners_for(UserRegistered) == [audit]


def test_registering_the_same_listener_twice_runs_it_twice() -> None:
    d = Dispatcher()
    _calls, make = recorder()
    listener = make("x")
    d.listen(UserRegistered, listener)
    d.listen(UserRegistered, listener)
    assert d.dispatch(UserRegistered("a")) == ["x", "x"]


def test_lambdas_and_closures_stay_registered_after_gc() -> None:
    d = Dispatcher()
    seen: list[str] = []

    def register() -> None:
        prefix = "closure:"

        def closure(event: UserRegistered) -> None:
            seen.append(prefix + event.user)

        d.listen(UserRegistered, closure)
        d.listen(UserRegistered, lambda event: seen.append("lambda:" + event.user))

    register()
    gc.collect()
    d.dispatch(UserRegistered("ada"))
    assert seen == ["closure:ada", "lambda:ada"]


@pytest.mark.parametrize(
    ("event", "listener"),
    [
        (UserRegistered("an instance"), print),
        ("", print),
        (UserRegistered, object),
        (UserRegistered, 42),
    ],
)
def test_listen_refuses_what_cannot_be_an_event_or_a_listener(event: Any, listener: Any) -> None:
    with pytest.raises(ConfigurationError):
        Dispatcher().listen(event, listener)


def test_a_listener_class_without_handle_is_refused() -> None:
    class NoHandle(Listener):
        pass

    with pytest.raises(ConfigurationError, match="no handle"):
        Dispatcher().listen(UserRegistered, NoHandle)


def test_extra_arguments_or_an_event_class_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="string events"):
        Dispatcher().dispatch(UserRegistered("a"), "extra")
    with pytest.raises(TypeError, match="not an event class"):
        Dispatcher().dispatch(UserRegistered)


def test_a_bad_item_in_a_listener_list_registers_none_of_the_list() -> None:
    d = Dispatcher()
    with pytest.raises(ConfigurationError):
        d.listen(UserRegistered, [print, 42])
    assert not d.has_listeners(UserRegistered)


# -- string events and wildcards -------------------------------------------------------


def test_string_events_pass_args_and_wildcards_get_the_name_first_in_global_order() -> None:
    d = Dispatcher()
    calls, make = recorder()
    d.listen("user.created", make("exact-1"))
    d.listen("user.*", make("wild-user"))
    d.listen("*", make("wild-all"))
    d.listen("user.created", make("exact-2"))
    d.listen("order.*", make("wild-order"))
    assert d.dispatch("user.created", 7, "x") == ["exact-1", "wild-user", "wild-all", "exact-2"]
    assert calls == [
        ("exact-1", 7, "x"),
        ("wild-user", "user.created", 7, "x"),
        ("wild-all", "user.created", 7, "x"),
        ("exact-2", 7, "x"),
    ]


def test_a_wildcard_star_matches_dots_and_only_star_is_special() -> None:
    d = Dispatcher()
    _calls, make = recorder()
    d.listen("app.*.done", make("w"))
    d.listen("a?c", make("literal"))
    assert d.dispatch("app.jobs.mail.done") == ["w"]
    assert d.dispatch("app.done") == []
    assert d.dispatch("abc") == []
    assert d.dispatch("a?c") == ["literal"]


# -- propagation -----------------------------------------------------------------------


def test_a_listener_returning_false_stops_propagation_and_is_left_out() -> None:
    d = Dispatcher()
    calls, make = recorder()
    d.listen(UserRegistered, make("first"))
    d.listen(UserRegistered, lambda e: False)
    d.listen(UserRegistered, make("never"))
    assert d.dispatch(UserRegistered("a")) == ["first"]
    assert [c[0] for c in calls] == ["first"]


def test_until_returns_the_first_non_none_result_and_stops() -> None:
    d = Dispatcher()
    calls: list[str] = []

    def none(e: object) -> None:
        calls.append("none")

    def zero(e: object) -> int:
        calls.append("zero")
        return 0

    def never(e: object) -> str:
        calls.append("never")
        return "never"

    d.listen(UserRegistered, [none, zero, never])
    assert d.until(UserRegistered("a")) == 0
    assert calls == ["none", "zero"]
    assert d.dispatch(UserRegistered("a"), halt=True) == 0
    assert Dispatcher().until(UserRegistered("a")) is None
    d.listen("ping", lambda: False)
    assert d.until("ping") is False


def test_an_exception_propagates_after_the_earlier_listeners_ran() -> None:
    d = Dispatcher()
    calls, make = recorder()

    def boom(event: object) -> None:
        raise RuntimeError("boom")

    d.listen(UserRegistered, [make("before"), boom, make("after")])
    with pytest.raises(RuntimeError, match="boom"):
        d.dispatch(UserRegistered("a"))
    assert [c[0] for c in calls] == ["before"]


# -- async -----------------------------------------------------------------------------


class AsyncGreet(Listener):
    async def handle(self, event: UserRegistered) -> str:
        await asyncio.sleep(0)
        return f"async {event.user}"


def test_dispatch_async_awaits_async_listeners_and_calls_sync_ones_in_order() -> None:
    d = Dispatcher()
    _calls, make = recorder()

    async def coro(event: UserRegistered) -> str:
        await asyncio.sleep(0)
        return "coro"

    d.listen(UserRegistered, [make("sync"), coro, AsyncGreet])
    assert asyncio.run(d.dispatch_async(UserRegistered("ada"))) == ["sync", "coro", "async ada"]


def test_dispatch_async_honours_false_and_halt() -> None:
    d = Dispatcher()

    async def stop(event: object) -> bool:
        return False

    async def first(event: object) -> None:
        return None

    d.listen(UserRegistered, [AsyncGreet, stop, AsyncGreet])
    assert asyncio.run(d.dispatch_async(UserRegistered("a"))) == ["async a"]
    d2 = Dispatcher()
    d2.listen(UserRegistered, [first, AsyncGreet, stop])
    assert asyncio.run(d2.dispatch_async(UserRegistered("b"), halt=True)) == "async b"


def test_sync_dispatch_with_an_async_listener_refuses_before_running_anything() -> None:
    d = Dispatcher()
    calls, make = recorder()
    d.listen(UserRegistered, [make("sync"), AsyncGreet])
    with pytest.raises(ConfigurationError, match="dispatch_async") as info:
        d.dispatch(UserRegistered("a"))
    assert "AsyncGreet" in str(info.value)
    assert calls == []


def test_sync_dispatch_refuses_async_listeners_inside_a_running_loop_too() -> None:
    d = Dispatcher()

    class CallableObject:
        async def __call__(self, event: object) -> None:
            return None

    d.listen(UserRegistered, CallableObject())

    async def main() -> None:
        with pytest.raises(ConfigurationError):
            d.dispatch(UserRegistered("a"))

    asyncio.run(main())


# -- subscribers -----------------------------------------------------------------------


def test_a_subscriber_class_registers_by_calling_listen() -> None:
    class Subscriber:
        def on_registered(self, event: UserRegistered) -> str:
            return "registered"

        def subscribe(self, dispatcher: Dispatcher) -> None:
            dispatcher.listen(UserRegistered, self.on_registered)

    d = Dispatcher()
    d.subscribe(Subscriber)
    assert d.dispatch(UserRegistered("a")) == ["registered"]


def test_a_subscriber_instance_may_return_a_mapping_of_method_names_and_callables() -> None:
    class Subscriber:
        def on_user(self, event: UserEvent) -> str:
            return "user"

        def on_ping(self, n: int) -> int:
            return n

        def subscribe(self, dispatcher: Dispatcher) -> dict[Any, Any]:
            return {UserEvent: "on_user", "ping": ["on_ping", lambda n: n * 10]}

    d = Dispatcher()
    d.subscribe(Subscriber())
    assert d.dispatch(UserRegistered("a")) == ["user"]
    assert d.dispatch("ping", 2) == [2, 20]


def test_a_subscriber_without_subscribe_or_with_a_bad_method_name_is_refused() -> None:
    class Nothing:
        pass

    class Typo:
        def subscribe(self, dispatcher: Dispatcher) -> dict[Any, Any]:
            return {UserEvent: "on_usr"}

    with pytest.raises(ConfigurationError, match="subscribe"):
        Dispatcher().subscribe(Nothing)
    with pytest.raises(ConfigurationError, match="on_usr"):
        Dispatcher().subscribe(Typo)


# -- forget, queries and the cache -----------------------------------------------------


def test_forget_removes_the_listeners_of_exactly_that_key() -> None:
    d = Dispatcher()
    _calls, make = recorder()
    keep, drop = make("keep"), make("drop")
    d.listen(UserEvent, make("base"))
    d.listen(UserRegistered, [keep, drop])
    d.listen("user.*", make("wild"))
    d.forget(UserRegistered, drop)
    assert d.dispatch(UserRegistered("a")) == ["base", "keep"]
    d.forget(UserRegistered)
    assert d.dispatch(UserRegistered("a")) == ["base"]
    d.forget("user.*")
    assert d.dispatch("user.created") == []
    d.forget("never.registered")


def test_has_listeners_follows_listen_and_forget_through_the_cache() -> None:
    d = Dispatcher()
    assert not d.has_listeners(AdminRegistered)
    assert not d.has_listeners("user.created")
    d.listen(UserEvent, print)  # a base class: the cached subclass answer must go stale
    assert d.has_listeners(AdminRegistered)
    assert d.has_listeners(AdminRegistered("instance"))
    d.listen("user.*", print)
    assert d.has_listeners("user.created")
    d.forget(UserEvent)
    d.forget("user.*")
    assert not d.has_listeners(AdminRegistered)
    assert not d.has_listeners("user.created")


def test_listeners_for_lists_what_would_hear_an_event_in_run_order() -> None:
    d = Dispatcher()

    class Greet(Listener):
        def handle(self, event: UserRegistered) -> None:
            return None

    d.listen(UserRegistered, Greet)
    d.listen(UserEvent, print)
    d.listen("user.*", repr)
    assert d.listeners_for(AdminRegistered("a")) == [Greet, print]
    assert d.listeners_for("user.x") == [repr]


def test_the_plan_cache_stays_bounded_with_dynamic_event_names() -> None:
    from tidings.events import dispatcher as module

    d = Dispatcher()
    for i in range(module._MAX_CACHED_PLANS + 10):
        d.dispatch(f"order.{i}")
    assert len(d._plans) <= module._MAX_CACHED_PLANS


# -- queued listeners ------------------------------------------------------------------


class QueuedWelcome(Listener, ShouldQueue):
    queue = "mail"
    handled: list[object] = []
    vetoed: list[object] = []

    def should_queue(self, event: UserRegistered) -> bool:
        QueuedWelcome.vetoed.append(event)
        return event.user != "bot"

    def handle(self, event: UserRegistered) -> None:
        QueuedWelcome.handled.append(event)


@queued
def queued_audit(event: object) -> None:
    """A module-level queued function."""


@queued(queue="high", tries=3)
def queued_wild(name: str, *args: object) -> None:
    """A queued wildcard listener."""


def test_a_queued_listener_is_pushed_not_run_and_its_job_id_is_the_result() -> None:
    pushed: list[tuple[Any, tuple[Any, ...]]] = []

    def push(target: Any, args: tuple[Any, ...]) -> str:
        pushed.append((target, args))
        return f"job-{len(pushed)}"

    d = Dispatcher(queue_listener=push)
    _calls, make = recorder()
    d.listen(UserRegistered, [make("sync"), QueuedWelcome, queued_audit])
    event = UserRegistered("ada")
    assert d.dispatch(event) == ["sync", "job-1", "job-2"]
    assert pushed == [(QueuedWelcome, (event,)), (queued_audit, (event,))]
    assert QueuedWelcome.handled == []


def test_should_queue_can_veto_and_the_vetoed_listener_gives_none() -> None:
    pushed: list[Any] = []

    def push(target: Any, args: tuple[Any, ...]) -> str:
        pushed.append(target)
        return "job"

    d = Dispatcher(queue_listener=push)
    d.listen(UserRegistered, QueuedWelcome)
    bot = UserRegistered("bot")
    assert d.dispatch(bot) == [None]
    assert pushed == []
    assert QueuedWelcome.vetoed[-1] is bot


def test_a_queued_wildcard_listener_gets_the_name_first_in_its_args() -> None:
    pushed: list[Any] = []

    def push(target: Any, args: tuple[Any, ...]) -> str:
        pushed.append((target, args))
        return "id"

    d = Dispatcher(queue_listener=push)
    d.listen("user.*", queued_wild)
    d.dispatch("user.created", 1, 2)
    assert pushed == [(queued_wild, ("user.created", 1, 2))]


def test_a_queued_listener_without_a_queue_callback_fails_before_anything_runs() -> None:
    d = Dispatcher()
    calls, make = recorder()
    d.listen(UserRegistered, [make("sync"), QueuedWelcome])
    with pytest.raises(ConfigurationError, match="queue_listener"):
        d.dispatch(UserRegistered("a"))
    with pytest.raises(ConfigurationError, match="queue_listener"):
        asyncio.run(d.dispatch_async(UserRegistered("a")))
    assert calls == []


def test_an_async_queued_listener_does_not_block_sync_dispatch() -> None:
    class AsyncQueued(Listener, ShouldQueue):
        async def handle(self, event: UserRegistered) -> None:
            return None

    d = Dispatcher(queue_listener=lambda target, args: "id")
    d.listen(UserRegistered, AsyncQueued)
    assert d.dispatch(UserRegistered("a")) == ["id"]


def test_dispatch_async_prefers_the_async_queue_callback_and_awaits_it() -> None:
    async def apush(target: Any, args: tuple[Any, ...]) -> str:
        await asyncio.sleep(0)
        return "async-job"

    d = Dispatcher(queue_listener=lambda t, a: "sync-job", queue_listener_async=apush)
    d.listen(UserRegistered, queued_audit)
    assert asyncio.run(d.dispatch_async(UserRegistered("a"))) == ["async-job"]
    assert d.dispatch(UserRegistered("a")) == ["sync-job"]
    only_async = Dispatcher(queue_listener_async=apush)
    only_async.listen(UserRegistered, queued_audit)
    assert asyncio.run(only_async.dispatch_async(UserRegistered("a"))) == ["async-job"]
    with pytest.raises(ConfigurationError):
        only_async.dispatch(UserRegistered("a"))
    sync_only = Dispatcher(queue_listener=lambda t, a: "sync-job")
    sync_only.listen(UserRegistered, QueuedWelcome)
    assert asyncio.run(sync_only.dispatch_async(UserRegistered("a"))) == ["sync-job"]


def test_queued_records_the_import_path_keeps_options_and_stays_callable() -> None:
    assert isinstance(queued_audit, QueuedFunction)
    assert queued_audit.path == f"{__name__}:queued_audit"
    assert queued_audit.queue is None and queued_audit.__doc__ == "A module-level queued function."
    assert (queued_wild.queue, queued_wild.tries) == ("high", 3)
    assert queued_wild("user.x", 1) is None
    assert QueuedWelcome.tries is None and QueuedWelcome.queue == "mail"


def test_queued_refuses_what_a_worker_could_not_import() -> None:
    def nested(event: object) -> None:
        return None

    with pytest.raises(ConfigurationError, match="lambda"):
        queued(lambda e: None)
    with pytest.raises(ConfigurationError, match="nested"):
        queued(nested)
    with pytest.raises(ConfigurationError, match="module-level function"):
        queued(print)
    with pytest.raises(ConfigurationError, match="module-level function"):
        queued(QueuedWelcome)


# -- discovery -------------------------------------------------------------------------


@pytest.fixture
def discovery_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.mark.usefixtures("discovery_path")
def test_discover_registers_listener_classes_by_their_handle_hint() -> None:
    from discovery_pkg.events import OrderCancelled, OrderPlaced, OrderShipped
    from discovery_pkg.listeners.orders import ChargeCard, NotifyCustomer, ReserveStock

    d = Dispatcher(queue_listener=lambda target, args: "job")
    found = d.discover("discovery_pkg")
    assert found == [
        (OrderPlaced, ReserveStock),
        (OrderShipped, NotifyCustomer),
        (OrderCancelled, NotifyCustomer),
        (OrderPlaced, ChargeCard),
    ]
    assert d.dispatch(OrderPlaced(1)) == ["reserved 1", "charged 1"]
    assert d.dispatch(OrderCancelled(2)) == ["job"]
    assert d.discover("discovery_pkg") == []
    assert d.listeners_for(OrderPlaced) == [ReserveStock, ChargeCard]


def test_discover_reports_an_unimportable_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "broken_listeners_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"broken_listeners_pkg\.sub"):
        Dispatcher().discover("broken_listeners_pkg")


def test_handled_events_refuses_an_unresolvable_hint() -> None:
    class Dangling(Listener):
        def handle(self, event: NoSuchEvent) -> None:  # type: ignore[name-defined]  # noqa: F821
            return None

    with pytest.raises(ConfigurationError, match="Dangling"):
        handled_events(Dangling)


# -- Event and the current dispatcher --------------------------------------------------


def test_event_dispatch_goes_through_the_installed_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tidings.events.listener._provider", None)
    with pytest.raises(ConfigurationError, match="no current tidings app"):
        Pinged(1).dispatch()
    d = Dispatcher()
    d.listen(Pinged, lambda e: e.n + 1)
    set_current_dispatcher_provider(lambda: d)
    assert current_dispatcher() is d
    assert Pinged(1).dispatch() == [2]
    assert asyncio.run(Pinged(5).dispatch_async()) == [6]


def test_bases_keep_no_state_so_slotted_dataclasses_work() -> None:
    @dataclass(slots=True, frozen=True)
    class Slotted(Event):
        n: int

    assert not hasattr(Slotted(1), "__dict__")


def test_tidings_events_exports_the_queued_decorator() -> None:
    assert tidings.events.queued is queued
