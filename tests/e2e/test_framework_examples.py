"""The Django, FastAPI and Flask examples, run end to end as a newcomer runs them.

Each test copies an example into ``tmp_path``, starts its web server (``manage.py
runserver``, ``uvicorn``, ``flask run``) on a free loopback port against the test
Redis, an aiosmtpd server on loopback and a real database (SQLite, or a private
PostgreSQL started with initdb/pg_ctl), POSTs to it over HTTP, runs ``notify-worker
--stop-when-empty`` and checks the mail that arrived. The Django and Flask tests also
roll a transaction back (after-commit dispatch: nothing may be mailed for it) and the
Django one deletes a row before the worker runs (a clear ModelNotFound failure).
"""

from __future__ import annotations

import email
import email.policy
import os
import shutil
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support import Proc
from tests.support.postgres import PostgresServer, binaries
from tests.support.procs import free_port, wait_for
from tests.support.smtp import SmtpServer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KEY = "k" * 32
Spawn = Callable[..., Proc]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    if binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb/pg_ctl not found; .ci/run installs it)")
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


def _database(kind: str, request: pytest.FixtureRequest, dialect: str = "postgresql") -> str:
    """'' for SQLite (the example's default file); a fresh PostgreSQL database otherwise."""
    if kind == "sqlite":
        return ""
    import psycopg

    server: PostgresServer = request.getfixturevalue("postgres")
    name = f"ex_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url(name).replace("postgresql://", f"{dialect}://", 1)


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


def _copy(example: str, tmp_path: Path) -> Path:
    target = tmp_path / example
    shutil.copytree(
        ROOT / "examples" / example, target, ignore=shutil.ignore_patterns("__pycache__", "*.db")
    )
    return target


def _env(redis_url: str, prefix: str, smtp: SmtpServer, database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "DJANGO_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        TIDINGS_REDIS_URL=redis_url,
        TIDINGS_KEY=KEY,
        TIDINGS_PREFIX=prefix,
        TIDINGS_MAIL_URL=f"smtp://127.0.0.1:{smtp.port}?tls=off",
        TIDINGS_MAIL_FROM="shop@example.org",
    )
    if database:
        env["DATABASE_URL"] = database
    else:
        env.pop("DATABASE_URL", None)
    return env


def _serve(spawn: Spawn, args: list[str], cwd: Path, env: dict[str, str], port: int) -> Proc:
    proc = spawn(args, name="server", env=env, cwd=cwd)

    def up() -> bool:
        assert proc.alive(), proc.tail()
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
        except httpx.TransportError:
            return False
        return True

    wait_for(up, 60, 0.1, message="the example's web server answers")
    return proc


def _worker(cwd: Path, env: dict[str, str], *args: str) -> str:
    import subprocess

    done = subprocess.run(
        [str(BIN / "notify-worker"), *args, "--stop-when-empty", "--sleep", "0.2"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, f"worker exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _failed(cwd: Path, env: dict[str, str], *args: str) -> list[dict[str, object]]:
    import subprocess

    done = subprocess.run(
        [str(BIN / "notify-worker"), *args, "failed", "list", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    records: list[dict[str, object]] = orjson.loads(done.stdout)
    return records


def _mails(smtp: SmtpServer) -> list[tuple[list[str], str]]:
    out = []
    for m in smtp.messages:
        msg = email.message_from_bytes(m.data, policy=email.policy.default)
        out.append((m.rcpt_tos, str(msg["Subject"])))
    return out


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_django_example(
    db: str,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    smtp: SmtpServer,
    spawn_proc: Spawn,
    request: pytest.FixtureRequest,
) -> None:
    cwd = _copy("django_app", tmp_path)
    env = _env(redis_url, prefix, smtp, _database(db, request))
    python = sys.executable
    import subprocess

    subprocess.run(
        [python, "manage.py", "migrate", "-v0"], cwd=cwd, env=env, check=True, timeout=120
    )
    port = free_port()
    _serve(
        spawn_proc,
        [python, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd,
        env,
        port,
    )
    base = f"http://127.0.0.1:{port}"

    ada = httpx.post(f"{base}/signup", data={"email": "ada@myapp.test", "name": "Ada"})
    assert ada.status_code == 201, ada.text
    # Rolled back inside atomic(): the listener's push is dropped with the row.
    bob = httpx.post(f"{base}/signup", data={"email": "bob@myapp.test", "rollback": "1"})
    assert bob.status_code == 409
    # Committed, then deleted before the worker runs: the job fails, naming the row.
    carol = httpx.post(f"{base}/signup", data={"email": "carol@myapp.test"})
    carol_id = carol.json()["id"]
    _delete_row(db, env, "accounts_user", carol_id, cwd / "db.sqlite3")

    log = _worker(cwd, {**env, "DJANGO_SETTINGS_MODULE": "djsite.settings"})
    assert "Processed  SendWelcome" in log and "Processed  Welcome (mail)" in log, log
    assert _mails(smtp) == [(["ada@myapp.test"], "Welcome to myapp")]
    # The listener saved through the ORM in the worker thread (async guard satisfied).
    assert httpx.get(f"{base}/users/{ada.json()['id']}").json()["welcomed"] is True
    failed = _failed(cwd, {**env, "DJANGO_SETTINGS_MODULE": "djsite.settings"})
    assert len(failed) == 1, failed
    assert "accounts.models:User with primary key" in str(failed[0]["exception"])
    assert "no longer exists" in str(failed[0]["exception"])


def _delete_row(db: str, env: dict[str, str], table: str, pk: int, sqlite_path: Path) -> None:
    if db == "sqlite":
        with sqlite3.connect(sqlite_path) as conn:
            conn.execute(f"DELETE FROM {table} WHERE id = ?", (pk,))
        return
    import psycopg

    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"DELETE FROM {table} WHERE id = %s", (pk,))


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_fastapi_example(
    db: str,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    smtp: SmtpServer,
    spawn_proc: Spawn,
    request: pytest.FixtureRequest,
) -> None:
    cwd = _copy("fastapi_app", tmp_path)
    env = _env(redis_url, prefix, smtp, _database(db, request, "postgresql+psycopg"))
    port = free_port()
    _serve(spawn_proc, [str(BIN / "uvicorn"), "main:api", "--port", str(port)], cwd, env, port)
    r = httpx.post(
        f"http://127.0.0.1:{port}/signup", json={"email": "ada@myapp.test", "name": "Ada"}
    )
    assert r.status_code == 201, r.text
    bad = httpx.post(f"http://127.0.0.1:{port}/signup", json={"name": "no email"})
    assert bad.status_code == 422  # pydantic refuses it before anything is queued
    log = _worker(cwd, env, "-A", "main:tidings")
    assert "Processed  SendWelcome" in log, log
    assert _mails(smtp) == [(["ada@myapp.test"], "Welcome to myapp")]
    assert _failed(cwd, env, "-A", "main:tidings") == []


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_flask_example(
    db: str,
    tmp_path: Path,
    redis_url: str,
    prefix: str,
    smtp: SmtpServer,
    spawn_proc: Spawn,
    request: pytest.FixtureRequest,
) -> None:
    cwd = _copy("flask_app", tmp_path)
    env = _env(redis_url, prefix, smtp, _database(db, request, "postgresql+psycopg"))
    port = free_port()
    _serve(
        spawn_proc,
        [str(BIN / "flask"), "--app", "wsgi", "run", "--port", str(port)],
        cwd,
        env,
        port,
    )
    base = f"http://127.0.0.1:{port}"
    ok = httpx.post(f"{base}/orders", data={"email": "ada@myapp.test", "item": "teapot"})
    assert ok.status_code == 201, ok.text
    rolled = httpx.post(
        f"{base}/orders", data={"email": "bob@myapp.test", "item": "cup", "rollback": "1"}
    )
    assert rolled.status_code == 409
    log = _worker(cwd, env, "-A", "wsgi:tidings_app")
    assert "Processed  SendReceipt" in log, log
    assert _mails(smtp) == [(["ada@myapp.test"], f"Order {ok.json()['id']}")]
    assert _failed(cwd, env, "-A", "wsgi:tidings_app") == []
