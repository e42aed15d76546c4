"""The seam between the App and the parts it ties together: :class:`AppHost`.

Workflows, notifications, moves and the operator's tools are handed the App (or reach
the current one) to find a connection, sign an envelope, push a job or announce an
event. They name it by this Protocol, never by :class:`~tidings.app.App` itself, so
that they sit below ``app.py`` (docs/architecture.md) and mypy checks every use.

It lives in its own layer, under ``workflows/`` and ``notifications/`` and over
``events/``, ``jobs/`` and ``moves/``, whose types it names. The worker's own seam is
:class:`tidings.worker.base.WorkerHost`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from tidings.config import Settings
from tidings.events.dispatcher import Dispatcher
from tidings.jobs.job import Job, PendingDispatch
from tidings.moves.queues import RedisQueue
from tidings.wire.signing import Signer

__all__ = ["AppHost", "WorkflowHost"]


class WorkflowHost(Protocol):
    """What the workflows' worker hooks use (chains, batches, unique jobs): the App, or
    the worker's :class:`~tidings.worker.base.WorkerHost`, which has all of it."""

    signer: Signer

    @property
    def max_payload_bytes(self) -> int: ...
    def queue_for(self, connection: str | None) -> RedisQueue: ...


class AppHost(WorkflowHost, Protocol):
    """What the parts below the App use of it (an :class:`~tidings.app.App` is one)."""

    settings: Settings
    events: Dispatcher
    schedules: list[Any]

    @property
    def max_payload_bytes(self) -> int: ...
    @property
    def database(self) -> Any: ...
    @property
    def notifications(self) -> Any: ...
    def queue_for(self, connection: str | None = None) -> RedisQueue: ...
    def note_queue(self, queue: str) -> None: ...
    def resolve_class(self, path: str) -> Any: ...
    def is_allowed(self, module: str) -> bool: ...
    def emit(self, event: object) -> None: ...
    def push_pending(self, pending: PendingDispatch) -> str | None: ...
    async def push_pending_async(self, pending: PendingDispatch) -> str | None: ...
    def dispatch_many(
        self, jobs: Iterable[Job | PendingDispatch], *, batch_size: int = 1000
    ) -> list[str]: ...
    async def dispatch_many_async(
        self, jobs: Iterable[Job | PendingDispatch], *, batch_size: int = 1000
    ) -> list[str]: ...
