"""The events example: sync listeners, a subscriber, a wildcard and a queued listener.

    OrderPlaced  ──▶ log_order          (sync: runs at dispatch, in this process)
                 ├─▶ reserve_stock      (sync, registered with @app.listener)
                 ├─▶ OrderSubscriber    (a subscriber: one method per event)
                 └─▶ SendReceipt        (queued: a job on the "receipts" queue)
    OrderShipped ──▶ OrderSubscriber
    "order.*"    ──▶ audit              (a wildcard string listener: gets the name first)

Run it with ``python examples/events/app.py``: it dispatches a few events (the sync
listeners print at once; the queued one is pushed and its job id printed), then runs
``notify-worker --stop-when-empty`` on the queue and prints what the worker ran. It
uses the embedded Redis under ``./.tidings/`` (no TIDINGS_REDIS_URL needed). Run a
worker yourself with ``notify-worker -A examples.events.app:app --queue receipts``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from tidings import App, Event, Listener, ShouldQueue, event

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    # Run as a script, this file is ``__main__``: a worker could not import SendReceipt
    # by that name. Import it under its package name and run that module instead.
    sys.path.insert(0, str(ROOT))
    sys.exit(importlib.import_module("examples.events.app").main())

app = App.from_env()


@dataclass
class OrderPlaced(Event):
    order_id: int
    total: Decimal
    email: str


@dataclass
class OrderShipped(Event):
    order_id: int
    carrier: str


def log_order(e: OrderPlaced) -> None:
    print(f"[app] log_order: order {e.order_id} placed, total {e.total}")


@app.listener(OrderPlaced)
def reserve_stock(e: OrderPlaced) -> str:
    print(f"[app] reserve_stock: stock reserved for order {e.order_id}")
    return "reserved"


class OrderSubscriber:
    """A subscriber: maps events to its own methods."""

    def subscribe(self, events: Any) -> dict[type, str]:
        return {OrderPlaced: "on_placed", OrderShipped: "on_shipped"}

    def on_placed(self, e: OrderPlaced) -> None:
        print(f"[app] OrderSubscriber.on_placed: order {e.order_id}")

    def on_shipped(self, e: OrderShipped) -> None:
        print(f"[app] OrderSubscriber.on_shipped: order {e.order_id} via {e.carrier}")


class SendReceipt(Listener, ShouldQueue):
    """Queued: not run at dispatch; a worker runs it from the "receipts" queue."""

    queue = "receipts"
    tries = 3

    def handle(self, e: OrderPlaced) -> None:
        print(
            f"[worker] SendReceipt: receipt for order {e.order_id} ({e.total}) to {e.email}",
            flush=True,
        )


def audit(name: str, *args: Any) -> None:
    print(f"[app] audit: {name} {args}")


app.listen(OrderPlaced, [log_order, SendReceipt])
app.subscribe(OrderSubscriber)
app.listen("order.*", audit)


def run_worker() -> subprocess.CompletedProcess[str]:
    """``notify-worker --stop-when-empty`` on the receipts queue, as a subprocess."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "tidings.cli", "-A", "examples.events.app:app"]
    cmd += ["--queue", "receipts", "--stop-when-empty", "--sleep", "1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def main() -> int:
    placed = OrderPlaced(1001, Decimal("42.50"), "ada@example.org")
    results = event(placed)
    # One result per listener, in registration order (reserve_stock was registered first,
    # by its decorator); the queued listener's result is its job id.
    print(f"[app] event(OrderPlaced) -> {results}")
    job_id = results[2]
    OrderShipped(1001, "UPS").dispatch()
    app.dispatch("order.refunded", 1001, Decimal("5.00"))

    print("\n--- notify-worker --queue receipts --stop-when-empty ---")
    done = run_worker()
    print(done.stdout.rstrip())
    if done.returncode != 0:
        print(done.stderr.rstrip(), file=sys.stderr)
    ran = [ln for ln in done.stdout.splitlines() if job_id in ln and " Processed " in ln]
    ok = done.returncode == 0 and bool(ran)
    print("\nOK: sync listeners ran at dispatch; the worker ran SendReceipt" if ok else "FAILED")
    return 0 if ok else 1
