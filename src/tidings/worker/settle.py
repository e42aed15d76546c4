"""Carrying out an outcome in Redis, fenced by the job's reservation token.

Workflow moves (the next chain link, a batch count, a chain's catch) and ``failed()``
run only after :meth:`Settler.still_held` renewed the lease with this worker's token:
a worker that froze past its lease and lost the job touches nothing of it. A move that
Redis refuses as "reservation lost" is sent again when the refusal only means the
reservation was adopted meanwhile (:mod:`tidings.worker.held`).

Two things are never read as success: a move given up on through an outage
(:class:`~tidings.worker.retrying.GaveUp`) and a move that fails on broken data (a key
of the wrong type). Either way the job is left to its lease with an ERROR line naming
its queue, nothing is announced for it, and the worker and its other queues go on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ResponseError

from tidings import _clock
from tidings.jobs.job import JobRun, running
from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.observability.lifecycle import (
    JobFailed,
    JobProcessed,
    JobReleased,
    JobWasCancelled,
    ReservationLost,
)
from tidings.worker.acks import AckBatcher
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.host import WorkerHost
from tidings.worker.options import (
    WorkerOptions,
    exception_class,
    exception_message,
    exception_text,
    short_error,
)
from tidings.worker.outcome import Cancelled, Done, Fail, Outcome, Retry
from tidings.worker.retrying import GaveUp, retrying

log = logging.getLogger("tidings.worker")

T = TypeVar("T")


class Settler:
    """Applies outcomes: ack (batched), release, fail; workflows before each."""

    def __init__(
        self,
        host: WorkerHost,
        options: WorkerOptions,
        rq: RedisQueue,
        broker: Broker,
        held: HeldJobs,
        acks: AckBatcher,
    ) -> None:
        self.host = host
        self.opts = options
        self.rq = rq
        self.broker = broker
        self.held = held
        self.acks = acks
        self.reservations_lost = 0

    # -- the one entry point ------------------------------------------------------------

    async def settle(self, held: HeldJob, outcome: Outcome, t0: float) -> None:
        """Carry out ``outcome`` for ``held``; the job is then acking or dropped."""
        queue = held.reserved.queue
        try:
            if isinstance(outcome, Done):
                await self._done(held, outcome, t0)
            elif isinstance(outcome, Retry):
                await self._retry(held, outcome, t0)
            elif isinstance(outcome, Cancelled):
                await self._cancelled(held, outcome)
            else:
                await self._fail(held, outcome, t0)
        except GaveUp:
            self.held.drop(held)  # logged by retrying(); its lease ends, it runs again
        except ResponseError as exc:
            # Not transient (retrying() re-raised it): the queue's data is broken, e.g.
            # a key of the wrong type. That queue's ERROR; the worker goes on.
            log.error(
                "queue %r: cannot settle %s (%s); the job is left to its lease",
                queue,
                held.reserved.id,
                short_error(exc),
            )
            self.held.drop(held)

    # -- outcomes -----------------------------------------------------------------------

    async def _done(self, held: HeldJob, out: Done, t0: float) -> None:
        res, body = held.reserved, out.body
        if out.skipped:
            if body.get("batch"):  # counted as done, or its batch would never finish
                from tidings.workflows import batch as batches

                await self._move(lambda: batches.record(self.host, body, "ok"), "a batch count")
            self.acks.add(held)
            return
        if (body["chain"] or body.get("batch")) and not await self.still_held(
            held, "its chain and batch moves and its ack"
        ):
            return
        if out.job is not None and (body["chain"] or body.get("batch")):
            job = out.job
            await self._move(
                lambda: self.host.workflow_hooks.on_success(job, body, res.queue),
                f"the chain and batch moves of {res.id}",
            )
        # Stored by the ack itself, only while the token holds: at most once per run.
        held.result, held.result_ttl_ms = out.result, int(body.get("result") or 0)
        self.acks.add(held)
        self.host.emit(
            JobProcessed(
                res.id, res.queue, body["displayName"], res.attempts, _clock.monotonic() - t0
            )
        )

    async def _retry(self, held: HeldJob, out: Retry, t0: float) -> None:
        res = held.reserved
        k = self.rq.keys(res.queue)
        self.held.set_state(held, State.SETTLING)
        exception = out.error is not None
        done = await self._fenced(
            held,
            lambda: self.broker.release(
                k, res, out.delay_s, uncount=out.uncount, exception=exception
            ),
            lambda reply: reply == -1,
            f"the release of {res.id}",
        )
        self.held.drop(held)
        if done == -1:
            self.report_lost(held, "its release" + (" for a retry" if exception else ""))
            return
        self.host.emit(
            JobReleased(
                res.id,
                res.queue,
                out.body["displayName"],
                res.attempts,
                out.delay_s,
                _clock.monotonic() - t0,
                None if out.error is None else short_error(out.error),
            )
        )

    async def _fail(self, held: HeldJob, out: Fail, t0: float) -> None:
        res, body = held.reserved, out.body
        display = out.name or (body["displayName"] if body else "(unknown)")
        # A stale holder must not run failed(), a chain's catch or a batch's failure count
        # for a job that was handed out again: check the token (and renew) first.
        # The check also marks the job as failing (unless cancelled first), so a cancel
        # sent while failed() and the workflow moves run answers "failing", not
        # "cancelling" for a job that then ends failed.
        if not await self.still_held(held, "its failure", failing=body is not None):
            return
        if held.reserved.cancelled and body is not None:
            # app.cancel reached the job before its failure opened (the lease check just
            # made reports the mark): a cancelled job is settled as cancelled, not
            # failed; failed() and a chain's catch do not run.
            await self._cancelled(held, Cancelled(body, ran=True))
            return
        if out.job is not None:
            try:
                # failed() sees self.job_id and self.attempts of the run that failed
                with running(JobRun(job_id=res.id, queue=res.queue, attempts=res.attempts)):
                    ran = out.job.failed(out.error)
                    if inspect.isawaitable(ran):
                        await ran
            except Exception:
                log.exception("failed() hook of %s raised", display)
        info = {
            "exception": exception_text(out.error),
            "class": exception_class(out.error),
            "message": exception_message(out.error),
            "name": display,
            "queue": res.queue,
            "attempts": res.attempts,
        }
        if body is not None and body.get("priority"):
            info["priority"] = body["priority"]  # `failed retry` brings it back at it
        if body is not None:
            job = out.job
            await self._move(
                lambda: self.host.workflow_hooks.on_final_failure(job, body, res.queue),
                f"the chain catch and batch count of {res.id}",
            )
        k = self.rq.keys(res.queue)
        self.held.set_state(held, State.SETTLING)
        moved = await self._fenced(
            held,
            lambda: self.broker.fail(k, res, info),
            lambda reply: not reply,
            f"the failure of {res.id}",
        )
        self.held.drop(held)
        if not moved:
            self.report_lost(held, "its move to the failed store")
            return
        self.host.emit(
            JobFailed(
                res.id,
                res.queue,
                display,
                res.attempts,
                short_error(out.error),
                _clock.monotonic() - t0,
            )
        )

    async def _cancelled(self, held: HeldJob, out: Cancelled) -> None:
        res, body = held.reserved, out.body
        # A stale holder must not count the batch nor record the cancel.
        if not await self.still_held(held, "its cancel"):
            return
        if body.get("batch"):
            from tidings.workflows import batch as batches

            await self._move(
                lambda: batches.record(self.host, body, "cancel"), f"the batch count of {res.id}"
            )
        k = self.rq.keys(res.queue)
        self.held.set_state(held, State.SETTLING)
        moved = await self._fenced(
            held,
            lambda: self.broker.cancelled(k, res),
            lambda reply: not reply,
            f"the cancel of {res.id}",
        )
        self.held.drop(held)
        if not moved:
            self.report_lost(held, "its cancel")
            return
        log.info("%s cancelled (%s)", res.id, "its run stopped" if out.ran else "never run")
        self.host.emit(JobWasCancelled(res.id, res.queue, body["displayName"], out.ran))

    # -- fencing ------------------------------------------------------------------------

    async def still_held(self, held: HeldJob, what: str, *, failing: bool = False) -> bool:
        """Renew ``held``'s lease, checking that its token is still the job's; False
        (the job dropped, the loss reported) when the job was handed out again.
        ``failing``: the check opens the job's failure and marks it so in the same
        script, unless app.cancel marked it first (then ``cancelled`` is set): a cancel
        from then on answers "failing", never "cancelling" for a job that ends failed."""
        res = held.reserved
        k = self.rq.keys(res.queue)
        renewed = await self._fenced(
            held,
            lambda: self.broker.extend(k, [(res.id, res.token)], failing=failing),
            lambda reply: bool(reply.lost),
            f"the lease check of {res.id}",
        )
        lost = renewed.lost
        if lost:
            self.held.drop(held)
            self.report_lost(held, what)
            return False
        if res.id in renewed.cancelled:
            res.cancelled = True  # app.cancel marked it (a message on the way, or missed)
        return True

    def report_lost(self, held: HeldJob, what: str) -> None:
        """Log (once per reservation) that ``held`` was handed out again elsewhere."""
        if held.lost_reported:
            return
        held.lost_reported = True
        self.reservations_lost += 1
        res = held.reserved
        log.warning(
            "reservation lost for %s: its lease expired and it was handed out again; "
            "%s refused, the new holder's run goes on",
            res.id,
            what,
        )
        self.host.emit(ReservationLost(res.id, res.queue))

    async def _fenced(
        self,
        held: HeldJob,
        op: Callable[[], Awaitable[T]],
        refused: Callable[[T], bool],
        what: str,
    ) -> T:
        """A move fenced by ``held``'s token (``op`` reads it when sent). A refusal that
        only means the reservation was adopted meanwhile (:mod:`tidings.worker.held`)
        is sent again with the new token."""
        while True:
            token = held.reserved.token
            reply = await self._move(op, what)
            if not (refused(reply) and held.adopted_since(token)):
                return reply

    async def _move(self, op: Callable[[], Awaitable[T]], what: str) -> T:
        return await retrying(op, limit_s=self.opts.give_up_s, what=what)
