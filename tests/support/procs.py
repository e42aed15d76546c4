"""Subprocess helpers for tests: start in a new session, log to a file, kill only our own.

Every process started through :func:`spawn` is registered by pid; :func:`kill_pid` refuses
any pid that is not in that registry, so a test can never signal a process it did not
start (a stale pid, the pytest process itself, or something else on the machine).

Synchronise on observable state (a marker key in Redis, a file, a log line) with
:func:`wait_for`, never on bare sleeps.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

__all__ = [
    "Proc",
    "free_port",
    "kill_pid",
    "live_procs",
    "python_cmd",
    "register",
    "spawn",
    "wait_for",
]

T = TypeVar("T")

_lock = threading.Lock()
_started: dict[int, Proc] = {}


class Proc:
    """A subprocess we started, in its own session, with stdout+stderr in ``log_path``."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, args: Sequence[str]):
        self.popen = popen
        self.log_path = log_path
        self.args = list(args)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        """Return True while the process has not exited (reaps it if it has)."""
        return self.popen.poll() is None

    def output(self) -> str:
        """Return everything the process wrote so far (stdout and stderr interleaved)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        """Return the last ``lines`` lines of the output, for error messages."""
        return "\n".join(self.output().splitlines()[-lines:])

    def signal(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the process (or to its whole session/process group).

        ``group=True`` also reaches children the process forked: the group id equals our
        pid because the process was started with ``start_new_session=True``, so the group
        holds only processes descended from it.
        """
        if self.popen.poll() is not None:
            return
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
        else:
            self.popen.send_signal(sig)

    def kill(self, *, group: bool = False) -> int:
        """SIGKILL the process and reap it; return its exit code."""
        self.signal(signal.SIGKILL, group=group)
        return self.popen.wait(timeout=10)

    def terminate(self, *, group: bool = False) -> None:
        """Send SIGTERM (does not wait)."""
        self.signal(signal.SIGTERM, group=group)

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for exit and return the exit code (raises subprocess.TimeoutExpired)."""
        return self.popen.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 5.0, *, group: bool = False) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; return the exit code."""
        if self.popen.poll() is None:
            self.terminate(group=group)
            try:
                return self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return self.kill(group=group)
        return self.popen.wait()

    def __enter__(self) -> Proc:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(timeout_s=2.0)

    def __repr__(self) -> str:
        return f"Proc(pid={self.pid}, returncode={self.returncode}, args={self.args!r})"


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, read, close).

    Another process can take it before the caller binds it; callers that start servers
    should retry on "address already in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def python_cmd(*args: str) -> list[str]:
    """Return a command line running this interpreter (the venv's python) with ``args``."""
    return [sys.executable, *args]


def spawn(
    args: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Proc:
    """Start ``args`` in a new session with stdout+stderr appended to ``log_path``.

    Args:
        args: the command line (no shell).
        log_path: file receiving both output streams (parent dirs are created).
        env: full environment; defaults to a copy of ``os.environ``.
        extra_env: variables added on top of ``env``.
        cwd: working directory.

    Returns:
        The registered :class:`Proc`.
    """
    full_env = dict(os.environ if env is None else env)
    if extra_env:
        full_env.update(extra_env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    proc = Proc(popen, log_path, args)
    register(proc)
    return proc


def register(proc: Proc) -> None:
    """Add a process started elsewhere (e.g. by RedisServer) to the kill registry."""
    with _lock:
        _started[proc.pid] = proc


def live_procs() -> list[Proc]:
    """Return every registered process that is still running."""
    with _lock:
        procs = list(_started.values())
    return [p for p in procs if p.alive()]


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid``, but only if the harness started that process.

    Raises:
        PermissionError: ``pid`` was not started through this module.
    """
    with _lock:
        proc = _started.get(pid)
    if proc is None:
        raise PermissionError(f"refusing to signal pid {pid}: not started by tests.support.procs")
    proc.signal(sig)


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.05,
    *,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns a truthy value; return that value.

    Exceptions raised by ``predicate`` propagate (poll for state, not for errors).

    Raises:
        TimeoutError: still falsy after ``timeout_s``; includes ``message`` and the last value.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise TimeoutError(f"wait_for timed out after {timeout_s}s: {what} (last={value!r})")
        time.sleep(interval_s)


@atexit.register
def _kill_leftovers() -> None:
    # Last resort if a fixture teardown never ran (e.g. pytest interrupted): never leave
    # our own children running. Touches registered pids only.
    for proc in live_procs():
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.kill()
