"""What the dashboard pages read from Redis (sync; Starlette runs them in its thread pool).

Every read is bounded: the last hour of minute buckets, the live-worker index, the
newest :data:`FAILED_SCAN` records of each queue's failed store, the newest batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tidings.dashboard.redaction import app_secrets, redact_value
from tidings.observability import metrics
from tidings.observability.metrics import Counts, JobTiming
from tidings.observability.redaction import redact
from tidings.wire.encryption import encrypted_key_id

FAILED_SCAN = 2000
FAILED_PAGE = 100


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class QueueRow:
    name: str
    ready: int
    delayed: int
    reserved: int
    failed: int
    hour: Counts
    points: list[tuple[int, Counts]]


@dataclass(slots=True)
class FailedRow:
    id: str
    queue: str
    name: str
    failed_at: float
    attempts: int
    error: str


@dataclass(slots=True)
class FailedDetail:
    id: str
    queue: str
    name: str
    failed_at: float
    attempts: int
    exception: str
    payload: str
    pushed_at: float | None
    job_class: str
    timing: JobTiming | None


class Reader:
    """Reads for one App (its default connection)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.rq = app.queue_for(None)
        self.prefix = self.rq.prefix
        self.secrets = app_secrets(app)

    @property
    def client(self) -> Any:
        return self.rq.client

    def queue_names(self) -> list[str]:
        names = set(self.rq.queue_names()) | set(metrics.measured_queues(self.client, self.prefix))
        return sorted(names)

    def queues(self) -> list[QueueRow]:
        names = self.queue_names()
        sizes = self.rq.sizes(names) if names else {}
        rows = []
        for name in names:
            s = sizes.get(name, {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0})
            points = metrics.series(self.client, self.prefix, name)
            rows.append(QueueRow(name, s["ready"], s["delayed"], s["reserved"], s["failed"],
                                 metrics.summed(points), points))  # fmt: skip
        return rows

    def classes(self, queue: str) -> list[tuple[str, Counts, list[tuple[int, Counts]]]]:
        out = []
        for cls in metrics.job_classes(self.client, self.prefix, queue)[:50]:
            points = metrics.series(self.client, self.prefix, queue, cls)
            out.append((cls, metrics.summed(points), points))
        return out

    def workers(self) -> list[dict[str, Any]]:
        return metrics.live_workers(self.client, self.prefix)

    def failed(self, *, cls: str = "", text: str = "", limit: int = FAILED_PAGE) -> list[FailedRow]:
        """The newest failed records, filtered by class name and/or text (in the error)."""
        rows: list[FailedRow] = []
        cls_l, text_l = cls.strip().lower(), text.strip().lower()
        for name in self.rq.queue_names():
            k = self.rq.keys(name)
            pairs = self.client.zrevrange(k.failed, 0, FAILED_SCAN - 1, withscores=True)
            if not pairs:
                continue
            ids = [_text(i) for i, _ in pairs]
            infos = self.client.hmget(k.failed_info, ids)
            for (job_id, score), raw in zip(zip(ids, (s for _, s in pairs), strict=True), infos,
                                            strict=True):  # fmt: skip
                info = _info(raw)
                exc = redact(str(info.get("exception", "")), self.secrets)
                row = FailedRow(job_id, name, str(info.get("name", "?")), score / 1000.0,
                                int(info.get("attempts") or 0), _last_line(exc))  # fmt: skip
                if cls_l and cls_l not in row.name.lower():
                    continue
                if text_l and text_l not in exc.lower() and text_l not in job_id:
                    continue
                rows.append(row)
        rows.sort(key=lambda r: r.failed_at, reverse=True)
        return rows[:limit]

    def failed_detail(self, job_id: str) -> FailedDetail | None:
        record = self.rq.find_failed(job_id)
        if record is None:
            return None
        payload, pushed, job_class = _payload(record.payload, self.secrets)
        try:
            timing = metrics.job_timing(self.client, self.prefix, job_id)
        except Exception:
            timing = None
        return FailedDetail(
            record.id, record.queue, record.name, record.failed_at, record.attempts,
            redact(record.exception, self.secrets), payload, pushed, job_class, timing,
        )  # fmt: skip

    def job(self, job_id: str) -> tuple[str | None, JobTiming | None]:
        state = self.rq.status(job_id, self.rq.queue_names())
        timing = metrics.job_timing(self.client, self.prefix, job_id) if state else None
        return state, timing

    def batches(self, limit: int = 50) -> list[Any]:
        from tidings.workflows.batch_admin import list_batches

        return list_batches(self.app, limit)


def _info(raw: Any) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        info = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"exception": "(unreadable failure record)"}
    return info if isinstance(info, dict) else {}


def _last_line(exc: str) -> str:
    lines = exc.strip().splitlines()
    return lines[-1][:300] if lines else ""


def _payload(raw: bytes, secrets: list[str]) -> tuple[str, float | None, str]:
    """The envelope's body, pretty and redacted; its pushedAt and job class."""
    try:
        envelope = orjson.loads(raw)
        body = envelope.get("body") if isinstance(envelope, dict) else None
    except orjson.JSONDecodeError:
        return redact(raw[:8192].decode("utf-8", "replace"), secrets), None, ""
    if not isinstance(body, dict):
        return "(no body)", None, ""
    pushed = body.get("pushedAt")
    clean = redact_value(body, secrets)
    sealed = encrypted_key_id(raw)
    if sealed is not None and isinstance(clean, dict):
        # Sealed data is shown as what it is, not as ciphertext (``failed show`` alike).
        clean["data"] = f"(encrypted: AES-256-GCM, key {sealed}; shown sealed)"
    text = orjson.dumps(clean, option=orjson.OPT_INDENT_2).decode()
    if len(text) > 32768:
        text = text[:32768] + "\n...[truncated]"
    return (text, float(pushed) if isinstance(pushed, int | float) else None,
            str(body.get("job", "")))  # fmt: skip
