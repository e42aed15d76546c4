"""A PostgreSQL server for tests, and a unique database per test run.

:func:`postgres_admin_url` finds a server, in this order:

1. ``$TIDINGS_TEST_POSTGRES_URL`` (an admin ``postgresql://`` URL);
2. a server already answering on 127.0.0.1:5432 as user ``postgres`` (``.ci/run``
   starts Debian's cluster there);
3. a private cluster made with ``initdb`` / ``pg_ctl`` from
   ``/usr/lib/postgresql/*/bin`` in a temporary directory, on a free loopback port,
   run as the ``postgres`` user when the tests run as root (initdb refuses root).

:class:`TestDatabase` then creates ``tidings_test_<pid>_<random>`` and drops it at the
end, so parallel runs never share tables. Nothing here imports tidings.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.procs import free_port

__all__ = ["PostgresCluster", "TestDatabase", "pg_bin_dir", "postgres_admin_url"]


def pg_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/N/bin`` holding initdb, or None."""

    def version(path: str) -> int:
        name = Path(path).parent.parent.name
        return int(name) if name.isdigit() else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    return Path(found[-1]).parent if found else None


def _can_connect(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


class PostgresCluster:
    """A throwaway cluster in a temp dir: ``start()``, ``url``, ``stop()`` (removes it)."""

    def __init__(self) -> None:
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise RuntimeError(
                "PostgreSQL is not installed: apt-get install postgresql (bash .ci/run does)"
            )
        self.bin = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tidings-pg-"))
        self.data = self.root / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise RuntimeError("running as root needs a 'postgres' user for initdb") from exc
            self.user = "postgres"
            shutil.chown(self.root, user="postgres", group=None)
            self.root.chmod(0o700)
        self.started = False

    def _run(self, *args: str, timeout: float = 60) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(
            cmd, check=True, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresCluster:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options,
            "-l", str(self.root / "log"), "-w", "-t", "30", "start",
        )  # fmt: skip
        self.started = True
        deadline = time.monotonic() + 30
        while not _can_connect(self.url):
            if time.monotonic() > deadline:
                raise RuntimeError(f"private PostgreSQL did not answer; see {self.root / 'log'}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        try:
            if self.started:
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
                self.started = False
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def postgres_admin_url() -> tuple[str, PostgresCluster | None]:
    """An admin URL and the private cluster behind it (None when it is not ours)."""
    url = os.environ.get("TIDINGS_TEST_POSTGRES_URL")
    if url:
        return url, None
    system = "postgresql://postgres@127.0.0.1:5432/postgres"
    if _can_connect(system):
        return system, None
    cluster = PostgresCluster().start()
    return cluster.url, cluster


class TestDatabase:
    """A database of its own for one test run, on the server at ``admin_url``."""

    __test__ = False  # not a pytest class

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"tidings_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        base = admin_url.rsplit("/", 1)[0]
        self.url = f"{base}/{self.name}"

    def create(self) -> TestDatabase:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def drop(self) -> None:
        import psycopg

        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.admin_url, autocommit=True) as conn,
        ):
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    @property
    def sqlalchemy_url(self) -> str:
        """The URL for SQLAlchemy with the psycopg (3) driver."""
        return self.url.replace("postgresql://", "postgresql+psycopg://", 1)
