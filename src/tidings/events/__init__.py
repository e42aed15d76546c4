"""Events and listeners: the dispatcher, the bases users write on, and the fakes.

See :mod:`tidings.events.dispatcher` for the dispatch rules and calling conventions.
"""

from tidings.events.call_queued import CallQueuedListener
from tidings.events.dispatcher import Dispatcher
from tidings.events.listener import Event, Listener, QueuedFunction, ShouldQueue, queued
from tidings.events.testing import FakeDispatcher, fake_events

__all__ = [
    "CallQueuedListener",
    "Dispatcher",
    "Event",
    "FakeDispatcher",
    "Listener",
    "QueuedFunction",
    "ShouldQueue",
    "fake_events",
    "queued",
]
