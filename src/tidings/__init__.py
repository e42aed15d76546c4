"""tidings: application events, listeners and notifications over one Redis job queue.

::

    from tidings import App, Event, Listener, ShouldQueue, Job, event, dispatch, chain

    app = App.from_env()
    app.listen(UserRegistered, SendWelcomeEmail)
    event(UserRegistered(user))
"""

from __future__ import annotations

from typing import Any

from tidings import _current
from tidings.app import App
from tidings.errors import (
    ChannelError,
    ConfigurationError,
    PayloadTooLarge,
    QueueUnavailable,
    SerializationError,
    TidingsError,
    ValidationError,
)
from tidings.events.call_queued import CallQueuedListener
from tidings.events.dispatcher import Dispatcher
from tidings.events.listener import Event, Listener, ShouldQueue, queued
from tidings.queue.backoff import Exponential
from tidings.queue.chain import chain
from tidings.queue.job import Job, PendingDispatch

__all__ = [
    "App",
    "CallQueuedListener",
    "ChannelError",
    "ConfigurationError",
    "Dispatcher",
    "Event",
    "Exponential",
    "Job",
    "Listener",
    "PayloadTooLarge",
    "PendingDispatch",
    "QueueUnavailable",
    "SerializationError",
    "ShouldQueue",
    "TidingsError",
    "ValidationError",
    "chain",
    "dispatch",
    "event",
    "listen",
    "queued",
]


def event(e: Any, *args: Any) -> Any:
    """Dispatch an event on the current App; returns the listeners' results."""
    return _current.current().dispatch(e, *args)


def dispatch(job: Job | PendingDispatch) -> str:
    """Push a job on the current App; returns the job id."""
    pending = job if isinstance(job, PendingDispatch) else PendingDispatch(job)
    return pending.dispatch()


def listen(event_key: Any, listener: Any) -> None:
    """Register a listener on the current App."""
    _current.current().listen(event_key, listener)
