"""Fixtures of the database-channel tests: a PostgreSQL server for the run (see
tests/support/pg_database.py) with a schema of its own per test, a private MariaDB server
for the run (tests/support/mariadb.py) with a database of its own per test, and
``database_url`` over real SQLite, real PostgreSQL and real MariaDB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mariadb import MySQLDatabase, mysql_admin_url
from tests.support.pg_database import TestDatabase, postgres_admin_url


@pytest.fixture(scope="session")
def postgres_db() -> Iterator[TestDatabase]:
    """A database of this run's own (dropped at the end) on a real PostgreSQL."""
    url, cluster = postgres_admin_url()
    try:
        db = TestDatabase(url).create()
        try:
            yield db
        finally:
            db.drop()
    finally:
        if cluster is not None:
            cluster.stop()


def postgres_schema_url(db: TestDatabase) -> Iterator[str]:
    """An SQLAlchemy URL whose search_path is a fresh schema (dropped after)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{db.sqlalchemy_url}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_url(postgres_db: TestDatabase) -> Iterator[str]:
    yield from postgres_schema_url(postgres_db)


@pytest.fixture(scope="session")
def mariadb_admin() -> Iterator[str]:
    """An admin ``mysql://`` URL: a private mariadbd for this run (stopped at the end)."""
    url, server = mysql_admin_url()
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


@pytest.fixture
def mariadb_url(mariadb_admin: str) -> Iterator[str]:
    """An SQLAlchemy ``mysql+pymysql://`` URL on a fresh database (dropped after)."""
    db = MySQLDatabase(mariadb_admin).create()
    try:
        yield db.sqlalchemy_url
    finally:
        db.drop()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'notifications.sqlite3'}"
    elif request.param == "postgresql":
        yield from postgres_schema_url(request.getfixturevalue("postgres_db"))
    else:
        yield request.getfixturevalue("mariadb_url")
