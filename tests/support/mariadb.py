"""A private MariaDB server on loopback for tests: mariadb-install-db + mariadbd on a free port.

``TIDINGS_TEST_MYSQL_URL`` (``mysql://user[:pass]@host:port``, an account that may create
and drop databases) points the tests at an existing server instead. Otherwise
:class:`MariaDBServer` makes a data directory in a temporary directory with
``mariadb-install-db`` (``mysql_install_db`` on older packages; ``--no-defaults``, so the
machine's ``/etc/mysql`` is never read, and root logs in without a password), starts
``mariadbd`` on 127.0.0.1 and a free port (its socket in the temp dir, as the ``mysql``
user when the tests run as root), waits until it answers, and ``stop()`` ends that pid
(SIGTERM, then SIGKILL) and removes the directory. The server keeps MariaDB's compiled-in
defaults on purpose (``latin1`` server charset, strict sql_mode): the store must ask for
``utf8mb4`` itself. The machine's own server on 3306, if any, is never used.

``binaries()`` is None when no MariaDB is installed (``.ci/run`` installs Debian's
mariadb-server-core and mariadb-client-core). Nothing here imports tidings.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .procs import Proc, free_port, spawn

__all__ = ["MariaDBServer", "MySQLDatabase", "binaries", "mysql_admin_url"]

# Small InnoDB files and buffers: the data dir is ~25 MB and starts in about a second.
# Both install and server must agree on the data-file options.
_INNODB = (
    "--innodb-log-file-size=8M",
    "--innodb-data-file-path=ibdata1:10M:autoextend",
    "--innodb-buffer-pool-size=32M",
)


def _which(
    *names: str, dirs: tuple[str, ...] = ("/usr/sbin", "/usr/libexec", "/usr/bin")
) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for d in dirs:
            path = Path(d) / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def binaries() -> tuple[str, str] | None:
    """``(mariadbd, mariadb-install-db)`` paths, or None when MariaDB is not installed."""
    server = _which("mariadbd", "mysqld")
    install = _which("mariadb-install-db", "mysql_install_db")
    if server is None or install is None:
        return None
    return server, install


def _connect(host: str, port: int, user: str = "root", password: str = "") -> Any:
    import pymysql

    return pymysql.connect(
        host=host, port=port, user=user, password=password, connect_timeout=2,
        charset="utf8mb4", autocommit=True,
    )  # fmt: skip


class MariaDBServer:
    """One private server; ``url(db)`` names a database on it (``mysql://root@…``)."""

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self.proc: Proc | None = None
        self.user = "root"

    def _log(self) -> str:
        path = (self.dir or Path("/nonexistent")) / "mariadbd.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def start(self, timeout_s: float = 60.0) -> MariaDBServer:
        found = binaries()
        if found is None:
            raise RuntimeError(
                "MariaDB is not installed (mariadbd / mariadb-install-db not found): "
                "apt-get install mariadb-server-core mariadb-client-core (bash .ci/run does)"
            )
        server, install = found
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-mariadb-"))
        data = self.dir / "data"
        as_user: list[str] = []
        if os.geteuid() == 0:
            # mariadbd refuses to run as root unless told to; prefer the mysql account.
            try:
                account = pwd.getpwnam("mysql")
            except KeyError:
                as_user = ["--user=root"]
            else:
                os.chown(self.dir, account.pw_uid, account.pw_gid)
                as_user = ["--user=mysql"]
        self.dir.chmod(0o755)
        try:
            subprocess.run(
                [
                    install, "--no-defaults", f"--datadir={data}", *as_user,
                    "--auth-root-authentication-method=normal", "--skip-test-db",
                    "--skip-name-resolve", *_INNODB,
                ],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(self.dir, ignore_errors=True)
            out = (exc.stdout or b"").decode(errors="replace")[-2000:]
            err = (exc.stderr or b"").decode(errors="replace")[-2000:]
            raise RuntimeError(f"mariadb-install-db failed: {out}\n{err}") from None
        for _ in range(5):
            self.port = free_port()
            self.proc = spawn(
                [
                    server, "--no-defaults", f"--datadir={data}", *as_user,
                    "--bind-address=127.0.0.1", f"--port={self.port}", "--skip-networking=0",
                    f"--socket={self.dir / 'mariadbd.sock'}",
                    f"--pid-file={self.dir / 'mariadbd.pid'}",
                    "--skip-name-resolve", "--skip-log-bin",
                    "--innodb-flush-log-at-trx-commit=2", "--max-connections=100",
                    *_INNODB,
                ],
                log_path=self.dir / "mariadbd.log",
            )  # fmt: skip
            if self._wait_ready(timeout_s):
                return self
            if "already in use" not in self._log():
                break  # not a port race: give up with the log
            self.proc.kill()
        log = self._log()
        self.stop()
        raise RuntimeError(f"could not start mariadbd: {log}")

    def _wait_ready(self, timeout_s: float) -> bool:
        import pymysql

        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.proc.alive():
                return False
            try:
                conn = _connect("127.0.0.1", self.port)
            except pymysql.err.OperationalError:
                time.sleep(0.1)
                continue
            conn.close()
            return True
        return False

    @property
    def admin_url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def stop(self) -> None:
        """End our mariadbd by its pid (SIGTERM, SIGKILL after 20 s) and remove the dir."""
        try:
            if self.proc is not None:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    self.proc.signal(signal.SIGTERM)
                    try:
                        self.proc.wait(20)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                self.proc = None
        finally:
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None


def mysql_admin_url() -> tuple[str, MariaDBServer | None]:
    """An admin ``mysql://`` URL and the private server behind it (None when not ours)."""
    url = os.environ.get("TIDINGS_TEST_MYSQL_URL")
    if url:
        return url.rstrip("/"), None
    server = MariaDBServer().start()
    return server.admin_url, server


class MySQLDatabase:
    """A database of its own (``CREATE DATABASE … utf8mb4``) on the server at ``admin_url``."""

    __test__ = False

    def __init__(self, admin_url: str) -> None:
        from urllib.parse import unquote, urlsplit

        self.admin_url = admin_url
        parts = urlsplit(admin_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 3306
        self.user = unquote(parts.username or "root")
        self.password = unquote(parts.password or "")
        self.name = f"tidings_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    def _admin_execute(self, sql: str) -> None:
        conn = _connect(self.host, self.port, self.user, self.password)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def create(self) -> MySQLDatabase:
        # The server's default charset, not utf8mb4: the store's table must ask for
        # utf8mb4 itself, as it must on a real server set up long ago.
        self._admin_execute(f"CREATE DATABASE `{self.name}`")
        return self

    def drop(self) -> None:
        import pymysql

        with contextlib.suppress(pymysql.Error):
            self._admin_execute(f"DROP DATABASE IF EXISTS `{self.name}`")

    @property
    def sqlalchemy_url(self) -> str:
        """The URL for SQLAlchemy with the PyMySQL driver (no charset: the store's job)."""
        base = self.admin_url.split("://", 1)[1]
        return f"mysql+pymysql://{base}/{self.name}"
