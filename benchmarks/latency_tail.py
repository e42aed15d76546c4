"""Where the tail of enqueue->start latency comes from (issue 28, goal 3).

The peers harness pools 750 samples (3 rounds of 5 s at 50 jobs/s): its p99 is the 8th
worst sample, and one slow moment of the machine moves it. This runs the same latency
rounds (``peers.latency_records``: one idle worker, one warm-up stamp, 50 stamps/s) for
longer, tidings sync, tidings async and huey taking turns, and prints p50 / p90 / p99 /
p99.9 of each with more samples. For tidings it also splits each of its slowest 1 %:
dispatch -> ``JobProcessing`` heard in the worker (the push, Redis, the wake-up, the pop)
and heard -> ``handle`` started (the hand-off to the handler: a job thread for sync).

    .venv/bin/python -m benchmarks.latency_tail --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics

from benchmarks._redis import bench_redis
from benchmarks.bench_queue import Ctx
from benchmarks.peers import LATENCY_PER_S, Peer, _peers, latency_records


def _round(ctx: Ctx, peer: Peer, seconds: float) -> list[list[float]]:
    records, _count = latency_records(ctx, peer, seconds)
    return [[float(x) for x in r.split(",")] for r in records]


def _cuts(values: list[float]) -> str:
    q = statistics.quantiles(values, n=1000, method="inclusive")
    ms = [statistics.median(values), q[899], q[989], q[998], max(values)]
    return " / ".join(f"{v * 1000:.2f}" for v in ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per round and system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="tidings sync,tidings async,huey")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")]
    with bench_redis() as server:
        prefix = f"tbench{os.getpid()}"
        os.environ.update(
            TIDINGS_REDIS_URL=server.url, TIDINGS_KEY=secrets.token_urlsafe(32),
            TIDINGS_PREFIX=prefix,
        )  # fmt: skip
        ctx = Ctx(server.url, prefix, n=1000, runs=1, quick=False)
        peers, _ = _peers(ctx)
        chosen = [p for p in peers if p.name in names]
        samples: dict[str, list[list[float]]] = {p.name: [] for p in chosen}
        for _ in range(args.rounds):
            for peer in chosen:
                samples[peer.name] += _round(ctx, peer, args.seconds)
        print(f"enqueue->start at {LATENCY_PER_S:.0f}/s, ms: p50 / p90 / p99 / p99.9 / max")
        for name, rows in samples.items():
            print(f"{name:>14}: {_cuts([r[0] for r in rows])}  ({len(rows)} samples)")
            split = [r for r in rows if len(r) == 3 and r[1] >= 0]
            if not split:
                continue
            split.sort(key=lambda r: r[0])
            tail = split[-max(1, len(split) // 100) :]
            heard = [r[2] for r in split]
            handed = [r[0] - r[2] for r in split]
            print(f"{'':>16}dispatch->heard {_cuts(heard)}; heard->handle {_cuts(handed)}")
            print(
                f"{'':>16}slowest 1 % ({len(tail)}): mean dispatch->heard "
                f"{statistics.fmean(r[2] for r in tail) * 1000:.2f} ms, heard->handle "
                f"{statistics.fmean(r[0] - r[2] for r in tail) * 1000:.2f} ms; totals "
                + ", ".join(f"{r[0] * 1000:.2f}" for r in tail[-8:])
            )


if __name__ == "__main__":
    main()
