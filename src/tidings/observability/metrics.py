"""Per-job measurements kept in bounded Redis structures, and the worker heartbeats.

Every worker measures every job it runs (no cron, no sampling): the wait from dispatch
(or due time) to start, the runtime, and the outcome. It adds them up in memory, per
queue and per job class, and writes the sums once a second in one pipeline, so a job
costs a few dictionary updates and no Redis round trip of its own. What lands in Redis
is bounded by design, whatever the throughput::

    {prefix}:stats:{Q}:<minute>             hash: the queue's counts in that minute
    {prefix}:stats:{Q}:<minute>:c:<class>   hash: the same for one job class
    {prefix}:stats:{Q}:classes              hash: class -> last minute it ran (index)
    {prefix}:stats:{Q}:total                hash: <class>|<field> -> count since ever
    {prefix}:stats:jobs:<minute>            hash: job id -> "queue wait_us run_us outcome"
    {prefix}:workers                        zset: worker id -> last heartbeat (ms)
    {prefix}:worker:<id>                    JSON heartbeat of one live worker (expires)

``<minute>`` is the epoch minute. Minute hashes expire after :data:`RETAIN_S` (two
hours: the dashboard shows the last one), so their number is bounded by
queues x classes x 120 whatever the job count; the total hashes grow with the classes
only (at most :data:`MAX_CLASSES` a queue from one worker; more fold into ``(other)``).
Per-job timings (for :meth:`App.job_status`) keep at most :data:`JOB_TIMING_CAP` jobs a
minute for :data:`JOB_TIMING_TTL_S`. Fields of a count hash::

    p f r s      processed, failed, released, stalled (lease lost) runs
    ru rn        runtime: sum (µs) and count of measured runs
    wu wn        wait: sum (µs) and count of measured starts
    rh<i> wh<i>  runtime / wait histogram: runs in bucket i of :data:`HIST_MS`

A worker heartbeat is written in the same pipeline with a TTL of
:data:`WORKER_TTL_S`: a worker that stops (or is SIGKILLed) disappears within it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import redis.asyncio

from tidings.observability.lifecycle import (
    JobFailed,
    JobProcessed,
    JobProcessing,
    JobReleased,
    ReservationLost,
)
from tidings.observability.process import rss_mb
from tidings.redis.errors import REDIS_ERRORS, reraise_cancel

log = logging.getLogger("tidings.observability.metrics")

BUCKET_S = 60
RETAIN_S = 7200
JOB_TIMING_TTL_S = 3600
JOB_TIMING_CAP = 1000
WORKER_TTL_S = 15
MAX_CLASSES = 200
MAX_CLASS_LEN = 200
OTHER = "(other)"
FLUSH_EVERY_S = 1.0
HIST_MS: tuple[float, ...] = (
    1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)  # fmt: skip
"""Upper bounds (ms) of the histogram buckets; a last bucket holds everything above."""
NBUCKETS = len(HIST_MS) + 1
OUTCOMES = {"p": "processed", "f": "failed", "r": "released", "s": "stalled"}
# Every field of a bucket hash: the outcomes and the sums behind the averages.
_FIELDS = OUTCOMES | {"ru": "runtime_us", "rn": "runtime_n", "wu": "wait_us", "wn": "wait_n"}


# -- key names ----------------------------------------------------------------------------


def minute_of(t: float) -> int:
    """The epoch minute of ``t`` (seconds)."""
    return int(t // BUCKET_S)


def queue_minute_key(prefix: str, queue: str, minute: int) -> str:
    return f"{prefix}:stats:{{{queue}}}:{minute}"


def class_minute_key(prefix: str, queue: str, minute: int, cls: str) -> str:
    return f"{prefix}:stats:{{{queue}}}:{minute}:c:{cls}"


def classes_key(prefix: str, queue: str) -> str:
    return f"{prefix}:stats:{{{queue}}}:classes"


def totals_key(prefix: str, queue: str) -> str:
    return f"{prefix}:stats:{{{queue}}}:total"


def timing_key(prefix: str, minute: int) -> str:
    return f"{prefix}:stats:jobs:{minute}"


def workers_key(prefix: str) -> str:
    return f"{prefix}:workers"


def worker_key(prefix: str, worker_id: str) -> str:
    return f"{prefix}:worker:{worker_id}"


def stats_queues_pattern(prefix: str) -> str:
    """SCAN pattern of the per-queue class indexes (queues that have measurements)."""
    return f"{prefix}:stats:{{*}}:classes"


# -- in-memory sums -----------------------------------------------------------------------


_bisect = bisect.bisect_left


@dataclass(slots=True)
class Counts:
    """Counts of one queue (or one class of a queue) over some span."""

    processed: int = 0
    failed: int = 0
    released: int = 0
    stalled: int = 0
    runtime_us: float = 0  # float while a worker adds up, int once read from Redis
    runtime_n: int = 0
    wait_us: float = 0
    wait_n: int = 0
    runtime_hist: list[int] = field(default_factory=lambda: [0] * NBUCKETS)
    wait_hist: list[int] = field(default_factory=lambda: [0] * NBUCKETS)

    def fields(self) -> dict[str, int]:
        """The non-zero fields, as stored in Redis."""
        out: dict[str, int] = {
            "p": self.processed,
            "f": self.failed,
            "r": self.released,
            "s": self.stalled,
            "ru": round(self.runtime_us),
            "rn": self.runtime_n,
            "wu": round(self.wait_us),
            "wn": self.wait_n,
        }
        for i, n in enumerate(self.runtime_hist):
            out[f"rh{i}"] = n
        for i, n in enumerate(self.wait_hist):
            out[f"wh{i}"] = n
        return {k: v for k, v in out.items() if v}

    @classmethod
    def from_fields(cls, raw: Mapping[Any, Any]) -> Counts:
        """Counts from a Redis hash (unknown or unreadable fields are ignored)."""
        c = cls()
        c.add_fields(raw)
        return c

    def add_fields(self, raw: Mapping[Any, Any]) -> None:
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            try:
                n = int(v)
            except (TypeError, ValueError):
                continue
            attr = _FIELDS.get(name)
            if attr is not None:
                setattr(self, attr, getattr(self, attr) + n)
            elif name[:2] in ("rh", "wh") and name[2:].isdigit() and int(name[2:]) < NBUCKETS:
                hist = self.runtime_hist if name[0] == "r" else self.wait_hist
                hist[int(name[2:])] += n

    def add(self, other: Counts) -> None:
        self.processed += other.processed
        self.failed += other.failed
        self.released += other.released
        self.stalled += other.stalled
        self.runtime_us += other.runtime_us
        self.runtime_n += other.runtime_n
        self.wait_us += other.wait_us
        self.wait_n += other.wait_n
        for i in range(NBUCKETS):
            self.runtime_hist[i] += other.runtime_hist[i]
            self.wait_hist[i] += other.wait_hist[i]

    @property
    def runtime_avg_ms(self) -> float | None:
        return self.runtime_us / self.runtime_n / 1000 if self.runtime_n else None

    @property
    def wait_avg_ms(self) -> float | None:
        return self.wait_us / self.wait_n / 1000 if self.wait_n else None

    def percentile_ms(self, q: float, *, wait: bool = False) -> float | None:
        """An upper bound of the ``q`` quantile (0..1) from the histogram buckets."""
        hist = self.wait_hist if wait else self.runtime_hist
        total = sum(hist)
        if not total:
            return None
        rank = q * total
        seen = 0
        for i, n in enumerate(hist):
            seen += n
            if seen >= rank:
                return HIST_MS[i] if i < len(HIST_MS) else float("inf")
        return float("inf")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class JobTiming:
    """The measured wait and runtime of one job's last run."""

    queue: str
    wait_s: float | None
    runtime_s: float | None
    outcome: str


@dataclass(frozen=True, slots=True)
class Progress:
    """What a job last reported with ``self.progress(done, total, note)``; ``at`` is
    when (epoch seconds)."""

    done: float
    total: float | None
    note: str | None
    at: float

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Progress | None:
        """Read the stored JSON (None when absent or unreadable)."""
        if not raw:
            return None
        try:
            doc = orjson.loads(raw)
            total = doc.get("total")
            note = doc.get("note")
            return cls(
                float(doc["done"]),
                None if total is None else float(total),
                None if note is None else str(note),
                float(doc["at"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None


class JobStatus(str):
    """A job's state (``"done"``...) that also carries its measured wait and runtime,
    and the progress it last reported (``progress``, None if it never did)."""

    wait_s: float | None
    runtime_s: float | None
    outcome: str | None
    progress: Progress | None

    @classmethod
    def of(
        cls, state: str, timing: JobTiming | None, progress: Progress | None = None
    ) -> JobStatus:
        s = cls(state)
        s.wait_s = timing.wait_s if timing else None
        s.runtime_s = timing.runtime_s if timing else None
        s.outcome = timing.outcome if timing else None
        s.progress = progress
        return s


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """What a worker shows of itself (:meth:`tidings.worker.worker.Worker.snapshot`)."""

    queues: tuple[str, ...] = ()
    concurrency: int = 0
    running: int = 0
    processed: int = 0
    reservations_lost: int = 0
    stopping: bool = False
    exit_code: int = 0


class Observed(Protocol):
    """The worker a :class:`Meter` measures."""

    @property
    def client(self) -> redis.asyncio.Redis | None: ...
    def snapshot(self) -> WorkerSnapshot: ...
    def job_name(self, job_id: str) -> str | None: ...


class Meter:
    """Adds up the worker's lifecycle events and writes them out once a second.

    :meth:`observe` is called by ``App.emit`` for every lifecycle event of a worker
    process (a few dictionary updates); :meth:`run` is the flushing task.
    """

    def __init__(self, prefix: str, *, worker: Observed | None = None, version: str = "") -> None:
        self.prefix = prefix
        self.worker = worker
        self.version = version
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started_at = time.time()
        # (queue, class) -> sums since the last flush, and since the start
        self._pending: dict[tuple[str, str], Counts] = {}
        self.totals: dict[tuple[str, str], Counts] = {}
        self._waits: dict[str, float] = {}  # running job id -> wait (s), while timings fit
        self._last: Counts | None = None  # the (queue, class) of the last event
        self._last_queue = ""
        self._last_name = ""
        self._timings: list[tuple[str, str]] = []  # (job id, "queue wait run outcome")
        self._timing_minute = -1
        self._timing_room = JOB_TIMING_CAP
        self._classes: dict[str, set[str]] = {}

    # -- hot path ---------------------------------------------------------------------

    def _counts(self, queue: str, name: str) -> Counts:
        key = (queue, name)
        c = self._pending.get(key)
        if c is None:
            seen = self._classes.setdefault(queue, set())
            if name not in seen:
                if len(seen) >= MAX_CLASSES or len(name) > MAX_CLASS_LEN:
                    return self._counts(queue, OTHER) if name != OTHER else self._new(key)
                seen.add(name)
            c = self._new(key)
        self._last, self._last_queue, self._last_name = c, queue, name
        return c

    def _new(self, key: tuple[str, str]) -> Counts:
        c = self._pending[key] = Counts()
        return c

    def _running_name(self, job_id: str) -> str:
        name = self.worker.job_name(job_id) if self.worker is not None else None
        return name if isinstance(name, str) else OTHER  # not running here any more

    def observe(self, event: object) -> None:
        """Record one lifecycle event (``App.emit`` calls this in worker processes).

        This runs twice a job: kept to a few attribute updates (sums in float µs, the
        last (queue, class) remembered, per-job timings only while there is room).
        """
        kind = type(event)
        e: Any = event
        if kind is JobProcessing:
            c = self._last
            if c is None or e.name != self._last_name or e.queue != self._last_queue:
                c = self._counts(e.queue, e.name)
            wait = e.wait_s
            c.wait_us += wait * 1e6
            c.wait_n += 1
            c.wait_hist[_bisect(HIST_MS, wait * 1000)] += 1
            if self._timing_room > 0:
                if len(self._waits) > 10_000:  # starts of jobs that never finished
                    self._waits.clear()
                self._waits[e.job_id] = wait
            return
        if kind is ReservationLost:  # rare: the class is read back from the envelope
            self._counts(e.queue, self._running_name(e.job_id)).stalled += 1
            return
        if kind is not JobProcessed and kind is not JobFailed and kind is not JobReleased:
            return
        c = self._last
        if c is None or e.name != self._last_name or e.queue != self._last_queue:
            c = self._counts(e.queue, e.name)
        if kind is JobProcessed:
            c.processed += 1
        elif kind is JobFailed:
            c.failed += 1
        else:
            c.released += 1
        d = e.duration_s
        c.runtime_us += d * 1e6
        c.runtime_n += 1
        c.runtime_hist[_bisect(HIST_MS, d * 1000)] += 1
        if self._timing_room > 0:
            self._timing_room -= 1
            started = self._waits.pop(e.job_id, None)
            w = "-" if started is None else str(int(started * 1e6))
            outcome = "p" if kind is JobProcessed else "f" if kind is JobFailed else "r"
            self._timings.append((e.job_id, f"{e.queue} {w} {int(d * 1e6)} {outcome}"))

    # -- flushing ---------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        """What the dashboard and ``notify-worker workers`` show of this worker."""
        snap = self.worker.snapshot() if self.worker is not None else WorkerSnapshot()
        return {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(snap.queues),
            "concurrency": snap.concurrency,
            "running": snap.running,
            "processed": snap.processed,
            "started_at": self.started_at,
            "beat_at": time.time(),
            "rss_mb": round(rss_mb(), 1),
            "version": self.version,
            "child": os.environ.get("TIDINGS_CHILD", ""),
            "pool": os.environ.get("TIDINGS_POOL", ""),
        }

    def _commands(self, pipe: Any, now: float, *, beat: bool) -> None:
        minute = minute_of(now)
        pending, self._pending = self._pending, {}
        self._last = None
        by_queue: dict[str, Counts] = {}
        for (queue, name), c in pending.items():
            fields = c.fields()
            total = self.totals.get((queue, name))
            if total is None:
                total = self.totals[(queue, name)] = Counts()
            total.add(c)
            if not fields:
                continue
            by_queue.setdefault(queue, Counts()).add(c)
            ck = class_minute_key(self.prefix, queue, minute, name)
            tk = totals_key(self.prefix, queue)
            for f, n in fields.items():
                pipe.hincrby(ck, f, n)
                pipe.hincrby(tk, f"{name}|{f}", n)
            pipe.expire(ck, RETAIN_S)
            pipe.hset(classes_key(self.prefix, queue), name, minute)
            pipe.expire(classes_key(self.prefix, queue), RETAIN_S)
        for queue, c in by_queue.items():
            qk = queue_minute_key(self.prefix, queue, minute)
            for f, n in c.fields().items():
                pipe.hincrby(qk, f, n)
            pipe.expire(qk, RETAIN_S)
        if self._timings:
            key = timing_key(self.prefix, minute)
            flat: list[str] = []
            for job_id, value in self._timings:
                flat += (job_id, value)
            self._timings = []
            pipe.hset(key, items=flat)
            pipe.expire(key, JOB_TIMING_TTL_S)
        if minute != self._timing_minute:
            self._timing_minute = minute
            self._timing_room = JOB_TIMING_CAP  # corrected by the HLEN below
        pipe.hlen(timing_key(self.prefix, minute))
        if beat:
            wk = workers_key(self.prefix)
            pipe.set(worker_key(self.prefix, self.id), orjson.dumps(self.heartbeat()),
                     ex=WORKER_TTL_S)  # fmt: skip
            pipe.zadd(wk, {self.id: int(now * 1000)})
            pipe.zremrangebyscore(wk, "-inf", int((now - 4 * WORKER_TTL_S) * 1000))
            pipe.expire(wk, 4 * WORKER_TTL_S)

    async def flush(self, client: Any, *, beat: bool = True) -> None:
        """Write what was measured since the last flush, and the heartbeat, in one pipeline."""
        pipe = client.pipeline(transaction=False)
        self._commands(pipe, time.time(), beat=beat)
        replies = await pipe.execute()
        hlen_at = -4 if beat else -1
        with contextlib.suppress(IndexError, TypeError, ValueError):
            self._timing_room = max(0, JOB_TIMING_CAP - int(replies[hlen_at]))

    async def run(self) -> None:
        """The flushing task of a worker: once a second until cancelled."""
        while self.worker is None or not self.worker.snapshot().stopping:
            await asyncio.sleep(FLUSH_EVERY_S)  # close() flushes the rest
            client = self.worker.client if self.worker is not None else None
            if client is None:
                continue
            try:
                await self.flush(client)
            except (*REDIS_ERRORS, Exception) as exc:  # metrics never stop the worker
                reraise_cancel()
                log.warning("metrics: could not write (%s: %s)", type(exc).__name__, exc)
            # redis-py can swallow a cancellation that lands inside a pipeline; without
            # this the task would sleep on and the worker's shutdown wait for it forever.
            reraise_cancel()

    async def close(self, client: Any) -> None:
        """Final flush and heartbeat removal, as the worker exits."""
        try:
            await self.flush(client, beat=False)
            pipe = client.pipeline(transaction=False)
            pipe.delete(worker_key(self.prefix, self.id))
            pipe.zrem(workers_key(self.prefix), self.id)
            await pipe.execute()
        except Exception as exc:
            log.warning("metrics: final write failed (%s: %s)", type(exc).__name__, exc)


# -- reading (dashboard, CLI, /metrics) -----------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def measured_queues(client: Any, prefix: str) -> list[str]:
    """Queues that have measurements in the last two hours."""
    pattern = stats_queues_pattern(prefix)
    start = len(f"{prefix}:stats:{{")
    names = set()
    for key in client.scan_iter(match=pattern, count=500):
        text = _text(key)
        names.add(text[start : text.rindex("}")])
    return sorted(names)


def job_classes(client: Any, prefix: str, queue: str) -> list[str]:
    """Job classes measured on ``queue`` in the last two hours, most recent first."""
    raw = client.hgetall(classes_key(prefix, queue))
    pairs = sorted(((_int(v), _text(k)) for k, v in raw.items()), reverse=True)
    return [name for _, name in pairs]


def _float(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return f if f == f and abs(f) != float("inf") else 0.0


def _clean_beat(beat: dict[str, Any]) -> dict[str, Any]:
    """A heartbeat with the types the readers expect, whatever was stored."""
    queues = beat.get("queues")
    return {
        "id": str(beat.get("id", "")),
        "host": str(beat.get("host", "")),
        "pid": _int(beat.get("pid")),
        "queues": [str(q) for q in queues] if isinstance(queues, list) else [],
        "concurrency": _int(beat.get("concurrency")),
        "running": _int(beat.get("running")),
        "processed": _int(beat.get("processed")),
        "started_at": _float(beat.get("started_at")),
        "beat_at": _float(beat.get("beat_at")),
        "rss_mb": round(_float(beat.get("rss_mb")), 1),
        "version": str(beat.get("version", "")),
        "child": str(beat.get("child", "")),
        "pool": str(beat.get("pool", "")),
    }


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def series(
    client: Any,
    prefix: str,
    queue: str,
    cls: str | None = None,
    *,
    minutes: int = 60,
    now: float | None = None,
) -> list[tuple[int, Counts]]:
    """Per-minute counts of a queue (or one class of it) over the last ``minutes``,
    oldest first, one entry a minute (empty minutes included)."""
    last = minute_of(time.time() if now is None else now)
    wanted = list(range(last - minutes + 1, last + 1))
    pipe = client.pipeline(transaction=False)
    for m in wanted:
        key = (
            queue_minute_key(prefix, queue, m)
            if cls is None
            else class_minute_key(prefix, queue, m, cls)
        )
        pipe.hgetall(key)
    replies = _replies(pipe)
    return [(m, Counts.from_fields(raw)) for m, raw in zip(wanted, replies, strict=True)]


def _replies(pipe: Any) -> list[Any]:
    """A pipeline's replies, with an error reply (a key of the wrong type) as empty."""
    return [{} if isinstance(r, Exception) else r for r in pipe.execute(raise_on_error=False)]


def summed(points: Iterable[tuple[int, Counts]]) -> Counts:
    total = Counts()
    for _, c in points:
        total.add(c)
    return total


def totals(client: Any, prefix: str, queues: Sequence[str]) -> dict[tuple[str, str], Counts]:
    """Counts since ever, per (queue, class), from the total hashes."""
    out: dict[tuple[str, str], Counts] = {}
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.hgetall(totals_key(prefix, q))
    for q, raw in zip(queues, _replies(pipe), strict=True):
        grouped: dict[str, dict[str, Any]] = {}
        for k, v in raw.items():
            name, _, f = _text(k).rpartition("|")
            grouped.setdefault(name, {})[f] = v
        for name, fields in grouped.items():
            out[(q, name)] = Counts.from_fields(fields)
    return out


def job_timing(client: Any, prefix: str, job_id: str, now: float | None = None) -> JobTiming | None:
    """The measured wait and runtime of a job, while its record lasts (an hour)."""
    last = minute_of(time.time() if now is None else now)
    minutes = range(last, last - JOB_TIMING_TTL_S // BUCKET_S - 2, -1)
    pipe = client.pipeline(transaction=False)
    for m in minutes:
        pipe.hget(timing_key(prefix, m), job_id)
    for raw in _replies(pipe):
        if raw and isinstance(raw, bytes | str):
            parts = _text(raw).split(" ")
            if len(parts) != 4:
                continue
            queue, wait, run, outcome = parts
            try:
                wait_s = None if wait == "-" else int(wait) / 1e6
                run_s = int(run) / 1e6
            except ValueError:
                continue
            return JobTiming(queue, wait_s, run_s, OUTCOMES.get(outcome, outcome))
    return None


def live_workers(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Heartbeats of the live workers (a worker silent for WORKER_TTL_S is gone)."""
    ids = [_text(i) for i in client.zrange(workers_key(prefix), 0, -1)]
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)  # not MGET: the keys span cluster slots
    for i in ids:
        pipe.get(worker_key(prefix, i))
    raws = [r if isinstance(r, bytes | str) else None for r in _replies(pipe)]
    out: list[dict[str, Any]] = []
    for raw in raws:
        if not raw:
            continue
        try:
            beat = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(beat, dict):
            out.append(_clean_beat(beat))
    out.sort(key=lambda b: (str(b.get("host", "")), _int(b.get("pid"))))
    return out
