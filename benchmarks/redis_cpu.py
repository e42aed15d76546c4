"""Redis CPU per drained no-op job: tidings beside huey, Dramatiq and BullMQ (issue 28).

    python benchmarks/redis_cpu.py [--n 10000] [--rounds 3] [--before REF] [--no-peers]

Redis runs every queue's moves on one thread, so the server CPU a job costs is the
ceiling of one shard whatever the number of workers (1e6 / us per job, jobs/s). Each
case drains N no-op jobs pushed beforehand, with one worker process at the library's
defaults, on a private Redis started here (peers are cleaned up with FLUSHDB):

* tidings: ``notify-worker -A benchmarks.bench_app:app --stop-when-empty`` on async
  :class:`~benchmarks.bench_app.NoOpJob` (pop, ack, done record, metrics, receipts);
* ``--before REF``: the same with another tree's ``src`` (a git ref of this repository,
  extracted with ``git archive``, or a directory holding ``tidings/``), taking turns
  with this tree's in every round;
* huey, Dramatiq and BullMQ (concurrency 1, its default), when installed (``make
  bench-anchors``); one that is not is skipped, saying so.

Around each drain (after the push: the push is not counted): ``CONFIG RESETSTAT``, then
``INFO cpu`` (the server's ``used_cpu_user + used_cpu_sys``) before and after, and ``INFO
commandstats`` after. tidings' worker exits when the queue is empty; a peer's drain ends
when its own count of unfinished jobs reads 0 (polled every 50 ms, a few commands) and
its worker is stopped after the figures are read. The cases take turns every round;
medians and [min-max] over rounds are printed.

commandstats counts the commands a script runs inside it as well as the script call
itself (EVALSHA's usec includes its inner commands' usec): the per-command rows show
what a job costs inside the scripts, not a sum.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._redis import bench_redis  # noqa: E402

SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


@dataclass
class Case:
    """One system's drain: how to fill, run and count it."""

    name: str
    fill: Callable[[int], Any]
    argv: list[str]
    env: dict[str, str]
    pending: Callable[[], int] | None
    """None: the worker exits by itself when the queue is empty (tidings)."""
    stop: Callable[[subprocess.Popen[bytes]], None] | None = None
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    stats: list[dict[str, tuple[float, float]]] = field(default_factory=list)
    """Per round: command -> (calls per job, usec per job)."""


def _before_src(ref: str) -> tuple[str, str]:
    """A directory holding the ``tidings`` package of ``ref`` (a directory, or a git ref
    extracted into a temporary one), and a label."""
    path = Path(ref)
    if (path / "tidings").is_dir():
        return str(path.resolve()), str(path)
    if (path / "src" / "tidings").is_dir():
        return str((path / "src").resolve()), str(path)
    out = tempfile.mkdtemp(prefix="tidings-before-")
    archive = subprocess.run(
        ["git", "archive", ref, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    return str(Path(out) / "src"), sha


def _cpu_s(client: Any) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _commandstats(client: Any, n: int) -> dict[str, tuple[float, float]]:
    out = {}
    for name, row in client.info("commandstats").items():
        cmd = name.removeprefix("cmdstat_")
        if cmd in ("info", "config|resetstat", "config"):
            continue  # this benchmark's own reads
        out[cmd] = (int(row["calls"]) / n, int(row["usec"]) / n)
    return out


def _drain(client: Any, case: Case, n: int) -> None:
    from benchmarks.bench_queue import spawn, stderr_tail

    client.flushdb()
    case.fill(n)
    client.config_resetstat()
    cpu0 = _cpu_s(client)
    t0 = time.perf_counter()
    proc = spawn(case.argv, case.env)
    try:
        deadline = time.monotonic() + 300
        if case.pending is None:
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{case.name}: worker still running after 300 s") from None
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{case.name}: worker exited {proc.returncode}: {stderr_tail(proc)}"
                )
        else:
            while case.pending() > 0:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{case.name}: worker exited {proc.returncode}: {stderr_tail(proc)}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{case.name}: not drained after 300 s")
                time.sleep(0.05)
        took = time.perf_counter() - t0
        cpu = _cpu_s(client) - cpu0
        stats = _commandstats(client, n)
    finally:
        if proc.poll() is None:
            assert case.stop is not None
            case.stop(proc)
    case.cpu.append(cpu / n * 1e6)
    case.wall.append(n / took)
    case.stats.append(stats)
    client.flushdb()


def _spread(values: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def _report(cases: list[Case], n: int, rounds: int) -> None:
    print(
        f"\nRedis CPU per drained no-op job: N = {n:,} jobs a drain, {rounds} rounds, cases "
        f"interleaved; median [min-max]; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs"
    )
    width = max(len(c.name) for c in cases)
    base = cases[0]
    print(
        f"  {'system':<{width}}  {'Redis CPU us/job':>22}  {'ceiling/shard jobs/s':>22}  "
        f"{'script calls/job':>16}  {'us/script call':>14}  {'drain jobs/s (wall)':>22}  "
        f"vs {base.name}"
    )
    for c in cases:
        if not c.cpu:
            continue
        calls = [sum(v[0] for k, v in s.items() if k in SCRIPT_CALLS) for s in c.stats]
        script_us = [sum(v[1] for k, v in s.items() if k in SCRIPT_CALLS) for s in c.stats]
        per_call = [u / k for u, k in zip(script_us, calls, strict=True) if k]
        ceiling = [1e6 / u for u in c.cpu]
        ratio = statistics.median(c.cpu) / statistics.median(base.cpu)
        print(
            f"  {c.name:<{width}}  {_spread(c.cpu):>22}  {_spread(ceiling, ',.0f'):>22}  "
            f"{_spread(calls, '.3f'):>16}  "
            f"{statistics.median(per_call) if per_call else 0.0:>14.0f}  "
            f"{_spread(c.wall, ',.0f'):>22}  {ratio:.2f}x"
        )
    for c in cases:
        if not c.cpu:
            continue
        print(
            f"\n  {c.name}: INFO commandstats per job (median over rounds; scripts' usec "
            "include their inner commands)"
        )
        cmds = sorted(
            {k for s in c.stats for k in s},
            key=lambda k: -statistics.median(s.get(k, (0, 0))[1] for s in c.stats),
        )
        for cmd in cmds:
            calls = statistics.median(s.get(cmd, (0.0, 0.0))[0] for s in c.stats)
            usec = statistics.median(s.get(cmd, (0.0, 0.0))[1] for s in c.stats)
            if calls < 0.001 and usec < 0.05:
                continue
            tag = "  (script)" if cmd in SCRIPT_CALLS else ""
            print(f"    {cmd:<24} {calls:8.3f} calls/job  {usec:7.2f} us/job{tag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="a git ref (or src directory) to run beside this tree")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names to keep (prefixes)")
    args = ap.parse_args()
    if os.environ.get("TIDINGS_BENCH_REDIS_URL"):
        sys.exit("redis_cpu.py needs its own Redis (it FLUSHDBs): unset TIDINGS_BENCH_REDIS_URL")
    with bench_redis() as server:
        prefix = f"tcpu{os.getpid()}"
        os.environ.update(
            TIDINGS_REDIS_URL=server.url,
            TIDINGS_KEY=secrets.token_urlsafe(32),
            TIDINGS_PREFIX=prefix,
        )
        os.environ.pop("TIDINGS_BENCH_LATENCY", None)
        from benchmarks import bench_app as b
        from benchmarks.bench_queue import Ctx, notify_worker_argv
        from benchmarks.peers import _peers, stop_tree

        ctx = Ctx(server.url, prefix, n=args.n, runs=args.rounds, quick=False)
        client = ctx.client
        argv = notify_worker_argv("--stop-when-empty")

        def fill_tidings(n: int) -> None:
            b.app.dispatch_many([b.NoOpJob(i) for i in range(n)])

        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        cases = [Case("tidings", fill_tidings, argv, dict(os.environ, PYTHONPATH=path), None)]
        if args.before:
            src, label = _before_src(args.before)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join((src, path)))

            def fill_before(n: int, env: dict[str, str] = env) -> None:
                # Pushed by the other tree's own code: its worker may not read this
                # tree's envelope frame (it would fail every job instead of running it).
                code = (
                    "from benchmarks import bench_app as b; "
                    f"b.app.dispatch_many([b.NoOpJob(i) for i in range({n})])"
                )
                subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)

            cases.append(Case(f"tidings before ({label})", fill_before, argv, env, None))
        skipped: list[str] = []
        if not args.no_peers:
            peers, missing = _peers(ctx)
            wanted = {"huey": "huey", "dramatiq": "Dramatiq", "BullMQ concurrency 1": "BullMQ"}
            for peer in peers:
                if peer.name not in wanted:
                    continue
                fill = peer.fill or peer.push
                env = dict(os.environ, PYTHONPATH=path, **peer.env)
                cases.append(
                    Case(
                        f"{wanted[peer.name]} ({peer.setting})",
                        fill,
                        peer.worker,
                        env,
                        peer.pending,
                        stop=lambda p, peer=peer: stop_tree(peer, p),
                    )
                )
            skipped = [m for m in missing if m.split()[0].lower() in ("huey", "dramatiq", "bullmq")]
        if args.only:
            keep = [s.strip() for s in args.only.split(",")]
            cases = [c for c in cases if any(c.name.startswith(k) for k in keep)]
        for name in skipped:
            print(f"skipped (not installed): {name}; make bench-anchors installs it")
        print(f"Redis {server.version}; cases: {', '.join(c.name for c in cases)}", flush=True)
        for r in range(args.rounds):
            for case in cases:
                _drain(client, case, args.n)
                print(
                    f"  round {r + 1}: {case.name[:40]:<40} {case.cpu[-1]:6.1f} us/job  "
                    f"{case.wall[-1]:8,.0f} jobs/s",
                    file=sys.stderr,
                    flush=True,
                )
        _report(cases, args.n, args.rounds)
        client.flushdb()


if __name__ == "__main__":
    main()
