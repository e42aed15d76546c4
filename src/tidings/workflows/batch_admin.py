"""Reading and operating batches: snapshots, listing, cancel, prune.

The counters are written only by the Lua scripts of :mod:`tidings.workflows.batch`; this
module reads them (``HGETALL`` of ``{prefix}:batch:{<id>}``) and runs the cancel script.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from tidings.hosts import AppHost
from tidings.redis import scripts
from tidings.redis.keys import BatchKeys, batches_key


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(value: Any) -> float | None:
    n = int(value or 0)
    return n / 1000.0 if n else None


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """A snapshot of a batch.

    Attributes:
        total: jobs counted into the batch.
        pending: jobs not finished yet.
        processed: jobs that succeeded (a job skipped because the batch was cancelled
            counts here too).
        failed: jobs that finally failed.
        cancelled_jobs: jobs cancelled with ``app.cancel`` (``then`` does not fire when
            any was; ``finally`` does).
        created_at, finished_at, cancelled_at: epoch seconds on Redis's clock, or None.
    """

    id: str
    name: str
    total: int
    pending: int
    processed: int
    failed: int
    created_at: float
    finished_at: float | None
    cancelled_at: float | None
    allow_failures: bool
    cancelled_jobs: int = 0

    @property
    def progress(self) -> float:
        """Percent of jobs finished (succeeded or failed), 0-100."""
        if self.total == 0:
            return 100.0
        return round(100.0 * (self.total - self.pending) / self.total, 2)

    @property
    def cancelled(self) -> bool:
        """Whether the batch was cancelled (by ``cancel()`` or its first failure)."""
        return self.cancelled_at is not None

    @property
    def finished(self) -> bool:
        """Whether every job has finished."""
        return self.finished_at is not None

    def summary(self) -> dict[str, Any]:
        """The JSON shape of ``notify-worker batches list --json``."""
        return {
            "id": self.id,
            "name": self.name,
            "total": self.total,
            "pending": self.pending,
            "processed": self.processed,
            "failed": self.failed,
            "cancelled_jobs": self.cancelled_jobs,
            "progress": self.progress,
            "cancelled": self.cancelled,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_hash(cls, batch_id: str, raw: dict[Any, Any]) -> BatchInfo:
        """Build from the batch hash as HGETALL returns it."""
        h = {_text(k): _text(v) for k, v in raw.items()}
        return cls(
            id=batch_id,
            name=h.get("name", ""),
            total=int(h.get("total", 0)),
            pending=int(h.get("pending", 0)),
            processed=int(h.get("processed", 0)),
            failed=int(h.get("failed", 0)),
            created_at=(_ms(h.get("created_at")) or 0.0),
            finished_at=_ms(h.get("finished_at")),
            cancelled_at=_ms(h.get("cancelled_at")),
            allow_failures=h.get("allow_failures") == "1",
            cancelled_jobs=int(h.get("cancelled", 0)),
        )


def find_batch(app: AppHost, batch_id: str) -> BatchInfo | None:
    """The batch ``batch_id``, or None when there is none (never was, or pruned)."""
    rq = app.queue_for(None)
    raw: Any = rq.client.hgetall(BatchKeys.build(rq.prefix, batch_id).info)
    return BatchInfo.from_hash(batch_id, raw) if raw else None


def failed_job_ids(app: AppHost, batch_id: str) -> list[str]:
    """Ids of the batch's jobs that finally failed (kept a week after it finished)."""
    rq = app.queue_for(None)
    raw: Any = rq.client.smembers(BatchKeys.build(rq.prefix, batch_id).failed)
    return sorted(_text(r) for r in raw)


def cancel_batch(app: AppHost, batch_id: str) -> bool:
    """Cancel a batch; True when it was cancelled now (False: finished, cancelled or gone)."""
    rq = app.queue_for(None)
    k = BatchKeys.build(rq.prefix, batch_id)
    return int(scripts.BATCH_CANCEL.call(rq.client, [k.info], [])) == 1


def list_batches(app: AppHost, limit: int = 50) -> list[BatchInfo]:
    """The most recent batches, newest first."""
    rq = app.queue_for(None)
    ids: Any = rq.client.zrevrange(batches_key(rq.prefix), 0, max(0, limit - 1))
    out = []
    for raw_id in ids:
        info = find_batch(app, _text(raw_id))
        if info is not None:
            out.append(info)
    return out


def prune_batches(app: AppHost, older_than_s: float, *, unfinished: bool = False) -> int:
    """Delete batches finished more than ``older_than_s`` ago (and, with ``unfinished``,
    unfinished ones created that long ago); returns how many were deleted."""
    rq = app.queue_for(None)
    client: redis.Redis = rq.client
    t: Any = client.time()
    cutoff = (int(t[0]) + int(t[1]) / 1e6 - older_than_s) * 1000
    index = batches_key(rq.prefix)
    n = 0
    raw_ids: Any = client.zrangebyscore(index, "-inf", cutoff)
    for raw_id in raw_ids:
        batch_id = _text(raw_id)
        k = BatchKeys.build(rq.prefix, batch_id)
        info = find_batch(app, batch_id)
        stale = info is None or (
            info.finished_at * 1000 <= cutoff if info.finished_at is not None else unfinished
        )
        if stale:
            client.delete(k.info, k.members, k.finished, k.failed, k.retried)
            client.zrem(index, batch_id)
            n += info is not None
    return n
