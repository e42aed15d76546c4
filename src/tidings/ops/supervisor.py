"""``notify-worker --processes N``: run N worker processes and keep them running.

* **Restart with backoff.** A child that exits (``--memory`` code 12, a stuck sync job
  code 13, a crash, a SIGKILL) is started again. A planned exit (0, 12, 13) after the
  child lived a while restarts at once; quick successive failures wait 0.5 s, 1 s, 2 s ...
  up to 10 s, reset once a child has lived a minute. A restart never holds up the others.
* **Signals.** SIGTERM/SIGINT are forwarded to every child, which stops taking jobs and
  finishes its running ones within ``--grace``; a child still alive ``grace + 5`` s after
  the signal is SIGKILLed, and the supervisor exits 0 once all are gone. A second
  SIGTERM/SIGINT is forwarded too (children exit at once). SIGUSR2/SIGCONT (pause/resume)
  are forwarded.
* **Hard kill of stuck children.** Each child writes a heartbeat file from its event
  loop every second (``TIDINGS_HEARTBEAT_FILE``, see :func:`heartbeat_task`). A child
  whose sync job overran its timeout says so there and exits 13 after finishing its other
  jobs; if it is still alive ``grace + 5`` s later it is SIGKILLed. A child whose event
  loop stops beating for ``timeout + 10`` s (an ``async`` job blocking the loop, a hang
  in C code) is SIGKILLed as well. Either way its jobs are re-delivered after
  ``retry_after`` and a fresh child takes over.

* **Finite runs.** With ``--once`` or ``--stop-when-empty`` a child that exits 0 has
  done its work and is not restarted; the supervisor exits 0 when every child has. A
  child that crashes is restarted as usual.

A job that kills its worker every time (a "poison pill") is thus retried once per
reservation; the worker's pre-run check fails it with ``MaxAttemptsExceeded`` once its
tries are used up, and the other jobs keep flowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidings.worker.host import RunningWorker

HEARTBEAT_ENV = "TIDINGS_HEARTBEAT_FILE"
PLANNED_EXITS = (0, 12, 13)
MAX_BACKOFF_S = 10.0
KILL_MARGIN_S = 5.0
EXIT_CONFIG = 78  # the worker refused to start (sysexits EX_CONFIG): do not restart it


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
    return [sys.executable, "-m", "tidings.cli.main", *out]


def _log(text: str) -> None:
    print(f"supervisor: {text}", flush=True)


@dataclass(slots=True)
class _Child:
    slot: int
    heartbeat: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float = 0.0
    term_at: float | None = None
    done: bool = False
    cmd: list[str] | None = None  # else the supervisor's
    env: dict[str, str] | None = None  # added to the supervisor's environment
    pool: str = ""
    retiring: bool = False  # SIGTERMed to shrink its pool: not restarted, then dropped

    def running(self) -> int:
        """Jobs the child reported running in its heartbeat file (0 when unknown)."""
        try:
            parts = self.heartbeat.read_text().split(" ")
        except OSError:
            return 0
        return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0


class Supervisor:
    """Runs ``n`` worker processes (see the module docstring).

    Args:
        n: how many children.
        argv: the supervisor's own argv (``--processes`` is stripped for the children).
        grace_s: the children's ``--grace``.
        timeout_s: the children's ``--timeout`` (0: no event-loop watchdog).
    """

    def __init__(self, n: int, argv: list[str], *, grace_s: float = 30.0, timeout_s: float = 60.0):
        self.exit_code = 0
        self.cmd = _child_argv(argv)
        self.grace_s = grace_s
        self.stale_s = timeout_s + 10.0 if timeout_s > 0 else 0.0
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-supervisor-"))
        self.children = [_Child(i, self.dir / f"worker-{i}") for i in range(n)]
        self.stopping = False
        self.restarts = 0
        # --once / --stop-when-empty children finish: exit 0 means done, not "restart me".
        self.finite = any(a in ("--once", "--stop-when-empty") for a in self.cmd)
        self.preexec_fn: Any = None  # run in each child before exec (pools: die with us)

    def tick(self, now: float) -> None:
        """Called every loop turn (0.1 s); a subclass adds or retires children here."""

    def _start(self, child: _Child) -> None:
        with contextlib.suppress(FileNotFoundError):
            child.heartbeat.unlink()
        # TIDINGS_CHILD: the child prefixes its lines with its number and pid.
        env = {
            **os.environ,
            **(child.env or {}),
            HEARTBEAT_ENV: str(child.heartbeat),
            "TIDINGS_CHILD": str(child.slot + 1),
            "TIDINGS_CHILDREN": str(len(self.children)),
        }
        child.proc = subprocess.Popen(child.cmd or self.cmd, env=env, preexec_fn=self.preexec_fn)
        child.started = time.monotonic()
        child.term_at = None

    def _signal(self, child: _Child, sig: int) -> None:
        if child.proc is not None and child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    def _on_stop_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        now = time.monotonic()
        for child in self.children:
            self._signal(child, signum)
            if child.term_at is None:
                child.term_at = now

    def _on_forward(self, signum: int, _frame: FrameType | None) -> None:
        for child in self.children:
            self._signal(child, signum)

    def _kill(self, child: _Child, why: str) -> None:
        assert child.proc is not None
        _log(f"worker {child.proc.pid} {why}; killing it")
        self._signal(child, signal.SIGKILL)

    def _watch(self, child: _Child, now: float) -> None:
        """Hard-kill a child that overstayed a stop, a stuck job, or stopped beating."""
        if child.term_at is not None and now - child.term_at > self.grace_s + KILL_MARGIN_S:
            self._kill(child, "did not exit within the grace period")
            child.term_at = now + 3600  # one SIGKILL is enough
            return
        try:
            stat = child.heartbeat.stat()
            beat = child.heartbeat.read_text()
        except OSError:
            return  # not beating yet (still importing the app)
        wall = time.time()
        state, _, rest = beat.partition(" ")
        since = rest.partition(" ")[0]
        if state in ("stuck", "stopping"):
            # Finishing its other jobs (at most --grace), then it exits by itself.
            if wall - float(since or wall) > self.grace_s + KILL_MARGIN_S and child.term_at is None:
                self._kill(child, f"is {state} and did not exit within the grace period")
                child.term_at = now + 3600
        elif self.stale_s and wall - stat.st_mtime > self.stale_s and child.term_at is None:
            self._kill(child, f"event loop silent for over {self.stale_s:g}s")
            child.term_at = now + 3600

    def _reap(self, child: _Child, code: int, now: float) -> None:
        assert child.proc is not None
        lived = now - child.started
        if lived > 60 or (code in PLANNED_EXITS and lived > 5):
            child.failures = 0
            delay = 0.0
        else:
            child.failures += 1
            delay = min(MAX_BACKOFF_S, 0.5 * 2 ** (child.failures - 1))
        _log(f"worker {child.proc.pid} exited with {code}; restarting in {delay:g}s")
        child.proc = None
        child.restart_at = now + delay

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT and every child is gone; returns 0 (78 when a
        worker refused to start for its configuration)."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGUSR2, self._on_forward)
        signal.signal(signal.SIGCONT, self._on_forward)
        try:
            for child in list(self.children):
                self._start(child)
            while True:
                now = time.monotonic()
                alive = 0
                for child in list(self.children):
                    if child.done:
                        continue
                    if child.proc is None:
                        if not self.stopping and now >= child.restart_at:
                            self._start(child)
                            self.restarts += 1
                            alive += 1
                        continue
                    code = child.proc.poll()
                    if code is None:
                        alive += 1
                        self._watch(child, now)
                    elif child.retiring:
                        _log(f"worker {child.proc.pid} retired (exit {code})")
                        child.proc = None
                        self.children.remove(child)
                    elif self.stopping:
                        child.proc = None
                    elif self.finite and code == 0:
                        _log(f"worker {child.proc.pid} finished")
                        child.proc = None
                        child.done = True
                    elif code == EXIT_CONFIG:
                        # Bad configuration (e.g. Redis too old): restarting cannot help.
                        _log(f"worker {child.proc.pid} refused to start (exit {code}); stopping")
                        child.proc = None
                        self.exit_code = EXIT_CONFIG
                        self._on_stop_signal(signal.SIGTERM, None)
                    else:
                        self._reap(child, code, now)
                finished = bool(self.children) and all(c.done for c in self.children)
                if (self.stopping or finished) and alive == 0:
                    return self.exit_code
                if not self.stopping:
                    self.tick(now)
                time.sleep(0.1)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def supervise(n: int, argv: list[str], *, grace_s: float = 30.0, timeout_s: float = 60.0) -> int:
    """Run ``n`` children until SIGTERM/SIGINT; returns the exit code."""
    return Supervisor(n, argv, grace_s=grace_s, timeout_s=timeout_s).run()


# -- the child's side --------------------------------------------------------------------


async def _beat(worker: RunningWorker, path: Path) -> None:
    from tidings.worker.options import EXIT_STUCK

    tmp = path.with_suffix(".tmp")

    def write(text: str) -> None:
        with contextlib.suppress(OSError):
            tmp.write_text(text)
            os.replace(tmp, path)

    try:
        while True:
            write(f"ok {time.time()} {worker.snapshot().running}")
            await asyncio.sleep(1.0)
    finally:
        # Cancelled as the worker starts to stop: it now drains (at most --grace).
        write(f"{'stuck' if worker.exit_code == EXIT_STUCK else 'stopping'} {time.time()}")


def heartbeat_task(worker: RunningWorker) -> list[Coroutine[Any, Any, None]]:
    """The heartbeat coroutine of a supervised worker (none when not supervised)."""
    path = os.environ.get(HEARTBEAT_ENV)
    return [_beat(worker, Path(path))] if path else []
