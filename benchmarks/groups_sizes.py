"""What fair groups cost `notify-worker monitor` (issue 25): ``sizes()`` of a queue with
no groups beside the same call on a queue with 100,000 groups of one ready job each
(one redis-server, interleaved rounds; the grouped ready count is one counter per queue).

    .venv/bin/python -m benchmarks.groups_sizes [--groups 100000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from benchmarks._redis import bench_redis, delete_prefix
from tidings import App, Job


@dataclass
class Nop(Job):
    def handle(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200, help="sizes() calls per round")
    args = ap.parse_args()
    with bench_redis() as server:
        prefix = f"gsz{time.time_ns()}"
        app = App(env=False, redis_url=server.url, key="bench-key-0123456789abcdef0123456789",
                  prefix=prefix, allowed_modules=__name__, metrics=False)  # fmt: skip
        try:
            for _ in range(100):
                Nop().on_queue("plain").dispatch()
            app.dispatch_many(
                Nop().on_queue("grouped").on_group(f"t{i}") for i in range(args.groups)
            )
            rq = app.queue_for(None)
            assert rq.sizes(["grouped"])["grouped"]["ready"] == args.groups
            times: dict[str, list[float]] = {"plain": [], "grouped": []}
            for _ in range(args.rounds):
                for name in ("plain", "grouped"):  # interleaved
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        rq.sizes([name])
                    times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
            print(
                f"redis {server.version}; load average {os.getloadavg()[0]:.1f}; "
                f"sizes() per call, µs, {args.rounds} interleaved rounds"
            )
            for name, label in (("plain", "100 ungrouped jobs"),
                                ("grouped", f"{args.groups:,} groups of one job")):  # fmt: skip
                xs = times[name]
                print(f"  {label:<28} median {statistics.median(xs):8.1f}  "
                      f"min {min(xs):8.1f}  max {max(xs):8.1f}")  # fmt: skip
            # The alternative not taken: sum the groups' lengths over the ring in one
            # script (Redis blocked meanwhile; paused groups, out of the ring, missed).
            k = rq.keys("grouped")
            lua = (
                "local n = 0 local base = string.sub(KEYS[1], 1, -7) "
                "for _, g in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do "
                "n = n + redis.call('LLEN', base .. ':g:' .. g) "
                "+ redis.call('ZCARD', base .. ':gp:' .. g) end return n"
            )
            sums = []
            for _ in range(3):
                t0 = time.perf_counter()
                assert rq.client.eval(lua, 1, k.gring) == args.groups
                sums.append((time.perf_counter() - t0) * 1e6)
            print(f"  {'a Lua sum over the ring':<28} median {statistics.median(sums):8.1f}  "
                  f"min {min(sums):8.1f}  max {max(sums):8.1f}  (not used)")  # fmt: skip
        finally:
            delete_prefix(app.queue_for(None).client, prefix)
            app.close()


if __name__ == "__main__":
    main()
