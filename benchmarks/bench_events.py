"""Sync event dispatch against a raw blinker ``Signal.send``, in the same run.

Run: ``python benchmarks/bench_events.py [--number N]``. Each figure is the best of
five timed runs, in nanoseconds per dispatch; the ratio is against raw blinker with the
same number of receivers (the target is at most 2x for one listener).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import blinker

from tidings.events import Dispatcher, Listener


@dataclass
class UserRegistered:
    user_id: int


class Greet(Listener):
    def handle(self, event: UserRegistered) -> None:
        return None


def receiver(sender: Any, **kwargs: Any) -> None:
    return None


def listener(event: UserRegistered) -> None:
    return None


def best_ns(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=200_000, help="calls per timed run")
    number = parser.parse_args().number
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


if __name__ == "__main__":
    main()
