"""The bases users write events and listeners on.

* :class:`Event` is an optional base for event objects; it only adds ``.dispatch()``
  and ``.dispatch_async()`` that go through the current app's dispatcher.
* :class:`Listener` is the base for listener classes. The dispatcher instantiates the
  class with no arguments for every call and calls ``handle(event)`` (sync or
  ``async def``). Per-listener queue options are plain class attributes.
* :class:`ShouldQueue` is a marker: a ``Listener`` that also inherits it is not run at
  dispatch; the dispatcher hands it to its ``queue_listener`` callback instead.
* :func:`queued` marks a module-level function as a queued listener. The worker must
  be able to import it again from its ``module:qualname`` path, so lambdas, closures
  and nested functions are refused when they are decorated, not when a job fails.
* :func:`discover_listeners` finds Listener classes in a package by the type hint of
  their ``handle`` (what ``Dispatcher.discover`` registers).
* :func:`set_current_dispatcher_provider` / :func:`current_dispatcher`: the hook the
  App installs so ``Event.dispatch()`` reaches the current app's dispatcher.

Every base here has ``__slots__ = ()`` and no ``__init__``, so events and listeners can
be ``@dataclass(slots=True)`` subclasses without fighting the base.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types
import typing
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, overload

from tidings.errors import ConfigurationError

__all__ = [
    "Event",
    "EventBus",
    "Listener",
    "QueuedFunction",
    "ShouldQueue",
    "current_dispatcher",
    "discover_listeners",
    "handled_events",
    "queued",
    "set_current_dispatcher_provider",
]


class ShouldQueue:
    """Marker mixin: a listener (or notification) that inherits it is queued.

    It carries no state and no behaviour; the dispatcher only tests ``issubclass``.
    """

    __slots__ = ()


class _QueueOptions:
    """Per-listener queue options, read by the job that carries a queued listener.

    ``None`` everywhere means "use the worker's default". They are class attributes
    on purpose: a listener class is instantiated fresh for every call, so there is no
    instance to configure.
    """

    __slots__ = ()

    connection: str | None = None
    """Name of the queue connection; ``None`` is the app's default."""
    queue: str | None = None
    """Queue name to push onto; ``None`` is ``default``."""
    delay: float | timedelta | None = None
    """Seconds (or a timedelta) before the job becomes ready."""
    tries: int | None = None
    """How many times the job may be attempted."""
    backoff: float | Sequence[float] | None = None
    """Seconds before a retry; a sequence gives one delay per attempt."""
    timeout: float | None = None
    """Seconds one attempt may run before it is failed or released."""
    retry_until: float | timedelta | datetime | None = None
    """Stop retrying after this many seconds / this timedelta from dispatch, or at this
    datetime."""
    max_exceptions: int | None = None
    """How many attempts may raise before the job fails, releases not counted."""
    after_commit: bool | None = None
    """Push when the surrounding database transaction commits, drop on rollback;
    ``None`` is the App's ``after_commit`` (see :mod:`tidings.after_commit`)."""
    delete_when_missing_models: bool | None = None
    """Drop (True) or fail (False) the job when a model argument's row is gone; ``None``
    is the App's ``missing_models``."""


class Listener(_QueueOptions):
    """Base class for listener classes.

    Subclasses define ``handle(self, event)``, plain or ``async def``. The type hint
    of ``event`` is what :meth:`Dispatcher.discover` registers the class for. Two
    optional hooks matter only for queued listeners (also inheriting
    :class:`ShouldQueue`):

    * ``should_queue(self, event) -> bool`` runs at dispatch; ``False`` vetoes the job.
    * ``failed(self, event, exc)`` runs when the job has finally failed.

    Both receive the same positional arguments as ``handle`` (for string events that
    is ``*args``, or ``(name, *args)`` for wildcard listeners). They are looked up,
    not declared here, so that a subclass may narrow ``event`` to its own event type
    without breaking ``mypy``'s override rules.

    Example::

        class SendWelcomeEmail(Listener, ShouldQueue):
            queue = "mail"
            tries = 3

            def handle(self, event: UserRegistered) -> None: ...
    """

    __slots__ = ()

    if TYPE_CHECKING:
        # Declared for type checkers only: a Callable attribute lets each subclass
        # define ``handle`` with its own event type (a method here could not be
        # narrowed). The dispatcher checks at listen() time that it exists.
        handle: Callable[..., Any]


class Event:
    """Optional base for events; adds ``dispatch()`` through the current app.

    Events are plain objects and need not inherit this; ``@dataclass`` subclasses
    are the norm.
    """

    __slots__ = ()

    def dispatch(self) -> list[Any]:
        """Dispatch this event through the current app's dispatcher.

        Returns:
            The listeners' results in order (see :meth:`Dispatcher.dispatch`).

        Raises:
            ConfigurationError: no app is current.
        """
        return current_dispatcher().dispatch(self)

    async def dispatch_async(self) -> list[Any]:
        """Dispatch this event and await its async listeners.

        Returns:
            The listeners' results in order (see :meth:`Dispatcher.dispatch_async`).
        """
        return await current_dispatcher().dispatch_async(self)


# -- current dispatcher -------------------------------------------------------------
# Lives here, beside Event.dispatch(), so this module needs nothing from dispatcher.py
# at run time; tidings.events.dispatcher re-exports both functions.


class EventBus(Protocol):
    """What :meth:`Event.dispatch` needs of the current app's dispatcher (a
    :class:`~tidings.events.dispatcher.Dispatcher`, or a test's fake)."""

    def dispatch(self, event: object) -> list[Any]: ...
    async def dispatch_async(self, event: object) -> list[Any]: ...


_provider: Callable[[], EventBus] | None = None


def set_current_dispatcher_provider(provider: Callable[[], EventBus] | None) -> None:
    """Install the function that returns the current app's dispatcher.

    The App installs it. It should read ``app.events`` on every call rather than
    capture one Dispatcher, so that ``fake_events`` swapping ``app.events`` is seen.
    ``None`` uninstalls it.
    """
    global _provider
    _provider = provider


def current_dispatcher() -> EventBus:
    """Return the current app's dispatcher.

    Raises:
        ConfigurationError: no App has been created (or made current) yet.
    """
    if _provider is None:
        raise ConfigurationError(
            "no current tidings app: create tidings.App(...) (or call app.make_current()) "
            "before dispatching events"
        )
    return _provider()


class QueuedFunction(_QueueOptions):
    """A module-level function marked as a queued listener by :func:`queued`.

    The object replaces the function in its module, so importing ``path`` gives this
    object back; calling it calls the function. Options are per instance here,
    since each decorated function is its own "class".

    Attributes:
        fn: the wrapped function.
        path: ``module:qualname``, what a worker imports to run it.
    """

    def __init__(self, fn: Callable[..., Any], path: str) -> None:
        self.fn = fn
        self.path = path
        # functools.update_wrapper-style metadata, so introspection and repr work.
        self.__dict__.update(
            __name__=fn.__name__,
            __qualname__=fn.__qualname__,
            __module__=fn.__module__,
            __doc__=fn.__doc__,
            __wrapped__=fn,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function now, in this process."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<queued {self.path}>"


@overload
def queued(fn: Callable[..., Any], /) -> QueuedFunction: ...


@overload
def queued(
    *,
    connection: str | None = None,
    queue: str | None = None,
    delay: float | timedelta | None = None,
    tries: int | None = None,
    backoff: float | Sequence[float] | None = None,
    timeout: float | None = None,
    retry_until: float | timedelta | datetime | None = None,
    max_exceptions: int | None = None,
    after_commit: bool | None = None,
) -> Callable[[Callable[..., Any]], QueuedFunction]: ...


def queued(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    connection: str | None = None,
    queue: str | None = None,
    delay: float | timedelta | None = None,
    tries: int | None = None,
    backoff: float | Sequence[float] | None = None,
    timeout: float | None = None,
    retry_until: float | timedelta | datetime | None = None,
    max_exceptions: int | None = None,
    after_commit: bool | None = None,
) -> QueuedFunction | Callable[[Callable[..., Any]], QueuedFunction]:
    """Mark a module-level function as a queued listener.

    Use bare (``@queued``) or with options (``@queued(queue="mail", tries=3)``); the
    options mean what the :class:`Listener` class attributes of the same names mean.

    Args:
        fn: the function, when used bare.
        connection: queue connection name.
        queue: queue name.
        delay: seconds or timedelta before the job is ready.
        tries: attempts allowed.
        backoff: seconds between attempts, or one per attempt.
        timeout: seconds one attempt may run.
        retry_until: give up after this many seconds / timedelta, or at this datetime.
        max_exceptions: attempts that may raise before the job fails.
        after_commit: push when the surrounding transaction commits (None: the App's).

    Returns:
        A :class:`QueuedFunction`, or a decorator that makes one.

    Raises:
        ConfigurationError: ``fn`` is a lambda, a closure, a nested function or not a
            function at all; a worker could not import it back.
    """

    def wrap(f: Callable[..., Any]) -> QueuedFunction:
        target = QueuedFunction(f, _import_path(f))
        target.connection = connection
        target.queue = queue
        target.delay = delay
        target.tries = tries
        target.backoff = backoff
        target.timeout = timeout
        target.retry_until = retry_until
        target.max_exceptions = max_exceptions
        target.after_commit = after_commit
        return target

    return wrap if fn is None else wrap(fn)


def _import_path(fn: Callable[..., Any]) -> str:
    """Return ``module:qualname`` for ``fn``, refusing what a worker cannot import."""
    if not inspect.isfunction(fn):
        raise ConfigurationError(
            f"queued() takes a module-level function, got {fn!r}; "
            "use a Listener subclass with ShouldQueue for classes"
        )
    name = fn.__qualname__
    if fn.__name__ == "<lambda>":
        raise ConfigurationError(
            f"queued() cannot take a lambda ({fn.__module__}.{name}): a worker "
            "imports queued listeners by name; define a module-level function"
        )
    if "<locals>" in name or fn.__closure__:
        raise ConfigurationError(
            f"queued() cannot take a nested function or closure ({fn.__module__}.{name}):"
            " a worker imports queued listeners by name; define it at module level"
        )
    module = fn.__module__
    if module == "__main__":
        # A script run as ``python -m pkg.mod`` knows its importable name; a bare
        # ``python app.py`` does not, and the path stays __main__ (the job will
        # then fail in the worker with a clear import error).
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
    return f"{module}:{name}"


# -- discovery ----------------------------------------------------------------------


def discover_listeners(package: str) -> list[tuple[type[Any], type[Listener]]]:
    """Import every module under ``package`` and list its Listener classes' events.

    Each :class:`Listener` subclass defined in those modules (not merely imported
    there) is paired with each event class :func:`handled_events` finds for it;
    abstract classes are left out. Modules are walked in name order and classes in
    definition order, so the result (and the registration order) is stable.

    Args:
        package: dotted name of a package (or a single module).

    Returns:
        ``(event class, listener class)`` pairs.

    Raises:
        ConfigurationError: a module failed to import or a hint cannot be resolved.
    """
    root = _import(package)
    modules = [root]
    path = getattr(root, "__path__", None)
    if path is not None:
        for info in pkgutil.walk_packages(path, root.__name__ + ".", onerror=_import_failed):
            modules.append(_import(info.name))
    found: list[tuple[type[Any], type[Listener]]] = []
    for module in modules:
        for obj in list(vars(module).values()):
            if (
                isinstance(obj, type)
                and issubclass(obj, Listener)
                and obj.__module__ == module.__name__
                and not inspect.isabstract(obj)
            ):
                found.extend((event, obj) for event in handled_events(obj))
    return found


def handled_events(cls: type[Listener]) -> list[type[Any]]:
    """Return the event classes named by the hint of ``cls.handle``'s event parameter.

    A union gives each of its classes. A missing hint, ``Any``, a type variable or
    any non-class hint gives ``[]``: such a class is a base, not a listener.

    Raises:
        ConfigurationError: the hints cannot be resolved (a forward reference to a
            name the module does not define).
    """
    handle = getattr(cls, "handle", None)
    if not callable(handle):
        return []
    params = list(inspect.signature(handle).parameters.values())
    if len(params) < 2:  # (self, event)
        return []
    try:
        hints = typing.get_type_hints(handle)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the type hints of {cls.__module__}.{cls.__qualname__}.handle: {exc}"
        ) from exc
    hint = hints.get(params[1].name)
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    # typing.Any is a class since 3.11; it and None mark a base, not an event.
    return [m for m in members if isinstance(m, type) and m not in (Any, type(None))]


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise ConfigurationError(f"discover could not import {name}: {exc}") from exc


def _import_failed(name: str) -> None:
    # walk_packages would silently skip a package whose import raised ImportError.
    raise ConfigurationError(f"discover could not import {name}") from sys.exc_info()[1]
