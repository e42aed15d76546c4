"""What the dashboard pages read from Redis (sync; Starlette runs them in its thread pool).

Every read is bounded: the last hour of minute buckets, the live-worker index, the
newest batches, and for the failed store one page at a time. The failed pages follow
the store's own order (failure time, newest first; ties by queue, then id) with a cursor
(``?after=``) that names the last entry shown, so a page costs the same with 10 or
100,000 failed jobs. A search reads at most :data:`FAILED_SCAN` records a request and,
when that did not fill the page, offers to continue from where it stopped: every failed
job is reachable, no request reads them all.
"""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from tidings.dashboard.redaction import app_secrets, redact_value
from tidings.observability import metrics
from tidings.observability.metrics import Counts, JobTiming, Progress
from tidings.observability.redaction import redact
from tidings.observability.terminal import escape
from tidings.wire.encryption import encrypted_key_id
from tidings.wire.envelope import read_body

#: Rows on a failed-jobs page.
FAILED_PAGE = 50
#: Most failed records one request reads while searching.
FAILED_SCAN = 2000
#: Records read per round trip while searching.
FAILED_CHUNK = 250
#: Entries at one failure time read to place a cursor whose own entry is gone.
TIES_READ = 1000
#: Characters of an error shown in the list (the job's page shows it all).
ERROR_CHARS = 300
#: Batch member ids one batch page reads (SSCAN), and members with progress it shows.
MEMBERS_READ = 2000
MEMBERS_SHOWN = 100


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


class Entry(NamedTuple):
    """A position in the failed store: failure time (ms), queue, job id (raw bytes)."""

    score: int
    queue: str
    id: bytes


@dataclass(slots=True)
class FailedPage:
    """One page of the failed list."""

    rows: list[FailedRow]
    next: str
    """Cursor of the next page ("" at the end)."""
    scanned: int
    """Records read for this page."""
    total: int
    """Failed jobs in all queues."""
    searching: bool


def encode_cursor(entry: Entry) -> str:
    raw = orjson.dumps([entry.score, entry.queue, entry.id.decode("latin-1")])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(text: str) -> Entry | None:
    """The entry a cursor names; None for "" or anything malformed (the newest page)."""
    if not text or len(text) > 1200:
        return None
    try:
        value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        score, queue, job_id = value
        if not isinstance(score, int) or not isinstance(queue, str) or not isinstance(job_id, str):
            return None
        return Entry(score, queue, job_id.encode("latin-1"))
    except (ValueError, TypeError, UnicodeEncodeError):
        return None


def error_summary(exception: str) -> str:
    """The last exception's own text (type and whole message), for one line of the list.

    A traceback's frames are indented; the summary is everything after the last frame,
    line breaks included (a message with ``\\r\\n`` is shown whole, its breaks visible),
    with every control and bidi character escaped as the CLI does.
    """
    text = exception.strip()
    marker = "Traceback (most recent call last):"
    at = text.rfind(marker)
    if at >= 0:
        lines = text[at + len(marker) :].lstrip("\r\n").split("\n")
        for i, line in enumerate(lines):
            if line and not line[0].isspace():
                text = "\n".join(lines[i:])
                break
    shown = escape(text)
    return shown if len(shown) <= ERROR_CHARS else shown[: ERROR_CHARS - 1] + "…"


class _Match:
    """The list's filter: class name and text, case-insensitive."""

    def __init__(self, cls: str, text: str, secrets: list[str]) -> None:
        self.cls = cls.strip().lower()
        self.text = text.strip().lower()
        self.secrets = secrets
        self.everything = not self.cls and not self.text
        # A match that overlaps the "[REDACTED]" marker exists only after redaction;
        # any other match is in the raw text too, so the raw text is a cheap pre-check.
        marker = "[redacted]"
        self.raw_precheck = not ("[" in self.text or "]" in self.text or self.text in marker)

    def row(self, entry: Entry, raw: Any) -> FailedRow | None:
        """The list row of ``entry`` when it matches (None when not, or gone)."""
        if raw is None:
            return None  # forgotten or retried since the page began
        info = _info(raw)
        name = str(info.get("name", "?"))
        if self.cls and self.cls not in name.lower():
            return None
        job_id = entry.id.decode("utf-8", "backslashreplace")
        exc = str(info.get("exception", ""))
        if self.text and self.text not in job_id.lower():
            if self.raw_precheck and self.text not in exc.lower():
                return None
            exc = redact(exc, self.secrets)
            if self.text not in exc.lower():
                return None
        else:
            exc = redact(exc, self.secrets)
        attempts = info.get("attempts")
        return FailedRow(job_id, entry.queue, name, entry.score / 1000.0,
                         attempts if isinstance(attempts, int) else 0,
                         error_summary(exc))  # fmt: skip


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


@dataclass(slots=True)
class JobView:
    """What the job page shows of one job."""

    id: str
    state: str
    queue: str
    name: str
    priority: int | None
    """-100..100; None when no record of it is left (the job finished)."""
    progress: Progress | None
    timing: JobTiming | None

    @property
    def percent(self) -> float | None:
        """``done / total`` as 0-100, when the job reported a total."""
        p = self.progress
        if p is None or not p.total or p.total <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * p.done / p.total))

    @property
    def cancellable(self) -> bool:
        return self.state in ("pending", "delayed", "reserved")


@dataclass(slots=True)
class MemberRow:
    """A batch member still to finish, with the progress it reported."""

    id: str
    queue: str
    progress: Progress

    @property
    def percent(self) -> float | None:
        p = self.progress
        if not p.total or p.total <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * p.done / p.total))


@dataclass(slots=True)
class BatchView:
    """A batch's page: its counters, and its running members' progress."""

    info: Any
    running: list[MemberRow]
    unfinished_read: int
    """Unfinished members read for this page (at most :data:`MEMBERS_READ` ids read)."""
    partial: bool
    """True when the batch has more members than one page reads."""


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

    def pools(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The pools' samples (processes per pool, every 5 s) and balancing decisions,
        newest first (written by the pools' leader, :mod:`tidings.pools.coordination`)."""
        from tidings.pools.coordination import read_history

        return read_history(self.client, self.prefix)

    def failed_page(self, *, cls: str = "", text: str = "", after: str = "",
                    limit: int = FAILED_PAGE) -> FailedPage:  # fmt: skip
        """One page of failed jobs, newest first, filtered by class name and/or text.

        Reads at most :data:`FAILED_SCAN` records: when the filter has not filled the
        page by then, the page ends with a cursor that continues the search there, so a
        search reaches every failed job, one bounded request at a time.

        Args:
            cls: part of the job class name (case-insensitive).
            text: part of the (redacted) exception text or of the id.
            after: a cursor from an earlier page (``FailedPage.next``), "" for the newest.
            limit: rows on the page.
        """
        queues = self.queue_names()
        sizes = self.rq.sizes(queues) if queues else {}
        total = sum(s["failed"] for s in sizes.values())
        match = _Match(cls, text, self.secrets)
        position = decode_cursor(after)
        rows: list[FailedRow] = []
        scanned = 0
        exhausted = False
        while len(rows) < limit and scanned < FAILED_SCAN:
            want = limit - len(rows) if match.everything else FAILED_CHUNK
            want = min(want, FAILED_SCAN - scanned)
            chunk = self._next_entries(queues, position, want)
            for entry, raw in zip(chunk, self._infos(chunk), strict=True):
                scanned += 1
                position = entry
                row = match.row(entry, raw)
                if row is not None:
                    rows.append(row)
                    if len(rows) >= limit:
                        break
            if len(chunk) < want and position == (chunk[-1] if chunk else position):
                exhausted = True
                break
        more = (
            not exhausted and position is not None and bool(self._next_entries(queues, position, 1))
        )
        return FailedPage(rows=rows, next=encode_cursor(position) if more and position else "",
                          scanned=scanned, total=total,
                          searching=not match.everything)  # fmt: skip

    def _next_entries(self, queues: list[str], after: Entry | None, n: int) -> list[Entry]:
        """The next ``n`` failed-store entries after ``after``, in the store's order
        (failure time, then queue, then id; newest first) across ``queues``."""
        plan: list[tuple[str, int]] = []
        for name in queues:
            offset = 0 if after is None else self._offset(name, after)
            plan.append((name, offset))
        pipe = self.client.pipeline(transaction=False)
        for name, offset in plan:
            pipe.zrevrange(self.rq.keys(name).failed, offset, offset + n - 1, withscores=True)
        merged: list[Entry] = []
        for (name, _), pairs in zip(plan, pipe.execute() if plan else [], strict=True):
            merged += [Entry(int(score), name, bytes(raw)) for raw, score in pairs]
        merged.sort(reverse=True)
        return merged[:n]

    def _offset(self, name: str, after: Entry) -> int:
        """How many entries of queue ``name``'s failed store come before ``after``'s
        position (in ZREVRANGE order: score descending, ties by id descending)."""
        key = self.rq.keys(name).failed
        s = after.score
        if name != after.queue:
            # Another queue sorts after the cursor's at an equal score when its name is
            # smaller: then its entries at that score are still to come.
            low = f"({s}" if name < after.queue else s
            return int(self.client.zcount(key, low, "+inf"))
        pipe = self.client.pipeline(transaction=False)
        pipe.zcount(key, f"({s}", "+inf")
        pipe.zscore(key, after.id)
        pipe.zrevrank(key, after.id)
        above, score, rank = pipe.execute()
        if score is not None and int(score) == s and rank is not None:
            return int(rank) + 1
        # The cursor's own entry is gone (retried, forgotten): count the ties after it.
        ties = self.client.zrevrangebyscore(key, s, s, start=0, num=TIES_READ)
        return int(above) + sum(1 for t in ties if bytes(t) > after.id)

    def _infos(self, entries: list[Entry]) -> list[Any]:
        """The info record of each entry (one HMGET per queue, in entry order)."""
        by_queue: dict[str, list[bytes]] = {}
        for e in entries:
            by_queue.setdefault(e.queue, []).append(e.id)
        found: dict[tuple[str, bytes], Any] = {}
        for name, ids in by_queue.items():
            values = self.client.hmget(self.rq.keys(name).failed_info, ids)
            found.update({(name, i): v for i, v in zip(ids, values, strict=True)})
        return [found.get((e.queue, e.id)) for e in entries]

    def failed_detail(self, job_id: str) -> FailedDetail | None:
        record = self.rq.find_failed(job_id)
        if record is None:
            return None
        payload, pushed, job_class = _payload(record.payload, self.secrets, job_id)
        try:
            timing = metrics.job_timing(self.client, self.prefix, job_id)
        except Exception:
            timing = None
        return FailedDetail(
            record.id, record.queue, record.name, record.failed_at, record.attempts,
            redact(record.exception, self.secrets), payload, pushed, job_class, timing,
        )  # fmt: skip

    def job(self, job_id: str) -> JobView | None:
        """The job's state on the first queue that knows it, its priority and the
        progress it last reported (None: no queue has a record of it)."""
        for queue in self.queue_names():
            state = self.rq.status(job_id, [queue])
            if state is not None:
                break
        else:
            return None
        k = self.rq.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(k.progress(job_id))
        pipe.hget(k.attempts, f"{job_id}:p")
        pipe.hget(k.jobs, job_id)
        raw_progress, raw_priority, body = pipe.execute()
        name, priority = _name_and_priority(body, raw_priority, job_id)
        try:
            timing = metrics.job_timing(self.client, self.prefix, job_id)
        except Exception:  # a page never fails for want of a measurement
            timing = None
        return JobView(job_id, state, queue, name, priority, Progress.parse(raw_progress),
                       timing)  # fmt: skip

    def batches(self, limit: int = 50) -> list[Any]:
        from tidings.workflows.batch_admin import list_batches

        return list_batches(self.app, limit)

    def batch(self, batch_id: str) -> BatchView | None:
        """A batch and the progress of its members still running (bounded: at most
        :data:`MEMBERS_READ` member ids read, :data:`MEMBERS_SHOWN` rows)."""
        from tidings.redis.keys import BatchKeys
        from tidings.workflows.batch_admin import find_batch

        info = find_batch(self.app, batch_id)
        if info is None:
            return None
        k = BatchKeys.build(self.prefix, batch_id)
        ids: list[bytes] = []
        cursor = 0
        while len(ids) < MEMBERS_READ:
            cursor, chunk = self.client.sscan(k.members, cursor, count=500)
            ids += [bytes(x) for x in chunk]
            if int(cursor) == 0:
                break
        partial = int(cursor) != 0
        ids = ids[:MEMBERS_READ]
        if not ids or info.finished:
            return BatchView(info, [], 0, partial)
        finished = self.client.smismember(k.finished, ids)
        open_ids = [i for i, f in zip(ids, finished, strict=True) if not f]
        queues = self.queue_names()
        rows: list[MemberRow] = []
        for start in range(0, len(open_ids), 100):
            chunk_ids = open_ids[start : start + 100]
            pipe = self.client.pipeline(transaction=False)
            for job_id in chunk_ids:
                for q in queues:
                    pipe.get(self.rq.keys(q).progress(job_id.decode("utf-8", "replace")))
            replies = pipe.execute() if chunk_ids and queues else []
            for n, job_id in enumerate(chunk_ids):
                for m, q in enumerate(queues):
                    p = Progress.parse(replies[n * len(queues) + m])
                    if p is not None:
                        rows.append(MemberRow(job_id.decode("utf-8", "backslashreplace"), q, p))
                        break
            if len(rows) >= MEMBERS_SHOWN:
                break
        rows.sort(key=lambda r: r.progress.at, reverse=True)
        return BatchView(info, rows[:MEMBERS_SHOWN], len(open_ids), partial)


def _info(raw: Any) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        info = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"exception": "(unreadable failure record)"}
    return info if isinstance(info, dict) else {}


def _name_and_priority(body: Any, raw_priority: Any, job_id: str) -> tuple[str, int | None]:
    """The job's display name and priority, from its envelope and its id:p entry."""
    name, priority = "", None
    if body:
        inner = read_body(body, job_id)
        if inner is not None:
            name = str(inner.get("displayName") or inner.get("job") or "")
            p = inner.get("priority", 0)
            priority = p if isinstance(p, int) and -100 <= p <= 100 else 0
    if raw_priority is not None:
        with contextlib.suppress(ValueError):
            priority = int(raw_priority)
    return name, priority


def _payload(raw: bytes, secrets: list[str], job_id: str) -> tuple[str, float | None, str]:
    """The envelope's body (every field, whichever frame was stored), pretty and
    redacted; its pushedAt and job class."""
    body = read_body(raw, job_id)
    if body is None:
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError:
            return redact(raw[:8192].decode("utf-8", "replace"), secrets), None, ""
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
