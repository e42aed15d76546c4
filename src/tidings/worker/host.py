"""What the worker needs from the App, as one Protocol mypy checks (the App is one)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import redis.asyncio

from tidings.jobs.job import Job
from tidings.jobs.middleware import Middleware
from tidings.moves.queues import RedisQueue
from tidings.observability.metrics import WorkerSnapshot
from tidings.wire.signing import Signer
from tidings.worker.options import WorkerOptions
from tidings.workflows.hooks import WorkflowHooks


class RunningWorker(Protocol):
    """A worker as the App's side tasks see it (the scheduler, metrics, the heartbeat
    its supervisor reads): :class:`~tidings.worker.worker.Worker` is one."""

    opts: WorkerOptions
    rq: RedisQueue
    exit_code: int

    @property
    def client(self) -> redis.asyncio.Redis | None: ...
    def snapshot(self) -> WorkerSnapshot: ...
    def job_name(self, job_id: str) -> str | None: ...


class WorkerHost(Protocol):
    """The App as a worker sees it."""

    signer: Signer
    workflow_hooks: WorkflowHooks
    """Chains, batches and unique jobs around each job (:mod:`tidings.workflows.hooks`)."""
    job_middleware: list[Middleware]
    """The App's middleware, run around every job inside the built-in layers."""

    @property
    def retry_after_s(self) -> float: ...
    @property
    def max_payload_bytes(self) -> int: ...

    def queue_for(self, connection: str | None) -> RedisQueue: ...
    def resolve_class(self, path: str) -> Any: ...
    def emit(self, event: object) -> None: ...
    def wrap_thread_call(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...
    def skips_missing_model(self, job_cls: type[Job], data: Any) -> bool: ...
    def worker_tasks(self, worker: RunningWorker) -> list[Coroutine[Any, Any, None]]: ...
    async def worker_stopped(self, worker: RunningWorker | None) -> None: ...
