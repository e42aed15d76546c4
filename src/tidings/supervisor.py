"""``notify-worker --processes N``: start N workers, restart any that exits, forward signals.

A child that exits (memory limit, a stuck sync job, a crash, a SIGKILL) is started
again after a backoff that grows with quick successive failures (capped at 10 s) and
resets once a child has lived a minute. SIGTERM/SIGINT are forwarded to every child;
the supervisor then waits for them and exits 0. ``restart`` makes the children exit
cleanly (code 0) and they are started again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import FrameType


def _child_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return [sys.executable, "-m", "tidings.cli", *out]


def supervise(n: int, argv: list[str]) -> int:
    """Run ``n`` children until SIGTERM/SIGINT; returns the exit code."""
    cmd = _child_argv(argv)
    children: dict[int, tuple[subprocess.Popen[bytes], float, float]] = {}
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc, _, _ in children.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for slot in range(n):
        children[slot] = (subprocess.Popen(cmd), time.monotonic(), 0.0)
    while True:
        alive = False
        for slot, (proc, started, backoff) in list(children.items()):
            code = proc.poll()
            if code is None:
                alive = True
                continue
            if stopping:
                continue
            lived = time.monotonic() - started
            backoff = 0.0 if lived > 60 or code == 0 else min(10.0, max(0.5, backoff * 2))
            print(
                f"supervisor: worker {proc.pid} exited with {code}; restarting in {backoff:g}s",
                flush=True,
            )
            time.sleep(backoff)
            children[slot] = (subprocess.Popen(cmd), time.monotonic(), backoff)
            alive = True
        if stopping and not alive:
            return 0
        time.sleep(0.1)
