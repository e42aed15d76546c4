"""Broadcast events: ``ShouldBroadcast`` and the queued listener that publishes them.

The App registers :class:`BroadcastEvent` for every ``ShouldBroadcast`` event, so a
dispatched one is queued through the normal pipeline like any queued listener
(``CallQueuedListener``: retries, the failed store, fakes), and the worker publishes it.
Its message id is the job id, so a retried job adds nothing twice.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from tidings import _current
from tidings.events.listener import Listener, ShouldQueue
from tidings.jobs.job import current_run


class ShouldBroadcast:
    """Mixin for events published to browsers when dispatched.

    Define ``broadcast_on()`` (a channel name or a list; ``private-...`` for private
    ones). Optional: ``broadcast_as()`` (the SSE event name, default the class name),
    ``broadcast_with()`` (the JSON data, default the event's public fields),
    ``broadcast_when()`` (False: not broadcast).
    """

    def broadcast_on(self) -> str | list[str]:
        """The channels to publish on."""
        raise NotImplementedError(f"{type(self).__qualname__} must define broadcast_on()")

    def broadcast_as(self) -> str:
        """The SSE event name."""
        return type(self).__name__

    def broadcast_with(self) -> dict[str, Any]:
        """The data the browser receives."""
        if dataclasses.is_dataclass(self):
            return {
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if not f.name.startswith("_")
            }
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def broadcast_when(self) -> bool:
        """Whether to broadcast this one."""
        return True


class BroadcastEvent(Listener, ShouldQueue):
    """Publishes a ``ShouldBroadcast`` event (queued; registered by the App)."""

    def should_queue(self, event: ShouldBroadcast) -> bool:
        return bool(event.broadcast_when())

    async def handle(self, event: ShouldBroadcast) -> None:
        app = _current.current()
        run = current_run()
        name = type(event).__qualname__
        await app.broadcasting.apublish(
            event.broadcast_on(),
            event.broadcast_as(),
            event.broadcast_with(),
            message_id=run.job_id if run is not None else uuid.uuid4().hex,
            where=f"{name}.broadcast_on()/broadcast_with()",
        )
