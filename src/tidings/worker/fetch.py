"""The fetch loop: keep ``concurrency`` jobs in flight, never sleep-poll.

It pops from the queues in priority order, each pop reserving as many jobs as there are
free slots. When every queue is empty it blocks on all their wake-up lists at once, for
at most the time until the next delayed job is due. The pop of the first queue rides
behind that wait (:mod:`tidings.worker.wakeup`): a wake-up's reply carries the reserved
jobs, and with one queue the loop needs no pop of its own after it.

Stopping or pausing (SIGUSR2) ends a blocking wait at once (``CLIENT UNBLOCK``) instead
of cutting the connection; jobs the pop behind it reserved are given back, uncounted,
never started while the worker is paused.

A job whose lease expired before (``stalls`` > 0: its worker died or froze with it) is a
suspect: the pop hands it out alone, and the worker runs it with nothing beside it (the
jobs it runs finish and are acked first). A job that kills its process then takes only
itself down, and its stalls, not its neighbours', run up to ``max_stalls``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

from tidings import _clock
from tidings.moves.consume import Broker, Reserved
from tidings.redis import scripts
from tidings.redis.errors import REDIS_ERRORS, is_transient, reraise_cancel
from tidings.redis.keys import QueueKeys
from tidings.worker.acks import AckBatcher
from tidings.worker.held import HeldJob, HeldJobs, State
from tidings.worker.options import WorkerOptions, short_error
from tidings.worker.wakeup import SlotWaits, Waiter

log = logging.getLogger("tidings.worker")

Start = Callable[[HeldJob, float], asyncio.Task[None]]
GiveBack = Callable[[Reserved], Awaitable[None]]


class Fetcher:
    """Reserves jobs and hands them to ``start`` (see the module docstring)."""

    def __init__(
        self,
        options: WorkerOptions,
        keys: Sequence[QueueKeys],
        broker: Broker,
        held: HeldJobs,
        acks: AckBatcher,
        wait: Waiter | SlotWaits,
        blocking: redis.asyncio.Redis,
        *,
        start: Start,
        give_back: GiveBack,
    ) -> None:
        self.opts = options
        self.keys = list(keys)
        self.broker = broker
        self.lease_s = broker.lease_ms / 1000.0
        self.held = held
        self.acks = acks
        self.wait = wait
        self.blocking = blocking
        self._start = start
        self._give_back = give_back
        self.stopping = False
        self._stopped = asyncio.Event()
        self.resumed = asyncio.Event()
        self.resumed.set()
        self._waiter: asyncio.Future[Any] | None = None
        self._interrupting: asyncio.Task[None] | None = None
        self._wait_errors = 0

    # -- control ------------------------------------------------------------------------

    def stop(self) -> None:
        """Take no more jobs; end a blocking wait at once."""
        self.stopping = True
        self._stopped.set()
        self.resumed.set()
        self.held.slot_free.set()
        self._end_wait()

    def pause(self) -> None:
        """Take no jobs until :meth:`resume` (SIGUSR2); a wait in progress ends now."""
        self.resumed.clear()
        self._end_wait()

    def resume(self) -> None:
        self.resumed.set()

    @property
    def paused(self) -> bool:
        return not self.resumed.is_set()

    def _end_wait(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            # Do not sit out a blocking wait of up to --sleep: the grace period starts now.
            self._interrupting = asyncio.ensure_future(self._interrupt_wait(waiter))

    async def _interrupt_wait(self, waiter: asyncio.Future[Any]) -> None:
        # A pop rides behind the wait: ask Redis to end the wait so that pop's jobs come
        # back and are given back, rather than cutting the connection under it. The wait
        # may not have reached Redis yet: try a few times.
        for _ in range(20):
            if waiter.done():
                return
            try:
                # Bounded: a CLIENT UNBLOCK that hangs (a node going away) must not hold
                # up the exit; cancelling the read is the fallback.
                if await asyncio.wait_for(self.wait.interrupt(), 2.0):
                    return
            except (*REDIS_ERRORS, TimeoutError):
                break
            await asyncio.sleep(0.05)
        waiter.cancel()

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        backoff = 0.05
        # What the pop behind the last blocking wait found (see _block).
        carried: tuple[bool, float | None] | None = None
        while not self.stopping:
            await self.resumed.wait()
            if self.stopping:
                break
            free = self.opts.concurrency - self.held.running
            if free <= 0:
                self.held.slot_free.clear()
                if self.opts.concurrency - self.held.running <= 0:
                    await self.held.slot_free.wait()
                continue
            held_before = len(self.held)
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
                    break
                free = self.opts.concurrency - self.held.running
                if wait == 0 or len(self.keys) > 1 or free <= 0 or self.opts.stop_when_empty:
                    # More are ready (pop again), no slot is free, or draining: an empty
                    # pop, not a blocking wait, tells --stop-when-empty it is done.
                    continue
                # The one queue is empty now: wait for more without an empty pop first,
                # once the jobs just started have run up to their first wait.
                await asyncio.sleep(0)
            else:
                if self.opts.stop_when_empty and held_before and not len(self.held):
                    # This worker's last jobs were acked while the pop ran: the wait it
                    # returned may be their leases' (they were still reserved). Pop again
                    # rather than sit out a blocking wait for them.
                    continue
                if self.opts.stop_when_empty and len(self.held):
                    # Nothing ready, but this worker's own jobs still run or wait for
                    # their acks: their ends decide whether the queue is empty, not a
                    # blocking wait.
                    await self.held.idle.wait()
                    await self.acks.flush()
                    if not len(self.held):
                        continue
                # --stop-when-empty waits for delayed and released jobs and for leases
                # held elsewhere (as Laravel's size() counts them); --once does not.
                idle = not self.held.running and (wait is None or self.opts.once)
                if (self.opts.stop_when_empty or self.opts.once) and idle:
                    break
            if wait is not None and wait <= 0.15:
                # Redis checks blocking timeouts on its 10 Hz tick (up to ~100 ms late):
                # for a job due this soon, a local timer is more punctual.
                await asyncio.sleep(wait)
                continue
            timeout = self.opts.sleep_s if wait is None else min(self.opts.sleep_s, wait)
            carried = await self._block(timeout, 1 if self.opts.once else free)

    async def _wait_all(self) -> None:
        tasks = self.held.tasks()
        if tasks:
            await asyncio.wait(tasks)

    async def _pop_all(self, free: int) -> tuple[bool, float | None]:
        got = False
        wait: float | None = None
        n_max = 1 if self.opts.once else free
        for k in self.keys:
            sent = _clock.monotonic()
            try:
                res = await self.broker.pop(k, n_max)
            except ResponseError as exc:
                if is_transient(exc):
                    raise
                # Data, not Redis, is broken (a key of the wrong type written by hand):
                # this queue is skipped with an error line; the others and the worker go on.
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
            if res.jobs:
                got = True
                jobs = await self._fresh(k, res.jobs, sent)
                if await self._take(jobs, res.now_s):
                    break  # a suspect ran alone: pop again from the first queue
            n_max -= len(res.jobs)
            if n_max <= 0:
                break
        return got, wait

    async def _fresh(self, k: QueueKeys, jobs: list[Reserved], sent: float) -> list[Reserved]:
        """The popped ``jobs`` still this worker's. A reply can sit unread for longer
        than a lease: the pop behind a blocking wait runs on the server even while the
        worker is frozen (SIGSTOP, a starved VM), and its jobs may have expired and gone
        to another worker meanwhile. When the reply took more than half a lease to come
        back, the leases are renewed first (one script call) and the jobs whose token
        moved on are not started."""
        if _clock.monotonic() - sent <= self.lease_s / 2:
            return jobs
        try:
            lost = set((await self.broker.extend(k, [(j.id, j.token) for j in jobs])).lost)
        except (*REDIS_ERRORS, ResponseError) as exc:
            reraise_cancel()
            log.warning(
                "could not check a late pop reply (%s); starting its jobs", short_error(exc)
            )
            return jobs
        if lost:
            log.warning(
                "a pop reply on queue %r came back %.1fs late (the worker was frozen or "
                "starved); %d of its jobs had been handed out again meanwhile and are not "
                "started here",
                k.name,
                _clock.monotonic() - sent,
                len(lost),
            )
        return [j for j in jobs if j.id not in lost]

    async def _take(self, jobs: Sequence[Reserved], now_s: float) -> bool:
        """Start the popped ``jobs`` (or give them back when paused or stopping);
        True when one was a suspect, run alone."""
        if self.stopping or self.paused:
            for res in jobs:
                if self.held.adopts(res):
                    self.held.hold(res)  # adopted: the run in progress goes on
                else:
                    await self._give_back(res)  # never started while paused
            return False
        suspect = False
        for res in jobs:
            if res.stalls > 0 and len(jobs) == 1 and not self.held.adopts(res):
                suspect = True
                await self._run_alone(res, now_s)
                continue
            held = self.held.hold(res)
            if held is not None:
                self._start(held, now_s)
        return suspect

    async def _run_alone(self, res: Reserved, now_s: float) -> None:
        """Run a suspect job with nothing beside it (see the module docstring)."""
        held = self.held.hold(res, State.WAITING)
        if held is None:
            return
        while self.held.running > 1 and not self.stopping:
            self.held.slot_free.clear()
            if self.held.running > 1:
                await self.held.slot_free.wait()
        await self.acks.flush()
        if self.stopping:
            self.held.drop(held)
            await self._give_back(res)
            return
        log.info(
            "%s stalled before (%d); running it alone in case it is what brought its worker down",
            res.id,
            res.stalls,
        )
        self.held.set_state(held, State.RUNNING)
        task = self._start(held, now_s)
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not self.stopping:
            await self.acks.flush()

    async def _block(self, timeout: float, n: int) -> tuple[bool, float | None] | None:
        """Wait up to ``timeout`` for a wake-up on any queue. The pop of the first queue
        rides behind the wait (see :mod:`tidings.worker.wakeup`): its jobs are started
        here, and with one queue what it found is returned, so the fetch loop needs no
        pop of its own; None: the fetch loop pops as usual."""
        notify = [k.notify for k in self.keys]
        wait: Awaitable[Any]
        if isinstance(self.wait, SlotWaits):
            wait = self.wait.wait(timeout)  # several queues on Redis Cluster
        elif self.wait.pipelines:
            keys, args = self.broker.pop_command(self.keys[0], n)
            wait = self.wait.wait(notify, timeout, scripts.POP, keys, args)
        else:
            wait = self.blocking.blpop(notify, timeout=timeout)
        self._waiter = asyncio.ensure_future(wait)
        sent = _clock.monotonic()
        try:
            raw = await self._waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the fetch loop itself is cancelled, not just the wait
            return None
        except (*REDIS_ERRORS, ResponseError) as exc:
            self._wait_errors += 1
            if not is_transient(exc):
                # Broken data behind the pop that rides the wait: the fetch loop's own
                # pop reports it per queue; never die of it.
                log.error("wait failed: %s", short_error(exc))
                await asyncio.sleep(min(timeout, 0.05 * 2 ** min(self._wait_errors, 5)))
                return None
            # The fetch loop pops at once (a killed connection costs no wait) and backs
            # off if Redis is down; only a wait failing again and again sleeps here.
            log.warning("redis unavailable while waiting (%s)", short_error(exc))
            if self._wait_errors > 1:
                await asyncio.sleep(min(timeout, 0.05 * 2 ** min(self._wait_errors, 5)))
            return None
        finally:
            self._waiter = None
        self._wait_errors = 0
        if isinstance(self.wait, SlotWaits) or not self.wait.pipelines or raw is None:
            return None
        res = self.broker.read_pop(self.keys[0], raw)
        jobs = await self._fresh(self.keys[0], res.jobs, sent) if res.jobs else res.jobs
        suspect = await self._take(jobs, res.now_s)
        if len(self.keys) > 1 or suspect or self.stopping or self.paused:
            return None
        return bool(res.jobs), res.wait_s
