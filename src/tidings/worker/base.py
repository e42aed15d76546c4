"""What the worker's parts share: options, the host contract, exit codes, Redis errors.

:class:`~tidings.worker.worker.Worker` is assembled from mixins, one a concept (the map
is in :mod:`tidings.worker.worker`), all subclasses of :class:`WorkerBase`, which sets up
the whole state in one ``__init__`` and holds what every part calls: :meth:`~WorkerBase.stop`
and :meth:`~WorkerBase._retrying` (a Redis move retried through an outage).

Mixins rather than collaborator objects: every part reads the same few fields (the
running jobs, the broker, the stop flag, the pending acks), and the per-job path stays
plain ``self`` attribute access, with no object or call in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.asyncio
from redis.exceptions import ResponseError

from tidings import _clock
from tidings.jobs.job import Job
from tidings.moves.consume import Broker, Reserved
from tidings.moves.queues import RedisQueue
from tidings.observability.lifecycle import ReservationLost
from tidings.observability.redaction import redact
from tidings.redis.errors import REDIS_ERRORS as REDIS_ERRORS
from tidings.redis.errors import is_transient as is_transient
from tidings.wire.envelope import JobBody
from tidings.wire.signing import Signer
from tidings.worker.health import ServerWatch
from tidings.worker.threads import SyncRunner
from tidings.worker.wakeup import SlotWaits, Waiter

log = logging.getLogger("tidings.worker")

EXIT_MEMORY = 12
EXIT_STUCK = 13
EXIT_CONFIG = 78  # sysexits EX_CONFIG: e.g. a Redis too old to run on


class WorkerHost(Protocol):
    """What the worker needs from the App."""

    signer: Signer

    def queue_for(self, connection: str | None) -> RedisQueue: ...
    def resolve_class(self, path: str) -> type[Any]: ...
    def emit(self, event: object) -> None: ...
    def run_job_pipeline(self, job: Job, call: Callable[[], Awaitable[Any]]) -> Awaitable[Any]: ...
    async def after_success(self, job: Job, body: JobBody, queue: str) -> None: ...
    async def after_failure(self, job: Job | None, body: JobBody, queue: str) -> None: ...
    def wrap_thread_call(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...
    def skips_missing_model(self, job_cls: type[Any], data: Any) -> bool: ...

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
    max_stalls: int = 3
    """How often a job's lease may expire (its worker died or froze) before the job goes
    to the failed store unrun, as "stalled N times" (a job's ``max_stalls`` wins)."""
    backoff_s: float = 0.0
    rest_s: float = 0.0
    grace_s: float = 30.0
    fault_point: str | None = None


def short_error(exc: BaseException) -> str:
    """``Type: message``, redacted, then cut to 500 characters, for logs and events."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a hostile __str__ must not break the worker's bookkeeping
        text = f"{type(exc).__name__}: <str() failed>"
    # Redact before cutting: a secret straddling the cut must not survive in part.
    text = redact(text)
    return text if len(text) <= 500 else text[:500] + "..."


def reraise_cancel() -> None:
    """Re-raise a cancellation that a library turned into another error.

    redis-py's asyncio client may answer a cancellation in the middle of a command with
    a ConnectionError; a loop that retries those would swallow the cancel and never end.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(slots=True)
class RunningJob:
    """A job reserved by this worker, and the task that runs it."""

    reserved: Reserved
    task: asyncio.Task[None] | None = None
    settling: bool = False
    """A release or fail of it is on its way: its lease is no longer renewed (the move
    ends the reservation, and a renewal racing it would report a loss that is not one)."""


class WorkerBase:
    """The worker's state, :meth:`stop`, and the Redis moves its parts share."""

    broker: Broker  # set by run(), once connected
    watch: ServerWatch  # set by the start-up checks

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
        self._running: dict[str, RunningJob] = {}
        self._acks: dict[str, list[tuple[str, int]]] = {}  # queue -> [(id, token)]
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
        # Sync handlers run here (tidings.worker.threads): threads fed and settled in batches.
        self._runner = SyncRunner(max(1, options.concurrency), thread_name_prefix="job")
        self._started = _clock.monotonic()
        self._restart_seen = 0.0
        self._client: redis.asyncio.Redis | None = None
        self._blocking: redis.asyncio.Redis | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._wait: Waiter | SlotWaits | None = None
        # Holds the task that ends a blocking wait on stop (asyncio keeps only weak refs).
        self._interrupting: asyncio.Task[None] | None = None
        self._wait_errors = 0
        self._restart_garbage_logged = False

    def stop(self, reason: str = "stopped", code: int | None = None) -> None:
        """Stop taking jobs; running ones finish (released after the grace period)."""
        if code is not None and self.exit_code == 0:
            self.exit_code = code
        if not self._stopping:
            self._stopping = True
            self._stop_reason = reason
            self._resume.set()
            self._slot_free.set()

    async def _retrying(self, op: Callable[[], Awaitable[Any]], *, limit_s: float = 60.0) -> Any:
        """Run a Redis move, retrying through connection errors for up to ``limit_s``."""
        delay = 0.05
        deadline = _clock.monotonic() + limit_s
        while True:
            try:
                return await op()
            except (*REDIS_ERRORS, ResponseError) as exc:
                reraise_cancel()
                if not is_transient(exc):
                    raise
                if _clock.monotonic() > deadline:
                    log.error("giving up on a Redis move after %ss: %s", limit_s, short_error(exc))
                    return None
                log.warning("redis unavailable (%s); retrying in %.2fs", short_error(exc), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _release_now(self, res: Reserved) -> None:
        """Give a reserved job back, ready at once, without counting the attempt."""
        k = self.rq.keys(res.queue)
        self._settling(res)
        await self._retrying(lambda: self.broker.release(k, res, 0, uncount=True))

    def _settling(self, res: Reserved) -> None:
        """Mark ``res`` as being released or failed (see :attr:`RunningJob.settling`)."""
        entry = self._running.get(res.id)
        if entry is not None:
            entry.settling = True

    def _reservation_lost(self, res: Reserved, what: str) -> None:
        """Log (once per job) that ``res`` was handed out again: ``what`` was refused."""
        if res.id in self._lost:
            return
        self._lost.add(res.id)
        self.reservations_lost += 1
        log.warning(
            "reservation lost for %s: its lease expired and it was handed out again; "
            "%s refused, the new holder's run goes on",
            res.id,
            what,
        )
        self.host.emit(ReservationLost(res.id, res.queue))

    async def _still_held(self, res: Reserved, what: str) -> bool:
        """Renew ``res``'s lease, checking that its token is still the job's; False
        (and logged) when the job was handed out again. Workflow moves (chain links,
        batch counts) run only after this check, with a fresh lease."""
        k = self.rq.keys(res.queue)
        lost = await self._retrying(lambda: self.broker.extend(k, [(res.id, res.token)]))
        if lost:
            self._reservation_lost(res, what)
            return False
        return True
