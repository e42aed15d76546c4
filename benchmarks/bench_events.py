"""Sync event dispatch against a raw blinker ``Signal.send``, in the same run; and the
cost of queuing a listener against a raw redis-py ``RPUSH``, in the same run.

Run: ``python benchmarks/bench_events.py [--number N] [--no-redis]``. Each figure is
the best of five timed runs. Dispatch is in nanoseconds per dispatch, the ratio against
raw blinker with the same number of receivers (the target is at most 2x for one
listener). Queuing is in microseconds per ``dispatch`` of an event with one queued
listener (build the CallQueuedListener job, encode, sign, one Lua push), the ratio
against one ``RPUSH`` of a payload of the same size: both are one loopback round trip.
The Redis is a throwaway redis-server on a free port, stopped by its PID (or
``TIDINGS_BENCH_REDIS_URL``, where only keys under a private prefix are touched).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import secrets
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import blinker

from tidings import App, ShouldQueue
from tidings.events import Dispatcher, Listener

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class UserRegistered:
    user_id: int


class Greet(Listener):
    def handle(self, event: UserRegistered) -> None:
        return None


class SendWelcome(Listener, ShouldQueue):
    """Queued: dispatch pushes a job; the benchmark never runs it."""

    tries = 3

    def handle(self, event: UserRegistered) -> None:
        return None


def receiver(sender: Any, **kwargs: Any) -> None:
    return None


def listener(event: UserRegistered) -> None:
    return None


def best_ns(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def build_only(app: App, listener: type[Listener], event: object) -> None:
    """What a queued dispatch does before its one round trip."""
    from tidings.jobs.compose import prepare

    prepare(app._queued_job(listener, (event,)), app.signer, max_bytes=app.max_payload_bytes)


def queued_rows(number: int) -> list[tuple[str, float, float | None]]:
    """µs per dispatch of an event with one queued listener, beside a raw RPUSH."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import redis

    from benchmarks._redis import bench_redis, delete_prefix

    # A worker imports listeners by module path, which ``__main__`` is not: dispatch
    # with this file's classes as imported under their package name.
    this = importlib.import_module("benchmarks.bench_events")
    rows: list[tuple[str, float, float | None]] = []
    with bench_redis() as server:
        prefix = f"tbench-events{os.getpid()}"
        app = App(
            env=False,
            redis_url=server.url,
            key=secrets.token_urlsafe(32),
            prefix=prefix,
            allowed_modules="benchmarks",
        )
        app.listen(this.UserRegistered, this.SendWelcome)
        client = redis.Redis.from_url(server.url)
        try:
            event = this.UserRegistered(1)
            [job_id] = app.dispatch(event)
            rq = app.queue_for(None)
            envelope = rq.client.hget(rq.keys("default").jobs, job_id)
            assert isinstance(envelope, bytes)
            ids = itertools.count()
            raw_key = f"{prefix}:raw"

            def lua_push() -> None:
                # A fresh id per push, as dispatch makes: each one adds a hash field.
                rq.push("bench-raw", [(f"{next(ids):032x}", envelope)])

            cases: dict[str, Callable[[], Any]] = {
                f"redis-py RPUSH of a {len(envelope)}-byte payload": partial(
                    client.rpush, raw_key, envelope
                ),
                # The same envelope through tidings' push alone (one EVALSHA of push.lua);
                # the rest of the gap is building, encoding and signing the job.
                "RedisQueue.push of that envelope (Lua push)": lua_push,
                "dispatch, 1 queued listener: job pushed": partial(app.dispatch, event),
                # The CPU part of that dispatch alone: job, options, encode, sign; no I/O.
                "  of which building the job, encoding, signing": partial(
                    build_only, app, this.SendWelcome, event
                ),
            }
            # Rounds interleave the cases, so drift on a busy machine hits them alike.
            best = dict.fromkeys(cases, float("inf"))
            for _ in range(5):
                for name, fn in cases.items():
                    t = timeit.timeit(fn, number=number) / number * 1e6
                    best[name] = min(best[name], t)
            raw = next(iter(best.values()))
            rows = [
                (name, us, None if i == 0 else us / raw)
                for i, (name, us) in enumerate(best.items())
            ]
        finally:
            delete_prefix(client, prefix)
            client.close()
            app.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=200_000, help="calls per timed run")
    parser.add_argument("--no-redis", action="store_true", help="skip the queued-listener rows")
    args = parser.parse_args()
    number = args.number
    event = UserRegistered(1)
    rows: list[tuple[str, float, float | None]] = []

    for count in (1, 10):
        signal = blinker.Signal()
        dispatcher = Dispatcher()
        classes = Dispatcher()
        for _ in range(count):
            # Distinct function objects: blinker keys receivers by identity.
            signal.connect(lambda sender, **kw: None, weak=False)
            dispatcher.listen(UserRegistered, lambda e: None)
            classes.listen(UserRegistered, Greet)
        raw = best_ns(partial(signal.send, event), number)
        rows.append((f"blinker Signal.send, {count} receiver(s)", raw, None))
        ours = best_ns(partial(dispatcher.dispatch, event), number)
        rows.append((f"Dispatcher.dispatch, {count} function listener(s)", ours, ours / raw))
        cls = best_ns(partial(classes.dispatch, event), number)
        rows.append((f"Dispatcher.dispatch, {count} Listener class(es)", cls, cls / raw))

    empty = Dispatcher()
    rows.append(
        ("Dispatcher.dispatch, no listeners", best_ns(lambda: empty.dispatch(event), number), None)
    )
    rows.append(
        (
            "Dispatcher.has_listeners (cached)",
            best_ns(lambda: empty.has_listeners(UserRegistered), number),
            None,
        )
    )
    strings = Dispatcher()
    strings.listen("user.created", listener)
    strings.listen("user.*", lambda name, *args: None)
    rows.append(
        (
            "Dispatcher.dispatch('user.created', 1), exact + wildcard",
            best_ns(lambda: strings.dispatch("user.created", 1), number),
            None,
        )
    )

    width = max(len(name) for name, _, _ in rows)
    print(f"{'case':<{width}}  {'ns/op':>8}  vs blinker")
    for name, ns, ratio in rows:
        print(f"{name:<{width}}  {ns:8.0f}  {'' if ratio is None else f'{ratio:.2f}x'}")

    if args.no_redis:
        return
    # Each queued dispatch is a round trip: far fewer calls than the in-memory rows.
    queued = queued_rows(max(200, number // 100))
    width = max(len(name) for name, _, _ in queued)
    print(f"\n{'case':<{width}}  {'us/op':>8}  vs RPUSH")
    for name, us, ratio in queued:
        print(f"{name:<{width}}  {us:8.1f}  {'' if ratio is None else f'{ratio:.2f}x'}")


if __name__ == "__main__":
    main()
