"""Broadcast publish: the receipt-per-message script (before) against the bounded one.

::

    .venv/bin/python -m benchmarks.broadcast_publish --messages 5000 --rounds 5

A throwaway Redis. Each round publishes ``--messages`` messages, one channel each out of
``--channels`` (``max_len`` 100), once with the old script (``XADD`` plus a receipt key
per message per channel, ``SET PX`` one day) and once with the current one
(``redis/lua/broadcast_publish.lua``: the channel's last ``max_len`` ids in a hash and a
list), alternating (A B A B) on fresh key prefixes. Prints per-publish time (median and
spread over rounds), then the keys and memory each leaves (``MEMORY USAGE`` summed over
its keys) per message count, to show what grows with the count.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import redis

from tidings.broadcasting.publish import publish_args
from tidings.redis.scripts import BROADCAST_PUBLISH

OLD_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if done then return done end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', tonumber(ARGV[1]), '*',
  'e', ARGV[3], 'd', ARGV[4])
redis.call('SET', KEYS[2], id, 'PX', tonumber(ARGV[2]))
return id
"""
MAX_LEN = 100


def _old(r: redis.Redis, old: Any, prefix: str, n: int, channels: int) -> None:
    for k in range(n):
        ch = f"u.{k % channels}"
        old(keys=[f"{prefix}:broadcast:{{streams}}:ch:{ch}",
                  f"{prefix}:broadcast:{{streams}}:rcpt:m{k}:{ch}"],
            args=[MAX_LEN, 86_400_000, "tick", b'{"k":%d}' % k])  # fmt: skip


def _new(r: redis.Redis, new: Any, prefix: str, n: int, channels: int) -> None:
    for k in range(n):
        keys, args = publish_args(prefix, f"u.{k % channels}", f"m{k}", "tick",
                                  b'{"k":%d}' % k, max_len=MAX_LEN,
                                  receipt_ttl_s=86_400)  # fmt: skip
        new(keys=keys, args=args)


def _footprint(r: redis.Redis, prefix: str) -> tuple[int, int]:
    keys = list(r.scan_iter(match=f"{prefix}:*", count=5000))
    return len(keys), sum(int(r.memory_usage(k, samples=0) or 0) for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--channels", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    from benchmarks._redis import bench_redis

    with bench_redis() as server:
        r = redis.Redis.from_url(server.url)
        scripts = (r.register_script(OLD_SCRIPT), r.register_script(BROADCAST_PUBLISH.source))
        server_us: dict[str, list[float]] = {}
        times: dict[str, list[float]] = {"old (receipt key per message)": [],
                                         "new (ids trimmed with the stream)": []}  # fmt: skip
        foot: dict[str, list[tuple[int, int, int]]] = {name: [] for name in times}
        for rnd in range(opts.rounds):
            for name, fn, script in zip(times, (_old, _new), scripts, strict=True):
                prefix = f"b{rnd}{name[:3]}"
                r.config_resetstat()
                t0 = time.perf_counter()
                fn(r, script, prefix, opts.messages, opts.channels)
                times[name].append((time.perf_counter() - t0) / opts.messages * 1e6)
                stat = r.info("commandstats").get("cmdstat_evalsha", {})
                server_us.setdefault(name, []).append(float(stat.get("usec_per_call", 0)))
                if rnd == 0:  # footprint at 1x and 2x the messages
                    foot[name].append((opts.messages, *_footprint(r, prefix)))
                    fn(r, script, prefix + "x", 2 * opts.messages, opts.channels)
                    foot[name].append((2 * opts.messages, *_footprint(r, prefix + "x")))
                r.flushdb()
        print(f"redis {server.version}; {opts.messages} messages over {opts.channels} "
              f"channels, max_len {MAX_LEN}, {opts.rounds} interleaved rounds")  # fmt: skip
        for name, xs in times.items():
            sv = server_us[name]
            print(f"  {name:36s} {statistics.median(xs):7.1f} us/publish "
                  f"(min {min(xs):.1f}, max {max(xs):.1f}); in Redis "
                  f"{statistics.median(sv):5.1f} us "
                  f"(min {min(sv):.1f}, max {max(sv):.1f})")  # fmt: skip
        for name, rows in foot.items():
            for n, keys, used in rows:
                print(f"  {name:36s} after {n:6d} messages: {keys:6d} keys, "
                      f"{used / 1024:8.1f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
