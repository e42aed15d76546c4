"""Fake events for users' tests: record what is dispatched, run nothing.

::

    with fake_events(app) as events:
        register_user("ada@example.com")
        events.assert_dispatched(UserRegistered, lambda e: e.email == "ada@example.com")
        events.assert_not_dispatched(UserDeleted)

``fake_events`` swaps ``app.events`` for a :class:`FakeDispatcher` and puts the real
one back on exit. Registration (``listen``, ``subscribe``, ``forget`` ...) still goes to
the real dispatcher, so code under test that registers listeners keeps working and
``assert_listening`` checks real registrations. With ``only=[E, ...]`` just those
events are faked; every other event runs through the real dispatcher as usual.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol, overload

from tidings.events.dispatcher import Dispatcher, EventKey, ListenerLike, _wildcard_regex
from tidings.events.listener import Listener, QueuedFunction

__all__ = ["FakeDispatcher", "fake_events"]

_SHOWN = 20  # dispatched events listed in a failure message


class FakeDispatcher(Dispatcher):
    """A dispatcher that records events instead of running their listeners.

    Args:
        real: the dispatcher it stands in for; registrations and the events that are
            not faked go to it.
        only: fake just these event classes (subclasses included) and names; ``None``
            fakes everything.

    Attributes:
        recorded: every faked dispatch, in order, as ``(event, ())`` for an object
            event or ``(name, args)`` for a string event.
    """

    def __init__(self, real: Dispatcher, only: Sequence[EventKey] | None = None) -> None:
        super().__init__(
            queue_listener=real.queue_listener, queue_listener_async=real.queue_listener_async
        )
        self.real = real
        self.only = tuple(only) if only is not None else None
        self.recorded: list[tuple[object, tuple[Any, ...]]] = []

    def fakes(self, event: object) -> bool:
        """Tell whether ``event`` (an instance or a name) is recorded, not run."""
        if self.only is None:
            return True
        if isinstance(event, str):
            return event in self.only
        return any(isinstance(key, type) and isinstance(event, key) for key in self.only)

    # -- dispatch: record or forward ------------------------------------------------

    @overload
    def dispatch(self, event: object, *args: Any, halt: Literal[False] = False) -> list[Any]: ...
    @overload
    def dispatch(self, event: object, *args: Any, halt: bool) -> Any: ...

    def dispatch(self, event: object, *args: Any, halt: bool = False) -> Any:
        """Record ``event`` if it is faked (returning no results), else dispatch it."""
        if not self.fakes(event):
            return self.real.dispatch(event, *args, halt=halt)
        self.recorded.append((event, args))
        return None if halt else []

    def until(self, event: object, *args: Any) -> Any:
        """Record ``event`` if it is faked (returning ``None``), else run ``until``."""
        return self.dispatch(event, *args, halt=True)

    @overload
    async def dispatch_async(
        self, event: object, *args: Any, halt: Literal[False] = False
    ) -> list[Any]: ...
    @overload
    async def dispatch_async(self, event: object, *args: Any, halt: bool) -> Any: ...

    async def dispatch_async(self, event: object, *args: Any, halt: bool = False) -> Any:
        """Async twin of :meth:`dispatch`."""
        if not self.fakes(event):
            return await self.real.dispatch_async(event, *args, halt=halt)
        self.recorded.append((event, args))
        return None if halt else []

    def _faked(self, event: object) -> bool:
        """:meth:`fakes`, also for an event class."""
        if isinstance(event, type):
            return self.only is None or any(
                isinstance(key, type) and issubclass(event, key) for key in self.only
            )
        return self.fakes(event)

    def has_listeners(self, event: object) -> bool:
        """True for a faked event, so code that skips unheard events still records it."""
        return self._faked(event) or self.real.has_listeners(event)

    def has_async_listeners(self, event: object) -> bool:
        """False for a faked event (it is recorded, not run), else the real answer."""
        return not self._faked(event) and self.real.has_async_listeners(event)

    def dispatch_sync_part(self, event: object) -> None:
        """Record ``event`` if it is faked, else run the real sync listeners."""
        if self.fakes(event):
            self.recorded.append((event, ()))
        else:
            self.real.dispatch_sync_part(event)

    # -- registration and queries: the real dispatcher's ---------------------------

    def listen(self, event: EventKey, listener: ListenerLike | Sequence[ListenerLike]) -> None:
        """Register on the real dispatcher."""
        self.real.listen(event, listener)

    def listener(self, event: EventKey) -> Callable[[Any], Any]:
        """Decorator registering on the real dispatcher."""
        return self.real.listener(event)

    def subscribe(self, subscriber: object) -> None:
        """Subscribe on the real dispatcher."""
        self.real.subscribe(subscriber)

    def forget(self, event: EventKey, listener: ListenerLike | None = None) -> None:
        """Forget on the real dispatcher."""
        self.real.forget(event, listener)

    def discover(self, package: str) -> list[tuple[type[Any], type[Listener]]]:
        """Discover into the real dispatcher."""
        return self.real.discover(package)

    def listeners_for(self, event: object) -> list[ListenerLike]:
        """The real dispatcher's listeners for ``event``."""
        return self.real.listeners_for(event)

    # -- assertions -----------------------------------------------------------------

    def dispatched(
        self, event: EventKey, predicate: Callable[..., bool] | None = None
    ) -> list[Any]:
        """Return what was recorded for an event class or name, in order.

        Args:
            event: an event class (instances of subclasses count), an exact name, or
                a wildcard name such as ``"user.*"``.
            predicate: keep only the dispatches it accepts; it is called like a
                listener would be: ``(event)``, ``(*args)`` or ``(name, *args)``.

        Returns:
            Event objects for a class; ``args`` tuples for an exact name;
            ``(name, *args)`` tuples for a wildcard.
        """
        found: list[Any] = []
        regex: re.Pattern[str] | None = None
        if isinstance(event, str) and "*" in event:
            regex = _wildcard_regex(event)
        for recorded, args in self.recorded:
            if isinstance(event, type):
                if isinstance(recorded, str) or not isinstance(recorded, event):
                    continue
                item: Any = recorded
                call_args: tuple[Any, ...] = (recorded,)
            elif not isinstance(recorded, str):
                continue
            elif regex is not None:
                if not regex.fullmatch(recorded):
                    continue
                item = call_args = (recorded, *args)
            elif recorded == event:
                item = call_args = args
            else:
                continue
            if predicate is None or predicate(*call_args):
                found.append(item)
        return found

    def assert_dispatched(
        self,
        event: EventKey,
        predicate: Callable[..., bool] | None = None,
        times: int | None = None,
    ) -> None:
        """Assert ``event`` was dispatched (``times`` times, when given).

        Raises:
            AssertionError: it was not, with the list of what was dispatched.
        """
        count = len(self.dispatched(event, predicate))
        if (count > 0) if times is None else (count == times):
            return
        wanted = "at least once" if times is None else _times(times)
        raise AssertionError(
            f"Expected {_name(event)} to be dispatched {wanted}{_matching(predicate)}, "
            f"but it was dispatched {_times(count)}.\n{self._summary()}"
        )

    def assert_not_dispatched(
        self, event: EventKey, predicate: Callable[..., bool] | None = None
    ) -> None:
        """Assert ``event`` was not dispatched (or never matched ``predicate``).

        Raises:
            AssertionError: it was, with the list of what was dispatched.
        """
        count = len(self.dispatched(event, predicate))
        if count:
            raise AssertionError(
                f"Expected {_name(event)} not to be dispatched{_matching(predicate)}, "
                f"but it was dispatched {_times(count)}.\n{self._summary()}"
            )

    def assert_nothing_dispatched(self) -> None:
        """Assert no faked event was dispatched at all.

        Raises:
            AssertionError: something was, with the list.
        """
        if self.recorded:
            raise AssertionError(
                f"Expected no events to be dispatched, but {len(self.recorded)} were.\n"
                f"{self._summary()}"
            )

    def assert_listening(self, event: EventKey, listener: ListenerLike) -> None:
        """Assert ``listener`` would hear ``event`` on the real dispatcher.

        A :func:`queued` function matches by itself or by the function it wraps.

        Raises:
            AssertionError: it would not, with the listeners that would.
        """
        listeners = self.real.listeners_for(event)
        for found in listeners:
            if found == listener or (isinstance(found, QueuedFunction) and found.fn == listener):
                return
        shown = ", ".join(_name(x) for x in listeners) or "none"
        raise AssertionError(
            f"Expected {_name(listener)} to listen to {_name(event)}; its listeners: {shown}."
        )

    def _summary(self) -> str:
        if not self.recorded:
            return "Nothing was dispatched."
        lines = [f"  {_show(event, args)}" for event, args in self.recorded[:_SHOWN]]
        if len(self.recorded) > _SHOWN:
            lines.append(f"  ... and {len(self.recorded) - _SHOWN} more")
        return "Dispatched:\n" + "\n".join(lines)


class _HasEvents(Protocol):
    events: Dispatcher


@contextmanager
def fake_events(
    owner: _HasEvents, only: Sequence[EventKey] | None = None
) -> Iterator[FakeDispatcher]:
    """Swap ``owner.events`` for a :class:`FakeDispatcher` for the ``with`` block.

    Args:
        owner: the App (anything with an ``events`` Dispatcher attribute).
        only: fake just these event classes and names; the rest run for real.

    Yields:
        The fake, to make assertions on.
    """
    real = owner.events
    fake = FakeDispatcher(real, only=only)
    owner.events = fake
    try:
        yield fake
    finally:
        owner.events = real


def _name(obj: object) -> str:
    if isinstance(obj, str):
        return repr(obj)
    return getattr(obj, "__qualname__", None) or repr(obj)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _matching(predicate: Callable[..., bool] | None) -> str:
    return "" if predicate is None else " matching the predicate"


def _show(event: object, args: tuple[Any, ...]) -> str:
    text = f"{event!r} {args!r}" if isinstance(event, str) else repr(event)
    return text if len(text) <= 160 else text[:157] + "..."
