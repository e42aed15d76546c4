"""Chains: run jobs one after another, each only after the previous one succeeded.

The remaining links travel inside the signed body (``chain``: a list of
``{"queue", "body", "delay"}``); when a link succeeds the worker signs and pushes the next
one before it acknowledges the current one. Every id is fixed when the chain is
dispatched, and the next link is pushed with :func:`~tidings.moves.push_once.push_once`: a
link re-delivered after a crash (it advanced the chain, then died before its ack) pushes
the same id again, and the push is refused whether that next link is still queued,
running, or already done. So each link runs once per successful run of its predecessor,
never a second time because of a re-delivery.

When a link finally fails, ``chainCatch`` (one job with one fixed id shared by every
link) is pushed once the same way, and the rest never run. Any job can be a link,
including :class:`~tidings.events.CallQueuedListener` and ``SendQueuedNotification``.
``catch`` takes a job, or a module-level function (plain, or marked with ``@queued``),
which the worker calls with no arguments.

Each link and the catch job remember their connection (the chain's ``on_connection``,
else the job's own ``connection`` option): the worker pushes them there, not on the
default connection.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidings import _current
from tidings.errors import ConfigurationError, PayloadRejected
from tidings.events.call_queued import CallQueuedListener
from tidings.events.listener import QueuedFunction, _import_path
from tidings.hosts import WorkflowHost
from tidings.jobs.compose import build_body, default_delay, new_id
from tidings.jobs.job import Job, PendingDispatch, option
from tidings.moves.push_once import push_once_async
from tidings.wire.envelope import JobBody, seal


def _link(job: Job, queue: str | None, connection: str | None) -> dict[str, Any]:
    src = job.option_source()
    q = queue or option(src, "queue") or "default"
    link = {"queue": q, "body": build_body(job, new_id()), "delay": default_delay(job)}
    conn = connection or option(src, "connection")
    if conn:
        link["connection"] = conn
    return link


@dataclass
class CallFunction(Job):
    """Calls a module-level function by its ``module:qualname`` path, with no arguments
    (a chain's ``catch`` given as a plain function). The worker imports it under the
    allowed modules only, as it does job classes."""

    function: str

    def display_name(self) -> str:
        """The function's name."""
        return self.function.rpartition(":")[2]

    def handle(self) -> Any:
        """Import and call the function (an ``async def`` one is awaited by the worker)."""
        fn = _current.current().resolve_class(self.function)
        if not isinstance(fn, types.FunctionType):
            raise PayloadRejected(f"{self.function!r} is not a function")
        return fn()


def _catch_job(callback: Job | Callable[..., Any]) -> Job:
    """The job a chain's ``catch`` pushes: the job itself, or one calling the function."""
    if isinstance(callback, Job):
        return callback
    if isinstance(callback, QueuedFunction):
        return CallQueuedListener.for_target(callback, ())
    if inspect.isfunction(callback):
        try:
            return CallFunction(_import_path(callback))
        except ConfigurationError as exc:
            raise ConfigurationError(str(exc).replace("queued()", "catch()")) from None
    raise TypeError(
        f"catch() takes a Job or a module-level function, got {type(callback).__name__}"
    )


class Chain:
    """A chain of jobs; build with :func:`chain`."""

    def __init__(self, jobs: list[Job]) -> None:
        if not jobs:
            raise ValueError("a chain needs at least one job")
        self.jobs = jobs
        self._queue: str | None = None
        self._connection: str | None = None
        self._catch: Job | None = None

    def on_queue(self, name: str) -> Chain:
        """Run every link on queue ``name``."""
        self._queue = name
        return self

    def on_connection(self, name: str) -> Chain:
        """Use connection ``name``."""
        self._connection = name
        return self

    def catch(self, callback: Job | Callable[..., Any]) -> Chain:
        """Dispatch ``callback`` once if a link finally fails: a Job, or a module-level
        function (plain or ``@queued``) the worker calls with no arguments.

        Raises:
            ConfigurationError: a lambda, closure or nested function (a worker imports
                the function by name).
            TypeError: neither a Job nor a function.
        """
        self._catch = _catch_job(callback)
        return self

    def _pending(self) -> PendingDispatch:
        conn = self._connection
        links = [_link(j, self._queue, conn) for j in self.jobs[1:]]
        # Every link carries the same catch job (same id): it can be pushed once only.
        catch = _link(self._catch, self._queue, conn) if self._catch is not None else None
        for link in links:
            link["body"]["chainCatch"] = catch
        return PendingDispatch(
            self.jobs[0], queue=self._queue, connection=self._connection, chain=links, catch=catch
        )

    def dispatch(self) -> str:
        """Push the first link; returns its id."""
        return str(_current.current().push_pending(self._pending()))

    async def dispatch_async(self) -> str:
        """Async twin of :meth:`dispatch`."""
        return str(await _current.current().push_pending_async(self._pending()))


def chain(*jobs: Job) -> Chain:
    """Chain jobs: each runs only after the previous one succeeded."""
    return Chain(list(jobs))


async def push_next(app: WorkflowHost, body: JobBody, queue: str) -> None:
    """Push the next link of ``body``'s chain (called before the ack)."""
    chain_rest = body["chain"]
    if not chain_rest:
        return
    nxt = chain_rest[0]
    nbody: JobBody = nxt["body"]
    nbody["chain"] = chain_rest[1:]
    nbody["pushedAt"] = body["pushedAt"]
    envelope = seal(nbody, app.signer, max_bytes=app.max_payload_bytes, queue=str(nxt["queue"]))
    delay = float(nxt.get("delay") or 0.0)
    rq = app.queue_for(nxt.get("connection"))
    priority = nbody.get("priority", 0)
    await push_once_async(rq, nxt["queue"], nbody["uuid"], envelope, delay, priority)


async def push_catch(app: WorkflowHost, body: JobBody) -> None:
    """Push the chain's catch callback after a link finally failed."""
    catch = body.get("chainCatch")
    if not catch:
        return
    cbody: JobBody = catch["body"]
    envelope = seal(cbody, app.signer, max_bytes=app.max_payload_bytes, queue=str(catch["queue"]))
    rq = app.queue_for(catch.get("connection"))
    await push_once_async(rq, catch["queue"], cbody["uuid"], envelope)
