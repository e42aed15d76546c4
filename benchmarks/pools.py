"""Pools balanced by measured wait: a trace-driven simulation beside Horizon's balancer,
a real burst on this machine beside fixed pools, and two supervisors' takeover time.

    .venv/bin/python -m benchmarks.pools                 # all three (~8 min)
    .venv/bin/python -m benchmarks.pools --only sim --hours 3 --seeds 3
    .venv/bin/python -m benchmarks.pools --only real --rounds 2
    .venv/bin/python -m benchmarks.pools --only takeover --rounds 3

``sim``: benchmarks/pools_sim.py (four pools, bursty Poisson arrivals) through tidings'
balancer and a port of Horizon's ``time`` strategy (cooldown 3 s, max shift 1), same
trace: p95 wait per pool, process-seconds, direction changes; then a steady load (no
bursts) for the direction changes alone.

``real``: ``notify-worker supervise`` with two pools (``fast``: no-op jobs, 1..2
processes; ``slow``: 50 ms sleeps, 1..6 processes, concurrency 4), 8 processes at most; a
steady 100 no-op jobs/s on ``fast`` and a burst of 5,000 slow jobs. Baseline in the same
run, interleaved: the same with ``balance="off"`` and one slow process (fixed pools).

``takeover``: two supervisors (max_processes 4 and 3) sharing a pool with
``max_processes_total=5``; SIGKILL one, time until the other runs its full share.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._redis import bench_redis, delete_prefix  # noqa: E402
from benchmarks.pools_sim import POOLS, POOLS_ISSUE, SimPool, simulate, trace  # noqa: E402


def _fmt(xs: list[float], unit: str = "s") -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    d = 2 if med < 1 else 1
    return f"{med:.{d}f} {unit} (min {min(xs):.{d}f}, max {max(xs):.{d}f}, n={len(xs)})"


# -- simulation ----------------------------------------------------------------------------


def run_sim(hours: float, seeds: int) -> None:
    for pools, what in (
        (POOLS, "targets mail 2 s, default 1 s, reports 30 s"),
        (POOLS_ISSUE, "the issue's example: a target on mail (1 s) only"),
    ):
        print(f"\n# pools with {what}")
        _run_sim(pools, hours, seeds)


def _run_sim(POOLS: list[SimPool], hours: float, seeds: int) -> None:
    print(f"\n## simulation: {len(POOLS)} pools, {hours:g} h of bursty arrivals, {seeds} seeds "
          "(budget 16 processes, each pool 1..10, start-up 1 s)")  # fmt: skip
    rows = [("horizon time (3 s, shift 1)", "horizon", 1),
            ("tidings (3 s, shift 1)", "tidings", 1),
            ("tidings (3 s, shift 2: default)", "tidings", 2)]  # fmt: skip
    for steady in (False, True):
        label = "steady load (no bursts, no swell)" if steady else "bursty trace"
        print(f"\n### {label}")
        res: dict[str, list[dict[str, Any]]] = {r[0]: [] for r in rows}
        for seed in range(1, seeds + 1):
            arr = trace(POOLS, hours, seed, steady=steady)
            for name, strategy, shift in rows:
                res[name].append(simulate(POOLS, arr, strategy=strategy, max_total=16,
                                          cooldown_s=3.0, max_shift=shift))  # fmt: skip
        for name, _, _ in rows:  # every seed, then the medians
            for seed, r in enumerate(res[name], 1):
                cells = " | ".join(f"{r[p.name]['p95_wait_s']:.1f} s" for p in POOLS)
                ps = sum(r[p.name]["process_s"] for p in POOLS)
                dc = sum(r[p.name]["direction_changes"] for p in POOLS)
                print(f"| {name}, seed {seed} | {cells} | {ps:,.0f} | {dc} |")
        head = "| balancer | " + " | ".join(f"p95 {p.name}" for p in POOLS)
        print(head + " | process-s | direction changes |")
        print("|---" * (len(POOLS) + 3) + "|")
        base_ps = None
        for name, _, _ in rows:
            runs = res[name]
            p95 = [statistics.median(r[p.name]["p95_wait_s"] for r in runs) for p in POOLS]
            ps = statistics.median(sum(r[p.name]["process_s"] for p in POOLS) for r in runs)
            dc = statistics.median(sum(r[p.name]["direction_changes"] for p in POOLS) for r in runs)
            base_ps = base_ps or ps
            cells = " | ".join(f"{x:.2f} s" for x in p95)
            print(f"| {name} | {cells} | {ps:,.0f} ({ps / base_ps:.2f}x) | {dc:.0f} |")
    targets = ", ".join(f"{p.name} {p.target_wait_s if p.target_wait_s else 'none'}"
                        for p in POOLS)  # fmt: skip
    print(f"\n(medians over seeds; tidings' wait targets: {targets}; Horizon has none)")


# -- real processes ----------------------------------------------------------------------------


def pool_counts(sup_pid: int | None = None, session: int | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        if f[0] == "Z" or (sup_pid is not None and int(f[1]) != sup_pid):
            continue
        if session is not None and int(f[3]) != session:
            continue
        for var in environ.split(b"\0"):
            if var.startswith(b"TIDINGS_POOL="):
                name = var.split(b"=", 1)[1].decode()
                out[name] = out.get(name, 0) + 1
    return out


def _supervise(url: str, prefix: str, config: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POOLS_REDIS_URL": url, "POOLS_PREFIX": prefix,
           "POOLS_CONFIG": orjson.dumps(config).decode(), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "tidings.cli", "supervise", "-A", "tests.e2e.pools_app:app",
         "--grace", "10"],
        cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _wait(pred: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _p95(xs: list[float]) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def real_round(url: str, balanced: bool, n: int, tag: str, host_max: int = 8) -> dict[str, Any]:
    from tests.e2e.pools_app import Noop, Slow, make_app

    prefix = f"tbpool{os.getpid()}{tag}"
    slow_max = 6 if balanced else 1
    config = {
        "pools": [
            {"name": "fast", "queues": ["fast"], "min_processes": 1, "max_processes": 2,
             "concurrency": 16, "target_wait_s": 0.5},
            {"name": "slow", "queues": ["slow"], "min_processes": 1, "max_processes": slow_max,
             "concurrency": 4, "target_wait_s": 1.0},
        ],
        "max_processes": host_max, "balance": "auto" if balanced else "off",
    }  # fmt: skip
    app = make_app(url, prefix, config)
    log = Path(f"/tmp/{prefix}.log")
    sup = _supervise(url, prefix, config, log)
    stop = threading.Event()
    try:
        want = {"fast": 1, "slow": 1} if balanced else {"fast": 2, "slow": 1}
        _wait(lambda: pool_counts(sup.pid) == want, 60, "the pools at their minimum")
        time.sleep(3)  # the workers' first beats and the leader's baseline

        def fast_load() -> None:
            i = 0
            while not stop.is_set():
                now = time.time()
                app.dispatch_many([Noop(f"f{i + k}", now) for k in range(10)])
                i += 10
                stop.wait(0.1)

        producer = threading.Thread(target=fast_load, daemon=True)
        producer.start()
        time.sleep(2)
        t0 = time.time()
        app.dispatch_many([Slow(f"s{i}", 50, t0) for i in range(n)])
        r = app.queue_for(None).client
        grown_at = None
        done_at = None
        back_at = None
        timeline: list[tuple[float, dict[str, int]]] = []
        while True:
            now = time.time()
            c = pool_counts(sup.pid)
            timeline.append((now - t0, c))
            if grown_at is None and c.get("slow", 0) > 1:
                grown_at = now - t0
            if done_at is None and r.llen(f"{prefix}:test:wait:slow") >= n:
                done_at = now - t0
                stop.set()
            if done_at is not None and (not balanced or c == {"fast": 1, "slow": 1}):
                back_at = now - t0
                break
            if now - t0 > 600:
                break
            time.sleep(0.2)
        stop.set()
        producer.join(5)

        def waits(queue: str) -> list[tuple[float, float]]:
            raw = r.lrange(f"{prefix}:test:wait:{queue}", 0, -1)
            out = []
            for x in raw:
                a, b = x.decode().split()
                out.append((float(a) - t0, float(b)))
            return out

        slow = waits("slow")
        fast = waits("fast")
        end = done_at or 0.0
        fast_burst = [w for at, w in fast if 0 <= at <= end]
        per5: dict[int, list[float]] = {}
        for at, w in slow:
            per5.setdefault(int(at // 5) * 5, []).append(w)
        procs5: dict[int, int] = {}
        for at, c in timeline:
            k = int(at // 5) * 5
            procs5[k] = max(procs5.get(k, 0), c.get("slow", 0))
        peak = max((c.get("slow", 0) for _, c in timeline), default=0)
        return {
            "grown_s": grown_at, "done_s": done_at,
            "back_s": (back_at - done_at) if back_at and done_at else None,
            "slow_p95": _p95([w for _, w in slow]), "fast_p95_burst": _p95(fast_burst),
            "slow_p95_per5": {k: _p95(v) for k, v in sorted(per5.items())}, "peak_slow": peak,
            "slow_started_per5": {k: len(v) for k, v in sorted(per5.items())},
            "slow_procs_per5": procs5,
            "lost": n - len(slow),
        }  # fmt: skip
    finally:
        stop.set()
        _stop(sup)
        delete_prefix(app.queue_for(None).client, prefix)
        app.close()


def run_real(url: str, rounds: int, n: int) -> None:
    print(f"\n## real run: burst of {n:,} slow jobs (50 ms) + 100 no-op jobs/s, this machine "
          "(2 cores, shared with other sessions: BUSY)")  # fmt: skip
    variants = {"fixed": (False, 8), "balanced, max_processes 8": (True, 8),
                "balanced, max_processes 4": (True, 4)}  # fmt: skip
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    for i in range(rounds):  # interleaved A/B/C
        for j, (label, (balanced, host_max)) in enumerate(variants.items()):
            out = real_round(url, balanced, n, f"v{j}r{i}", host_max)
            res[label].append(out)
            print(f"  round {i + 1} {label}: {out}", flush=True)
    print("\n| pools | slow pool grown after | burst done after | slow p95 wait | fast p95 "
          "wait during burst | back to minimum after burst | jobs lost |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, runs in res.items():

        def col(key: str, runs: list[dict[str, Any]] = runs) -> str:
            xs = [r[key] for r in runs if r[key] is not None]
            return _fmt(xs)

        bal = label != "fixed"
        print(f"| {label} | {col('grown_s') if bal else 'never'} | "
              f"{col('done_s')} | {col('slow_p95')} | {col('fast_p95_burst')} | "
              f"{col('back_s') if bal else '-'} | "
              f"{sum(r['lost'] for r in runs)} |")  # fmt: skip
    for label, runs in res.items():
        r0 = runs[0]
        print(
            f"\n{label}, round 1, per 5 s since the burst (all 5,000 dispatched at 0 s, so"
            " a job's wait is when it started):"
        )
        for what, key, f in (("slow p95 wait", "slow_p95_per5", "{:.1f}"),
                             ("slow jobs started", "slow_started_per5", "{}"),
                             ("slow processes (most)", "slow_procs_per5", "{}")):  # fmt: skip
            cells = ", ".join(f"{k}s:" + f.format(v) for k, v in r0[key].items())
            print(f"  {what}: {cells}")


# -- takeover ------------------------------------------------------------------------------


def takeover_round(url: str, tag: str) -> tuple[float | None, int]:
    from tests.e2e.pools_app import Slow, make_app

    prefix = f"tbtake{os.getpid()}{tag}"
    shared = {"pools": [{"name": "slow", "queues": ["slow"], "min_processes": 1,
                         "max_processes": 4, "concurrency": 4, "target_wait_s": 0.5,
                         "max_processes_total": 5}]}  # fmt: skip
    app = make_app(url, prefix, shared)
    a = _supervise(url, prefix, {**shared, "max_processes": 4}, Path(f"/tmp/{prefix}-a.log"))
    b = _supervise(url, prefix, {**shared, "max_processes": 3}, Path(f"/tmp/{prefix}-b.log"))
    worst = 0
    try:
        _wait(lambda: pool_counts(session=a.pid).get("slow") == 1
              and pool_counts(session=b.pid).get("slow") == 1, 60, "one each")  # fmt: skip
        app.dispatch_many([Slow(f"s{i}", 50) for i in range(20000)])

        def total() -> int:
            nonlocal worst
            t = sum(pool_counts(session=a.pid).values()) + sum(pool_counts(session=b.pid).values())
            worst = max(worst, t)
            return t

        _wait(lambda: total() == 5, 120, "the total")
        if pool_counts(session=b.pid).get("slow", 0) >= 3:
            return None, worst  # b already runs its full share: nothing to take over
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed = time.monotonic()
        _wait(lambda: total() >= 0 and pool_counts(session=b.pid).get("slow") == 3
              and not pool_counts(session=a.pid), 120, "takeover")  # fmt: skip
        return time.monotonic() - killed, worst
    finally:
        _stop(b)
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
        delete_prefix(app.queue_for(None).client, prefix)
        app.close()


def run_takeover(url: str, rounds: int) -> None:
    print("\n## two supervisors (max_processes 4 and 3), max_processes_total 5, lease 5 s: "
          "SIGKILL one")  # fmt: skip
    times, worst = [], 0
    for i in range(rounds):
        took, w = takeover_round(url, str(i))
        worst = max(worst, w)
        if took is None:
            print(f"  round {i + 1}: the surviving host already ran 3: not counted", flush=True)
            continue
        times.append(took)
        print(
            f"  round {i + 1}: other host at its full share {took:.1f} s after the SIGKILL",
            flush=True,
        )
    print(f"takeover: {_fmt(times)}; most processes seen at once: {worst} (total 5)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="sim,real,takeover")
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()
    # SIGTERM ends the run through the finally blocks: supervisors and Redis stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    only = set(args.only.split(","))
    print("machine: 2 cores shared with other sessions running tests (busy); figures noisy")
    if "sim" in only:
        run_sim(args.hours, args.seeds)
    if only & {"real", "takeover"}:
        with bench_redis() as server:
            if "real" in only:
                run_real(server.url, args.rounds, args.n)
            if "takeover" in only:
                run_takeover(server.url, max(args.rounds, 3))


if __name__ == "__main__":
    main()
