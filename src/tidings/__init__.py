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
from tidings._version import __version__ as __version__
from tidings.app import App
from tidings.errors import (
    BatchClosed,
    ChannelError,
    ConfigurationError,
    JobCancelled,
    JobFailedError,
    JobNotFound,
    PayloadTooLarge,
    QueueUnavailable,
    ResultMissing,
    ResultTooLarge,
    SerializationError,
    TidingsError,
    ValidationError,
)
from tidings.events.call_queued import CallQueuedListener
from tidings.events.dispatcher import Dispatcher
from tidings.events.listener import Event, Listener, ShouldQueue, queued
from tidings.jobs.backoff import Exponential
from tidings.jobs.job import Job, PendingDispatch
from tidings.jobs.limits import RateLimited, Skip, ThrottlesExceptions, WithoutOverlapping
from tidings.pools.spec import Pool
from tidings.wire.encryption import ShouldBeEncrypted
from tidings.workflows.batch import batch
from tidings.workflows.chain import chain

__all__ = [
    "App",
    "BatchClosed",
    "CallQueuedListener",
    "ChannelError",
    "ConfigurationError",
    "Dispatcher",
    "Event",
    "Exponential",
    "Job",
    "JobCancelled",
    "JobFailedError",
    "JobNotFound",
    "Listener",
    "PayloadTooLarge",
    "PendingDispatch",
    "Pool",
    "QueueUnavailable",
    "RateLimited",
    "ResultMissing",
    "ResultTooLarge",
    "SerializationError",
    "ShouldBeEncrypted",
    "ShouldQueue",
    "Skip",
    "ThrottlesExceptions",
    "TidingsError",
    "ValidationError",
    "WithoutOverlapping",
    "batch",
    "chain",
    "dispatch",
    "event",
    "listen",
    "queued",
]


def event(e: Any, *args: Any) -> Any:
    """Dispatch an event on the current App; returns the listeners' results."""
    return _current.current().dispatch(e, *args)


def dispatch(job: Job | PendingDispatch) -> str | None:
    """Push a job on the current App; returns the job id (None: a dropped unique job)."""
    pending = job if isinstance(job, PendingDispatch) else PendingDispatch(job)
    return pending.dispatch()


def listen(event_key: Any, listener: Any) -> None:
    """Register a listener on the current App."""
    _current.current().listen(event_key, listener)
