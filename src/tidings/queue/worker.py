"""The asyncio worker: reserve in batches, run up to N jobs at once, ack in batches.

One fetch loop keeps ``concurrency`` jobs in flight. It pops from the queues in priority
order (each pop reserves as many jobs as there are free slots) and, when every queue is
empty, blocks on all their wake-up lists at once for at most the time until the next
delayed job is due, so no worker sleep-polls. Async handlers run as tasks, sync ones in
a thread pool. Acks collect while one is in flight and go out together.

A housekeeping task renews the leases of running jobs every third of ``retry_after`` and
checks the restart signal, ``--memory`` and ``--max-time``. Redis errors anywhere are
logged and retried with a capped backoff; the worker never dies of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import signal
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tidings import _clock
from tidings.errors import (
    ConfigurationError,
    JobTimeout,
    MaxAttemptsExceeded,
    PayloadRejected,
    SerializationError,
)
from tidings.queue import serializer
from tidings.queue.backoff import delay_for
from tidings.queue.broker import Broker, Reserved
from tidings.queue.connection import async_client
from tidings.queue.events import (
    JobFailed,
    JobProcessed,
    JobProcessing,
    JobReleased,
    ReservationLost,
    WorkerStarting,
    WorkerStopping,
)
from tidings.queue.health import ServerWatch
from tidings.queue.job import Job, JobRun, _run, running
from tidings.queue.keys import restart_key
from tidings.queue.payload import JobBody, open_envelope
from tidings.queue.redis_queue import RedisQueue
from tidings.queue.signing import Signer

log = logging.getLogger("tidings.worker")

REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
# Replies that mean "not now" rather than "never": out of memory, a replica that was the
# primary a moment ago, a failover or cluster resharding in progress, a busy script.
_TRANSIENT_REPLIES = ("MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN", "BUSY ")


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis error is worth retrying (connection trouble or a transient reply)."""
    if isinstance(exc, (*REDIS_ERRORS, OutOfMemoryError, ReadOnlyError)):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT_REPLIES)


EXIT_MEMORY = 12
EXIT_STUCK = 13
EXIT_CONFIG = 78  # sysexits EX_CONFIG: e.g. a Redis too old to run on
MAX_EXCEPTION_TEXT = 8192


class WorkerHost(Protocol):
    """What the worker needs from the App."""

    signer: Signer

    def queue_for(self, connection: str | None) -> RedisQueue: ...
    def resolve_class(self, path: str) -> type[Any]: ...
    def emit(self, event: object) -> None: ...
    def run_job_pipeline(self, job: Job, call: Callable[[], Awaitable[Any]]) -> Awaitable[Any]: ...
    async def after_success(self, job: Job, body: JobBody, queue: str) -> None: ...
    async def after_failure(self, job: Job | None, body: JobBody, queue: str) -> None: ...

    @property
    def retry_after_s(self) -> float: ...
    @property
    def max_payload_bytes(self) -> int: ...


@dataclass(slots=True)
class WorkerOptions:
    """``notify-worker`` options."""

    queues: list[str] = field(default_factory=lambda: ["default"])
    connection: str | None = None
    concurrency: int = 16
    once: bool = False
    stop_when_empty: bool = False
    max_jobs: int = 0
    max_time_s: float = 0.0
    memory_mb: float = 0.0
    sleep_s: float = 3.0
    timeout_s: float = 60.0
    tries: int = 1
    backoff_s: float = 0.0
    rest_s: float = 0.0
    grace_s: float = 30.0
    fault_point: str | None = None


def _exception_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    if len(text) > MAX_EXCEPTION_TEXT:
        text = (
            text[: MAX_EXCEPTION_TEXT // 2]
            + "\n...[truncated]...\n"
            + text[-MAX_EXCEPTION_TEXT // 2 :]
        )
    return text


def _short(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a hostile __str__ must not break the worker's bookkeeping
        text = f"{type(exc).__name__}: <str() failed>"
    return text if len(text) <= 500 else text[:500] + "..."


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reraise_cancel() -> None:
    """Re-raise a cancellation that a library turned into another error.

    redis-py's asyncio client may answer a cancellation in the middle of a command with
    a ConnectionError; a loop that retries those would swallow the cancel and never end.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(slots=True)
class _Running:
    reserved: Reserved
    task: asyncio.Task[None] | None = None


class Worker:
    """Runs jobs from one connection's queues until told to stop."""

    def __init__(self, host: WorkerHost, options: WorkerOptions) -> None:
        self.host = host
        self.opts = options
        self.rq = host.queue_for(options.connection)
        self.keys = [self.rq.keys(q) for q in options.queues]
        self.signer = host.signer
        self.exit_code = 0
        self.processed = 0
        self.reservations_lost = 0
        self._lost: set[str] = set()  # running jobs whose lease loss was reported
        self._running: dict[str, _Running] = {}
        self._acks: dict[str, list[str]] = {}
        self._ack_event = asyncio.Event()
        # Held while a batch of acks is out: the final flush at exit waits for the ack
        # loop's batch in flight instead of cancelling it (which left jobs reserved).
        self._ack_lock = asyncio.Lock()
        self._slot_free = asyncio.Event()
        self._resume = asyncio.Event()
        self._resume.set()
        self._stopping = False
        self._stop_reason = ""
        self._signals = 0
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, options.concurrency), thread_name_prefix="job"
        )
        self._started = _clock.monotonic()
        self._restart_seen = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._client: redis.asyncio.Redis | None = None
        self._blocking: redis.asyncio.Redis | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._threads_busy = 0

    # -- lifecycle -------------------------------------------------------------------

    def stop(self, reason: str = "stopped", code: int | None = None) -> None:
        """Stop taking jobs; running ones finish (released after the grace period)."""
        if code is not None and self.exit_code == 0:
            self.exit_code = code
        if not self._stopping:
            self._stopping = True
            self._stop_reason = reason
            self._resume.set()
            self._slot_free.set()
            if self._waiter is not None:
                # Do not sit out a blocking wait of up to --sleep: the grace period
                # starts now.
                self._waiter.cancel()

    @property
    def threads_left(self) -> bool:
        """Whether sync handlers are still running in threads (stuck, or past the grace
        period): the process must then exit without joining them."""
        return self._threads_busy > 0

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now, running jobs stay reserved")
            os._exit(1)
        name = signal.Signals(signum).name
        log.info(
            "%s: finishing %d running jobs (grace %gs); a second signal exits at once",
            name,
            len(self._running),
            self.opts.grace_s,
        )
        self.stop(f"signal {name}")

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            loop.add_signal_handler(signal.SIGUSR2, self._pause)
            loop.add_signal_handler(signal.SIGCONT, self._resume.set)

    def _pause(self) -> None:
        log.info("paused (SIGCONT resumes)")
        self._resume.clear()

    async def run(self) -> int:
        """Work until stopped; returns the process exit code."""
        loop = asyncio.get_running_loop()
        self._install_signals(loop)
        self._client = async_client(self.rq.url)
        self._blocking = async_client(self.rq.url, socket_timeout_s=self.opts.sleep_s + 10.0)
        self.broker = Broker(
            self._client,
            retry_after_s=self.host.retry_after_s,
            max_bytes=self.host.max_payload_bytes,
        )
        if not await self._startup_checks():
            for c in (self._client, self._blocking):
                with contextlib.suppress(Exception):
                    await c.aclose()
            self._executor.shutdown(wait=False)
            return self.exit_code
        self.host.emit(WorkerStarting(tuple(self.opts.queues), os.getpid()))
        acker = asyncio.create_task(self._ack_loop())
        keeper = asyncio.create_task(self._housekeeping())
        fetcher = asyncio.create_task(self._fetch_loop())
        # The App's own tasks for this process (the scheduler, the supervisor heartbeat).
        tasks: list[Any] = getattr(self.host, "worker_tasks", lambda w: [])(self)
        side = [asyncio.create_task(c) for c in tasks]
        try:
            await fetcher
        finally:
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            await self._drain()
            self._ack_event.set()
            self._stopping = True
            await self._flush_acks()
            for t in (acker, keeper):
                t.cancel()
            await asyncio.gather(acker, keeper, return_exceptions=True)
            self.host.emit(WorkerStopping(self.exit_code, self._stop_reason))
            stopped = getattr(self.host, "worker_stopped", None)  # e.g. close SMTP/HTTP clients
            if stopped is not None:
                try:
                    await stopped(self)
                except Exception:
                    log.exception("worker_stopped hook raised")
            self._executor.shutdown(wait=not self.threads_left, cancel_futures=True)
            for c in (self._client, self._blocking):
                with contextlib.suppress(Exception):
                    await c.aclose()
        return self.exit_code

    async def _startup_checks(self) -> bool:
        """Check the server once (see :mod:`tidings.queue.health`), waiting for Redis to
        come up; False when the worker must not run (too old a Redis, or stopped)."""
        assert self._client is not None
        self.watch = ServerWatch(self._client, self.rq.prefix)
        delay = 0.05
        while not self._stopping:
            try:
                await self.watch.startup()
                await self._check_restart(initial=True)
                return True
            except ConfigurationError as exc:
                log.critical("refusing to start: %s", exc)
                self.exit_code = EXIT_CONFIG
                return False
            except (*REDIS_ERRORS, ResponseError) as exc:
                if not is_transient(exc):
                    raise
                log.warning(
                    "redis unavailable at start-up (%s); retrying in %.2fs", _short(exc), delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False

    def _thread_done(self, _fut: asyncio.Future[Any]) -> None:
        self._threads_busy -= 1

    async def _drain(self) -> None:
        """Wait for running jobs; release the ones still running after the grace period."""
        pending = [r.task for r in self._running.values() if r.task is not None]
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.opts.grace_s)
            for r in list(self._running.values()):
                if r.task in still:
                    r.task.cancel()
                    log.warning("releasing %s: still running after the grace period", r.reserved.id)
                    await self._release_now(r.reserved)
            if still:
                await asyncio.wait(still, timeout=1.0)

    async def _release_now(self, res: Reserved) -> None:
        k = self.rq.keys(res.queue)
        await self._retrying(lambda: self.broker.release(k, res.id, 0, uncount=True))

    # -- fetching --------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        backoff = 0.05
        while not self._stopping:
            await self._resume.wait()
            if self._stopping:
                break
            free = self.opts.concurrency - len(self._running)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            try:
                got, wait = await self._pop_all(free)
                backoff = 0.05
            except (*REDIS_ERRORS, ResponseError) as exc:
                if not is_transient(exc):
                    raise
                log.warning("redis unavailable (%s); retrying in %.2fs", _short(exc), backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if got:
                if self.opts.once:
                    await self._wait_all()
                    self.stop("--once")
                continue
            # --stop-when-empty waits for delayed and released jobs and for leases held
            # elsewhere (as Laravel's size() counts them); --once does not.
            idle = not self._running and (wait is None or self.opts.once)
            if (self.opts.stop_when_empty or self.opts.once) and idle:
                self.stop("queue empty")
                break
            if wait is not None and wait <= 0.15:
                # Redis checks blocking timeouts on its 10 Hz tick (up to ~100 ms late):
                # for a job due this soon, a local timer is more punctual.
                await asyncio.sleep(wait)
                continue
            timeout = self.opts.sleep_s if wait is None else min(self.opts.sleep_s, wait)
            await self._block(timeout)

    async def _wait_all(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _pop_all(self, free: int) -> tuple[bool, float | None]:
        got = False
        wait: float | None = None
        n_max = 1 if self.opts.once else free
        for k in self.keys:
            res = await self.broker.pop(k, n_max)
            if res.wait_s is not None:
                wait = res.wait_s if wait is None else min(wait, res.wait_s)
            for job in res.jobs:
                got = True
                self._start(job, res.now_s)
            n_max -= len(res.jobs)
            if n_max <= 0:
                break
        return got, wait

    async def _block(self, timeout: float) -> None:
        assert self._blocking is not None
        self._waiter = asyncio.ensure_future(
            self._blocking.blpop([k.notify for k in self.keys], timeout=timeout)
        )
        try:
            await self._waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the fetch loop itself is cancelled, not just the wait
        except REDIS_ERRORS as exc:
            log.warning("redis unavailable while waiting (%s)", _short(exc))
            await asyncio.sleep(min(timeout, 1.0))
        finally:
            self._waiter = None

    def _start(self, reserved: Reserved, now_s: float) -> None:
        entry = _Running(reserved)
        self._running[reserved.id] = entry
        task = asyncio.create_task(self._process(reserved, now_s))
        entry.task = task

    # -- running one job ---------------------------------------------------------------

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
            body = open_envelope(res.envelope, self.signer, job_id=res.id)
        except PayloadRejected as exc:
            await self._fail(res, None, None, exc, t0, name="(rejected)")
            return
        try:
            cls = self.host.resolve_class(body["job"])
            if not (isinstance(cls, type) and issubclass(cls, Job)):
                raise PayloadRejected(f"unknown job type {body['job']!r}: not a Job class")
            job = serializer.decode(body["data"], self.host.resolve_class)
            if not isinstance(job, cls):
                raise PayloadRejected("malformed payload: data does not hold the named job")
        except (PayloadRejected, SerializationError) as exc:
            await self._fail(res, body, None, exc, t0)
            return
        max_tries = body["maxTries"] if body["maxTries"] is not None else self.opts.tries
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
            await self._retrying(
                lambda: self.broker.release(k, res.id, run.released_s or 0.0, uncount=run.uncount)
            )
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
            # Chains and batches advance before the ack (see tidings.queue.workflow).
            await self._retrying(lambda: self.host.after_success(job, body, res.queue))
            self._acks.setdefault(res.queue, []).append(res.id)
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
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, ctx.run, handle)
        self._threads_busy += 1
        fut.add_done_callback(self._thread_done)
        done, _ = await asyncio.wait({fut}, timeout=limit)
        if not done:
            # A thread cannot be cancelled: fail or release this job, finish the others,
            # and exit non-zero so the supervisor starts a fresh process.
            log.error(
                "sync job %s overran its timeout of %ss; the worker will exit", run.job_id, limit
            )
            self.stop("a sync job could not be cancelled after its timeout", EXIT_STUCK)
            raise JobTimeout(f"job ran longer than its timeout of {limit}s (sync; worker recycled)")
        result = fut.result()
        if inspect.isawaitable(result):
            return await result
        return result

    async def _on_exception(
        self, res: Reserved, body: JobBody, job: Job, exc: BaseException, max_tries: int, t0: float
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
        await self._retrying(lambda: self.broker.release(k, res.id, delay, exception=True))
        self.host.emit(
            JobReleased(
                res.id,
                res.queue,
                body["displayName"],
                res.attempts,
                delay,
                _clock.monotonic() - t0,
                _short(exc),
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
        await self._retrying(lambda: self.broker.fail(k, res.id, info))
        self.host.emit(
            JobFailed(
                res.id, res.queue, display, res.attempts, _short(exc), _clock.monotonic() - t0
            )
        )

    # -- acks, leases, housekeeping ------------------------------------------------------

    async def _retrying(self, op: Callable[[], Awaitable[Any]], *, limit_s: float = 60.0) -> Any:
        """Run a Redis move, retrying through connection errors for up to ``limit_s``."""
        delay = 0.05
        deadline = _clock.monotonic() + limit_s
        while True:
            try:
                return await op()
            except (*REDIS_ERRORS, ResponseError) as exc:
                _reraise_cancel()
                if not is_transient(exc):
                    raise
                if _clock.monotonic() > deadline:
                    log.error("giving up on a Redis move after %ss: %s", limit_s, _short(exc))
                    return None
                log.warning("redis unavailable (%s); retrying in %.2fs", _short(exc), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _ack_loop(self) -> None:
        while True:
            await self._ack_event.wait()
            self._ack_event.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        async with self._ack_lock:
            while self._acks:
                batch, self._acks = self._acks, {}
                for queue, ids in batch.items():
                    lost = int(await self._ack(queue, ids) or 0)
                    # Jobs whose loss a lease renewal already reported count once.
                    known = sum(1 for i in ids if i in self._lost)
                    self._lost.difference_update(ids)
                    lost = max(0, lost - known)
                    if lost:
                        self.reservations_lost += lost
                        log.warning(
                            "reservation lost for %d of %d acked jobs on %r: their lease had "
                            "expired, so they may have run elsewhere too",
                            lost,
                            len(ids),
                            queue,
                        )

    async def _ack(self, queue: str, ids: list[str]) -> Any:
        k = self.rq.keys(queue)
        return await self._retrying(lambda: self.broker.ack(k, ids))

    async def _housekeeping(self) -> None:
        lease_every = max(0.2, self.host.retry_after_s / 3)
        next_lease = _clock.monotonic() + lease_every
        while True:
            await asyncio.sleep(min(1.0, lease_every))
            try:
                if _clock.monotonic() >= next_lease:
                    next_lease = _clock.monotonic() + lease_every
                    await self._renew_leases()
                await self._check_restart()
                await self.watch.tick()
            except REDIS_ERRORS as exc:
                log.warning("housekeeping: redis unavailable (%s)", _short(exc))
            except ResponseError as exc:  # pragma: no cover - e.g. OOM on a write
                log.warning("housekeeping: %s", exc)
            _reraise_cancel()
            if self.opts.memory_mb and _rss_mb() > self.opts.memory_mb:
                self.stop(f"memory above {self.opts.memory_mb} MB", EXIT_MEMORY)
            if self.opts.max_time_s and _clock.monotonic() - self._started > self.opts.max_time_s:
                self.stop("--max-time reached")

    async def _renew_leases(self) -> None:
        by_queue: dict[str, list[str]] = {}
        for job_id, entry in list(self._running.items()):
            by_queue.setdefault(entry.reserved.queue, []).append(job_id)
        for queue, ids in by_queue.items():
            lost = await self.broker.extend(self.rq.keys(queue), ids)
            if len(self._lost) > 10_000:  # ids of lost jobs later released, not acked
                self._lost.clear()
            for job_id in lost:
                if job_id in self._lost:
                    continue  # reported at an earlier renewal
                self._lost.add(job_id)
                self.reservations_lost += 1
                log.warning("reservation lost for %s: it may run elsewhere too", job_id)
                self.host.emit(ReservationLost(job_id, queue))

    async def _check_restart(self, *, initial: bool = False) -> None:
        assert self._client is not None
        raw = await self._client.get(restart_key(self.rq.prefix))
        value = float(raw) if raw else 0.0
        if initial:
            self._restart_seen = value
        elif value > self._restart_seen:
            self.stop("restart requested")
