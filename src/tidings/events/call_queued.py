"""CallQueuedListener: the job that carries a queued listener to a worker."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from tidings import _current
from tidings.errors import PayloadRejected
from tidings.events.listener import Listener, QueuedFunction
from tidings.jobs.job import Job
from tidings.wire.serializer import class_path


@dataclass
class CallQueuedListener(Job):
    """Runs ``listener`` (a Listener class or queued function path) with ``args``.

    Attributes:
        listener: ``module:QualName`` of the listener class or queued function.
        args: the call arguments: ``(event,)``, or a string event's ``*args``.
    """

    listener: str
    args: tuple[Any, ...]

    @classmethod
    def for_target(
        cls, target: type[Listener] | QueuedFunction, args: tuple[Any, ...]
    ) -> CallQueuedListener:
        """The job for a queued listener class or function."""
        path = target.path if isinstance(target, QueuedFunction) else class_path(target)
        job = cls(path, tuple(args))
        object.__setattr__(job, "_target", target)
        return job

    def _resolve(self) -> Any:
        target = getattr(self, "_target", None)
        if target is None:
            app = _current.current()
            target = app.resolve_class(self.listener)
            if not (
                isinstance(target, QueuedFunction)
                or (isinstance(target, type) and issubclass(target, Listener))
            ):
                raise PayloadRejected(f"{self.listener!r} is not a listener")
            if isinstance(target, QueuedFunction) and not app.is_allowed(target.fn.__module__):
                # As resolve_class does for classes: an allowed module that imported a
                # queued function from elsewhere does not make that function allowed.
                raise PayloadRejected(
                    f"{self.listener!r} wraps {target.path}, outside the allowed modules"
                )
            object.__setattr__(self, "_target", target)
        return target

    def option_source(self) -> Any:
        """Options come from the listener class (or the queued function's options)."""
        target = self._resolve()
        return target if isinstance(target, QueuedFunction) else target()

    def group_args(self) -> tuple[Any, ...]:
        """A listener's ``group`` hook gets the event arguments (e.g. the event)."""
        return tuple(self.args)

    def display_name(self) -> str:
        """The listener's name."""
        return self.listener.rpartition(":")[2]

    def middleware(self) -> list[Any]:
        """The listener's ``middleware()``, when it defines one."""
        target = self._resolve()
        hook = None if isinstance(target, QueuedFunction) else getattr(target(), "middleware", None)
        return list(hook()) if callable(hook) else []

    def runs_async(self) -> bool:
        """Whether the listener's handle is ``async def``."""
        target = self._resolve()
        fn = target.fn if isinstance(target, QueuedFunction) else getattr(target, "handle", None)
        return inspect.iscoroutinefunction(fn)

    def handle(self) -> Any:
        """Run the listener; an async ``handle`` is awaited by the worker."""
        target = self._resolve()
        if isinstance(target, QueuedFunction):
            return target.fn(*self.args)
        return target().handle(*self.args)

    async def failed(self, exc: BaseException) -> None:
        """Call the listener's ``failed(*args, exc)`` when it has one."""
        target = self._resolve()
        hook = None if isinstance(target, QueuedFunction) else getattr(target(), "failed", None)
        if hook is not None:
            out = hook(*self.args, exc)
            if inspect.isawaitable(out):
                await out
