"""Where the worker's job lifecycle meets chains, batches and unique jobs.

The worker calls one object, :class:`WorkflowHooks` (the App holds it as
``app.workflow_hooks``):

* :meth:`~WorkflowHooks.layers` - middleware every job runs through before its own: a
  batch job's gate (skip when the batch was cancelled or already counted this job) and
  a ``unique_until="processing"`` job's unlock. It also binds the run's batch handle
  (``self.batch`` of a batch job or a batch callback).
* :meth:`~WorkflowHooks.on_success` - after ``handle`` succeeded, before the ack: push
  the next chain link, record the batch outcome (which may fire callbacks).
* :meth:`~WorkflowHooks.on_final_failure` - when a job has finally failed, before it
  moves to the failed store: push the chain's catch callback, record the batch failure.

Every push these make has an id fixed in advance and goes through
:func:`~tidings.moves.push_once.push_once`, and every count is a Lua script that
remembers the ids it counted, so a worker dying between these calls and the ack (the
job is then re-delivered and calls them again) neither runs a link twice nor counts a
job twice.
"""

from __future__ import annotations

from tidings.hosts import WorkflowHost
from tidings.jobs.job import Job, JobRun
from tidings.jobs.middleware import Middleware
from tidings.wire.envelope import JobBody
from tidings.workflows import batch as batches
from tidings.workflows.chain import push_catch, push_next
from tidings.workflows.unique import UniqueStart


class WorkflowHooks:
    """The workflow moves around one job (see the module docstring)."""

    def __init__(self, app: WorkflowHost) -> None:
        self.app = app

    def layers(self, run: JobRun | None) -> list[Middleware]:
        """The built-in middleware of the run in progress (usually none); binds
        ``run.batch``."""
        if run is None or not isinstance(run.body, dict):
            return []
        body = run.body
        batch_id = body.get("batch") or body.get("batchCallback")
        if batch_id:
            run.batch = batches.BatchRef(str(batch_id))
        layers: list[Middleware] = []
        if body.get("batch"):
            layers.append(batches.BatchGate(self.app, body["batch"], run.job_id))
        if body.get("unique"):
            conn = body.get("uniqueConnection")
            layers.append(UniqueStart(self.app, run.queue, body["unique"], run.job_id, conn))
        return layers

    async def on_success(self, job: Job, body: JobBody, queue: str) -> None:
        """Advance the job's chain and count it in its batch (before its ack)."""
        if body["chain"]:
            await push_next(self.app, body, queue)
        if body.get("batch"):
            await batches.record(self.app, body, "ok")

    async def on_final_failure(self, job: Job | None, body: JobBody, queue: str) -> None:
        """Fire the chain's catch and count the failure in the batch (before the failed move)."""
        if body.get("chainCatch"):
            await push_catch(self.app, body)
        if body.get("batch"):
            await batches.record(self.app, body, "fail")
