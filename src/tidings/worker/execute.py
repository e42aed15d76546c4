"""Running one reserved job, from its envelope to the decision on what becomes of it.

:meth:`JobRunner._process_inner` is the per-job hot path::

    open_envelope (signature) ─▶ resolve the class, decode ─▶ out of tries / past retry_until?
        ─▶ JobProcessing ─▶ app middleware ─▶ _invoke: handle() under the timeout
        ─▶ ok: after_success (chains, batches), queue the ack, JobProcessed
           self.release(s) / middleware release: back to delayed, JobReleased
           self.fail(exc) or a payload that cannot run: _fail, JobFailed
           an exception: _on_exception retries with backoff, or fails when out of tries

An async handler runs as a task under ``asyncio.timeout``; a sync one runs on the
worker's long-lived job threads (:class:`~tidings.worker.threads.SyncRunner`: fed and
settled in batches, one timer for every deadline), and one that overruns its timeout
cannot be cancelled, so the worker fails or releases it and stops with ``EXIT_STUCK``
for its supervisor to restart. Acks are only queued here;
:mod:`tidings.worker.upkeep` sends them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

from tidings import _clock
from tidings.errors import (
    JobStalled,
    JobTimeout,
    MaxAttemptsExceeded,
    ModelNotFound,
    PayloadRejected,
    SerializationError,
)
from tidings.jobs.backoff import delay_for
from tidings.jobs.job import Job, JobRun, _run, running
from tidings.moves.consume import Reserved
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobProcessing, JobReleased
from tidings.observability.redaction import redact
from tidings.wire import serializer
from tidings.wire.encryption import open_data
from tidings.wire.envelope import JobBody, open_envelope
from tidings.worker.base import EXIT_STUCK, RunningJob, WorkerBase, short_error
from tidings.worker.threads import Overran

log = logging.getLogger("tidings.worker")

MAX_EXCEPTION_TEXT = 8192


def _exception_text(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # a hostile __str__ must not break the worker's bookkeeping
        text = f"{type(exc).__name__}: <traceback could not be formatted>"
    # Redact the whole text before cutting it (issue 12): the failed store keeps it.
    text = redact(text)
    if len(text) > MAX_EXCEPTION_TEXT:
        text = (
            text[: MAX_EXCEPTION_TEXT // 2]
            + "\n...[truncated]...\n"
            + text[-MAX_EXCEPTION_TEXT // 2 :]
        )
    return text


class JobRunner(WorkerBase):
    """Runs reserved jobs as tasks and settles each one: ack, release or fail."""

    def _start(self, reserved: Reserved, now_s: float) -> None:
        entry = RunningJob(reserved)
        self._running[reserved.id] = entry
        task = asyncio.create_task(self._process(reserved, now_s))
        entry.task = task

    async def _process(self, res: Reserved, now_s: float) -> None:
        t0 = _clock.monotonic()
        try:
            await self._process_inner(res, now_s, t0)
        except asyncio.CancelledError:
            raise
        except Exception:  # pragma: no cover - a bug in the worker itself
            log.exception("internal error while processing %s", res.id)
        finally:
            self._running.pop(res.id, None)
            self._slot_free.set()
            self.processed += 1
            if self.opts.max_jobs and self.processed >= self.opts.max_jobs:
                self.stop("--max-jobs reached")
            if self.opts.rest_s:
                await asyncio.sleep(self.opts.rest_s)

    def _fault(self, point: str) -> None:
        if self.opts.fault_point == point:
            os.kill(os.getpid(), signal.SIGKILL)

    async def _process_inner(self, res: Reserved, now_s: float, t0: float) -> None:
        k = self.rq.keys(res.queue)
        self._fault("after_pop")
        try:
            body = open_envelope(res.envelope, self.signer, job_id=res.id, queue=res.queue)
        except PayloadRejected as exc:
            await self._fail(res, None, None, exc, t0, name="(rejected)")
            return
        max_tries = body["maxTries"] if body["maxTries"] is not None else self.opts.tries
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
            if self.host.skips_missing_model(cls, body["data"]):
                log.info("%s skipped: %s", res.id, exc)
                if body.get("batch"):  # counted as done, or its batch would never finish
                    from tidings.workflows import batch as batches

                    await self._retrying(lambda: batches.record(self.host, body, "ok"))
                self._acks.setdefault(res.queue, []).append((res.id, res.token))
                self._ack_event.set()
                return
            await self._fail(res, body, None, exc, t0)
            return
        except (PayloadRejected, SerializationError) as exc:
            await self._fail(res, body, None, exc, t0)
            return
        except JobTimeout as exc:  # a model load overran: retry or fail as a timeout
            await self._on_exception(res, body, None, exc, max_tries, t0)
            return
        if res.stalls:
            max_stalls = body.get("maxStalls")
            if not isinstance(max_stalls, int) or isinstance(max_stalls, bool):
                max_stalls = self.opts.max_stalls
            if res.stalls > max_stalls:
                times = "time" if res.stalls == 1 else "times"
                stalled = JobStalled(
                    f"stalled {res.stalls} {times} (max_stalls {max_stalls}): its lease "
                    "expired each time, as when a worker dies or freezes past retry_after"
                )
                await self._fail(res, body, job, stalled, t0)
                return
        until = body["retryUntil"]
        if until is not None and _clock.now() > until:
            await self._fail(res, body, job, MaxAttemptsExceeded("retry_until has passed"), t0)
            return
        if until is None and max_tries > 0 and res.attempts > max_tries:
            lost = MaxAttemptsExceeded(
                f"max attempts exceeded ({max_tries}; worker lost or timed out on an earlier try)"
            )
            await self._fail(res, body, job, lost, t0)
            return
        run = JobRun(res.id, res.queue, res.attempts, body=body)
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
                await self.host.run_job_pipeline(job, lambda: self._invoke(job, run, timeout))
        except Exception as exc:
            await self._on_exception(res, body, job, exc, max_tries, t0)
            return
        self._fault("before_ack")
        name = body["displayName"]
        if run.failed_exc is not None:
            await self._fail(res, body, job, run.failed_exc, t0)
        elif run.released_s is not None:
            self._settling(res)
            done = await self._retrying(
                lambda: self.broker.release(k, res, run.released_s or 0.0, uncount=run.uncount)
            )
            if done == -1:
                self._reservation_lost(res, "its release")
                return
            self.host.emit(
                JobReleased(
                    res.id,
                    res.queue,
                    name,
                    res.attempts,
                    run.released_s,
                    _clock.monotonic() - t0,
                    None,
                )
            )
        else:
            # Chains and batches advance before the ack (see tidings.workflows.hooks), and
            # only while this worker still holds the job (a fresh lease, token checked).
            if (body["chain"] or body.get("batch")) and not await self._still_held(
                res, "its chain and batch moves and its ack"
            ):
                return
            await self._retrying(lambda: self.host.after_success(job, body, res.queue))
            self._acks.setdefault(res.queue, []).append((res.id, res.token))
            self._ack_event.set()
            self.host.emit(
                JobProcessed(res.id, res.queue, name, res.attempts, _clock.monotonic() - t0)
            )

    async def _invoke(self, job: Job, run: JobRun, timeout_s: float | None) -> Any:
        handle = job.handle
        limit = timeout_s if timeout_s and timeout_s > 0 else None
        if job.runs_async():
            token = _run.set(run)
            try:
                async with asyncio.timeout(limit):
                    return await handle()
            except TimeoutError as exc:
                raise JobTimeout(f"job ran longer than its timeout of {limit}s") from exc
            finally:
                _run.reset(token)
        ctx = contextvars.copy_context()
        ctx.run(_run.set, run)
        try:
            result = await self._runner.submit(
                self._wrapped(handle), ctx, limit, alone=len(self._running) == 1
            )
        except Overran:
            # A thread cannot be cancelled: fail or release this job, finish the others,
            # and exit non-zero so the supervisor starts a fresh process.
            log.error(
                "sync job %s overran its timeout of %ss; the worker will exit", run.job_id, limit
            )
            self.stop("a sync job could not be cancelled after its timeout", EXIT_STUCK)
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
            return await self._runner.submit(self._wrapped(load), contextvars.copy_context(), limit)
        except Overran:
            log.error("loading the models of %s overran %ss; the worker will exit", res.id, limit)
            self.stop("a model load could not be cancelled after its timeout", EXIT_STUCK)
            raise JobTimeout(
                f"loading the job's models took longer than its timeout of {limit}s"
            ) from None

    def _wrapped(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` inside the host's per-thread wrapper (the Django integration closes
        stale database connections around it)."""
        return self.host.wrap_thread_call(fn)

    async def _on_exception(
        self,
        res: Reserved,
        body: JobBody,
        job: Job | None,
        exc: BaseException,
        max_tries: int,
        t0: float,
    ) -> None:
        exceptions = res.exceptions + 1
        retry = not getattr(exc, "permanent", False)
        until = body["retryUntil"]
        if until is not None:
            retry = retry and _clock.now() < until
        elif max_tries > 0 and res.attempts >= max_tries:
            retry = False
        if body["maxExceptions"] and exceptions >= body["maxExceptions"]:
            retry = False
        if not retry:
            await self._fail(res, body, job, exc, t0)
            return
        delay = delay_for(body["backoff"], res.attempts, default_s=self.opts.backoff_s)
        hinted = getattr(exc, "retry_after_s", None)
        if hinted:
            delay = max(delay, float(hinted))
        k = self.rq.keys(res.queue)
        self._settling(res)
        done = await self._retrying(lambda: self.broker.release(k, res, delay, exception=True))
        if done == -1:
            self._reservation_lost(res, "its release for a retry")
            return
        self.host.emit(
            JobReleased(
                res.id,
                res.queue,
                body["displayName"],
                res.attempts,
                delay,
                _clock.monotonic() - t0,
                short_error(exc),
            )
        )

    async def _fail(
        self,
        res: Reserved,
        body: JobBody | None,
        job: Job | None,
        exc: BaseException,
        t0: float,
        *,
        name: str | None = None,
    ) -> None:
        display = name or (body["displayName"] if body else "(unknown)")
        # A stale holder must not run failed(), a chain's catch or a batch's failure count
        # for a job that was handed out again: check the token (and renew) first.
        if not await self._still_held(res, "its failure"):
            return
        if job is not None:
            try:
                out = job.failed(exc)
                if inspect.isawaitable(out):
                    await out
            except Exception:
                log.exception("failed() hook of %s raised", display)
        info = {
            "exception": _exception_text(exc),
            "name": display,
            "queue": res.queue,
            "attempts": res.attempts,
        }
        if body is not None:
            await self._retrying(lambda: self.host.after_failure(job, body, res.queue))
        k = self.rq.keys(res.queue)
        self._settling(res)
        moved = await self._retrying(lambda: self.broker.fail(k, res, info))
        if moved is False:
            self._reservation_lost(res, "its move to the failed store")
            return
        self.host.emit(
            JobFailed(
                res.id,
                res.queue,
                display,
                res.attempts,
                short_error(exc),
                _clock.monotonic() - t0,
            )
        )
