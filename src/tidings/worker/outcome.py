"""What running one job decided, before any of it is written to Redis.

The executor (:mod:`tidings.worker.execute`) returns one of these; the settler
(:mod:`tidings.worker.settle`) carries it out, fenced by the job's reservation token.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidings.jobs.job import Job
from tidings.wire.envelope import JobBody


@dataclass(slots=True)
class Done:
    """``handle`` returned (or the job was skipped): advance its workflows, then ack."""

    job: Job | None
    body: JobBody
    skipped: bool = False
    """A job whose model argument is gone, dropped as its class asks: acked, counted
    as done in its batch, never run, no chain advanced."""
    result: bytes | None = None
    """The signed return value to store with the ack (``store_result``), if any."""


@dataclass(slots=True)
class Retry:
    """Put the job back, due in ``delay_s``: a retry after an exception (``error``), or
    a release asked for by the job or its middleware (``error`` None)."""

    body: JobBody
    delay_s: float
    error: BaseException | None = None
    uncount: bool = False
    """Give the attempt back (limits that are not the job's fault)."""


@dataclass(slots=True)
class Fail:
    """Move the job to the failed store with ``error`` as its reason (``failed()``, a
    chain's catch and a batch's failure count first)."""

    error: BaseException
    body: JobBody | None
    job: Job | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """``app.cancel`` asked for the job: record it as cancelled (no retry, no
    ``failed()``, no chain catch; its batch counts it as cancelled)."""

    body: JobBody
    ran: bool
    """Whether its handler had started."""


Outcome = Done | Retry | Fail | Cancelled
