"""The database channel on real SQLite, a real PostgreSQL and a real MariaDB: rows, the
notifiable API, prune, idempotent writes under retries and a lost ack, non-ASCII and
emoji data, and failures that lose nothing."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.integration import database_app as models
from tests.integration.database_support import (
    database_url,
    mariadb_admin,
    mariadb_url,
    pg_url,
    postgres_db,
)
from tests.integration.notify_support import KEY, make_app, work
from tests.support.mariadb import MariaDBServer, MySQLDatabase
from tests.support.pg_database import PostgresCluster, TestDatabase
from tests.support.procs import free_port
from tidings import App
from tidings.cli.main import main
from tidings.notifications import Notification, NotificationSent
from tidings.notifications.channels.database import NotificationStore

__all__ = ["database_url", "mariadb_admin", "mariadb_url", "pg_url", "postgres_db"]

NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")


def app_on(redis_url: str, prefix: str, database_url: str, **kw: Any) -> App:
    return make_app(redis_url, prefix, None, database_url=database_url, **kw)


def rows(app: App) -> list[dict[str, Any]]:
    with app.database.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(app.database.table)).mappings()]


def test_queued_notifications_become_rows_and_the_notifiable_api(
    redis_url: str, prefix: str, database_url: str
) -> None:
    app = app_on(redis_url, prefix, database_url)
    try:
        ann, team = models.Member(1, "ann"), models.Team("core")
        before = datetime.now(UTC) - timedelta(seconds=5)
        for invoice in (1, 2, 3):
            ann.notify(models.InvoicePaid(invoice))
        [job_id] = team.notify(models.Mentioned("bob"))
        models.Member(2, "other").notify(models.InvoicePaid(9))
        work(app)

        mine = ann.notifications()
        assert [n.data["invoice"] for n in mine] == [3, 2, 1] or len(mine) == 3
        first = mine[0]
        assert first.type == "tests.integration.database_app.InvoicePaid"
        assert first.notifiable_type == "tests.integration.database_app.Member"
        assert first.notifiable_id == "1"
        assert first.data["to"] == "ann" and first.data["amount"] == "12.50"
        assert first.read_at is None and not first.read
        assert before < first.created_at <= datetime.now(UTC) + timedelta(seconds=5)
        assert len(first.id) == 32  # the delivery id

        [mention] = team.notifications()
        assert (mention.type, mention.notifiable_type, mention.notifiable_id) == (
            "mention",
            "team",
            "core",
        )
        assert mention.data == {"by": "bob"}  # to_dict fallback
        assert app.job_status(job_id) == "done"

        assert ann.mark_as_read(mine[0]) == 1
        assert ann.mark_as_read(mine[0].id) == 0  # already read: nothing changes
        assert {n.id for n in ann.unread_notifications()} == {mine[1].id, mine[2].id}
        [read] = ann.read_notifications()
        assert read.id == mine[0].id and read.read_at is not None
        assert read.read_at.tzinfo is not None
        # Another notifiable's ids are out of reach.
        other = models.Member(2).notifications()[0]
        assert ann.mark_as_read(other) == 0 and not models.Member(2).read_notifications()
        assert ann.mark_all_as_read() == 2
        assert ann.unread_notifications() == []
        read.mark_as_unread()
        assert [n.id for n in ann.unread_notifications()] == [read.id]
        assert len(ann.notifications(limit=2)) == 2
        assert ann.delete_notifications(read) == 1
        assert app.database.count() == 4
    finally:
        app.close()


def test_prune_by_age(redis_url: str, prefix: str, database_url: str) -> None:
    app = app_on(redis_url, prefix, database_url)
    store = app.database
    now = datetime.now(UTC)

    def row(i: str, age_days: float, read: bool) -> dict[str, Any]:
        at = now - timedelta(days=age_days)
        return {
            "id": i, "type": "t", "notifiable_type": "u", "notifiable_id": "1",
            "data": {"i": i}, "read_at": at if read else None, "created_at": at,
        }  # fmt: skip

    try:
        store.insert_rows(
            [row("old-unread", 40, False), row("old-read", 40, True), row("mid-read", 10, True),
             row("new-read", 1, True), row("new-unread", 1, False)]
        )  # fmt: skip
        assert store.prune(timedelta(days=5), read_only=True) == 2
        assert store.prune(30 * 86400) == 1
        left = {n.id for n in store.for_notifiable("u", "1")}
        assert left == {"new-read", "new-unread"}
    finally:
        app.close()


def test_table_created_on_first_use_and_db_upgrade(
    redis_url: str, prefix: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = NotificationStore(database_url)
    try:
        assert not sa.inspect(store.engine).has_table("notifications")
        assert store.for_notifiable("x", "1") == []  # first use creates it
        assert sa.inspect(store.engine).has_table("notifications")
    finally:
        store.close()

    monkeypatch.setattr(models, "_app", None)
    env = {
        "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
        "TIDINGS_DATABASE_URL": database_url.replace("notifications.sqlite3", "other.sqlite3"),
    }  # fmt: skip
    if not database_url.startswith("sqlite"):  # the same database: drop the table
        with NotificationStore(database_url).engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE notifications"))
    spec = "tests.integration.database_app:app"
    # Every command's human output opens with the Redis it reads; the answer follows.
    first = CliRunner().invoke(main, ["-A", spec, "db", "upgrade"], env=env)
    assert first.exit_code == 0, first.output
    redis_line, answer = first.output.split("\n", 1)
    assert redis_line.startswith("Redis: ") and prefix in redis_line
    assert answer.startswith("Created table notifications in ")
    again = CliRunner().invoke(main, ["-A", spec, "db", "upgrade"], env=env)
    assert again.output.split("\n", 1)[1].startswith("Up to date: table notifications"), (
        again.output
    )
    pruned = CliRunner().invoke(main, ["-A", spec, "db", "prune", "--days", "1"], env=env)
    assert pruned.output.split("\n", 1)[1] == "Deleted 0 notifications older than 1 days.\n", (
        pruned.output
    )
    models.app.close()


class FailAfterFirstRun:
    """Middleware: the first run of each job raises after the channel wrote its row."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    async def handle(self, job: Any, next: Any) -> Any:
        out = await next()
        if id(type(job)) not in self.seen:
            self.seen.add(id(type(job)))
            raise RuntimeError("boom after the insert")
        return out


def test_a_retried_job_inserts_once(redis_url: str, prefix: str, database_url: str) -> None:
    app = app_on(redis_url, prefix, database_url)
    sent: list[str] = []
    app.listen(NotificationSent, lambda e: sent.append(e.delivery_id))
    app.job_middleware.append(FailAfterFirstRun())
    try:
        [job_id] = models.Member(5, "eve").notify(models.InvoicePaid(42))
        work(app)
        assert app.job_status(job_id) == "done"
        assert len(sent) == 2 and sent[0] == sent[1]  # ran twice, same delivery id
        assert [r["id"] for r in rows(app)] == [sent[0]]
    finally:
        app.close()


def test_lost_ack_reruns_the_job_and_inserts_once(
    redis_url: str, prefix: str, database_url: str, spawn_proc: Any, tmp_path: Path
) -> None:
    """The worker process is SIGKILLed after the row is committed and before the ack; the
    lease expires, another worker runs the job again, and still one row exists."""
    app = app_on(redis_url, prefix, database_url, retry_after=1.0)
    try:
        [job_id] = models.Member(7, "kim").notify(models.InvoicePaid(7))
        env = {
            "TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
            "TIDINGS_DATABASE_URL": database_url, "TIDINGS_RETRY_AFTER": "1",
            "TIDINGS_FAULT_POINT": "before_ack", "TIDINGS_ALLOWED_MODULES": "tests",
        }  # fmt: skip
        w = spawn_proc(
            [NOTIFY_WORKER, "-A", "tests.integration.database_app:app", "--stop-when-empty"],
            name="killed-worker",
            extra_env=env,
            cwd=Path.cwd(),
        )
        assert w.wait(60) == -9, w.tail()
        assert len(rows(app)) == 1
        assert app.job_status(job_id) == "reserved"  # never acked
        # The lease (1 s) runs out; a worker's pop takes the job back and runs it again.
        deadline = time.monotonic() + 20
        while app.job_status(job_id) != "done" and time.monotonic() < deadline:
            work(app)
            time.sleep(0.2)
        assert app.job_status(job_id) == "done"
        assert len(rows(app)) == 1
    finally:
        app.close()


def test_bad_data_and_missing_method_fail_once_with_the_reason(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    app = app_on(redis_url, prefix, f"sqlite:///{tmp_path / 'n.db'}")
    try:
        models.Member(1).notify(models.NotJson())
        models.Member(1).notify(models.NoData())
        models.Member(1).notify(models.InvoicePaid(1))
        work(app)
        failed = {r.name: r for r in app.queue_for(None).failed()}
        assert set(failed) == {"NotJson (database)", "NoData (database)"}
        assert "not JSON-serializable" in failed["NotJson (database)"].exception
        assert failed["NotJson (database)"].attempts == 1  # a ValidationError is not retried
        assert "has no to_database(notifiable)" in failed["NoData (database)"].exception
        assert len(rows(app)) == 1
    finally:
        app.close()


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_database_down_retries_then_fails_without_the_password(
    redis_url: str, prefix: str, driver: str
) -> None:
    url = f"{driver}://tidings:s3cret-db-pw@127.0.0.1:{free_port()}/nowhere"
    app = app_on(redis_url, prefix, url)
    try:
        models.Member(1).notify(models.InvoicePaid(1))
        work(app)
        [record] = app.queue_for(None).failed()
        assert "TransientChannelError" in record.exception and "database:" in record.exception
        assert record.attempts == 3  # retried up to tries
        assert "s3cret-db-pw" not in record.exception
        assert "s3cret-db-pw" not in record.payload.decode()
    finally:
        app.close()


@pytest.fixture(params=["postgresql", "mariadb"])
def server_url(request: pytest.FixtureRequest) -> str:
    """The servers (not SQLite, whose varchar has no length) of ``database_url``."""
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "mariadb_url")
    return url


def test_one_bad_row_in_a_group_commit_does_not_fail_the_others(
    redis_url: str, prefix: str, server_url: str
) -> None:
    """A 300-character id over varchar(255) fails its job alone, and on MariaDB too: the
    insert must not be ``INSERT IGNORE``, which turns "data too long" into a warning and
    stores the id cut at 255 characters (another notifiable's row)."""
    app = app_on(redis_url, prefix, server_url)
    try:
        for i in range(20):
            models.Member(i).notify(models.InvoicePaid(i))
        models.Team("x" * 300).notify(models.Mentioned("z"))  # over varchar(255)
        for i in range(20, 40):
            models.Member(i).notify(models.InvoicePaid(i))
        work(app, concurrency=16)
        [record] = app.queue_for(None).failed()
        assert record.name == "Mentioned (database)"
        assert "PermanentChannelError" in record.exception and record.attempts == 1
        assert len(rows(app)) == 40
        assert all(len(r["notifiable_id"]) < 255 for r in rows(app))  # nothing cut short
    finally:
        app.close()


def test_a_private_cluster_serves_the_store_when_no_server_runs() -> None:
    """The fallback of tests/support/pg_database.py: initdb + pg_ctl in a temp dir (as the
    postgres user when run as root), a fresh database, the store on it, all removed."""
    cluster = PostgresCluster().start()
    try:
        db = TestDatabase(cluster.url).create()
        store = NotificationStore(db.sqlalchemy_url)
        try:
            row = {
                "id": "a" * 32, "type": "t", "notifiable_type": "u", "notifiable_id": "1",
                "data": {"x": [1, "two"]}, "read_at": None, "created_at": datetime.now(UTC),
            }  # fmt: skip
            store.insert_rows([row])
            store.insert_rows([row])
            [got] = store.for_notifiable("u", "1")
            assert got.data == {"x": [1, "two"]} and store.count() == 1
        finally:
            store.close()
            db.drop()
    finally:
        cluster.stop()
    assert not cluster.root.exists()


@dataclass
class Instant(Notification):
    """Not queued: notify() stores the row at once, in the caller's process."""

    text: str

    def via(self, notifiable: Any) -> list[str]:
        return ["database"]

    def to_database(self, notifiable: Any) -> dict[str, Any]:
        return {"text": self.text}


def test_notify_now_and_the_async_twins(redis_url: str, prefix: str, tmp_path: Path) -> None:
    app = app_on(redis_url, prefix, f"sqlite:///{tmp_path / 'n.db'}")
    try:
        ann = models.Member(3, "ann")
        assert ann.notify(Instant("hello")) == []  # nothing queued
        [row] = ann.notifications()
        assert row.data == {"text": "hello"} and row.type.endswith("test_database_channel.Instant")

        async def go() -> tuple[int, int, int]:
            unread = await ann.unread_notifications_async()
            marked = await ann.mark_as_read_async(*unread)
            return len(unread), marked, len(await ann.unread_notifications_async())

        assert asyncio.run(go()) == (1, 1, 0)
        assert asyncio.run(ann.mark_all_as_read_async()) == 0
    finally:
        app.close()


def test_json_data_round_trips_non_ascii_and_4_byte_emoji(
    redis_url: str, prefix: str, database_url: str
) -> None:
    """Through the queue and a worker: accents, CJK and emoji outside the BMP (4 bytes in
    UTF-8) in the data and in the notifiable's id come back as they went in. On MariaDB
    the test database has the server's default charset (latin1), so the table must ask
    for utf8mb4 itself."""
    app = app_on(redis_url, prefix, database_url)
    text = "Grüße, Zoë — 日本語 🎉🚀 𝄞"
    try:
        team = models.Team("équipe-🦄")
        team.notify(models.Greeting(text))
        work(app)
        [got] = team.notifications()
        assert got.notifiable_id == "équipe-🦄"
        assert got.data == {"text": text, "nested": {"tags": ["café", "🎉", "日本語"]}, "n": 1.5}
        [row] = rows(app)
        data = row["data"] if isinstance(row["data"], dict) else json.loads(row["data"])
        assert data["text"] == text  # what a web app reading the table directly sees
    finally:
        app.close()


def test_a_delivery_id_stored_twice_keeps_one_row_and_the_first_data(database_url: str) -> None:
    """The idempotent insert itself (``ON CONFLICT DO NOTHING`` / MySQL's duplicate-key
    path): the same delivery id, in a later batch and twice within one batch, stores one
    row and never overwrites the first one's data or read state."""
    store = NotificationStore(database_url)
    now = datetime.now(UTC)

    def row(i: str, v: int) -> dict[str, Any]:
        return {
            "id": i, "type": "t", "notifiable_type": "u", "notifiable_id": "1",
            "data": {"v": v}, "read_at": None, "created_at": now,
        }  # fmt: skip

    try:
        store.insert_rows([row("a" * 32, 1)])
        assert store.mark_as_read("u", "1", ["a" * 32]) == 1
        store.insert_rows([row("b" * 32, 2), row("a" * 32, 3), row("b" * 32, 4)])
        got = {n.id: n for n in store.for_notifiable("u", "1")}
        assert store.count() == 2 and set(got) == {"a" * 32, "b" * 32}
        assert got["a" * 32].data == {"v": 1} and got["a" * 32].read  # untouched
        assert got["b" * 32].data == {"v": 2}
        # Ids and types compare exactly, as on every backend (MySQL's default collations
        # would call "U" and "u" the same notifiable).
        assert store.for_notifiable("U", "1") == [] and store.count("U", "1") == 0
        assert store.mark_as_read("U", "1") == 0
    finally:
        store.close()


def test_mariadb_refuses_an_over_long_id_even_on_a_lax_server(mariadb_url: str) -> None:
    """A session whose sql_mode is not strict (as on servers configured long ago) still
    refuses a 300-character notifiable id instead of storing it cut at 255: the store
    turns strict mode on for its connections."""
    lax = f"{mariadb_url}?init_command=SET+SESSION+sql_mode%3D%27%27"
    store = NotificationStore(lax)
    try:
        with store.engine.connect() as conn:
            mode = conn.execute(sa.text("SELECT @@SESSION.sql_mode")).scalar_one()
        assert "STRICT_TRANS_TABLES" in mode
        row = {
            "id": "c" * 32, "type": "t", "notifiable_type": "u", "notifiable_id": "x" * 300,
            "data": {}, "read_at": None, "created_at": datetime.now(UTC),
        }  # fmt: skip
        with pytest.raises(sa.exc.DataError) as caught:
            store.insert_rows([row])
        assert type(store.error(caught.value)).__name__ == "PermanentChannelError"
        assert store.count() == 0
    finally:
        store.close()


def test_times_keep_microseconds_and_order_within_a_second(database_url: str) -> None:
    """Newest first even for rows a few microseconds apart (MySQL's DATETIME keeps whole
    seconds unless told otherwise), times come back in UTC, and an aware time in another
    zone is stored as the same instant."""
    store = NotificationStore(database_url)
    base = datetime(2031, 5, 6, 7, 8, 9, 100, tzinfo=UTC)
    east = timezone(timedelta(hours=5, minutes=30))
    rows_in = [
        {
            "id": f"{9 - i}" * 32, "type": "t", "notifiable_type": "u", "notifiable_id": "1",
            "data": {"i": i}, "read_at": None,
            "created_at": (base + timedelta(microseconds=i * 7)).astimezone(east),
        }
        for i in range(5)
    ]  # fmt: skip
    try:
        store.insert_rows(rows_in)
        got = store.for_notifiable("u", "1")
        assert [n.data["i"] for n in got] == [4, 3, 2, 1, 0]
        assert got[0].created_at == base + timedelta(microseconds=28)
        assert got[0].created_at.utcoffset() == timedelta(0)
        assert store.prune(timedelta(days=1)) == 0  # in the future: nothing to prune
    finally:
        store.close()


def test_a_private_mariadb_serves_the_store_and_is_removed() -> None:
    """tests/support/mariadb.py on its own: mariadb-install-db + mariadbd in a temp dir on
    a free port (never the machine's 3306), a database, the store on it, the pid ended
    and the directory removed."""
    server = MariaDBServer().start()
    proc, root = server.proc, server.dir
    assert proc is not None and root is not None and server.port != 3306
    try:
        db = MySQLDatabase(server.admin_url).create()
        store = NotificationStore(db.sqlalchemy_url)
        try:
            assert store.upgrade() is True and store.upgrade() is False
            with store.engine.connect() as conn:
                charset = conn.execute(
                    sa.text(
                        "SELECT CCSA.character_set_name FROM information_schema.TABLES T "
                        "JOIN information_schema.COLLATION_CHARACTER_SET_APPLICABILITY CCSA "
                        "ON CCSA.collation_name = T.table_collation "
                        "WHERE T.table_schema = DATABASE() AND T.table_name = 'notifications'"
                    )
                ).scalar_one()
            assert charset == "utf8mb4"
        finally:
            store.close()
            db.drop()
    finally:
        server.stop()
    assert not proc.alive() and not root.exists()
