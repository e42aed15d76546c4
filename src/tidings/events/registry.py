"""The listener registry behind the Dispatcher: listen, subscribe, forget, discover.

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

:class:`ListenerRegistry` is the registration half of
:class:`~tidings.events.dispatcher.Dispatcher` (its base class): it stores and compiles,
it never runs a listener. What a queued listener's registration calls (the push to the
queue callback) is the Dispatcher's, through :meth:`ListenerRegistry._queued_registration`.
"""

from __future__ import annotations

import inspect
import itertools
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeAlias, TypeVar, cast

import blinker

from tidings.errors import ConfigurationError
from tidings.events.listener import Listener, QueuedFunction, ShouldQueue, discover_listeners

__all__ = ["EventKey", "ListenerLike", "ListenerRegistry", "QueuedTarget"]

EventKey: TypeAlias = type[Any] | str
"""What listeners register for: an event class or an event name."""
QueuedTarget: TypeAlias = type[Listener] | QueuedFunction
"""What the queue callback receives: the listener class, or the queued function."""
ListenerLike: TypeAlias = type[Listener] | QueuedFunction | Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])

_MAX_CACHED_PLANS = 4096  # dynamic event names must not grow the cache without bound


_KEY_TYPES = (type, str)
"""What is already an event key (a tuple: ``type | str`` would build a union per call)."""


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

    __slots__ = ("acalls", "async_listeners", "calls", "listeners", "queued", "sync_calls")

    def __init__(self, regs: Sequence[_Registration], name: str | None) -> None:
        def bind(reg: _Registration, fn: Callable[..., Any]) -> Callable[..., Any]:
            # Wildcard listeners of a name get the name first; bind it once here.
            wildcard = name is not None and isinstance(reg.key, str) and "*" in reg.key
            return partial(fn, name) if wildcard else fn

        self.calls = tuple(bind(r, r.call) for r in regs)
        self.acalls = tuple(bind(r, r.acall) for r in regs)
        self.listeners = tuple(r.listener for r in regs)
        self.async_listeners = tuple(r.listener for r in regs if r.is_async)
        self.sync_calls = tuple(bind(r, r.call) for r in regs if not r.is_async)
        self.queued = any(r.call is not r.acall for r in regs)


class ListenerRegistry:
    """Keeps the listeners of each event class and name, and compiles them into plans.

    The base of :class:`~tidings.events.dispatcher.Dispatcher`, which adds running them;
    not meant to be used on its own.
    """

    def __init__(self) -> None:
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

        Cached per class or name: after the first call it is one dict lookup (inlined
        here: the worker asks twice a job, a queued notification twice more).
        """
        key = event if isinstance(event, _KEY_TYPES) else type(event)
        plan = self._plans.get(key) or self._compile(key)
        return bool(plan.calls)

    def has_async_listeners(self, event: object) -> bool:
        """Tell whether an ``async def`` listener would hear ``event`` (cached as above)."""
        return bool(self._plan_of(event).async_listeners)

    def dispatch_sync_part(self, event: object) -> None:
        """Run the sync (and queued) listeners of an object event, skipping async ones:
        for fire-and-forget events (the queue's lifecycle events) raised where no event
        loop runs. Results and ``False`` are ignored."""
        for call in self._plan_of(event).sync_calls:
            call(event)

    def listeners_for(self, event: object) -> list[ListenerLike]:
        """Return the listeners that would hear ``event``, in the order they run.

        Args:
            event: an event instance, an event class or an event name.
        """
        return list(self._plan_of(event).listeners)

    # -- internals ------------------------------------------------------------------

    def _register(self, key: EventKey, listener: ListenerLike) -> _Registration:
        seq = next(self._seq)
        if isinstance(listener, QueuedFunction) or (
            isinstance(listener, type) and issubclass(_listener_class(listener), ShouldQueue)
        ):
            return self._queued_registration(seq, key, cast(QueuedTarget, listener))
        if isinstance(listener, type):
            cls = _listener_class(listener)
            call = _instantiating(cls)
            return _Registration(seq, key, cls, call, call, _is_async(cls.handle))
        if not callable(listener):
            raise ConfigurationError(f"listener {listener!r} is not callable")
        return _Registration(seq, key, listener, listener, listener, _is_async(listener))

    def _plan_of(self, event: object) -> _Plan:
        key = event if isinstance(event, _KEY_TYPES) else type(event)
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

    def _queued_registration(self, seq: int, key: EventKey, target: QueuedTarget) -> _Registration:
        """What a queued listener registers as: a push, not a run (the Dispatcher's)."""
        raise NotImplementedError


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
