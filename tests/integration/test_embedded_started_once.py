"""The embedded server is never started twice on one directory, even
when the running one does not answer PING (paused, busy, loading its AOF)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tidings.ops.embedded import _answers, _lock_held, ensure_embedded


def _servers_on(directory: Path) -> set[int]:
    """Pids of redis-server processes whose command line names ``directory``."""
    out = set()
    needle = str(directory.resolve()).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"redis-server" in cmdline and needle in cmdline and state != "Z":
            out.add(int(entry.name))
    return out


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A ./.tidings-like directory; every redis-server started on it is stopped after."""
    directory = tmp_path / "home"
    try:
        yield directory
    finally:
        for pid in _servers_on(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def _pid(directory: Path) -> int:
    return int((directory / "redis.pid").read_text().strip())


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z" or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def test_a_paused_server_is_not_replaced(home: Path) -> None:
    url = ensure_embedded(home)
    first = _pid(home)
    assert _lock_held(home / "server.lock")
    os.kill(first, signal.SIGSTOP)  # alive, answers nothing (as a long script or load)
    try:
        assert ensure_embedded(home) == url
        assert _pid(home) == first
        assert _servers_on(home) == {first}
    finally:
        os.kill(first, signal.SIGCONT)
    client = redis.Redis.from_url(url)
    try:
        assert client.ping()
    finally:
        client.close()


def test_a_dead_server_is_replaced(home: Path) -> None:
    url = ensure_embedded(home)
    first = _pid(home)
    os.kill(first, signal.SIGKILL)
    _wait_gone(first)
    # No wait for the lock here: the kernel drops a killed process's flock a moment
    # after its exit, and ensure_embedded must ride that out rather than take the held
    # lock for a live server.
    assert ensure_embedded(home) == url
    second = _pid(home)
    assert second != first and _servers_on(home) == {second}
    assert _answers(home / "redis.sock")


def test_a_loading_server_counts_as_alive(home: Path) -> None:
    """A socket answering -LOADING (a large AOF being read) is a live server."""
    home.mkdir(parents=True)
    sock_path = home / "redis.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(64)
                conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert _answers(sock_path)
        assert ensure_embedded(home) == f"unix://{sock_path.resolve()}"
        assert _servers_on(home) == set()
        assert sock_path.exists()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
