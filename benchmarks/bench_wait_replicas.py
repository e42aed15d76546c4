"""What ``TIDINGS_WAIT_REPLICAS=1`` costs a dispatch, on Sentinel and on Redis Cluster.

    .venv/bin/python -m benchmarks.bench_wait_replicas [--n 1500] [--rounds 4]

Starts a Sentinel group (primary, replica, three sentinels) and a 6-node cluster on
loopback (tests/support/topology.py), and times ``Job.dispatch()`` (sync, one at a time)
with ``wait_replicas=0`` and ``=1``, rounds interleaved (0,1 then 1,0), as microseconds
per dispatch (medians over rounds). With the setting every push goes out in one pipeline
with ``WAIT 1 100`` on the same connection. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.e2e.jobs_app import Ordered
from tests.support.topology import ClusterGroup, SentinelGroup
from tidings import App


def _bench(url: str, n: int, rounds: int) -> dict[int, float]:
    apps = {
        w: App(
            env=False,
            redis_url=url,
            key="bench-wait-replicas-key-0123456789",
            prefix=f"bench-wait{w}",
            allowed_modules="tests",
            wait_replicas=w,
        )
        for w in (0, 1)
    }
    times: dict[int, list[float]] = {0: [], 1: []}
    try:
        for r in range(rounds):
            for w in (0, 1) if r % 2 == 0 else (1, 0):
                apps[w].make_current()
                for _ in range(50):  # warm: scripts loaded, connections open
                    Ordered("x").on_queue("high").dispatch()
                t0 = time.perf_counter()
                for _ in range(n):
                    Ordered("x").on_queue("high").dispatch()
                times[w].append((time.perf_counter() - t0) / n * 1e6)
    finally:
        for app in apps.values():
            app.close()
    return {w: statistics.median(v) for w, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidings-bench-wait-"))
    for name, group in (("sentinel", SentinelGroup), ("cluster", ClusterGroup)):
        with group(base / name) as g:
            r = _bench(g.url, args.n, args.rounds)
        print(
            f"{name}: µs per dispatch, wait_replicas=0 {r[0]:.0f}, =1 {r[1]:.0f} "
            f"({r[1] / r[0]:.2f}x)"
        )


if __name__ == "__main__":
    main()
