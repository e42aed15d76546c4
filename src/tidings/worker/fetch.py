"""The fetch side of the worker: keep ``concurrency`` jobs in flight, never sleep-poll.

The fetch loop pops from the queues in priority order, each pop reserving as many jobs
as there are free slots. When every queue is empty it blocks on all their wake-up lists
at once, for at most the time until the next delayed job is due. The pop of the first
queue rides behind that wait (see :mod:`tidings.worker.wakeup`): a wake-up's reply
carries the reserved jobs, and with one queue the loop needs no pop of its own after it.

Stopping ends a blocking wait at once (``CLIENT UNBLOCK``) instead of cutting the
connection, so the jobs the pop behind it reserved come back and are given back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from redis.exceptions import ResponseError

from tidings.redis import scripts
from tidings.worker.base import REDIS_ERRORS, is_transient, short_error
from tidings.worker.execute import JobRunner
from tidings.worker.wakeup import SlotWaits

log = logging.getLogger("tidings.worker")


class Fetcher(JobRunner):
    """Reserves jobs and starts them (see the module docstring)."""

    def stop(self, reason: str = "stopped", code: int | None = None) -> None:
        """Stop taking jobs; running ones finish (released after the grace period)."""
        waiter = None if self._stopping else self._waiter
        super().stop(reason, code)
        if waiter is not None:
            # Do not sit out a blocking wait of up to --sleep: the grace period starts now.
            self._interrupting = asyncio.ensure_future(self._interrupt_wait(waiter))

    async def _interrupt_wait(self, waiter: asyncio.Future[Any]) -> None:
        # A pop rides behind the wait: ask Redis to end the wait so that pop's jobs come
        # back and are given back, rather than cutting the connection under it. The wait
        # may not have reached Redis yet: try a few times.
        for _ in range(20):
            if waiter.done() or self._wait is None:
                return
            try:
                # Bounded: a CLIENT UNBLOCK that hangs (a node going away) must not hold
                # up the exit; cancelling the read is the fallback.
                if await asyncio.wait_for(self._wait.interrupt(), 2.0):
                    return
            except (*REDIS_ERRORS, TimeoutError):
                break
            await asyncio.sleep(0.05)
        waiter.cancel()

    async def _fetch_loop(self) -> None:
        backoff = 0.05
        # What the pop behind the last blocking wait found (see _block).
        carried: tuple[bool, float | None] | None = None
        while not self._stopping:
            await self._resume.wait()
            if self._stopping:
                break
            free = self.opts.concurrency - len(self._running)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            if carried is not None:
                (got, wait), carried = carried, None
            else:
                try:
                    got, wait = await self._pop_all(free)
                    backoff = 0.05
                except (*REDIS_ERRORS, ResponseError) as exc:
                    if not is_transient(exc):
                        raise
                    log.warning(
                        "redis unavailable (%s); retrying in %.2fs", short_error(exc), backoff
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
            if got:
                if self.opts.once:
                    await self._wait_all()
                    self.stop("--once")
                    continue
                free = self.opts.concurrency - len(self._running)
                if wait == 0 or len(self.keys) > 1 or free <= 0:
                    continue  # more are ready (pop again), or no slot is free
                # The one queue is empty now: wait for more without an empty pop first,
                # once the jobs just started have run up to their first wait.
                await asyncio.sleep(0)
            else:
                # --stop-when-empty waits for delayed and released jobs and for leases
                # held elsewhere (as Laravel's size() counts them); --once does not.
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
            carried = await self._block(timeout, 1 if self.opts.once else free)

    async def _wait_all(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _pop_all(self, free: int) -> tuple[bool, float | None]:
        got = False
        wait: float | None = None
        n_max = 1 if self.opts.once else free
        for k in self.keys:
            try:
                res = await self.broker.pop(k, n_max)
            except ResponseError as exc:
                if is_transient(exc):
                    raise
                # Data, not Redis, is broken (a key of the wrong type written by hand):
                # this queue is skipped with an error line; the others and the worker go
                # on (issue 12: the fetch loop never dies of data).
                log.error("cannot pop from queue %r: %s", k.name, short_error(exc))
                continue
            if res.dropped:
                log.info(
                    "queue %r: dropped %d entries of running or finished jobs "
                    "(stale copies or replays)",
                    k.name,
                    res.dropped,
                )
            if res.wait_s is not None:
                wait = res.wait_s if wait is None else min(wait, res.wait_s)
            for job in res.jobs:
                got = True
                self._start(job, res.now_s)
            n_max -= len(res.jobs)
            if n_max <= 0:
                break
        return got, wait

    async def _block(self, timeout: float, n: int) -> tuple[bool, float | None] | None:
        """Wait up to ``timeout`` for a wake-up on any queue. The pop of the first queue
        rides behind the wait (see :mod:`tidings.worker.wakeup`): its jobs are started
        here, and with one queue what it found is returned, so the fetch loop needs no
        pop of its own; None: the fetch loop pops as usual."""
        assert self._blocking is not None and self._wait is not None
        notify = [k.notify for k in self.keys]
        wait: Awaitable[Any]
        if isinstance(self._wait, SlotWaits):
            wait = self._wait.wait(timeout)  # several queues on Redis Cluster
        elif self._wait.pipelines:
            keys, args = self.broker.pop_command(self.keys[0], n)
            wait = self._wait.wait(notify, timeout, scripts.POP, keys, args)
        else:
            wait = self._blocking.blpop(notify, timeout=timeout)
        self._waiter = asyncio.ensure_future(wait)
        try:
            raw = await self._waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the fetch loop itself is cancelled, not just the wait
            return None
        except (*REDIS_ERRORS, ResponseError) as exc:
            if not is_transient(exc):
                # Broken data behind the pop that rides the wait (issue 12): the fetch
                # loop's own pop reports it per queue; never die of it.
                log.error("wait failed: %s", short_error(exc))
                self._wait_errors += 1
                await asyncio.sleep(min(timeout, 0.05 * 2 ** min(self._wait_errors, 5)))
                return None
            # The fetch loop pops at once (a killed connection costs no wait) and backs
            # off if Redis is down; only a wait failing again and again sleeps here.
            self._wait_errors += 1
            log.warning("redis unavailable while waiting (%s)", short_error(exc))
            if self._wait_errors > 1:
                await asyncio.sleep(min(timeout, 0.05 * 2 ** min(self._wait_errors, 5)))
            return None
        finally:
            self._waiter = None
        self._wait_errors = 0
        if isinstance(self._wait, SlotWaits) or not self._wait.pipelines or raw is None:
            return None
        res = self.broker.read_pop(self.keys[0], raw)
        if self._stopping:
            for job in res.jobs:  # reserved as the wait was ended: give them back
                await self._release_now(job)
            return None
        for job in res.jobs:
            self._start(job, res.now_s)
        if len(self.keys) > 1:
            return None
        return bool(res.jobs), res.wait_s
