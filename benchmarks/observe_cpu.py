"""Worker CPU per job with the per-job metrics on and off (and tracing, if installed).

    python benchmarks/observe_cpu.py [--n 20000] [--rounds 8]

Wall-clock drain rates swing by 2x on a shared machine; the CPU time the worker process
itself used (user + system, from ``wait4``) per drained job moves far less, so this is
the figure to compare. Cases take turns every round; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._redis import bench_redis  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    with bench_redis() as server:
        prefix = f"tobs{os.getpid()}"
        os.environ.update(TIDINGS_REDIS_URL=server.url, TIDINGS_KEY=secrets.token_urlsafe(32),
                          TIDINGS_PREFIX=prefix)  # fmt: skip
        from benchmarks import bench_app as b

        cases = {
            "metrics on, tracing off (default without the otel extra)": {"TIDINGS_TRACING": "0"},
            "metrics off, tracing off": {"TIDINGS_TRACING": "0", "TIDINGS_METRICS": "0"},
        }
        try:
            import opentelemetry.trace  # noqa: F401

            cases["metrics on, opentelemetry-api installed (no SDK)"] = {}
        except ImportError:
            pass
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        wall: dict[str, list[float]] = {k: [] for k in cases}
        argv = [sys.executable, "-m", "tidings.cli", "-A", "benchmarks.bench_app:app",
                "--stop-when-empty"]  # fmt: skip
        for _ in range(args.rounds):
            for name, extra in cases.items():
                client = b.app.queue_for(None).client
                for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                    client.delete(key)
                b.app.dispatch_many([b.NoOpJob(i) for i in range(args.n)])
                env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
                t0 = time.perf_counter()
                proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                took = time.perf_counter() - t0
                assert proc.returncode == 0, proc.returncode
                cpu[name].append((usage.ru_utime + usage.ru_stime) / args.n * 1e6)
                wall[name].append(args.n / took)
        off = "metrics off, tracing off"
        base = statistics.median(cpu[off])
        print(f"N = {args.n:,} no-op jobs a drain, {args.rounds} rounds, cases interleaved "
              "(includes interpreter start-up, the same for every case); "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
        for name in cases:
            c, w = cpu[name], wall[name]
            print(
                f"  {name:<58} {statistics.median(c):6.1f} us CPU/job "
                f"[{min(c):.1f}-{max(c):.1f}] ({statistics.median(c) / base - 1:+.1%})   "
                f"{statistics.median(w):7,.0f} jobs/s wall [{min(w):,.0f}-{max(w):,.0f}]"
            )
        # Paired by round (the cases of one round ran back to back): the spread of the
        # ratio is the noise the effect must beat.
        for name in cases:
            if name == off:
                continue
            rc = sorted(a / b_ for a, b_ in zip(cpu[name], cpu[off], strict=True))
            rw = sorted(a / b_ for a, b_ in zip(wall[off], wall[name], strict=True))
            q = len(rc) // 4
            print(
                f"  {name[:30]:<30} / metrics off, per round: CPU/job "
                f"{statistics.median(rc):.3f}x [{rc[0]:.3f}-{rc[-1]:.3f}, middle half "
                f"{rc[q]:.3f}-{rc[-1 - q]:.3f}]; drain time {statistics.median(rw):.3f}x "
                f"[{rw[0]:.3f}-{rw[-1]:.3f}, middle half {rw[q]:.3f}-{rw[-1 - q]:.3f}]"
            )
        for key in b.app.queue_for(None).client.scan_iter(match=f"{prefix}:*", count=1000):
            b.app.queue_for(None).client.delete(key)


if __name__ == "__main__":
    main()
