"""The event dispatcher: who hears an event, in which order, and what queued means.

:class:`Dispatcher` runs the listeners that :class:`~tidings.events.registry.ListenerRegistry`
(its base: ``listen``, ``subscribe``, ``forget``, ``discover``) keeps; how a registration
compiles into the cached plan a dispatch walks is described there.

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
import types
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal, Protocol, TypeAlias, cast, overload

from tidings.errors import ConfigurationError
from tidings.events.listener import current_dispatcher, set_current_dispatcher_provider
from tidings.events.registry import _MAX_CACHED_PLANS as _MAX_CACHED_PLANS  # kept importable
from tidings.events.registry import (
    EventKey,
    ListenerLike,
    ListenerRegistry,
    QueuedTarget,
    _Plan,
    _Registration,
)
from tidings.events.registry import _wildcard_regex as _wildcard_regex  # for .testing

__all__ = [
    "Dispatcher",
    "EventKey",
    "ListenerLike",
    "QueueCallback",
    "QueuedTarget",
    "current_dispatcher",
    "set_current_dispatcher_provider",
]

QueueCallback: TypeAlias = Callable[[QueuedTarget, tuple[Any, ...]], Any]
AsyncQueueCallback: TypeAlias = Callable[[QueuedTarget, tuple[Any, ...]], Awaitable[Any]]


class _Vetoing(Protocol):
    def should_queue(self, *args: Any) -> bool: ...


class Dispatcher(ListenerRegistry):
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
        super().__init__()

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

    # -- preflight and queued listeners ---------------------------------------------

    def _queued_registration(self, seq: int, key: EventKey, target: QueuedTarget) -> _Registration:
        veto = callable(getattr(target, "should_queue", None))
        push = partial(self._push, target, veto)
        return _Registration(seq, key, target, push, partial(self._apush, push), False)

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


def _describe(obj: object) -> str:
    if isinstance(obj, type | types.FunctionType | types.MethodType):
        return f"{obj.__module__}.{obj.__qualname__}"
    return repr(obj)
