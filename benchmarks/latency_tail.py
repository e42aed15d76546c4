"""Where the tail of enqueue->start latency comes from (issue 28, goal 3).

The peers harness pools 750 samples (3 rounds of 5 s at 50 jobs/s): its p99 is the 8th
worst sample, and one slow moment of the machine moves it. This runs the same latency
rounds (``peers._latency``'s way: one idle worker, one warm-up stamp, 50 stamps/s) for
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
import time

from benchmarks._redis import bench_redis
from benchmarks.bench_queue import Ctx, _app, _text, spawn, worker_env
from benchmarks.peers import LATENCY_PER_S, Peer, _peers, _reset_peer_keys, stop_tree


def _round(ctx: Ctx, peer: Peer, seconds: float) -> list[list[float]]:
    key = _app().mark_key("latency")
    _reset_peer_keys(ctx)
    proc = spawn(peer.worker, worker_env(ctx, **peer.env, **peer.latency_env))
    try:
        peer.paced_stamps(1.0, 1.0)
        deadline = time.monotonic() + 60
        while int(ctx.client.llen(key)) < 1:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{peer.name}: warm-up job never started")
            time.sleep(0.01)
        time.sleep(0.5)
        ctx.client.delete(key)
        count = peer.paced_stamps(LATENCY_PER_S, seconds)
        deadline = time.monotonic() + 15
        while int(ctx.client.llen(key)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop_tree(peer, proc)
    rows = [[float(x) for x in _text(r).split(",")] for r in ctx.client.lrange(key, 0, -1)]
    _reset_peer_keys(ctx)
    return rows


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
