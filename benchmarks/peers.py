"""Peers: tidings beside other Redis job queues, every figure measured the same way.

For tidings and each installed peer (huey, dramatiq, rq, saq, taskiq with taskiq-redis),
in the same run and on the same Redis:

* **enqueue one at a time**: N no-op jobs pushed with the library's usual call (for the
  asyncio libraries, saq and taskiq, awaited one after the other in one event loop);
* **drain**: N jobs pushed first, then one worker process with the library's defaults,
  timed by polling the library's own count of unfinished jobs (:func:`_poll_drain`);
* **enqueue -> start latency**: as ``bench_queue.latency_rows`` measures tidings: one idle
  worker, 50 stamp jobs/s for 5 s (3 s with ``--quick``), each job appending
  ``time.time() - sent_at`` when it starts; p50 / p99. One warm-up stamp job is waited for
  first (it proves the worker is consuming, whatever its start-up looks like). The
  libraries take turns for ``--runs`` rounds (one with ``--quick``), a fresh worker each
  round, and each row pools the samples of its rounds.

The peers' apps and jobs are built lazily in :mod:`benchmarks.bench_app`. Peers keep keys
outside tidings' prefix (rq has no prefix at all) and are cleaned up with ``FLUSHDB``, so
they run only on the private Redis ``run.py`` starts.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from benchmarks.anchor_peers import anchor_versions, anchors
from benchmarks.bench_queue import (
    WORKER_TIMEOUT_S,
    Ctx,
    Row,
    _app,
    _paced,
    _pcts,
    _text,
    notify_worker_argv,
    rate,
    spawn,
    stderr_tail,
    worker_env,
)

LATENCY_PER_S = 50.0


@dataclass(slots=True)
class Peer:
    """How to push to, drain, stamp and count one job queue library."""

    name: str
    enqueue: Callable[[int], Any]
    """Push job number i the library's usual way (a coroutine function when ``loop`` is set)."""
    worker: list[str]
    pending: Callable[[], int]
    """Jobs not yet finished (or not yet taken, where that is all the library tells)."""
    setting: str
    drain_n: int | None = None
    stamp: Callable[[float], Any] | None = None
    """Push a job that appends ``time.time() - sent_at`` to ``mark_key("latency")`` when it
    starts (a coroutine function when ``loop`` is set)."""
    loop: asyncio.AbstractEventLoop | None = None
    """The producer's event loop, for asyncio libraries (their clients are bound to one)."""
    prepare: Callable[[], Any] | None = None
    """Run after the keys are reset and before pushing (taskiq: declare the stream's group)."""
    close: Callable[[], Any] | None = None
    latency_env: dict[str, str] = field(default_factory=dict)
    """Environment of the latency worker only."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of every worker of this peer (drain and latency)."""
    idle_wait: str = ""
    """How its idle worker waits for a job (printed beside its latency)."""
    stop_grace_s: float = 30.0
    """How long the worker gets to exit on SIGTERM before it is stopped harder."""
    hard_stops: int = 0
    push_timed: bool = True
    """Whether its one-at-a-time enqueue is a figure of its own (not for a second tree)."""
    procs: int = 1
    """Worker processes started for the drain (each runs ``worker``)."""
    drain_only: bool = False
    """A second setting of a library measured above: drain only (no enqueue, no latency)."""
    anchor: bool = False
    """Not Python (Sidekiq, BullMQ): drain and latency only, pushed by ``fill``/``paced``."""
    fill: Callable[[int], Any] | None = None
    """Push n jobs by other means than ``enqueue`` (untimed): the anchors' own clients."""
    paced: Callable[[float, float], int] | None = None
    """Send stamp jobs at ``per_s`` for ``duration_s`` by other means; how many were sent."""

    def _run(self, fn: Callable[[], Any]) -> Any:
        result = fn()
        if self.loop is not None:
            return self.loop.run_until_complete(result)
        return result

    def push(self, n: int) -> float:
        """Push n jobs one at a time; jobs/s (``prepare`` is not timed)."""
        if self.prepare is not None:
            self._run(self.prepare)
        if self.loop is None:
            t = time.perf_counter()
            for i in range(n):
                self.enqueue(i)
            return rate(n, time.perf_counter() - t)

        async def one_by_one() -> float:
            t = time.perf_counter()
            for i in range(n):
                await self.enqueue(i)
            return rate(n, time.perf_counter() - t)

        return float(self.loop.run_until_complete(one_by_one()))

    def paced_stamps(self, per_s: float, duration_s: float) -> int:
        """Send stamp jobs at ``per_s`` for ``duration_s``; how many were sent."""
        if self.paced is not None:
            return self.paced(per_s, duration_s)
        stamp = self.stamp
        assert stamp is not None
        if self.loop is None:
            return _paced(per_s, duration_s, lambda: stamp(time.time()))

        async def paced() -> int:
            count = int(per_s * duration_s)
            t0 = time.perf_counter()
            for i in range(count):
                pause = t0 + i / per_s - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                await stamp(time.time())
            return count

        return int(self.loop.run_until_complete(paced()))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _peers(ctx: Ctx) -> tuple[list[Peer], list[str]]:
    """The installed peers, and the pip names of those that are not."""
    b = _app()
    bin_dir = Path(sys.executable).parent
    peers: list[Peer] = []
    missing: list[str] = []
    k = b.app.queue_for(None).keys("default")
    # TIDINGS_BENCH_BEFORE=<src dir of another tidings checkout>: that tree's workers run
    # as extra peers in the same run, taking turns with this one's (before/after tables).
    trees = [("", {})]
    before = os.environ.get("TIDINGS_BENCH_BEFORE")
    if before:
        path = os.pathsep.join(p for p in (before, os.environ.get("PYTHONPATH", "")) if p)
        trees.append((" (before)", {"PYTHONPATH": path}))
    # tidings twice: a sync ``def handle`` (what the peers' bodies are, and what most
    # Django/Flask code is) and an ``async def handle``.
    for (tag, env), (name, job, stamp_job) in itertools.product(
        trees,
        (
            ("tidings sync", b.NoOpSyncJob, b.StampSync),
            ("tidings async", b.NoOpJob, b.Stamp),
        ),
    ):
        peers.append(
            Peer(
                name + tag,
                lambda i, job=job: job(i).dispatch(),
                notify_worker_argv(),
                lambda: int(ctx.client.hlen(k.jobs)),
                f"notify-worker, defaults (--concurrency 16), {name.split()[1]} handle()",
                stamp=lambda sent_at, stamp_job=stamp_job: stamp_job(sent_at=sent_at).dispatch(),
                latency_env={"TIDINGS_BENCH_LATENCY": "1"},  # as latency_rows runs it
                env=env,
                push_timed=not tag,
                idle_wait="BLPOP with the pop script queued behind it",
            )
        )
    for (tag, env), procs in itertools.product(trees, (1, 2)):
        peers.append(
            Peer(
                f"tidings sync{tag}, {procs} process{'es' if procs > 1 else ''} x 64",
                lambda i: b.NoOpSyncJob(i).dispatch(),
                notify_worker_argv("--concurrency", "64"),
                lambda: int(ctx.client.hlen(k.jobs)),
                f"notify-worker --concurrency 64, sync handle(), {procs} process(es)",
                procs=procs,
                env=env,
                drain_only=True,
            )
        )
    try:
        huey, noop, huey_stamp = b.huey_app, b.huey_noop, b.huey_stamp
        peers.append(
            Peer(
                "huey",
                lambda i: noop(i),
                [str(bin_dir / "huey_consumer"), "benchmarks.bench_app.huey_app"],
                lambda: int(huey.pending_count()),
                "huey_consumer, defaults (1 thread worker)",
                stamp=lambda sent_at: huey_stamp(sent_at),
                idle_wait="BRPOP (blocking=True)",
            )
        )
        peers.append(
            Peer(
                "huey, 2 processes",
                lambda i: noop(i),
                [
                    str(bin_dir / "huey_consumer"),
                    "benchmarks.bench_app.huey_app",
                    "-k",
                    "process",
                    "-w",
                    "2",
                ],
                lambda: int(huey.pending_count()),
                "huey_consumer -k process -w 2",
                drain_only=True,
            )
        )
    except ImportError:
        missing.append("huey")
    try:
        broker, actor, dramatiq_stamp = b.dramatiq_broker, b.dramatiq_noop, b.dramatiq_stamp
        msgs = f"{broker.namespace}:{actor.queue_name}.msgs"
        peers.append(
            Peer(
                "dramatiq",
                lambda i: actor.send(i),
                [
                    str(bin_dir / "dramatiq"),
                    "benchmarks.bench_app:dramatiq_broker",
                    "--processes",
                    "1",
                ],
                lambda: int(ctx.client.hlen(msgs)),
                "dramatiq, 1 process x 8 threads (default threads)",
                stamp=lambda sent_at: dramatiq_stamp.send(sent_at),
                idle_wait="polls a fetch script, backing off",
            )
        )
    except ImportError:
        missing.append("dramatiq")
    try:
        import rq

        queue = rq.Queue(f"{ctx.prefix}-rq", connection=redis.Redis.from_url(ctx.url))
        started = rq.registry.StartedJobRegistry(queue=queue)
        peers.append(
            Peer(
                "rq",
                lambda i: queue.enqueue(b.rq_noop, i),
                [
                    str(bin_dir / "rq"),
                    "worker",
                    "--url",
                    ctx.url,
                    "-w",
                    "rq.worker.SimpleWorker",
                    queue.name,
                ],
                lambda: int(queue.count) + int(started.count),
                "rq SimpleWorker (no fork per job; the default forks)",
                drain_n=min(ctx.n, 2_000),
                stamp=lambda sent_at: queue.enqueue(b.rq_stamp, sent_at),
                idle_wait="BLPOP",
            )
        )
    except ImportError:
        missing.append("rq")
    try:
        saq_queue = b.saq_queue
        incomplete = saq_queue.namespace("incomplete")  # a job leaves it when finished
        saq_loop = asyncio.new_event_loop()

        peers.append(
            Peer(
                "saq",
                lambda i: saq_queue.enqueue("saq_noop", n=i),
                [str(bin_dir / "saq"), "benchmarks.bench_app.saq_settings"],
                lambda: int(ctx.client.zcard(incomplete)),
                "saq, 1 process, defaults (concurrency 10)",
                stamp=lambda sent_at: saq_queue.enqueue("saq_stamp", sent_at=sent_at),
                loop=saq_loop,
                idle_wait="BLMOVE x10",
                close=_closing(saq_loop, saq_queue.disconnect),
            )
        )
    except ImportError:
        missing.append("saq")
    try:
        tq_broker, tq_noop, tq_stamp = b.taskiq_broker, b.taskiq_noop, b.taskiq_stamp
        tq_loop = asyncio.new_event_loop()

        def tq_pending(stream: str = tq_broker.queue_name) -> int:
            # Not yet delivered to the group (lag) + delivered and not yet acked (pending);
            # taskiq acks after the task (and its result) are done.
            for group in ctx.client.xinfo_groups(stream):
                if _text(group["name"]) == tq_broker.consumer_group_name:
                    return int(group["lag"]) + int(group["pending"])
            raise RuntimeError(f"taskiq: no consumer group on {stream}")

        peers.append(
            Peer(
                "taskiq",
                lambda i: tq_noop.kiq(i),
                [
                    str(bin_dir / "taskiq"),
                    "worker",
                    "benchmarks.bench_app:taskiq_broker",
                    "--workers",
                    "1",
                ],
                tq_pending,
                "taskiq worker --workers 1 (default 2), RedisStreamBroker, defaults",
                stamp=lambda sent_at: tq_stamp.kiq(sent_at),
                loop=tq_loop,
                # The stream's consumer group reads from "$": declare it before pushing.
                prepare=tq_broker.startup,
                close=_closing(tq_loop, tq_broker.shutdown),
                stop_grace_s=3.0,
                idle_wait="XREADGROUP BLOCK 2000",
            )
        )
        peers.append(
            Peer(
                "taskiq, 2 processes",
                lambda i: tq_noop.kiq(i),
                [
                    str(bin_dir / "taskiq"),
                    "worker",
                    "benchmarks.bench_app:taskiq_broker",
                    "--workers",
                    "2",
                ],
                tq_pending,
                "taskiq worker (its default --workers 2)",
                loop=tq_loop,
                prepare=tq_broker.startup,
                stop_grace_s=3.0,
                drain_only=True,
            )
        )
    except ImportError:
        missing.append("taskiq taskiq-redis")
    peers += anchors(ctx, missing)
    return peers, missing


def _closing(
    loop: asyncio.AbstractEventLoop, shutdown: Callable[[], Awaitable[Any]]
) -> Callable[[], None]:
    """A peer's ``close``: run its async ``shutdown`` on its loop, then close the loop."""

    def close() -> None:
        loop.run_until_complete(shutdown())
        loop.close()

    return close


def _reset_peer_keys(ctx: Ctx) -> None:
    # Peers keep keys outside our prefix (rq has no prefix at all): peers only run on the
    # private server run.py started, so emptying its database is safe.
    ctx.client.flushdb()


# -- stopping a worker and whatever it forked -------------------------------------------


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time), to tell a PID from its reuse; None once
    the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process under ``pid`` right now."""
    out: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                started = _start_time(kid)
                if started is not None:
                    out.append((kid, started))
                    todo.append(kid)
    return out


def _signal_alive(procs: list[tuple[int, str]], sig: int) -> int:
    """Send ``sig`` (0: only count) to those of ``procs`` still running (same PID and
    start time); how many there were."""
    sent = 0
    for pid, started in procs:
        if _start_time(pid) == started:
            try:
                os.kill(pid, sig)
                sent += 1
            except ProcessLookupError:
                pass
    return sent


def stop_tree(peer: Peer, proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker; if it has not exited after ``peer.stop_grace_s``, SIGINT the
    processes it forked five times (taskiq's hard kill: its worker process raises
    KeyboardInterrupt after ``--hardkill-count`` 3 more signals), then SIGKILL all of them.

    Only this worker's process and the processes it forked are signalled, by PID.
    """
    kids = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=peer.stop_grace_s)
    except subprocess.TimeoutExpired:
        peer.hard_stops += 1
        for _ in range(5):
            _signal_alive(kids, signal.SIGINT)
            time.sleep(0.05)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while _signal_alive(kids, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_alive(kids, signal.SIGKILL)


# -- measuring ---------------------------------------------------------------------------


def _poll_drain(pending: Callable[[], int], n: int, procs: list[subprocess.Popen[bytes]]) -> float:
    """jobs/s from the first job taken to the last, by polling the peer's own count."""
    first: tuple[float, int] | None = None
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while True:
        left = pending()
        now = time.perf_counter()
        if first is None and left < n:
            first = (now, left)
        if left <= 0 and first is not None:
            return rate(first[1], now - first[0]) if now > first[0] else float("nan")
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}: {stderr_tail(proc)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{left} jobs left after {WORKER_TIMEOUT_S:.0f}s")
        time.sleep(0.002)


def _latency(ctx: Ctx, peer: Peer, duration_s: float) -> tuple[list[float], int]:
    """Enqueue->start seconds of stamp jobs at 50/s to one idle worker; and how many sent."""
    records, count = latency_records(ctx, peer, duration_s)
    return [float(r.split(",")[0]) for r in records], count


def latency_records(ctx: Ctx, peer: Peer, duration_s: float) -> tuple[list[str], int]:
    """The records of stamp jobs sent at 50/s to one idle worker (``enqueue->start``
    first, then what a tidings stamp adds; see ``bench_app.Stamp``); and how many sent."""
    key = _app().mark_key("latency")
    _reset_peer_keys(ctx)
    if peer.prepare is not None:
        peer._run(peer.prepare)
    proc = spawn(peer.worker, worker_env(ctx, **peer.env, **peer.latency_env))
    try:
        peer.paced_stamps(1.0, 1.0)  # warm-up: waited for, then dropped
        deadline = time.monotonic() + 60
        while int(ctx.client.llen(key)) < 1:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}: {stderr_tail(proc)}")
            if time.monotonic() > deadline:
                raise RuntimeError("warm-up job not started after 60 s")
            time.sleep(0.01)
        time.sleep(0.5)  # let it reach its blocking wait
        ctx.client.delete(key)
        count = peer.paced_stamps(LATENCY_PER_S, duration_s)
        deadline = time.monotonic() + 15
        while int(ctx.client.llen(key)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop_tree(peer, proc)
    records = [_text(r) for r in ctx.client.lrange(key, 0, -1)]
    _reset_peer_keys(ctx)
    return records, count


def peer_rows(ctx: Ctx) -> list[Row]:
    """Enqueue, drain and enqueue->start latency of tidings and each installed peer."""
    if os.environ.get("TIDINGS_BENCH_REDIS_URL"):
        ctx.notes.append(
            "peers skipped: they run only on the private Redis run.py starts (they FLUSHDB)"
        )
        return []
    peers, missing = _peers(ctx)
    if missing:
        pip = [m for m in missing if "(" not in m]
        ctx.notes.append(
            f"peers not installed (skipped): {', '.join(missing)}"
            + (f"; pip install {' '.join(pip)}" if pip else "")
        )
    try:
        return _measure(ctx, peers)
    finally:
        for peer in peers:
            if peer.close is not None:
                peer.close()


def _measure(ctx: Ctx, peers: list[Peer]) -> list[Row]:
    rows: list[Row] = []
    results: dict[str, tuple[float, float]] = {}
    runs = 1 if ctx.quick else ctx.runs
    # One-at-a-time enqueue: the peers take turns, run by run (a slow moment of a shared
    # machine then costs every library alike); the median of each is printed.
    pushes: dict[str, list[float]] = {}
    broken: dict[str, Exception] = {}
    for r in range(ctx.runs + 1):  # round 0 warms up (500 jobs each)
        for peer in peers:
            if peer.name in broken or peer.drain_only or peer.anchor or not peer.push_timed:
                continue
            n = peer.drain_n or ctx.n
            try:
                _reset_peer_keys(ctx)
                rate = peer.push(min(n, 500) if r == 0 else n)
            except Exception as exc:  # reported in the peer's row below
                broken[peer.name] = exc
                continue
            finally:
                _reset_peer_keys(ctx)
            if r:
                pushes.setdefault(peer.name, []).append(rate)

    def drain_one(peer: Peer) -> float:
        n = peer.drain_n or ctx.n
        _reset_peer_keys(ctx)
        if peer.fill is not None:
            peer.fill(n)
        else:
            peer.push(n)
        procs = [spawn(peer.worker, worker_env(ctx, **peer.env)) for _ in range(peer.procs)]
        try:
            return _poll_drain(peer.pending, n, procs)
        finally:
            for proc in procs:
                stop_tree(peer, proc)
            _reset_peer_keys(ctx)

    # Drains take turns too, round by round.
    drains: dict[str, list[float]] = {}
    for _ in range(runs):
        for peer in peers:
            if peer.name in broken:
                continue
            try:
                drains.setdefault(peer.name, []).append(drain_one(peer))
            except Exception as exc:  # a peer's failure must not hide the others
                broken[peer.name] = exc
    for peer in peers:
        n = peer.drain_n or ctx.n
        if peer.name in broken:
            exc = broken[peer.name]
            rows.append(Row(f"peer {peer.name}: FAILED", type(exc).__name__, str(exc)[:80]))
            continue
        enq = statistics.median(pushes[peer.name]) if peer.name in pushes else float("nan")
        drained = statistics.median(drains[peer.name])
        results[peer.name] = (enq, drained)
        only_drain = peer.drain_only or peer.anchor or not peer.push_timed
        what = "drain" if only_drain else "enqueue one at a time / drain"
        rows.append(
            Row(
                f"peer {peer.name}: {what}",
                f"{drained:,.0f} jobs/s" if only_drain else f"{enq:,.0f} / {drained:,.0f} jobs/s",
                peer.setting + (f", N={n:,}" if n != ctx.n else ""),
            )
        )
    sync, asyn = results.get("tidings sync"), results.get("tidings async")
    if sync and asyn:
        # Ratios: tidings sync / peer and tidings async / peer (drain); enqueue is the same
        # dispatch() for both, so one ratio (the async row's).
        for row in rows:
            name = row.figure.removeprefix("peer ").partition(":")[0]
            if (name.startswith("tidings") and "(before)" not in name) or name not in results:
                continue
            theirs = results[name]
            drain = f"{sync[1] / theirs[1]:.2f}x sync, {asyn[1] / theirs[1]:.2f}x async"
            row.ratio = (
                drain if row.figure.endswith(": drain") else f"{asyn[0] / theirs[0]:.2f}x / {drain}"
            )

    # Latency moves with the machine's phases even more than rates do: the peers take
    # turns, round by round (a fresh worker each), and each row pools its rounds' samples.
    duration = 3.0 if ctx.quick else 5.0
    rounds = 1 if ctx.quick else max(1, ctx.runs)
    samples: dict[str, list[float]] = {}
    sent: dict[str, int] = {}
    failed: dict[str, Exception] = {}
    timed = [p for p in peers if p.stamp is not None or p.paced is not None]
    for _ in range(rounds):
        for peer in timed:
            if peer.name in failed:
                continue
            try:
                values, count = _latency(ctx, peer, duration)
            except Exception as exc:
                failed[peer.name] = exc
                continue
            samples.setdefault(peer.name, []).extend(values)
            sent[peer.name] = sent.get(peer.name, 0) + count
    latency: dict[str, tuple[float, float]] = {}
    lat_rows: list[Row] = []
    for peer in timed:
        figure = f"peer {peer.name}: enqueue->start p50 / p99"
        if peer.name in failed:
            exc = failed[peer.name]
            lat_rows.append(Row(f"{figure}: FAILED", type(exc).__name__, str(exc)[:80]))
            continue
        values, count = samples.get(peer.name, []), sent.get(peer.name, 0)
        if not values:
            lat_rows.append(Row(f"{figure}: FAILED", "no samples"))
            continue
        p50, p99 = _pcts(values)
        if len(values) < count:
            ctx.notes.append(f"{peer.name} latency: only {len(values)} of {count} jobs started")
        latency[peer.name] = (p50, p99)
        lat_rows.append(
            Row(
                figure,
                f"{p50:.2f} / {p99:.2f} ms",
                f"{len(values)} jobs at {LATENCY_PER_S:.0f}/s in {rounds} round(s); "
                f"idle: {peer.idle_wait}",
                goal="p50, p99 <= best Python peer's" if peer.name == "tidings sync" else "",
            )
        )
    if "tidings sync" in latency and "tidings async" in latency:
        for row in lat_rows:
            name = row.figure.removeprefix("peer ").partition(":")[0]
            if (not name.startswith("tidings") or "(before)" in name) and name in latency:
                rs = latency["tidings sync"][1] / latency[name][1]
                ra = latency["tidings async"][1] / latency[name][1]
                row.ratio = f"{rs:.2f}x sync, {ra:.2f}x async p99"
    rows += lat_rows

    hard = [f"{p.name} x{p.hard_stops}" for p in peers if p.hard_stops]
    if hard:
        ctx.notes.append(
            "peer workers that did not exit on SIGTERM and were hard-stopped "
            f"(SIGINT x5, then SIGKILL, by PID): {', '.join(hard)}"
        )
    versions = ", ".join(
        f"{dist} {_version(dist)}"
        for dist in ("huey", "dramatiq", "rq", "saq", "taskiq", "taskiq-redis")
        if _version(dist) != "?"
    )
    versions += anchor_versions()
    ctx.notes.append(
        "peer rows: drains timed by polling each library's own pending count, tidings too; "
        "ratio = tidings / peer (enqueue; drain with a sync and with an async handle()), "
        "tidings p99 / peer p99 (latency, sync and async handle()); the peers' job bodies "
        "are sync except saq's (its jobs are coroutines); "
        f"latency after one warm-up job; {versions}"
    )
    return rows
