"""Queue figures: enqueue, drain, enqueue-to-start latency, worker memory.

Every tidings figure is printed beside a baseline measured in the same run on the same
Redis (a bare redis-py loop, pipeline or BLPOP consumer), because absolute rates drift
on a shared machine and the ratio is what shows a regression. Nothing is asserted.

Called by ``benchmarks/run.py``, which starts the Redis, sets ``TIDINGS_REDIS_URL``,
``TIDINGS_KEY`` and ``TIDINGS_PREFIX`` and only then imports :mod:`benchmarks.bench_app`.
Workers are separate processes (``notify-worker -A benchmarks.bench_app:app``); a drain
is timed from the worker's ``WorkerStarting`` (wall clock) to the last ack (the ``done``
zset's Redis ``TIME`` score), so interpreter start-up is left out.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks._redis import delete_prefix

ROOT = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 180.0


@dataclass(slots=True)
class Row:
    """One line of the printed table."""

    figure: str
    value: str
    baseline: str = ""
    ratio: str = ""
    goal: str = ""


@dataclass(slots=True)
class Ctx:
    """What every benchmark needs."""

    url: str
    prefix: str
    n: int
    runs: int
    quick: bool
    client: redis.Redis = field(init=False)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from tidings.redis.clients import sync_client  # any URL: plain, cluster, sentinel

        self.client = sync_client(self.url)

    def clean(self) -> None:
        """Delete every key this run made (never anything outside the prefix)."""
        delete_prefix(self.client, self.prefix)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("nan")


def fmt_rate(value: float, unit: str = "jobs/s") -> str:
    return f"{value:,.0f} {unit}"


def fmt_ratio(ours: float, base: float) -> str:
    return f"{ours / base:.2f}x" if base > 0 else "-"


def median_of(runs: int, once: Callable[[], float]) -> float:
    """Median of ``runs`` results of ``once()``."""
    return statistics.median(once() for _ in range(runs))


def interleaved(runs: int, *cases: Callable[[], float]) -> list[float]:
    """Median of each case over ``runs`` rounds, the cases taking turns in each round.

    Taking turns spreads a burst of load from elsewhere on a shared machine over every
    case, so the ratios between them hold up better than the absolute figures.
    """
    results: list[list[float]] = [[] for _ in cases]
    for _ in range(runs):
        for i, case in enumerate(cases):
            results[i].append(case())
    return [statistics.median(r) for r in results]


def _app() -> Any:
    from benchmarks import bench_app

    return bench_app


# -- enqueue ---------------------------------------------------------------------------


def sample_envelope() -> bytes:
    """The envelope a NoOpJob is pushed as (to size the baselines' payloads)."""
    from tidings.jobs.compose import prepare
    from tidings.jobs.job import PendingDispatch

    b = _app()
    _, _, envelope, _, _ = prepare(
        PendingDispatch(b.NoOpJob(12345)), b.app.signer, max_bytes=b.app.max_payload_bytes
    )
    return envelope


def enqueue_one(ctx: Ctx) -> list[Row]:
    """``Job.dispatch()`` in a loop beside bare RPUSH and EVALSHA loops."""
    b = _app()
    n = ctx.n
    payload = sample_envelope()
    key = f"{ctx.prefix}:baseline:list"
    raw = redis.Redis.from_url(ctx.url)
    sha = raw.script_load("return redis.call('RPUSH', KEYS[1], ARGV[1])")

    def tidings_loop() -> float:
        ctx.clean()
        t = time.perf_counter()
        for i in range(n):
            b.NoOpJob(i).dispatch()
        return rate(n, time.perf_counter() - t)

    def rpush_loop() -> float:
        ctx.clean()
        t = time.perf_counter()
        for _ in range(n):
            raw.rpush(key, payload)
        return rate(n, time.perf_counter() - t)

    def evalsha_loop() -> float:
        ctx.clean()
        t = time.perf_counter()
        for _ in range(n):
            raw.evalsha(sha, 1, key, payload)
        return rate(n, time.perf_counter() - t)

    tidings_loop()  # warm-up: connection, script cache
    ours, rpush, evalsha = interleaved(ctx.runs, tidings_loop, rpush_loop, evalsha_loop)
    ctx.clean()
    raw.close()
    ctx.notes.append(
        f"envelope of a no-op job: {len(payload)} bytes (baselines push the same size)"
    )
    return [
        Row(
            "enqueue one at a time: Job.dispatch()",
            fmt_rate(ours),
            f"redis-py RPUSH loop {fmt_rate(rpush, '/s')}",
            fmt_ratio(ours, rpush),
            ">= 0.80x RPUSH; >= huey 11.0k",
        ),
        Row("", "", f"redis-py EVALSHA loop {fmt_rate(evalsha, '/s')}", fmt_ratio(ours, evalsha)),
    ]


def enqueue_bulk(ctx: Ctx) -> list[Row]:
    """``app.dispatch_many(jobs)`` beside a redis-py pipeline of RPUSH, 1000 a batch."""
    b = _app()
    n = ctx.n
    payload = sample_envelope()
    key = f"{ctx.prefix}:baseline:list"
    raw = redis.Redis.from_url(ctx.url)

    def tidings_bulk() -> float:
        ctx.clean()
        jobs = [b.NoOpJob(i) for i in range(n)]
        t = time.perf_counter()
        b.app.dispatch_many(jobs)
        return rate(n, time.perf_counter() - t)

    def pipeline() -> float:
        ctx.clean()
        t = time.perf_counter()
        for start in range(0, n, 1000):
            pipe = raw.pipeline(transaction=False)
            for _ in range(min(1000, n - start)):
                pipe.rpush(key, payload)
            pipe.execute()
        return rate(n, time.perf_counter() - t)

    tidings_bulk()
    ours, base = interleaved(ctx.runs, tidings_bulk, pipeline)
    ctx.clean()
    raw.close()
    return [
        Row(
            "bulk enqueue: app.dispatch_many(jobs)",
            fmt_rate(ours),
            f"redis-py pipeline RPUSH x1000 {fmt_rate(base, '/s')}",
            fmt_ratio(ours, base),
            ">= 2x best peer (36.4k)",
        )
    ]


# -- workers ---------------------------------------------------------------------------


def worker_env(ctx: Ctx, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def notify_worker_argv(*args: str) -> list[str]:
    """``notify-worker -A benchmarks.bench_app:app ARGS`` with this interpreter."""
    return [sys.executable, "-m", "tidings.cli", "-A", "benchmarks.bench_app:app", *args]


def spawn(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a worker; its per-job lines go to /dev/null (they are still formatted)."""
    err = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    proc._bench_err = err  # type: ignore[attr-defined]
    return proc


def stderr_tail(proc: subprocess.Popen[bytes]) -> str:
    """The worker's last stderr line (an exception's message, usually)."""
    err = proc._bench_err  # type: ignore[attr-defined]
    err.seek(0)
    lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else "(no output)"


def stop(proc: subprocess.Popen[bytes], *, timeout_s: float = 30.0) -> int | None:
    """SIGTERM the worker (by PID) and wait; SIGKILL it if it will not go."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def wait_started(
    ctx: Ctx, count: int, procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 30.0
) -> None:
    key = _app().mark_key("started")
    deadline = time.monotonic() + timeout_s
    while int(ctx.client.llen(key)) < count:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited with {p.returncode} at start: {stderr_tail(p)}")
        if time.monotonic() > deadline:
            raise RuntimeError("worker did not start in time")
        time.sleep(0.01)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


ROUND_TRIPS = ("evalsha", "eval", "blpop", "brpop", "blmove", "bzpopmin")
"""Commands the worker sends itself (its scripts' inner commands are counted apart)."""


def round_trips(ctx: Ctx) -> int:
    """Calls so far of the commands in ROUND_TRIPS, from INFO commandstats."""
    stats = ctx.client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ROUND_TRIPS)


def redis_cpu_s(ctx: Ctx) -> float:
    """CPU seconds the Redis server has used (user + sys, all its threads)."""
    cpu = ctx.client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def drain_once(
    ctx: Ctx,
    argv: Sequence[str],
    procs: int,
    sync: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[float, float, float]:
    """Fill the queue with N no-op jobs, run ``procs`` workers until empty.

    The clock starts when the last worker has announced ``WorkerStarting`` (so one
    worker importing while the other drains does not skew a 2-process figure) and stops
    at the last ack; only the jobs acked in between are counted.

    Returns:
        jobs/s, the workers' Redis round trips per job (scripts and blocking waits) and
        Redis server CPU seconds per job.
    """
    b = _app()
    ctx.clean()
    cls = b.NoOpSyncJob if sync else b.NoOpJob
    b.app.dispatch_many([cls(i) for i in range(ctx.n)])
    calls, cpu = round_trips(ctx), redis_cpu_s(ctx)
    workers = [spawn(argv, worker_env(ctx, **(env or {}))) for _ in range(procs)]
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    for w in workers:
        try:
            w.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            k = b.app.queue_for(None).keys("default")
            left = ctx.client.hlen(k.jobs)
            for other in workers:
                stop(other, timeout_s=5)
            raise RuntimeError(
                f"worker {w.pid} still running after {WORKER_TIMEOUT_S:.0f}s with {left} jobs left "
                f"(stopped: SIGTERM, then SIGKILL if needed)"
            ) from None
        if w.returncode != 0:
            raise RuntimeError(f"worker exited with {w.returncode}: {stderr_tail(w)}")
    calls, cpu = round_trips(ctx) - calls, redis_cpu_s(ctx) - cpu
    k = b.app.queue_for(None).keys("default")
    done = int(ctx.client.zcard(k.done))
    failed = int(ctx.client.zcard(k.failed))
    if done != ctx.n or failed:
        raise RuntimeError(f"expected {ctx.n} done, got {done} done and {failed} failed")
    return steady_rate(ctx), calls / ctx.n, cpu / ctx.n


def steady_rate(ctx: Ctx) -> float:
    """jobs/s acked from the last worker's WorkerStarting to the last ack."""
    b = _app()
    k = b.app.queue_for(None).keys("default")
    started = max(float(x) for x in ctx.client.lrange(b.mark_key("started"), 0, -1))
    last = float(ctx.client.zrange(k.done, -1, -1, withscores=True)[0][1]) / 1000.0
    counted = int(ctx.client.zcount(k.done, int(started * 1000), "+inf"))
    return rate(counted, last - started)


@dataclass(slots=True)
class DrainCase:
    """One worker configuration of the drain figures."""

    figure: str
    argv: list[str]
    procs: int = 1
    sync: bool = False
    env: dict[str, str] = field(default_factory=dict)
    versus: str = ""
    goal: str = ""
    results: list[tuple[float, float, float]] = field(default_factory=list)

    def median(self) -> tuple[float, float, float]:
        ordered = sorted(self.results, key=lambda r: r[0])
        return ordered[len(ordered) // 2]


def drain_rows(ctx: Ctx) -> list[Row]:
    """Drain rate of one and two worker processes on no-op jobs.

    The cases take turns (run 1 of each, then run 2 of each...), so a burst of load from
    elsewhere on a shared machine lands on all of them rather than on one.
    """
    stop_empty = notify_worker_argv("--stop-when-empty")
    cases = [
        DrainCase(
            "drain, 1 process, defaults (--concurrency 16)",
            stop_empty,
            goal=">= 2x huey 3.3k (6.6k)",
        ),
        DrainCase(
            "drain, 1 process, defaults, metrics off",
            stop_empty,
            env={"TIDINGS_METRICS": "0"},
            versus="vs defaults (metrics on)",
        ),
        DrainCase(
            "drain, 1 process, --concurrency 64",
            notify_worker_argv("--stop-when-empty", "--concurrency", "64"),
            versus="vs defaults",
        ),
        DrainCase(
            "drain, 2 processes, defaults",
            stop_empty,
            procs=2,
            versus="vs 1 process",
            goal=">= 2x 4.3k (~9k)",
        ),
        DrainCase(
            "drain, 1 process, sync handle() (job threads)",
            stop_empty,
            sync=True,
            versus="vs async",
        ),
        DrainCase(
            "drain, 1 process, sync handle(), --concurrency 64",
            notify_worker_argv("--stop-when-empty", "--concurrency", "64"),
            sync=True,
            versus="vs async",
        ),
        DrainCase(
            "drain, 1 process, bare Worker (no per-job log lines)",
            [sys.executable, "-m", "benchmarks.bench_app", "--concurrency", "16"],
            versus="vs notify-worker",
        ),
    ]
    for _ in range(1 if ctx.quick else ctx.runs):
        for case in cases:
            case.results.append(drain_once(ctx, case.argv, case.procs, case.sync, case.env))
    ctx.clean()
    default = cases[0].median()[0]
    rows = []
    for case in cases:
        jobs_s, trips, cpu = case.median()
        detail = f"{trips:.3f} trips, Redis {cpu * 1e6:.0f} us CPU /job"
        rows.append(
            Row(
                case.figure,
                fmt_rate(jobs_s),
                f"{case.versus}; {detail}" if case.versus else detail,
                fmt_ratio(jobs_s, default) if case.versus else "",
                case.goal,
            )
        )
    return rows


# -- latency ---------------------------------------------------------------------------

_BLPOP_CONSUMER = """
import sys, time, redis
url, key, out, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = redis.Redis.from_url(url)
c.rpush(out + ":ready", "1")
for _ in range(count):
    got = c.blpop([key], timeout=10)
    if got is None:
        break
    c.rpush(out, f"{time.time() - float(got[1]):.6f}")
"""


_ASYNC_BLPOP_CONSUMER = """
import asyncio, sys, time
import redis.asyncio
async def main():
    url, key, out, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = redis.asyncio.Redis.from_url(url)
    await c.rpush(out + ":ready", "1")
    for _ in range(count):
        got = await c.blpop([key], timeout=10)
        if got is None:
            break
        await c.rpush(out, f"{time.time() - float(got[1]):.6f}")
asyncio.run(main())
"""


def _paced(rate_per_s: float, duration_s: float, send: Callable[[], None]) -> int:
    count = int(rate_per_s * duration_s)
    t0 = time.perf_counter()
    for i in range(count):
        due = t0 + i / rate_per_s
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        send()
    return count


def _wait_len(ctx: Ctx, key: str, count: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while int(ctx.client.llen(key)) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _pcts(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        raise RuntimeError(f"only {len(values)} samples")
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values) * 1000, cuts[98] * 1000


def _stamp_push(ctx: Ctx, key: str) -> None:
    ctx.client.rpush(key, f"{time.time():.6f}")


def _blpop_baseline(
    ctx: Ctx, script: str, per_s: float, duration: float, count: int
) -> list[float]:
    """Seconds from RPUSH of a timestamp to a bare consumer's BLPOP returning it."""
    key, out = f"{ctx.prefix}:baseline:blpop", f"{ctx.prefix}:baseline:blpop:out"
    ctx.client.delete(key, out, out + ":ready")
    consumer = subprocess.Popen(
        [sys.executable, "-c", script, ctx.url, key, out, str(count)], cwd=ROOT
    )
    try:
        _wait_len(ctx, out + ":ready", 1)
        time.sleep(0.2)
        _paced(per_s, duration, lambda: _stamp_push(ctx, key))
        _wait_len(ctx, out, count)
    finally:
        if consumer.poll() is None:
            consumer.terminate()
        consumer.wait()
    return [float(x) for x in ctx.client.lrange(out, 0, -1)]


def _stamp_round(
    ctx: Ctx, per_s: float, duration: float, sync: bool = False
) -> tuple[list[list[str]], int]:
    """One idle notify-worker fed ``Stamp`` jobs (``StampSync`` with ``sync``) at ``per_s``;
    its records and the count sent."""
    b = _app()
    cls = b.StampSync if sync else b.Stamp
    ctx.clean()
    worker = spawn(notify_worker_argv(), worker_env(ctx, TIDINGS_BENCH_LATENCY="1"))
    try:
        wait_started(ctx, 1, [worker])
        time.sleep(0.5)  # let it reach its blocking wait
        count = _paced(per_s, duration, lambda: cls(sent_at=time.time()).dispatch())
        _wait_len(ctx, b.mark_key("latency"), count)
    finally:
        stop(worker)
    records = [_text(r).split(",") for r in ctx.client.lrange(b.mark_key("latency"), 0, -1)]
    return records, count


def latency_rows(ctx: Ctx) -> list[Row]:
    """Enqueue-to-start at 50 jobs/s against one idle worker, and a bare BLPOP consumer."""
    per_s, duration = 50.0, (3.0 if ctx.quick else 5.0)
    rounds = 1 if ctx.quick else max(1, ctx.runs)
    records: list[list[str]] = []
    sync_starts: list[float] = []
    base: list[float] = []
    abase: list[float] = []
    count = 0
    # The three take turns, round by round, and each pools its rounds' samples: latency
    # moves with the machine's phases.
    for _ in range(rounds):
        got, sent = _stamp_round(ctx, per_s, duration)
        records += got
        count += sent
        got, _ = _stamp_round(ctx, per_s, duration, sync=True)
        sync_starts += [float(r[0]) for r in got]
        base += _blpop_baseline(ctx, _BLPOP_CONSUMER, per_s, duration, sent)
        abase += _blpop_baseline(ctx, _ASYNC_BLPOP_CONSUMER, per_s, duration, sent)
    ctx.clean()
    starts = [float(r[0]) for r in records]
    waits = [float(r[1]) for r in records if float(r[1]) >= 0]
    heard = [float(r[2]) for r in records if float(r[1]) >= 0]
    if len(starts) < count:
        ctx.notes.append(f"latency: only {len(starts)} of {count} jobs started within 15 s")
    p50, p99 = _pcts(starts)
    b50, b99 = _pcts(base)
    a50, a99 = _pcts(abase)
    rows = [
        Row(
            f"enqueue->start, {per_s:.0f} jobs/s, idle worker (p50 / p99)",
            f"{p50:.2f} / {p99:.2f} ms",
            f"redis-py RPUSH->BLPOP {b50:.2f} / {b99:.2f} ms",
            f"{p99 / b99:.2f}x p99",
            "p99 <= best peer (peer rows)",
        ),
        Row("", "", f"redis.asyncio BLPOP {a50:.2f} / {a99:.2f} ms", f"{p99 / a99:.2f}x p99"),
    ]
    if sync_starts:
        s50, s99 = _pcts(sync_starts)
        rows.append(
            Row(
                "  the same, sync handle() (job threads)",
                f"{s50:.2f} / {s99:.2f} ms",
                f"vs async handle() {p50:.2f} / {p99:.2f} ms",
                f"{s99 / p99:.2f}x p99",
            )
        )
    if waits:
        w50, w99 = _pcts(waits)
        h50, h99 = _pcts(heard)
        rows.append(Row("  of which dispatch -> pop script (wait_s)", f"{w50:.2f} / {w99:.2f} ms"))
        rows.append(Row("  of which dispatch -> JobProcessing heard", f"{h50:.2f} / {h99:.2f} ms"))
    return rows


# -- memory ----------------------------------------------------------------------------


def memory_rows(ctx: Ctx) -> list[Row]:
    """RSS of one idle worker, after a warm-up drain, and after more drains."""
    b = _app()
    rounds = 2 if ctx.quick else 4
    ctx.clean()
    worker = spawn(notify_worker_argv(), worker_env(ctx))
    k = b.app.queue_for(None).keys("default")
    rss: list[int] = []
    try:
        wait_started(ctx, 1, [worker])
        time.sleep(0.5)
        rss.append(rss_kb(worker.pid))
        for _ in range(1 + rounds):
            b.app.dispatch_many([b.NoOpJob(i) for i in range(ctx.n)])
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            while int(ctx.client.hlen(k.jobs)) > 0:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker stopped draining: {stderr_tail(worker)}")
                time.sleep(0.05)
            time.sleep(0.2)  # the last acks and their bookkeeping
            rss.append(rss_kb(worker.pid))
            ctx.client.delete(k.done)
    finally:
        stop(worker)
    ctx.clean()
    idle, warm, last = rss[0] / 1024, rss[1] / 1024, rss[-1] / 1024
    total = ctx.n * (1 + rounds)
    growth = (last - warm) / warm * 100
    return [
        Row(
            f"worker RSS: idle / after {ctx.n:,} / after {total:,} jobs",
            f"{idle:.1f} / {warm:.1f} / {last:.1f} MB",
            "growth after warm-up",
            f"{growth:+.1f}%",
            "< 10% growth",
        )
    ]


def observe_rows(ctx: Ctx) -> list[Row]:
    """Cost of the per-job metrics (and of tracing, with opentelemetry-api installed) on
    the default drain: the cases take turns every round; the ratio is the median of the
    per-round ratios, so a burst of load elsewhere hits both sides of a pair alike."""
    argv = notify_worker_argv("--stop-when-empty")
    cases = [
        DrainCase("drain, metrics on (default), tracing off", argv,
                  env={"TIDINGS_TRACING": "0"}),
        DrainCase("drain, metrics off, tracing off", argv,
                  env={"TIDINGS_TRACING": "0", "TIDINGS_METRICS": "0"}),
    ]  # fmt: skip
    try:
        import opentelemetry.trace  # noqa: F401

        cases.append(DrainCase("drain, metrics on, opentelemetry-api installed (no SDK)", argv))
    except ImportError:
        pass
    rounds = 1 if ctx.quick else max(ctx.runs, 7)
    for _ in range(rounds):
        for case in cases:
            case.results.append(drain_once(ctx, case.argv, case.procs, case.sync, case.env))
    ctx.clean()
    off = cases[1]
    rows = []
    for case in cases:
        pairs = sorted(a[0] / b[0] for a, b in zip(case.results, off.results, strict=True))
        jobs_s = case.median()[0]
        rows.append(
            Row(
                case.figure,
                fmt_rate(jobs_s),
                f"vs metrics off, median of {rounds} paired rounds "
                f"(range {pairs[0]:.3f}-{pairs[-1]:.3f})",
                f"{pairs[len(pairs) // 2]:.3f}x",
                ">= 0.95x (issue 14)" if case is cases[0] else "",
            )
        )
    return rows


ALL: dict[str, Callable[[Ctx], list[Row]]] = {
    "enqueue": enqueue_one,
    "bulk": enqueue_bulk,
    "drain": drain_rows,
    "latency": latency_rows,
    "memory": memory_rows,
    "observe": observe_rows,
}


# -- profile ---------------------------------------------------------------------------

# Where a drained job's time goes, by the first rule that matches a sampled stack
# (outermost frame first within a rule's own test). Order matters: log lines and Redis
# I/O are picked out before the generic per-job steps that call them.
BUCKETS: list[tuple[str, Callable[[list[str]], bool]]] = [
    (
        "per-job log lines (notify-worker output listeners)",
        lambda s: any("install_output" in f for f in s),
    ),
    (
        "redis-py: reading + parsing replies",
        lambda s: any("(redis/" in f and ("read_response" in f or "_parsers" in f) for f in s),
    ),
    (
        "redis-py: packing + sending commands, socket write",
        lambda s: any("(redis/" in f for f in s),
    ),
    ("idle: epoll wait (for Redis replies)", lambda s: "select (" in s[-1]),
    (
        "open_envelope: HMAC verify + orjson + field checks",
        lambda s: any("open_envelope" in f for f in s),
    ),
    ("resolve_class: allow-list + import_module", lambda s: any("resolve_class" in f for f in s)),
    ("serializer.decode (job object rebuilt)", lambda s: any("(serializer.py" in f for f in s)),
    ("lifecycle events (App.emit -> Dispatcher)", lambda s: any("App.emit" in f for f in s)),
    (
        "running the job: middleware pipeline, asyncio.timeout, handle",
        lambda s: any("_pipeline" in f or "_invoke" in f for f in s),
    ),
    (
        "worker's own code (self time in worker/broker/scripts)",
        lambda s: (
            s[-1]
            .split(" (")[-1]
            .startswith(
                (
                    "worker.py",
                    "fetch.py",
                    "execute.py",
                    "settle.py",
                    "acks.py",
                    "held.py",
                    "consume.py",
                    "scripts.py",
                )
            )
        ),
    ),
    ("asyncio: tasks, events, callbacks, scheduling", lambda s: "(asyncio/" in s[-1]),
    ("other", lambda s: True),
]


def _short_frame(frame: str) -> str:
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    for cut in ("site-packages/", "/src/", "python3.11/"):
        path = path.split(cut)[-1]
    return f"{name} ({path})"


def summarize_profile(path: Path, per_job_us: float) -> list[str]:
    """Bucket table and top self-time functions of a py-spy ``--format raw`` file.

    Shares come from the samples; microseconds from ``per_job_us``, the measured wall
    time per job (py-spy drops samples when it cannot keep up, so counts understate time).
    """
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames:
            stacks.append((frames.split(";"), int(count)))
    loop = [(s, c) for s, c in stacks if any("run_forever" in f for f in s)]
    total = sum(c for _, c in loop) or 1
    buckets: dict[str, int] = {name: 0 for name, _ in BUCKETS}
    leaves: dict[str, int] = {}
    for s, c in loop:
        for name, test in BUCKETS:
            if test(s):
                buckets[name] += c
                break
        leaf = _short_frame(s[-1])
        leaves[leaf] = leaves.get(leaf, 0) + c
    out = [f"  {per_job_us:.0f} us/job of wall time (drain rate under py-spy); {total:,} samples"]
    for name, c in sorted(buckets.items(), key=lambda kv: -kv[1]):
        out.append(f"  {c / total:6.1%}  {c / total * per_job_us:6.1f} us/job  {name}")
    out.append("  top self time:")
    for leaf, c in sorted(leaves.items(), key=lambda kv: -kv[1])[:10]:
        out.append(f"  {c / total:6.1%}  {leaf}")
    return out


def profile_drain(ctx: Ctx, out_dir: Path, rate_hz: int = 1000) -> list[str]:
    """Drain N jobs under py-spy, with notify-worker and with a bare Worker."""
    import shutil

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        return ["py-spy not found: .venv/bin/pip install py-spy"]
    b = _app()
    out: list[str] = []
    for label, argv in (
        ("notify-worker --stop-when-empty (defaults)", notify_worker_argv("--stop-when-empty")),
        ("bare Worker (no per-job log lines)", [sys.executable, "-m", "benchmarks.bench_app"]),
    ):
        ctx.clean()
        b.app.dispatch_many([b.NoOpJob(i) for i in range(ctx.n)])
        raw = out_dir / f"profile-{'cli' if 'notify' in label else 'bare'}.txt"
        cmd = [
            pyspy,
            "record",
            "--nonblocking",
            "--rate",
            str(rate_hz),
            "--format",
            "raw",
            "--output",
            str(raw),
            "--",
            *argv,
        ]
        subprocess.run(
            cmd,
            cwd=ROOT,
            env=worker_env(ctx),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        jobs_s = steady_rate(ctx)
        out.append(f"{label}: {jobs_s:,.0f} jobs/s under py-spy; samples in {raw}")
        out += summarize_profile(raw, 1e6 / jobs_s)
    ctx.clean()
    return out


# -- peers -----------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    """``peer_rows`` moved to :mod:`benchmarks.peers`, re-exported here.

    Lazily (PEP 562): ``benchmarks.peers`` imports this module, so an eager
    ``from benchmarks.peers import peer_rows`` would be a circular import.
    """
    if name == "peer_rows":
        from benchmarks.peers import peer_rows

        return peer_rows
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
