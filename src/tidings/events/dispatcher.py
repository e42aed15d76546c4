"""The event dispatcher: who hears an event, in which order, and what queued means.

Registry and hot path::

    listen(key, listener) ──▶ _Registration(seq, listener, call)
                              connected (weak=False) to the blinker Signal of `key`
    dispatch(event) ──▶ _plans[type(event) or name] ──miss──▶ _compile(key)
                          │                                   every Signal whose key is
                          ▼                                   in the class's MRO (or, for
                     for call in plan.calls: call(*args)      a name, the exact name and
                                                              matching wildcards), sorted
                                                              by seq

blinker keeps the receivers, strongly referenced, so a lambda or closure registered as
a listener lives as long as its registration. blinker promises no order and its
``send`` costs a set union and a generator per call, so dispatch does not go through
it: each event class or name compiles once into a :class:`_Plan` (a tuple of ready
callables in global registration order), cached until the next ``listen``/``forget``.

Calling conventions (the same for ``handle``, ``should_queue`` and ``failed``):

* object event: ``listener(event)``;
* string event, exact name: ``listener(*args)``;
* string event, wildcard (``"user.*"``, ``*`` matches any run of characters, dots
  included): ``listener(name, *args)``.

A queued listener (a :class:`Listener` subclass that also inherits
:class:`ShouldQueue`, or a :func:`queued` function) is not run. The dispatcher calls
``should_queue(*call_args)`` on a fresh instance when the class defines it (``False``
skips the listener, its result is ``None``), then ``queue_listener(target, call_args)``
where ``target`` is the listener class or :class:`QueuedFunction` and ``call_args`` is
exactly the tuple above; the callback's return (a job id) is that listener's result.
"""

from __future__ import annotations

import inspect
import itertools
import re
import threading
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal, Protocol, TypeAlias, TypeVar, cast, overload

import blinker

from tidings.errors import ConfigurationError
from tidings.events.listener import (
    Listener,
    QueuedFunction,
    ShouldQueue,
    current_dispatcher,
    discover_listeners,
    set_current_dispatcher_provider,
)

__all__ = [
    "Dispatcher",
    "EventKey",
    "ListenerLike",
    "QueueCallback",
    "QueuedTarget",
    "current_dispatcher",
    "set_current_dispatcher_provider",
]

EventKey: TypeAlias = type[Any] | str
"""What listeners register for: an event class or an event name."""
QueuedTarget: TypeAlias = type[Listener] | QueuedFunction
"""What the queue callback receives: the listener class, or the queued function."""
ListenerLike: TypeAlias = type[Listener] | QueuedFunction | Callable[..., Any]
QueueCallback: TypeAlias = Callable[[QueuedTarget, tuple[Any, ...]], Any]
AsyncQueueCallback: TypeAlias = Callable[[QueuedTarget, tuple[Any, ...]], Awaitable[Any]]
F = TypeVar("F", bound=Callable[..., Any])

_MAX_CACHED_PLANS = 4096  # dynamic event names must not grow the cache without bound


class _Vetoing(Protocol):
    def should_queue(self, *args: Any) -> bool: ...


class _Registration:
    """One ``listen`` call: the blinker receiver, with the order blinker lacks."""

    __slots__ = ("acall", "call", "is_async", "key", "listener", "seq")

    def __init__(
        self,
        seq: int,
        key: EventKey,
        listener: ListenerLike,
        call: Callable[..., Any],
        acall: Callable[..., Any],
        is_async: bool,
    ) -> None:
        self.seq = seq
        self.key = key
        self.listener = listener
        self.call = call  # what sync dispatch calls
        self.acall = acall  # what dispatch_async calls (differs only for queued ones)
        self.is_async = is_async

    def __call__(self, sender: Any, **_: Any) -> Any:
        # blinker's receiver signature, so a raw ``Signal.send(event)`` still works.
        return self.call(sender)


class _Plan:
    """Everything one dispatch of one event class or name needs, precomputed."""

    __slots__ = ("acalls", "async_listeners", "calls", "listeners", "queued")

    def __init__(self, regs: Sequence[_Registration], name: str | None) -> None:
        def bind(reg: _Registration, fn: Callable[..., Any]) -> Callable[..., Any]:
            # Wildcard listeners of a name get the name first; bind it once here.
            wildcard = name is not None and isinstance(reg.key, str) and "*" in reg.key
            return partial(fn, name) if wildcard else fn

        self.calls = tuple(bind(r, r.call) for r in regs)
        self.acalls = tuple(bind(r, r.acall) for r in regs)
        self.listeners = tuple(r.listener for r in regs)
        self.async_listeners = tuple(r.listener for r in regs if r.is_async)
        self.queued = any(r.call is not r.acall for r in regs)


class Dispatcher:
    """Registers listeners and dispatches events to them, in registration order.

    Args:
        queue_listener: called instead of running a queued listener, with the
            listener class (or :class:`QueuedFunction`) and the call arguments; its
            return value (a job id) becomes that listener's result.
        queue_listener_async: the same for :meth:`dispatch_async`, awaited; when
            unset, ``dispatch_async`` uses ``queue_listener``.

    Both callbacks are plain attributes, so an app may wire them after creation.
    """

    def __init__(
        self,
        *,
        queue_listener: QueueCallback | None = None,
        queue_listener_async: AsyncQueueCallback | None = None,
    ) -> None:
        self.queue_listener = queue_listener
        self.queue_listener_async = queue_listener_async
        self._signals: dict[EventKey, blinker.Signal] = {}
        self._wildcards: dict[str, re.Pattern[str]] = {}
        self._plans: dict[EventKey, _Plan] = {}
        self._seq = itertools.count()
        self._lock = threading.RLock()

    # -- registration -------------------------------------------------------------

    def listen(self, event: EventKey, listener: ListenerLike | Sequence[ListenerLike]) -> None:
        """Register one listener, or a list of them, for an event class or name.

        A :class:`Listener` subclass is instantiated per call and its ``handle``
        called; any other callable is called directly. Registering the same
        listener twice makes it run twice, as in Laravel.

        Args:
            event: an event class (its subclasses are heard too) or a name, where
                ``*`` in a name is a wildcard.
            listener: a Listener class, a :func:`queued` function, any callable, or a
                list of these.

        Raises:
            ConfigurationError: the event is not a class or a non-empty name, or a
                listener is neither callable nor a Listener class.
        """
        key = _event_key(event)
        listeners = list(listener) if isinstance(listener, Sequence) else [listener]
        with self._lock:
            # All validated before any is connected: a bad list registers nothing.
            regs = [self._register(key, item) for item in listeners]
            signal = self._signals.get(key)
            if signal is None:
                signal = self._signals[key] = blinker.Signal(repr(key))
                if isinstance(key, str) and "*" in key:
                    self._wildcards[key] = _wildcard_regex(key)
            for reg in regs:
                signal.connect(reg, weak=False)
            self._plans.clear()

    def listener(self, event: EventKey) -> Callable[[F], F]:
        """Decorator form of :meth:`listen`; returns the listener unchanged.

        Example::

            @dispatcher.listener(UserRegistered)
            def audit(event: UserRegistered) -> None: ...
        """

        def register(fn: F) -> F:
            self.listen(event, fn)
            return fn

        return register

    def subscribe(self, subscriber: object) -> None:
        """Let a subscriber register its listeners.

        The subscriber (a class, instantiated with no arguments, or an instance) has
        ``subscribe(dispatcher)``. It may call ``dispatcher.listen`` itself, or return
        a mapping ``{event: listener | method name | list of them}``.

        Raises:
            ConfigurationError: the subscriber has no ``subscribe`` method, or a
                method name in its mapping does not exist.
        """
        instance = subscriber() if isinstance(subscriber, type) else subscriber
        method = getattr(instance, "subscribe", None)
        if not callable(method):
            raise ConfigurationError(f"subscriber {subscriber!r} has no subscribe(dispatcher)")
        mapping = method(self)
        if not isinstance(mapping, Mapping):
            return
        for event, spec in mapping.items():
            items = spec if isinstance(spec, list | tuple) else [spec]
            resolved: list[ListenerLike] = []
            for item in items:
                if isinstance(item, str):
                    bound = getattr(instance, item, None)
                    if not callable(bound):
                        raise ConfigurationError(
                            f"subscriber {subscriber!r} has no method {item!r}"
                        )
                    item = bound
                resolved.append(item)
            self.listen(event, resolved)

    def forget(self, event: EventKey, listener: ListenerLike | None = None) -> None:
        """Remove every listener of an event class or name, or only ``listener``.

        Only registrations made for exactly this key are removed: forgetting a
        subclass leaves its base class's listeners in place.
        """
        key = _event_key(event)
        with self._lock:
            signal = self._signals.get(key)
            if signal is None:
                return
            for reg in list(_regs(signal)):
                if listener is None or reg.listener == listener:
                    signal.disconnect(reg)
            if not signal.receivers:
                del self._signals[key]
                if isinstance(key, str):
                    self._wildcards.pop(key, None)
            self._plans.clear()

    def discover(self, package: str) -> list[tuple[type[Any], type[Listener]]]:
        """Import every module under ``package`` and register the Listener classes.

        Each :class:`Listener` subclass defined in those modules is registered for
        the type hint of its ``handle(self, event: T)`` parameter (each member of a
        union). Abstract classes and classes whose hint is missing, ``Any`` or not a
        class are skipped: they are bases. A pair already registered is not
        registered again, so discovering twice is harmless.

        Args:
            package: dotted name of a package (or a single module).

        Returns:
            The ``(event class, listener class)`` pairs registered, in order.

        Raises:
            ConfigurationError: a module failed to import or a hint cannot be resolved.
        """
        found = []
        for event, cls in discover_listeners(package):
            if cls not in self.listeners_for(event):
                self.listen(event, cls)
                found.append((event, cls))
        return found

    # -- queries --------------------------------------------------------------------

    def has_listeners(self, event: object) -> bool:
        """Tell whether anything would hear ``event`` (an instance, class or name).

        Cached per class or name: after the first call it is one dict lookup.
        """
        return bool(self._plan_of(event).calls)

    def listeners_for(self, event: object) -> list[ListenerLike]:
        """Return the listeners that would hear ``event``, in the order they run.

        Args:
            event: an event instance, an event class or an event name.
        """
        return list(self._plan_of(event).listeners)

    # -- dispatch -------------------------------------------------------------------

    @overload
    def dispatch(self, event: object, *args: Any, halt: Literal[False] = False) -> list[Any]: ...
    @overload
    def dispatch(self, event: object, *args: Any, halt: bool) -> Any: ...

    def dispatch(self, event: object, *args: Any, halt: bool = False) -> Any:
        """Run the listeners of an event now, in registration order.

        An object event is heard by the listeners of its class and of every base
        class in its MRO (``object`` hears everything); a string event by the
        listeners of that exact name (with ``*args``) and of matching wildcards (with
        ``(name, *args)``). A listener returning ``False`` stops propagation and is
        left out of the results. An exception from a listener propagates to the
        caller; the listeners before it have run, the ones after it do not.

        Async listeners are never run here, not even when no event loop is running:
        a sync caller has no loop to run them on, and a private ``asyncio.run`` per
        listener would break anything bound to the app's loop. When any listener of
        the event is async, nothing runs and ``ConfigurationError`` says to use
        :meth:`dispatch_async`. Queued listeners do not count: they are only pushed.

        Args:
            event: an event object, or an event name.
            *args: for a name only, the arguments the listeners get.
            halt: stop at the first non-``None`` result and return it (see
                :meth:`until`).

        Returns:
            The listeners' results, in order; with ``halt``, the first non-``None``
            result or ``None``.

        Raises:
            ConfigurationError: the event has async listeners, or queued listeners
                and no ``queue_listener``.
        """
        if isinstance(event, str):
            key: EventKey = event
        else:
            if args:
                raise TypeError("extra arguments are only passed with string events")
            key = event.__class__
            args = (event,)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._compile(key)
        if plan.async_listeners or plan.queued:
            self._preflight(key, plan, sync=True)
        if halt:
            for call in plan.calls:
                result = call(*args)
                if result is not None:
                    return result
            return None
        results: list[Any] = []
        for call in plan.calls:
            result = call(*args)
            if result is False:
                break
            results.append(result)
        return results

    def until(self, event: object, *args: Any) -> Any:
        """Dispatch until a listener returns something other than ``None``.

        Returns:
            That first non-``None`` result (``False`` included), or ``None``.
        """
        return self.dispatch(event, *args, halt=True)

    @overload
    async def dispatch_async(
        self, event: object, *args: Any, halt: Literal[False] = False
    ) -> list[Any]: ...
    @overload
    async def dispatch_async(self, event: object, *args: Any, halt: bool) -> Any: ...

    async def dispatch_async(self, event: object, *args: Any, halt: bool = False) -> Any:
        """Like :meth:`dispatch`, awaiting async listeners; sync ones are called directly.

        Listeners still run one after another, in registration order, so that
        ``False`` can stop propagation and results keep their order.
        """
        if isinstance(event, str):
            key: EventKey = event
        else:
            if args:
                raise TypeError("extra arguments are only passed with string events")
            key = event.__class__
            args = (event,)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._compile(key)
        if plan.queued:
            self._preflight(key, plan, sync=False)
        results: list[Any] = []
        for call in plan.acalls:
            result = call(*args)
            if inspect.isawaitable(result):
                result = await result
            if halt:
                if result is not None:
                    return result
                continue
            if result is False:
                break
            results.append(result)
        return None if halt else results

    # -- internals ------------------------------------------------------------------

    def _register(self, key: EventKey, listener: ListenerLike) -> _Registration:
        seq = next(self._seq)
        if isinstance(listener, QueuedFunction) or (
            isinstance(listener, type) and issubclass(_listener_class(listener), ShouldQueue)
        ):
            veto = callable(getattr(listener, "should_queue", None))
            push = partial(self._push, cast(QueuedTarget, listener), veto)
            return _Registration(seq, key, listener, push, partial(self._apush, push), False)
        if isinstance(listener, type):
            cls = _listener_class(listener)
            call = _instantiating(cls)
            return _Registration(seq, key, cls, call, call, _is_async(cls.handle))
        if not callable(listener):
            raise ConfigurationError(f"listener {listener!r} is not callable")
        return _Registration(seq, key, listener, listener, listener, _is_async(listener))

    def _plan_of(self, event: object) -> _Plan:
        key = event if isinstance(event, type | str) else type(event)
        return self._plans.get(key) or self._compile(key)

    def _compile(self, key: EventKey) -> _Plan:
        with self._lock:  # so a plan built from a stale registry is never stored
            regs: list[_Registration] = []
            if isinstance(key, str):
                if "*" not in key and key in self._signals:
                    regs.extend(_regs(self._signals[key]))
                for pattern, regex in self._wildcards.items():
                    if regex.fullmatch(key):
                        regs.extend(_regs(self._signals[pattern]))
                regs.sort(key=lambda r: r.seq)
                plan = _Plan(regs, key)
            else:
                if issubclass(key, type):
                    # Not cached, so the mistake is reported on every dispatch.
                    raise TypeError("dispatch an event object, not an event class")
                for base in key.__mro__:
                    if base in self._signals:
                        regs.extend(_regs(self._signals[base]))
                regs.sort(key=lambda r: r.seq)
                plan = _Plan(regs, None)
            if len(self._plans) >= _MAX_CACHED_PLANS:
                self._plans.clear()
            self._plans[key] = plan
            return plan

    def _preflight(self, key: EventKey, plan: _Plan, *, sync: bool) -> None:
        # Checked before any listener runs, so a misconfiguration never half-runs.
        if sync and plan.async_listeners:
            names = ", ".join(_describe(x) for x in plan.async_listeners)
            raise ConfigurationError(
                f"{_describe(key)} has async listeners ({names}) that a sync dispatch "
                "cannot await; use `await dispatch_async(event)` from async code, or "
                "make them queued (ShouldQueue)"
            )
        no_callback = self.queue_listener is None and (sync or self.queue_listener_async is None)
        if plan.queued and no_callback:
            raise ConfigurationError(
                f"{_describe(key)} has queued listeners but this Dispatcher has no "
                "queue_listener; dispatch through an App, or pass queue_listener="
            )

    def _push(self, target: QueuedTarget, veto: bool, *args: Any, use_async: bool = False) -> Any:
        """Veto or hand a queued listener to the queue callback; its job id is the result."""
        if veto and not cast(_Vetoing, cast(type, target)()).should_queue(*args):
            return None
        if use_async and self.queue_listener_async is not None:
            return self.queue_listener_async(target, args)
        assert self.queue_listener is not None  # _preflight checked it
        return self.queue_listener(target, args)

    @staticmethod
    async def _apush(push: Callable[..., Any], *args: Any) -> Any:
        result = push(*args, use_async=True)
        return await result if inspect.isawaitable(result) else result


# -- helpers --------------------------------------------------------------------------


def _event_key(event: object) -> EventKey:
    if isinstance(event, type):
        return event
    if isinstance(event, str) and event:
        return event
    raise ConfigurationError(
        f"listeners register for an event class or a non-empty name, got {event!r}"
    )


def _regs(signal: blinker.Signal) -> list[_Registration]:
    # Every receiver is a _Registration connected with weak=False; dict order is
    # connection order, though only seq orders across signals.
    return cast(list[_Registration], list(signal.receivers.values()))


def _wildcard_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def _listener_class(cls: type[Any]) -> type[Listener]:
    if not issubclass(cls, Listener):
        raise ConfigurationError(
            f"{cls.__qualname__} is a class but not a tidings Listener; "
            "subclass Listener (with handle(self, event)) or pass a function"
        )
    if not callable(getattr(cls, "handle", None)):
        raise ConfigurationError(f"{cls.__qualname__} has no handle(self, event)")
    return cls


def _instantiating(cls: type[Listener]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return cls().handle(*args)

    call.__qualname__ = f"{cls.__qualname__}.handle"
    return call


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with async __call__
    )


def _describe(obj: object) -> str:
    if isinstance(obj, type | types.FunctionType | types.MethodType):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)
