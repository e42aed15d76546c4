"""The jobs this worker holds: one reservation per job id, whatever state it is in.

A job is held from the pop that reserved it until its ack, release or fail was
confirmed. Holding it by job id (not by task) is what keeps one worker from running a
job twice: when a pop hands this worker a job it already holds (its lease expired while
the worker was frozen, and the pop that recovered it ran for this same worker), the
reservation is *adopted*: the run in progress goes on under the new token, and every
later move (lease renewal, ack, release, fail) sends that token. A move sent with the
old token just before is refused as lost; the part that sent it sees the token moved
on (:meth:`HeldJob.adopted_since`) and sends it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from tidings.jobs.job import JobRun
from tidings.moves.consume import Reserved

log = logging.getLogger("tidings.worker")


class State(Enum):
    WAITING = "waiting"
    """Reserved, not started yet (a suspect job waiting to run alone)."""
    RUNNING = "running"
    SETTLING = "settling"
    """A release or fail is on its way: its lease is no longer renewed (the move ends the
    reservation, and a renewal racing it would report a loss that is not one)."""
    ACKING = "acking"
    """Finished; its ack is queued or in flight."""


@dataclass(slots=True, eq=False)
class HeldJob:
    """One reservation this worker holds, and the task running it."""

    reserved: Reserved
    state: State = State.RUNNING
    task: asyncio.Task[None] | None = None
    adoptions: int = 0
    lost_reported: bool = False
    run: JobRun | None = None
    """The run once the executor started it (a cancel reaches the handler through it)."""
    result: bytes | None = None
    """The signed return value its ack stores (``store_result``), if any."""
    result_ttl_ms: int = 0

    def request_cancel(self) -> None:
        """``app.cancel`` asked for this job: not started yet, it never runs; running,
        its run is asked to stop (see :meth:`JobRun.request_cancel`)."""
        self.reserved.cancelled = True
        if self.run is not None and self.state is State.RUNNING:
            self.run.request_cancel()

    @property
    def token(self) -> int:
        return self.reserved.token

    def adopted_since(self, token: int) -> bool:
        """Whether the reservation moved on to a newer token since ``token`` was sent."""
        return self.reserved.token != token


@dataclass(slots=True)
class HeldJobs:
    """Every reservation of this worker, by job id, and how many of them run."""

    _jobs: dict[str, HeldJob] = field(default_factory=dict)
    _running: int = 0
    slot_free: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no job runs (a suspect job waits for it, to run alone)."""

    def __post_init__(self) -> None:
        self.idle.set()

    def adopts(self, res: Reserved) -> bool:
        """Whether ``res`` is a job this worker holds under an earlier reservation that
        expired (the pop that recovered it counted a stall): the run in progress goes on
        under ``res``. A job popped again after this worker's own release took effect
        (same stall count) is a new reservation, not one to adopt."""
        held = self._jobs.get(res.id)
        if held is None:
            return False
        return res.token == held.reserved.token or res.stalls > held.reserved.stalls

    def hold(self, res: Reserved, state: State = State.RUNNING) -> HeldJob | None:
        """Hold ``res``; None when it is adopted (:meth:`adopts`: the new token replaces
        the old one, and nothing new is started)."""
        held = self._jobs.get(res.id)
        if held is None or not self.adopts(res):
            if held is not None:
                # Our release of it took effect and a pop handed it out again before the
                # release's reply came back: the old entry settles on its own, uncounted.
                self._count(held.state, None)
            held = self._jobs[res.id] = HeldJob(res, state)
            self._count(None, state)
            return held
        if res.token == held.reserved.token:
            return None  # the same reservation again
        old = held.reserved.token
        held.reserved.token = res.token
        held.reserved.stalls = res.stalls
        if res.cancelled:
            held.request_cancel()
        held.adoptions += 1
        held.lost_reported = False
        log.warning(
            "%s: its lease expired while this worker still held it (frozen or starved past "
            "retry_after) and a pop handed it back to this worker; the %s run goes on "
            "under the new reservation (token %d -> %d), it is not started again",
            res.id,
            held.state.value,
            old,
            res.token,
        )
        return None

    def get(self, job_id: str) -> HeldJob | None:
        return self._jobs.get(job_id)

    def cancel(self, job_id: str) -> bool:
        """Pass a cancel on to job ``job_id`` if this worker holds it."""
        held = self._jobs.get(job_id)
        if held is None:
            return False
        if not held.reserved.cancelled:
            log.info("%s: cancel asked for; stopping it", job_id)
        held.request_cancel()
        return True

    def set_state(self, held: HeldJob, state: State) -> None:
        if self._jobs.get(held.reserved.id) is held:
            self._count(held.state, state)
        held.state = state

    def drop(self, held: HeldJob) -> None:
        """Forget ``held`` (its ack, release or fail was confirmed, or given up)."""
        if self._jobs.get(held.reserved.id) is held:
            del self._jobs[held.reserved.id]
            if held.state is not State.ACKING:  # acking jobs take no slot
                self._count(held.state, None)

    def _count(self, before: State | None, after: State | None) -> None:
        was = before is not None and before is not State.ACKING
        now = after is not None and after is not State.ACKING
        if was == now:
            return
        self._running += 1 if now else -1
        if self._running < 1:
            self.idle.set()
            self.slot_free.set()
        elif now:
            self.idle.clear()
        else:
            self.slot_free.set()

    @property
    def running(self) -> int:
        """Jobs taking a slot: waiting to start, running or settling (not acking)."""
        return self._running

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[HeldJob]:
        return iter(list(self._jobs.values()))

    def renewable(self) -> dict[str, list[HeldJob]]:
        """Held jobs whose leases the worker renews, by queue (not those settling)."""
        by_queue: dict[str, list[HeldJob]] = {}
        for held in self._jobs.values():
            if held.state is not State.SETTLING:
                by_queue.setdefault(held.reserved.queue, []).append(held)
        return by_queue

    def tasks(self) -> list[asyncio.Task[None]]:
        return [h.task for h in self._jobs.values() if h.task is not None and not h.task.done()]
