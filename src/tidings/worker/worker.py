"""The asyncio worker: reserve in batches, run up to N jobs at once, ack in batches.

One fetch loop keeps ``concurrency`` jobs in flight. It pops from the queues in priority
order (each pop reserves as many jobs as there are free slots) and, when every queue is
empty, blocks on all their wake-up lists at once for at most the time until the next
delayed job is due, so no worker sleep-polls. Async handlers run as tasks, sync ones on
long-lived threads fed in batches (:mod:`tidings.worker.threads`). Acks collect while one
is in flight and go out together.

A housekeeping task renews the leases of running jobs every third of ``retry_after`` and
checks the restart signal, ``--memory`` and ``--max-time``. Redis errors anywhere are
logged and retried with a capped backoff; the worker never dies of them.

The worker is put together from one mixin a concept, all on one shared state::

    Worker(Fetcher(JobRunner(WorkerBase)), Upkeep(WorkerBase))

    WorkerBase  worker_base    options, host contract, exit codes, transient Redis errors;
                               the shared state, stop(), Redis moves retried through outages
    JobRunner   worker_jobs    one job: decode, middleware, timeout; ack, release or fail
    Fetcher     worker_fetch   the fetch loop, pops, the blocking wait and its interrupt
    Upkeep      worker_upkeep  acks in batches, leases, restart, --memory, --max-time
    Worker      (here)         lifecycle: run, signals, start-up checks, drain within --grace

The names the CLI, the supervisor and tests import (``Worker``, ``WorkerOptions``,
``WorkerHost``, the ``EXIT_*`` codes, ``REDIS_ERRORS``, ``is_transient``) are
re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from redis.exceptions import ResponseError

from tidings.errors import ConfigurationError
from tidings.moves.consume import Broker
from tidings.observability.lifecycle import WorkerStarting, WorkerStopping
from tidings.redis.clients import async_client
from tidings.worker.base import (
    EXIT_CONFIG,
    EXIT_MEMORY,
    EXIT_STUCK,
    REDIS_ERRORS,
    WorkerHost,
    WorkerOptions,
    is_transient,
    short_error,
)
from tidings.worker.execute import MAX_EXCEPTION_TEXT
from tidings.worker.fetch import Fetcher
from tidings.worker.health import ServerWatch
from tidings.worker.upkeep import Upkeep
from tidings.worker.wakeup import make_waiter

__all__ = [
    "EXIT_CONFIG",
    "EXIT_MEMORY",
    "EXIT_STUCK",
    "MAX_EXCEPTION_TEXT",
    "REDIS_ERRORS",
    "Worker",
    "WorkerHost",
    "WorkerOptions",
    "is_transient",
]

log = logging.getLogger("tidings.worker")


class Worker(Fetcher, Upkeep):
    """Runs jobs from one connection's queues until told to stop."""

    @property
    def threads_left(self) -> bool:
        """Whether sync handlers are still running in threads (stuck, or past the grace
        period): the process must then exit without joining them."""
        return self._runner.busy > 0

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now, running jobs stay reserved")
            os._exit(1)
        name = signal.Signals(signum).name
        log.info(
            "%s: finishing %d running %s (grace %gs); a second signal exits at once",
            name,
            len(self._running),
            "job" if len(self._running) == 1 else "jobs",
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
        self._wait = make_waiter(self._blocking, self.keys, self.opts.sleep_s)
        self.broker = Broker(
            self._client,
            retry_after_s=self.host.retry_after_s,
            max_bytes=self.host.max_payload_bytes,
        )
        if not await self._startup_checks():
            for c in (self._client, self._blocking):
                with contextlib.suppress(Exception):
                    await c.aclose()
            self._runner.close(wait=False)
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
            self._runner.close(wait=not self.threads_left)
            await self._wait.close()
            for c in (self._client, self._blocking):
                with contextlib.suppress(Exception):
                    await c.aclose()
        return self.exit_code

    async def _startup_checks(self) -> bool:
        """Check the server once (see :mod:`tidings.worker.health`), waiting for Redis to
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
                    "redis unavailable at start-up (%s); retrying in %.2fs",
                    short_error(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False

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
