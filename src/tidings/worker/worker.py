"""The asyncio worker, wired from its parts: reserve in batches, run up to N jobs at
once, settle each, ack in batches.

Each part is one object with its own state; :class:`Worker` builds them, starts their
tasks under one supervisor and drains on stop::

    Fetcher       fetch.py     the fetch loop, pops, the blocking wait, pause, suspects
    HeldJobs      held.py      every reservation of this worker, one per job id
    Executor      execute.py   one job: decode, middleware, timeout -> an Outcome
    Settler       settle.py    an Outcome in Redis: workflows, release, fail (fenced)
    AckBatcher    acks.py      acks in batches (results stored with them), broken data kept
                               to its queue
    ProgressWriter progress.py self.progress(...) to Redis, at most every 100 ms a job
    CancelListener cancels.py  app.cancel of a running job, heard on {prefix}:cancels
    LeaseKeeper   leases.py    lease renewal every third of retry_after
    Upkeep        upkeep.py    restart signal, server watch, --memory, --max-time
    Supervised    tasks.py     background tasks restarted or the worker stopped, never silent
    SyncRunner    threads.py   the job threads sync handlers run on

One job, start to end: ``Fetcher._take`` holds it and calls :meth:`Worker._start`;
``_run_one`` asks the executor for an outcome and hands it to the settler; a ``Done``
ends in the ack batcher, whose confirmed ack drops the job from ``HeldJobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

from tidings import _clock
from tidings.errors import ConfigurationError
from tidings.jobs.job import JobRun
from tidings.moves.consume import Broker, Reserved
from tidings.observability.lifecycle import WorkerStarting, WorkerStopping
from tidings.observability.metrics import WorkerSnapshot
from tidings.redis.clients import async_client
from tidings.redis.errors import REDIS_ERRORS, is_transient
from tidings.wire.envelope import read_body
from tidings.worker.acks import AckBatcher
from tidings.worker.cancels import CancelListener
from tidings.worker.execute import Executor
from tidings.worker.fetch import Fetcher
from tidings.worker.health import ServerWatch
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.host import WorkerHost
from tidings.worker.leases import LeaseKeeper
from tidings.worker.options import (
    EXIT_CONFIG,
    EXIT_MEMORY,
    EXIT_SOFTWARE,
    EXIT_STUCK,
    MAX_EXCEPTION_TEXT,
    WorkerOptions,
    short_error,
)
from tidings.worker.outcome import Fail
from tidings.worker.progress import ProgressWriter
from tidings.worker.retrying import GaveUp, retrying
from tidings.worker.settle import Settler
from tidings.worker.tasks import Supervised
from tidings.worker.threads import SyncRunner
from tidings.worker.upkeep import Upkeep
from tidings.worker.wakeup import make_waiter

__all__ = [
    "EXIT_CONFIG",
    "EXIT_MEMORY",
    "EXIT_SOFTWARE",
    "EXIT_STUCK",
    "MAX_EXCEPTION_TEXT",
    "Worker",
    "WorkerHost",
    "WorkerOptions",
]

log = logging.getLogger("tidings.worker")


class Worker:
    """Runs jobs from one connection's queues until told to stop."""

    def __init__(self, host: WorkerHost, options: WorkerOptions) -> None:
        self.host = host
        self.opts = options
        self.rq = host.queue_for(options.connection)
        self.keys = [self.rq.keys(q) for q in options.queues]
        self.exit_code = 0
        self.processed = 0
        self.held = HeldJobs()
        self.threads = SyncRunner(max(1, options.concurrency), thread_name_prefix="job")
        self.tasks = Supervised(self._part_died)
        self._stopping = False
        self._stop_reason = ""
        self._signals = 0
        self._client: redis.asyncio.Redis | None = None
        self._blocking: redis.asyncio.Redis | None = None
        self._fetcher: Fetcher | None = None
        self._settler: Settler | None = None
        self._progress: ProgressWriter | None = None

    # -- what others read ---------------------------------------------------------------

    @property
    def client(self) -> redis.asyncio.Redis | None:
        """The worker's Redis client (None before :meth:`run` connects)."""
        return self._client

    @property
    def reservations_lost(self) -> int:
        return self._settler.reservations_lost if self._settler is not None else 0

    @property
    def threads_left(self) -> bool:
        """Whether sync handlers are still running in threads (stuck, or past the grace
        period): the process must then exit without joining them."""
        return self.threads.busy > 0

    def snapshot(self) -> WorkerSnapshot:
        """What the worker shows of itself (heartbeats, metrics, the dashboard)."""
        return WorkerSnapshot(
            queues=tuple(self.opts.queues),
            concurrency=self.opts.concurrency,
            running=self.held.running,
            processed=self.processed,
            reservations_lost=self.reservations_lost,
            stopping=self._stopping,
            exit_code=self.exit_code,
        )

    def job_name(self, job_id: str) -> str | None:
        """The display name of a job this worker holds, read from its envelope (None
        when it holds none, or the envelope is unreadable)."""
        held = self.held.get(job_id)
        body = read_body(held.reserved.envelope, job_id) if held is not None else None
        name = body.get("displayName") if body is not None else None
        return name if isinstance(name, str) else None

    # -- control ------------------------------------------------------------------------

    def stop(self, reason: str = "stopped", code: int | None = None) -> None:
        """Stop taking jobs; running ones finish (released after the grace period)."""
        if code is not None and self.exit_code == 0:
            self.exit_code = code
        if not self._stopping:
            self._stopping = True
            self._stop_reason = reason
            if self._fetcher is not None:
                self._fetcher.stop()

    def _part_died(self, name: str) -> None:
        self.stop(f"its {name} task kept dying", EXIT_SOFTWARE)

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now, running jobs stay reserved")
            os._exit(1)
        n = self.held.running
        log.info(
            "%s: finishing %d running %s (grace %gs); a second signal exits at once",
            signal.Signals(signum).name,
            n,
            "job" if n == 1 else "jobs",
            self.opts.grace_s,
        )
        self.stop(f"signal {signal.Signals(signum).name}")

    def _pause(self) -> None:
        log.info("paused (SIGCONT resumes)")
        if self._fetcher is not None:
            self._fetcher.pause()

    def _resume(self) -> None:
        if self._fetcher is not None and self._fetcher.paused:
            log.info("resumed")
            self._fetcher.resume()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
            loop.add_signal_handler(signal.SIGUSR2, self._pause)
            loop.add_signal_handler(signal.SIGCONT, self._resume)

    # -- one job ------------------------------------------------------------------------

    def _start(self, held: HeldJob, now_s: float) -> asyncio.Task[None]:
        task = asyncio.create_task(self._run_one(held, now_s))
        held.task = task
        return task

    async def _run_one(self, held: HeldJob, now_s: float) -> None:
        assert self._settler is not None and self._progress is not None
        t0 = _clock.monotonic()
        progress = self._progress.for_job(held)

        def bind(run: JobRun) -> None:
            held.run = run
            run.report = progress.report

        try:
            if self.opts.fault_point:
                self._fault("after_pop")
            outcome = await self.executor.run(held.reserved, now_s, bind)
            await progress.flush()  # the last value reported is kept
            if self.opts.fault_point and not isinstance(outcome, Fail):
                self._fault("before_ack")
            await self._settler.settle(held, outcome, t0)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in the worker itself: the job is left to its lease
            log.exception("internal error while processing %s", held.reserved.id)
            self.held.drop(held)
        finally:
            if held.run is not None:
                # held -> run -> progress.report -> progress -> held is a reference cycle:
                # left in place, every job's objects (its body, its decoded job) wait for
                # the cyclic GC instead of being freed here (measured: ~12 objects a job
                # in gen-1 collections, 10-20 % of a no-op job's CPU). The run is over:
                # a late report (a sync handler's thread that overran) is dropped.
                held.run.report = None
            if held.state is not State.ACKING:
                self.held.drop(held)
            self.processed += 1
            if self.opts.max_jobs and self.processed >= self.opts.max_jobs:
                self.stop("--max-jobs reached")
            if self.opts.rest_s:
                await asyncio.sleep(self.opts.rest_s)

    def _fault(self, point: str) -> None:
        if self.opts.fault_point == point:
            os.kill(os.getpid(), signal.SIGKILL)

    async def _give_back(self, res: Reserved) -> None:
        """Give a reserved job back, ready at once, without counting the attempt."""
        assert self._broker is not None
        broker, k = self._broker, self.rq.keys(res.queue)
        try:
            await retrying(
                lambda: broker.release(k, res, 0, uncount=True),
                limit_s=self.opts.give_up_s,
                what=f"giving back {res.id}",
            )
        except GaveUp:
            pass  # logged; its lease ends and it runs again
        except ResponseError as exc:
            log.error("queue %r: cannot give back %s (%s)", res.queue, res.id, short_error(exc))

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self) -> int:
        """Work until stopped; returns the process exit code."""
        self._install_signals(asyncio.get_running_loop())
        self._client = client = async_client(self.rq.url)
        self._blocking = async_client(self.rq.url, socket_timeout_s=self.opts.sleep_s + 10.0)
        wait = make_waiter(self._blocking, self.keys, self.opts.sleep_s)
        self._broker = broker = Broker(
            client, retry_after_s=self.host.retry_after_s, max_bytes=self.host.max_payload_bytes
        )
        acks = AckBatcher(
            self.rq, broker, self.held,
            report_lost=lambda h, what: settler.report_lost(h, what),
            stopping=lambda: self._stopping,
        )  # fmt: skip
        self._settler = settler = Settler(self.host, self.opts, self.rq, broker, self.held, acks)
        self.executor = Executor(
            self.host, self.opts, self.threads,
            prefix=self.rq.prefix,
            stop=lambda reason, code: self.stop(reason, code),
            alone=lambda: self.held.running == 1,
        )  # fmt: skip
        leases = LeaseKeeper(
            self.rq, broker, self.held,
            retry_after_s=self.host.retry_after_s, report_lost=settler.report_lost,
            cancel=self.held.cancel,
        )  # fmt: skip
        self._progress = ProgressWriter(self.rq, broker, self.host.emit)
        cancels = CancelListener(client, self.rq.prefix, self.held)
        watch = ServerWatch(client, self.rq.prefix)
        upkeep = Upkeep(client, self.rq.prefix, self.opts, watch, self.stop)
        self._fetcher = fetcher = Fetcher(
            self.opts, self.keys, broker, self.held, acks, wait, self._blocking,
            start=self._start, give_back=self._give_back,
        )  # fmt: skip
        if self._stopping:
            fetcher.stop()
        try:
            if not await self._startup_checks(watch, upkeep):
                return self.exit_code
            self.host.emit(WorkerStarting(tuple(self.opts.queues), os.getpid()))
            self.tasks.start("acks", acks.run)
            self.tasks.start("leases", leases.run)
            self.tasks.start("upkeep", upkeep.run)
            self.tasks.start("cancels", cancels.run)
            for i, coro in enumerate(self.host.worker_tasks(self)):
                self.tasks.start(f"app-{i}", _once(coro), restart=False)
            try:
                await fetcher.run()
            except Exception:
                log.exception("the fetch loop died: the worker exits")
                self.stop("its fetch loop died", EXIT_SOFTWARE)
            self.stop(self._stop_reason or ("--once" if self.opts.once else "queue empty"))
            await self.tasks.stop(self._app_tasks())
            await self._drain()
            await acks.flush(limit_s=max(1.0, min(self.opts.grace_s, 10.0)))
            await self.tasks.stop()
            self.host.emit(WorkerStopping(self.exit_code, self._stop_reason))
            try:
                await self.host.worker_stopped(self)  # e.g. close SMTP/HTTP clients
            except Exception:
                log.exception("worker_stopped hook raised")
        finally:
            self.threads.close(wait=not self.threads_left)
            await wait.close()
            for c in (self._client, self._blocking):
                with contextlib.suppress(Exception):
                    await c.aclose()
        return self.exit_code

    def _app_tasks(self) -> list[str]:
        return [n for n in self.tasks.names() if n.startswith("app-")]

    async def _startup_checks(self, watch: ServerWatch, upkeep: Upkeep) -> bool:
        """Check the server once (see :mod:`tidings.worker.health`), waiting for Redis to
        come up; False when the worker must not run (too old a Redis, or stopped)."""
        delay = 0.05
        while not self._stopping:
            try:
                await watch.startup()
                await upkeep.check_restart(initial=True)
                return True
            except ConfigurationError as exc:
                log.critical("refusing to start: %s", exc)
                self.exit_code = EXIT_CONFIG
                return False
            except (*REDIS_ERRORS, ResponseError) as exc:
                if not is_transient(exc):
                    raise
                log.warning(
                    "redis unavailable at start-up (%s); retrying in %.2fs",
                    short_error(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False

    async def _drain(self) -> None:
        """Wait for running jobs; give back the ones still running after the grace period."""
        pending = self.held.tasks()
        if not pending:
            return
        _, still = await asyncio.wait(pending, timeout=self.opts.grace_s)
        for held in self.held:
            if held.task in still:
                assert held.task is not None
                held.task.cancel()
                log.warning("releasing %s: still running after the grace period", held.reserved.id)
                self.held.set_state(held, State.SETTLING)
                await self._give_back(held.reserved)
        if still:
            await asyncio.wait(still, timeout=1.0)


def _once(coro: Coroutine[Any, Any, None]) -> Any:
    """A factory for :class:`Supervised` that runs ``coro`` (a coroutine object) once."""

    async def run() -> None:
        await coro

    return run
