"""Running one reserved job, from its envelope to an :data:`~tidings.worker.outcome.Outcome`.

:meth:`Executor.run` is the per-job hot path; it writes nothing to Redis (the settler
does, fenced by the reservation)::

    open_envelope (signature) ─▶ resolve the class, decode ─▶ stalled / out of tries?
        ─▶ JobProcessing ─▶ built-in, App and job middleware ─▶ handle() under the timeout
        ─▶ Done  |  Retry(delay) (self.release, middleware, an exception with tries left)
           |  Fail(reason) (self.fail, out of tries, a payload that cannot run)

An async handler runs as a task under ``asyncio.timeout``; a sync one runs on the
worker's long-lived job threads (:class:`~tidings.worker.threads.SyncRunner`), and one
that overruns its timeout cannot be cancelled: the worker fails or retries it and stops
with ``EXIT_STUCK`` for its supervisor to restart.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tidings import _clock
from tidings.errors import (
    JobCancelled,
    JobStalled,
    JobTimeout,
    MaxAttemptsExceeded,
    ModelNotFound,
    PayloadRejected,
    SerializationError,
    TidingsError,
)
from tidings.jobs.backoff import delay_for
from tidings.jobs.job import Job, JobRun, _run, running
from tidings.jobs.middleware import Middleware, run_through
from tidings.moves.consume import Reserved
from tidings.observability import tracing
from tidings.observability.lifecycle import JobProcessing
from tidings.redis.errors import REDIS_ERRORS, is_transient
from tidings.wire import serializer
from tidings.wire.encryption import open_data
from tidings.wire.envelope import JobBody, open_envelope
from tidings.wire.results import seal_result
from tidings.worker.host import WorkerHost
from tidings.worker.options import EXIT_STUCK, WorkerOptions, short_error
from tidings.worker.outcome import Cancelled, Done, Fail, Outcome, Retry
from tidings.worker.threads import Overran, SyncRunner

log = logging.getLogger("tidings.worker")

UNAVAILABLE_RETRY_S = 1.0


class Executor:
    """Runs reserved jobs and decides what becomes of each (see the module docstring)."""

    def __init__(
        self,
        host: WorkerHost,
        options: WorkerOptions,
        threads: SyncRunner,
        *,
        prefix: str,
        stop: Callable[[str, int], None],
        alone: Callable[[], bool],
    ) -> None:
        self.host = host
        self.opts = options
        self.threads = threads
        self.prefix = prefix
        self._stop = stop
        self._alone = alone

    async def run(
        self,
        res: Reserved,
        now_s: float,
        bind: Callable[[JobRun], None] | None = None,
    ) -> Outcome:
        """Decode, check and run ``res``; never raises for anything the job did.
        ``bind`` is handed the run before ``handle`` starts (cancels reach it there)."""
        try:
            body = open_envelope(res.envelope, self.host.signer, job_id=res.id, queue=res.queue)
        except PayloadRejected as exc:
            return Fail(exc, None, name="(rejected)")
        if res.cancelled:
            return Cancelled(body, ran=False)  # cancelled while it waited: never run
        max_tries = body["maxTries"] if body["maxTries"] is not None else self.opts.tries
        cls: Any = None
        try:
            cls = self.host.resolve_class(body["job"])
            if not (isinstance(cls, type) and issubclass(cls, Job)):
                raise PayloadRejected(f"unknown job type {body['job']!r}: not a Job class")
            # Decrypted once, here (ShouldBeEncrypted); the stored envelope stays sealed.
            body["data"] = open_data(body, self.host)
            try:
                job = serializer.decode(body["data"], self.host.resolve_class)
            except serializer.NeedsThread:
                job = await self._load_models(res, body)
            if not isinstance(job, cls):
                raise PayloadRejected("malformed payload: data does not hold the named job")
        except ModelNotFound as exc:
            if cls is not None and self.host.skips_missing_model(cls, body["data"]):
                log.info("%s skipped: %s", res.id, exc)
                return Done(None, body, skipped=True)
            return Fail(exc, body)
        except (PayloadRejected, SerializationError) as exc:
            return Fail(exc, body)
        except JobTimeout as exc:  # a model load overran: retry or fail as a timeout
            return self._after_exception(res, body, None, exc, max_tries)
        refused = self._refusal(res, body, max_tries)
        if refused is not None:
            return Fail(refused, body, job)
        run = JobRun(res.id, res.queue, res.attempts, body=body)
        if bind is not None:
            bind(run)
        if res.cancelled:  # cancelled while it was decoded
            return Cancelled(body, ran=False)
        self.host.emit(
            JobProcessing(
                res.id,
                res.queue,
                body["displayName"],
                res.attempts,
                max(0.0, now_s - body["pushedAt"]),
            )
        )
        timeout = body["timeout"] if body["timeout"] is not None else self.opts.timeout_s
        try:
            with running(run):  # middleware sees the run (release_uncounted, self.batch)
                value = await self._pipeline(job, run, lambda: self._invoke(job, run, timeout))
        except Exception as exc:
            if run.cancelled or isinstance(exc, JobCancelled):
                return Cancelled(body, ran=True)  # not retried, failed() not called
            if not run.handle_started and isinstance(exc, REDIS_ERRORS) and is_transient(exc):
                # Redis was unavailable to a layer before handle() (a batch's gate, a
                # rate limit): not the job's failure. Back in a second, attempt given back.
                log.warning(
                    "%s: redis unavailable before it started (%s); released uncounted",
                    res.id,
                    short_error(exc),
                )
                return Retry(body, UNAVAILABLE_RETRY_S, uncount=True)
            return self._after_exception(res, body, job, exc, max_tries)
        if run.cancel_sent:
            return Cancelled(body, ran=True)  # the handler swallowed the cancel
        if run.failed_exc is not None:
            return Fail(run.failed_exc, body, job)
        if run.released_s is not None:
            return Retry(body, run.released_s, uncount=run.uncount)
        keep = body.get("result")
        if keep is None:
            return Done(job, body)
        try:
            result = seal_result(
                value,
                self.host.signer,
                queue=res.queue,
                job_id=res.id,
                max_bytes=int(body.get("resultMaxBytes") or self.opts.result_max_bytes),
            )
        except SerializationError as exc:  # unencodable or too large: fails, named
            return Fail(exc, body, job)
        return Done(job, body, result=result)

    def _refusal(self, res: Reserved, body: JobBody, max_tries: int) -> BaseException | None:
        """Why ``res`` must not run at all (stalled too often, out of tries), or None."""
        if res.stalls:
            max_stalls = body.get("maxStalls")
            if not isinstance(max_stalls, int) or isinstance(max_stalls, bool):
                max_stalls = self.opts.max_stalls
            if res.stalls > max_stalls:
                times = "time" if res.stalls == 1 else "times"
                return JobStalled(
                    f"stalled {res.stalls} {times} (max_stalls {max_stalls}): its lease "
                    "expired each time, as when a worker dies or freezes past retry_after"
                )
        until = body["retryUntil"]
        if until is not None and _clock.now() > until:
            return MaxAttemptsExceeded("retry_until has passed")
        if until is None and max_tries > 0 and res.attempts > max_tries:
            return MaxAttemptsExceeded(
                f"max attempts exceeded ({max_tries}; worker lost or timed out on an earlier try)"
            )
        return None

    async def _pipeline(self, job: Job, run: JobRun, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call`` inside the built-in layers (batch gate, unique unlock), the App's
        middleware and the job's own, outermost first; traced when tracing records."""
        layers: list[Middleware] = [
            *self.host.workflow_hooks.layers(run),
            *self.host.job_middleware,
            *job.middleware(),
        ]
        if tracing.ENABLED and tracing.recording():
            if not layers:
                return await tracing.run_job(run, call)
            return await tracing.run_job(run, lambda: run_through(layers, job, call))
        if not layers:
            return await call()
        return await run_through(layers, job, call)

    async def _invoke(self, job: Job, run: JobRun, timeout_s: float | None) -> Any:
        if run.cancelled:  # cancelled while middleware ran: never start it
            raise JobCancelled(f"job {run.job_id} was cancelled", job_id=run.job_id)
        handle = job.handle
        limit = timeout_s if timeout_s and timeout_s > 0 else None
        run.handle_started = True
        if job.runs_async():
            token = _run.set(run)
            task = asyncio.current_task()
            run.handler_task = task
            try:
                async with asyncio.timeout(limit):
                    return await handle()
            except TimeoutError as exc:
                raise JobTimeout(f"job ran longer than its timeout of {limit}s") from exc
            except asyncio.CancelledError:
                if not run.cancel_sent or task is None:
                    raise  # the worker itself is being cancelled
                task.uncancel()
                raise JobCancelled(f"job {run.job_id} was cancelled", job_id=run.job_id) from None
            finally:
                run.handler_task = None
                if run.cancel_sent and task is not None and task.cancelling():
                    task.uncancel()  # the handler swallowed the cancel: undo it
                _run.reset(token)
        ctx = contextvars.copy_context()
        ctx.run(_run.set, run)
        try:
            result = await self.threads.submit(
                self.host.wrap_thread_call(handle), ctx, limit, alone=self._alone()
            )
        except Overran:
            # A thread cannot be cancelled: fail or retry this job, finish the others,
            # and exit non-zero so the supervisor starts a fresh process.
            log.error(
                "sync job %s overran its timeout of %ss; the worker will exit", run.job_id, limit
            )
            self._stop("a sync job could not be cancelled after its timeout", EXIT_STUCK)
            raise JobTimeout(
                f"job ran longer than its timeout of {limit}s (sync; worker recycled)"
            ) from None
        if inspect.isawaitable(result):
            return await result
        return result

    async def _load_models(self, res: Reserved, body: JobBody) -> Any:
        """Decode a payload whose model arguments load from a database: in a worker
        thread (Django refuses ORM calls on the loop), through the host's per-thread
        wrapper, within the job's timeout. A load that overruns it cannot be cancelled:
        the worker stops with ``EXIT_STUCK``, as for a stuck sync job."""
        timeout = body["timeout"] if body["timeout"] is not None else self.opts.timeout_s
        limit = timeout if timeout and timeout > 0 else None
        load = functools.partial(serializer.decode, body["data"], self.host.resolve_class)
        try:
            return await self.threads.submit(
                self.host.wrap_thread_call(load), contextvars.copy_context(), limit
            )
        except Overran:
            log.error("loading the models of %s overran %ss; the worker will exit", res.id, limit)
            self._stop("a model load could not be cancelled after its timeout", EXIT_STUCK)
            raise JobTimeout(
                f"loading the job's models took longer than its timeout of {limit}s"
            ) from None

    def _after_exception(
        self,
        res: Reserved,
        body: JobBody,
        job: Job | None,
        exc: BaseException,
        max_tries: int,
    ) -> Outcome:
        """Retry with backoff while tries are left; else fail."""
        exceptions = res.exceptions + 1
        known = exc if isinstance(exc, TidingsError) else None
        retry = not (known is not None and known.permanent)
        until = body["retryUntil"]
        if until is not None:
            retry = retry and _clock.now() < until
        elif max_tries > 0 and res.attempts >= max_tries:
            retry = False
        if body["maxExceptions"] and exceptions >= body["maxExceptions"]:
            retry = False
        if not retry:
            return Fail(exc, body, job)
        delay = delay_for(body["backoff"], res.attempts, default_s=self.opts.backoff_s)
        hinted = known.retry_after_s if known is not None else None
        if hinted:
            delay = max(delay, float(hinted))
        return Retry(body, delay, exc)
