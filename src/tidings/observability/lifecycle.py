"""Lifecycle events of the queue, announced through the app's dispatcher.

They come in pairs (``JobProcessing`` -> ``JobProcessed`` / ``JobFailed`` /
``JobReleased``); the worker's own output lines are listeners of these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobQueued:
    """A job was pushed."""

    job_id: str
    queue: str
    name: str
    delay_s: float


@dataclass(frozen=True, slots=True)
class JobProcessing:
    """A worker is about to run a job."""

    job_id: str
    queue: str
    name: str
    attempts: int
    wait_s: float
    """Seconds from dispatch (or due time) to this start."""


@dataclass(frozen=True, slots=True)
class JobProcessed:
    """A job ran to completion and was acknowledged."""

    job_id: str
    queue: str
    name: str
    attempts: int
    duration_s: float


@dataclass(frozen=True, slots=True)
class JobReleased:
    """A job was put back to run again later."""

    job_id: str
    queue: str
    name: str
    attempts: int
    delay_s: float
    duration_s: float
    exception: str | None


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A job went to the failed store."""

    job_id: str
    queue: str
    name: str
    attempts: int
    exception: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class WorkerStarting:
    """A worker is starting on its queues."""

    queues: tuple[str, ...]
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerStopping:
    """A worker is exiting with ``status``."""

    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReservationLost:
    """A running job's lease had expired and it may run elsewhere too."""

    job_id: str
    queue: str


@dataclass(frozen=True, slots=True)
class JobProgressed:
    """A running job reported progress (``self.progress``; throttled: at most one event
    per 100 ms per job, the last value always announced)."""

    job_id: str
    queue: str
    done: float
    total: float | None
    note: str | None


@dataclass(frozen=True, slots=True)
class JobWasCancelled:
    """A job was cancelled by ``app.cancel``: settled unrun, or its run stopped."""

    job_id: str
    queue: str
    name: str
    ran: bool
    """Whether its handler had started (an async one was cancelled, a sync one stopped)."""
