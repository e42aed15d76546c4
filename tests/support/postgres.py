"""A private PostgreSQL server on loopback for tests: initdb + pg_ctl on a free port.

``TIDINGS_TEST_PG_URL`` (``postgresql://user@host:port/db``) points the tests at an
existing server instead. Otherwise a cluster is created in a temporary directory (as the
``postgres`` user when the tests run as root, which initdb refuses), listening on
127.0.0.1 only, with fsync off; ``stop()`` shuts it down and removes the directory.
``binaries()`` is None when no PostgreSQL is installed (``.ci/run`` installs Debian's).

Nothing here imports tidings.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .procs import free_port

__all__ = ["PostgresServer", "binaries"]


def binaries() -> Path | None:
    """The directory holding initdb and pg_ctl, or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True):
        return Path(path).parent
    return None


class PostgresServer:
    """One started cluster; ``url(db)`` names a database on it."""

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self._as: list[str] = []

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> PostgresServer:
        bindir = binaries()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (initdb/pg_ctl not found)")
        self.dir = Path(tempfile.mkdtemp(prefix="tidings-pg-"))
        data = self.dir / "data"
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        for _ in range(5):
            self.port = free_port()
            options = (
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c full_page_writes=off -c synchronous_commit=off"
            )
            try:
                self._run(
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    str(self.dir / "log"),
                    "start",
                )
                return self
            except subprocess.CalledProcessError:
                time.sleep(0.2)  # port taken between free_port() and bind: try another
        raise RuntimeError(f"could not start PostgreSQL: {self.log()}")

    def log(self) -> str:
        path = (self.dir or Path("/nonexistent")) / "log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        bindir = binaries()
        if self.dir is None:
            return
        if bindir is not None and (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run(
                [
                    *self._as,
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.dir / "data"),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
