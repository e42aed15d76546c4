"""The database channel: in-app notifications (the bell icon) in a ``notifications`` table.

A notification whose ``via()`` names ``"database"`` is stored as one row::

    id               the delivery id (primary key: a retried job never inserts twice)
    type             the notification's class (``database_type(notifiable)`` overrides)
    notifiable_type  the notifiable's class (a ``notifiable_type`` attribute overrides)
    notifiable_id    ``notifiable.route_notification_for("database")``: its ``id``
    data             JSON: ``to_database(notifiable)``, else ``to_dict(notifiable)``
    read_at          NULL until read
    created_at       when it was stored (UTC)

Storage is SQLAlchemy Core (the ``database`` extra) on ``TIDINGS_DATABASE_URL`` (any
SQLAlchemy URL: SQLite, PostgreSQL, MySQL/MariaDB; default an SQLite file under
``.tidings/``). The table is created on first use where it is missing;
``notify-worker db upgrade`` creates it ahead of time, and :func:`notifications_table`
hands the same table to an Alembic ``target_metadata``.

SQLAlchemy Core is synchronous, so the worker runs it in a small thread pool of the
store's own (not the pool sync jobs run in) and never blocks its event loop. Rows that
arrive while a write is in flight are written together, in one transaction, by the
next one (group commit): a job's ``send`` returns only once its row is committed, so an
ack never runs ahead of the write, and under load one commit serves many jobs.

Every insert is ``INSERT … ON CONFLICT (id) DO NOTHING`` (``INSERT … ON DUPLICATE KEY
UPDATE id = id`` on MySQL/MariaDB; a checked insert elsewhere), so a job that runs twice
— its ack lost, its lease expired — stores one row.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tidings import _current
from tidings.errors import (
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.hosts import AppHost
from tidings.notifications.channels.base import DeliveryResult
from tidings.observability.redaction import clean

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "DatabaseChannel",
    "DatabaseNotification",
    "HasDatabaseNotifications",
    "NotificationStore",
    "build_row",
    "notifiable_key",
    "notifications_table",
]

#: Most rows one transaction writes (the group commit's batch).
MAX_BATCH = 500


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise ConfigurationError(
            "the database channel needs SQLAlchemy: pip install 'tidings[database]'"
        ) from None
    return sqlalchemy


def notifications_table(
    metadata: sa.MetaData, name: str = "notifications", schema: str | None = None
) -> sa.Table:
    """The ``notifications`` table on ``metadata`` (hand it to Alembic's autogenerate).

    Args:
        metadata: the MetaData to define it on (an Alembic ``target_metadata``).
        name: the table's name.
        schema: a database schema (PostgreSQL), else the default one.
    """
    sa_ = _sqlalchemy()
    from sqlalchemy.dialects import mysql

    # MySQL/MariaDB: DATETIME keeps whole seconds unless given a precision (rows stored
    # in the same second would come back in any order), and has no zone (every time is
    # stored as UTC; see _utc_rows).
    stamp = sa_.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    table: sa.Table = sa_.Table(
        name,
        metadata,
        sa_.Column("id", sa_.String(64), primary_key=True),
        sa_.Column("type", sa_.String(255), nullable=False),
        sa_.Column("notifiable_type", sa_.String(255), nullable=False),
        sa_.Column("notifiable_id", sa_.String(255), nullable=False),
        sa_.Column("data", sa_.JSON, nullable=False),
        sa_.Column("read_at", stamp, nullable=True),
        sa_.Column("created_at", stamp, nullable=False),
        sa_.Index(f"{name}_notifiable_index", "notifiable_type", "notifiable_id"),
        sa_.Index(f"{name}_created_at_index", "created_at"),
        schema=schema,
        # MySQL/MariaDB only (other dialects ignore mysql_*): utf8mb4 whatever the
        # server's or the database's default (latin1 on many; "utf8" is 3 bytes and
        # refuses emoji), and a binary collation, so ids and types compare exactly as on
        # SQLite and PostgreSQL ("Ann" is not "ann"). InnoDB's 3072-byte key limit holds
        # the (notifiable_type, notifiable_id) index: 2 x 255 x 4 bytes.
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mysql_engine="InnoDB",
    )
    return table


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # a driver that hands back text
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass
class DatabaseNotification:
    """One stored notification, as :meth:`HasDatabaseNotifications.notifications` gives it."""

    id: str
    type: str
    notifiable_type: str
    notifiable_id: str
    data: dict[str, Any]
    read_at: datetime | None
    created_at: datetime

    @property
    def read(self) -> bool:
        """Whether it has been read."""
        return self.read_at is not None

    def mark_as_read(self) -> None:
        """Mark this one read (in the current App's database)."""
        _current.current().database.mark_as_read(
            self.notifiable_type, self.notifiable_id, [self.id]
        )
        self.read_at = self.read_at or datetime.now(UTC)

    def mark_as_unread(self) -> None:
        """Mark this one unread again."""
        _current.current().database.mark_as_unread(
            self.notifiable_type, self.notifiable_id, [self.id]
        )
        self.read_at = None


def _classname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def notifiable_key(notifiable: Any, notification: Any = None) -> tuple[str, str]:
    """``(notifiable_type, notifiable_id)`` of a notifiable.

    The type is a ``notifiable_type`` attribute (or method) when it has one, else its
    class as ``module.QualName``; the id is its ``database`` route (its ``id``).

    Raises:
        ValidationError: the notifiable has no id.
    """
    custom = getattr(notifiable, "notifiable_type", None)
    kind = custom() if callable(custom) else custom
    if not isinstance(kind, str) or not kind:
        kind = _classname(notifiable)
    route = getattr(notifiable, "route_notification_for", None)
    if route is not None:
        ident = route("database", notification)
    else:
        ident = getattr(notifiable, "id", None)
    if ident is None or ident == "":
        raise ValidationError(
            f"{type(notifiable).__qualname__} has no id for the database channel "
            "(give it an `id` or define route_notification_for_database())",
            field="database",
        )
    return kind, str(ident)


def _json_default(value: Any) -> Any:
    if type(value).__name__ in ("Decimal", "UUID"):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(type(value).__name__)


def build_row(
    notifiable: Any, notification: Any, delivery_id: str, now: datetime | None = None
) -> dict[str, Any]:
    """The row a notification stores for ``notifiable`` (no I/O).

    Raises:
        ConfigurationError: neither ``to_database`` nor ``to_dict`` is defined.
        ValidationError: the data is not a JSON-serializable dict, or no id.
    """
    method = getattr(notification, "to_database", None) or getattr(notification, "to_dict", None)
    if method is None:
        raise ConfigurationError(
            f"{type(notification).__qualname__} has no to_database(notifiable) "
            "(or to_dict(notifiable)) for the database channel"
        )
    data = method(notifiable)
    if not isinstance(data, dict):
        raise ValidationError(
            f"{type(notification).__qualname__}.to_database() must return a dict, "
            f"not {type(data).__name__}",
            field="data",
        )
    try:
        data = orjson.loads(orjson.dumps(data, default=_json_default))
    except TypeError as exc:
        raise ValidationError(
            f"database notification data is not JSON-serializable: {exc}", field="data"
        ) from None
    custom = getattr(notification, "database_type", None)
    kind = custom(notifiable) if callable(custom) else None
    kind_s = kind if isinstance(kind, str) and kind else _classname(notification)
    ntype, nid = notifiable_key(notifiable, notification)
    return {
        "id": delivery_id,
        "type": kind_s,
        "notifiable_type": ntype,
        "notifiable_id": nid,
        "data": data,
        "read_at": None,
        "created_at": now or datetime.now(UTC),
    }


def _sqlite_wal(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers (a web app's bell icon) never block the worker's writes. Synchronous
    # stays FULL: a row is on disk before its job is acked.
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def _mysql_session(dbapi_conn: Any, _record: Any) -> None:
    # Strict mode for this connection, whatever the server's: without it MySQL stores an
    # over-long value cut short (a notifiable id cut at 255 characters names another
    # notifiable) with only a warning, where SQLite and PostgreSQL fail the row.
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(
            "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), "
            "'STRICT_TRANS_TABLES')"
        )
    finally:
        cursor.close()


def _utc_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    # Every stored time is UTC: SQLite and MySQL keep no zone (the driver drops it), so an
    # aware time in another zone would be stored as its wall clock and sort wrongly.
    out = []
    for row in rows:
        fixed = dict(row)
        for key in ("created_at", "read_at"):
            value = fixed.get(key)
            if isinstance(value, datetime) and value.tzinfo is not None:
                fixed[key] = value.astimezone(UTC)
        out.append(fixed)
    return out


def _seconds(age: float | timedelta) -> float:
    return age.total_seconds() if isinstance(age, timedelta) else float(age)


class NotificationStore:
    """The ``notifications`` table behind one SQLAlchemy URL.

    Sync methods (call them from web views, scripts, threads); the worker's channel
    runs :meth:`insert_rows` in :attr:`executor`.
    """

    def __init__(
        self,
        url: str,
        *,
        table_name: str = "notifications",
        schema: str | None = None,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        """Configure the store; nothing connects until first use.

        Args:
            url: an SQLAlchemy URL (``TIDINGS_DATABASE_URL``).
            table_name: the table's name.
            schema: a database schema (PostgreSQL), else the connection's default.
            engine_options: extra ``create_engine`` keywords (pool size ...).
        """
        sa_ = _sqlalchemy()
        try:
            self._url = sa_.engine.make_url(url)
        except sa_.exc.ArgumentError:
            raise ConfigurationError(
                "TIDINGS_DATABASE_URL is not an SQLAlchemy URL "
                "(e.g. sqlite:///path.db, postgresql+psycopg://user:pass@host/db)"
            ) from None
        self._secrets = [self._url.password] if self._url.password else []
        self.metadata = sa_.MetaData()
        self.table = notifications_table(self.metadata, table_name, schema)
        # Preferences (tidings.notifications.rules.preferences) share the MetaData, so
        # `upgrade` (`notify-worker db upgrade`) creates their table too.
        from tidings.notifications.rules.preferences import preferences_table

        self.preferences_table = preferences_table(
            self.metadata, "notification_preferences", schema
        )
        self._engine_options = engine_options or {}
        self._engine: Any = None
        self._ready = False
        self._lock = threading.RLock()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tidings-db")

    @property
    def url(self) -> str:
        """The URL with its password hidden (for logs and CLI output)."""
        text: str = self._url.render_as_string(hide_password=True)
        return text

    @property
    def engine(self) -> Any:
        """The SQLAlchemy Engine (created on first use)."""
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = self._make_engine()
        return self._engine

    def _make_engine(self) -> Any:
        sa_ = _sqlalchemy()
        options: dict[str, Any] = {"pool_pre_ping": True}
        if self._url.get_backend_name() == "sqlite":
            database = self._url.database
            if database and database != ":memory:" and not database.startswith("file:"):
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            # Wait for other processes' writes instead of failing with "locked".
            options["connect_args"] = {"timeout": 30}
        elif self._url.get_backend_name() == "postgresql":
            # A server that does not answer fails the attempt (and retries the job)
            # instead of hanging a write thread until the job's timeout.
            options["connect_args"] = {"connect_timeout": 10}
        elif self._mysql and self._url.get_driver_name() in ("pymysql", "mysqldb"):
            connect_args: dict[str, Any] = {"connect_timeout": 10}
            if "charset" not in self._url.query:
                connect_args["charset"] = "utf8mb4"  # 4-byte UTF-8 on the wire too
            options["connect_args"] = connect_args
        options["pool_timeout"] = 30
        options.update(self._engine_options)
        engine = sa_.create_engine(self._url, **options)
        if self._url.get_backend_name() == "sqlite":
            sa_.event.listen(engine, "connect", _sqlite_wal)
        elif self._mysql:
            sa_.event.listen(engine, "connect", _mysql_session)
        return engine

    @property
    def _mysql(self) -> bool:
        return self._url.get_backend_name() in ("mysql", "mariadb")

    def error(self, exc: BaseException) -> Exception:
        """A driver error as a channel error: connection trouble retries, bad data fails.
        The text is redacted (no password) and shortened."""
        sa_ = _sqlalchemy()
        # Redact, then cut (tidings.observability.redaction.clean): a password across the cut must
        # not survive in part.
        text = clean(f"{type(exc).__name__}: {getattr(exc, 'orig', None) or exc}", 300,
                     self._secrets)  # fmt: skip
        permanent = (sa_.exc.DataError, sa_.exc.IntegrityError)
        if isinstance(exc, permanent):
            return PermanentChannelError(f"database: {text}", channel="database")
        return TransientChannelError(f"database: {text}", channel="database")

    # -- schema --------------------------------------------------------------------------

    def upgrade(self) -> bool:
        """Create the table and its indexes where missing; True when it created them."""
        sa_ = _sqlalchemy()
        with self._lock:
            engine = self.engine
            inspector = sa_.inspect(engine)
            existed = inspector.has_table(self.table.name, schema=self.table.schema)
            try:
                self.metadata.create_all(engine, checkfirst=True)
            except sa_.exc.DatabaseError:
                # Another process created them between the check and the CREATE.
                inspector = sa_.inspect(engine)
                for table in self.metadata.sorted_tables:
                    if not inspector.has_table(table.name, schema=table.schema):
                        raise
            self._ready = True
            return not existed

    def _ensure(self) -> None:
        if not self._ready:
            self.upgrade()

    # -- writes --------------------------------------------------------------------------

    def insert_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` in one transaction, skipping ids already stored."""
        if not rows:
            return
        self._ensure()
        sa_ = _sqlalchemy()
        dialect = self.engine.dialect.name
        rows = _utc_rows(rows)
        with self.engine.begin() as conn:
            if dialect in ("sqlite", "postgresql"):
                from sqlalchemy.dialects import postgresql, sqlite

                module: Any = sqlite if dialect == "sqlite" else postgresql
                stmt = module.insert(self.table).on_conflict_do_nothing(index_elements=["id"])
                conn.execute(stmt, rows)
            elif dialect in ("mysql", "mariadb"):
                from sqlalchemy.dialects import mysql

                # Not INSERT IGNORE: it also turns "data too long" and other refusals
                # into warnings and stores the row altered. A duplicate id sets id to
                # itself: nothing changes, and every other error still fails the row.
                stmt = mysql.insert(self.table).on_duplicate_key_update(id=self.table.c.id)
                conn.execute(stmt, rows)
            else:
                ids = [r["id"] for r in rows]
                seen = set(
                    conn.execute(
                        sa_.select(self.table.c.id).where(self.table.c.id.in_(ids))
                    ).scalars()
                )
                fresh = [r for r in rows if r["id"] not in seen]
                if fresh:
                    conn.execute(self.table.insert(), fresh)

    def _where(self, notifiable_type: str, notifiable_id: str) -> Any:
        t = self.table
        return (t.c.notifiable_type == notifiable_type) & (t.c.notifiable_id == notifiable_id)

    def mark_as_read(
        self, notifiable_type: str, notifiable_id: str, ids: Iterable[str] | None = None
    ) -> int:
        """Mark a notifiable's notifications read (``ids``, or every unread one)."""
        return self._set_read(notifiable_type, notifiable_id, ids, datetime.now(UTC))

    def mark_as_unread(
        self, notifiable_type: str, notifiable_id: str, ids: Iterable[str] | None = None
    ) -> int:
        """Mark a notifiable's notifications unread again."""
        return self._set_read(notifiable_type, notifiable_id, ids, None)

    def _set_read(
        self, ntype: str, nid: str, ids: Iterable[str] | None, when: datetime | None
    ) -> int:
        self._ensure()
        t = self.table
        cond = self._where(ntype, nid)
        cond = cond & (t.c.read_at.is_(None) if when is not None else t.c.read_at.is_not(None))
        if ids is not None:
            wanted = list(ids)
            if not wanted:
                return 0
            cond = cond & t.c.id.in_(wanted)
        with self.engine.begin() as conn:
            count: int = conn.execute(t.update().where(cond).values(read_at=when)).rowcount
        return count

    def delete(self, notifiable_type: str, notifiable_id: str, ids: Iterable[str]) -> int:
        """Delete some of a notifiable's notifications."""
        self._ensure()
        t = self.table
        cond = self._where(notifiable_type, notifiable_id) & t.c.id.in_(list(ids))
        with self.engine.begin() as conn:
            count: int = conn.execute(t.delete().where(cond)).rowcount
        return count

    def prune(self, older_than: float | timedelta, *, read_only: bool = False) -> int:
        """Delete notifications created more than ``older_than`` (seconds or timedelta)
        ago; with ``read_only`` only those already read. Returns how many went."""
        self._ensure()
        t = self.table
        cutoff = datetime.now(UTC) - timedelta(seconds=_seconds(older_than))
        cond = t.c.created_at < cutoff
        if read_only:
            cond = cond & t.c.read_at.is_not(None)
        with self.engine.begin() as conn:
            count: int = conn.execute(t.delete().where(cond)).rowcount
        return count

    # -- reads ---------------------------------------------------------------------------

    def for_notifiable(
        self,
        notifiable_type: str,
        notifiable_id: str,
        *,
        read: bool | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[DatabaseNotification]:
        """A notifiable's notifications, newest first (``read`` filters)."""
        self._ensure()
        sa_ = _sqlalchemy()
        t = self.table
        cond = self._where(notifiable_type, notifiable_id)
        if read is True:
            cond = cond & t.c.read_at.is_not(None)
        elif read is False:
            cond = cond & t.c.read_at.is_(None)
        query = sa_.select(t).where(cond).order_by(t.c.created_at.desc(), t.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        if offset:
            query = query.offset(offset)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            DatabaseNotification(
                id=r["id"],
                type=r["type"],
                notifiable_type=r["notifiable_type"],
                notifiable_id=r["notifiable_id"],
                data=r["data"] if isinstance(r["data"], dict) else orjson.loads(r["data"]),
                read_at=_utc(r["read_at"]),
                created_at=_utc(r["created_at"]) or datetime.now(UTC),
            )
            for r in rows
        ]

    def count(self, notifiable_type: str | None = None, notifiable_id: str | None = None) -> int:
        """How many rows (of one notifiable, when given)."""
        self._ensure()
        sa_ = _sqlalchemy()
        query = sa_.select(sa_.func.count()).select_from(self.table)
        if notifiable_type is not None and notifiable_id is not None:
            query = query.where(self._where(notifiable_type, notifiable_id))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def close(self) -> None:
        """Dispose of the connection pool and the write threads."""
        self.executor.shutdown(wait=True)
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tidings-db")


class DatabaseChannel:
    """The ``database`` channel of one event loop: group-committed, idempotent inserts."""

    def __init__(self, app: AppHost) -> None:
        self.store: NotificationStore = app.database
        self._pending: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> DeliveryResult:
        """Store the notification; returns once the row is committed.

        Raises:
            ConfigurationError, ValidationError: no ``to_database``, bad data, no id.
            TransientChannelError: the database could not be reached (retry).
            PermanentChannelError: the database refused the row.
        """
        row = build_row(notifiable, notification, delivery_id)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((row, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await done
        return DeliveryResult("database", delivery_id, "stored")

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            rows = [row for row, _ in batch]
            try:
                await loop.run_in_executor(self.store.executor, self.store.insert_rows, rows)
            except Exception as exc:
                if len(batch) == 1:
                    self._settle(batch, self.store.error(exc))
                    continue
                # One bad row must not fail the others: write each alone.
                for item in batch:
                    try:
                        await loop.run_in_executor(
                            self.store.executor, self.store.insert_rows, [item[0]]
                        )
                    except Exception as one:
                        self._settle([item], self.store.error(one))
                    else:
                        self._settle([item], None)
            else:
                self._settle(batch, None)

    @staticmethod
    def _settle(
        items: Sequence[tuple[dict[str, Any], asyncio.Future[None]]], exc: Exception | None
    ) -> None:
        for _, fut in items:
            if fut.done():
                continue
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    async def close(self) -> None:
        """Wait for rows still being written."""
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait({writer}, timeout=30)


class HasDatabaseNotifications:
    """The database channel's API on notifiables (part of ``Notifiable``).

    Reads and writes go to the current App's database (``TIDINGS_DATABASE_URL``); the
    notifiable is found by :func:`notifiable_key`.
    """

    def _notification_store(self) -> tuple[NotificationStore, str, str]:
        store: NotificationStore = _current.current().database
        kind, ident = notifiable_key(self)
        return store, kind, ident

    def notifications(
        self, *, limit: int | None = None, offset: int = 0
    ) -> list[DatabaseNotification]:
        """Every stored notification of this notifiable, newest first."""
        store, kind, ident = self._notification_store()
        return store.for_notifiable(kind, ident, limit=limit, offset=offset)

    def unread_notifications(
        self, *, limit: int | None = None, offset: int = 0
    ) -> list[DatabaseNotification]:
        """The unread ones, newest first."""
        store, kind, ident = self._notification_store()
        return store.for_notifiable(kind, ident, read=False, limit=limit, offset=offset)

    def read_notifications(
        self, *, limit: int | None = None, offset: int = 0
    ) -> list[DatabaseNotification]:
        """The read ones, newest first."""
        store, kind, ident = self._notification_store()
        return store.for_notifiable(kind, ident, read=True, limit=limit, offset=offset)

    def mark_as_read(self, *notifications: str | DatabaseNotification) -> int:
        """Mark the given notifications (ids or objects) read; returns how many changed."""
        store, kind, ident = self._notification_store()
        ids = [n.id if isinstance(n, DatabaseNotification) else str(n) for n in notifications]
        return store.mark_as_read(kind, ident, ids)

    def mark_all_as_read(self) -> int:
        """Mark every unread notification read; returns how many changed."""
        store, kind, ident = self._notification_store()
        return store.mark_as_read(kind, ident)

    def delete_notifications(self, *notifications: str | DatabaseNotification) -> int:
        """Delete the given notifications; returns how many went."""
        store, kind, ident = self._notification_store()
        ids = [n.id if isinstance(n, DatabaseNotification) else str(n) for n in notifications]
        return store.delete(kind, ident, ids)

    # -- async twins (FastAPI and other event-loop apps): the same calls in a thread ----

    async def notifications_async(
        self, *, limit: int | None = None, offset: int = 0
    ) -> list[DatabaseNotification]:
        """Async twin of :meth:`notifications`."""
        return await asyncio.to_thread(lambda: self.notifications(limit=limit, offset=offset))

    async def unread_notifications_async(
        self, *, limit: int | None = None, offset: int = 0
    ) -> list[DatabaseNotification]:
        """Async twin of :meth:`unread_notifications`."""
        return await asyncio.to_thread(
            lambda: self.unread_notifications(limit=limit, offset=offset)
        )

    async def mark_as_read_async(self, *notifications: str | DatabaseNotification) -> int:
        """Async twin of :meth:`mark_as_read`."""
        return await asyncio.to_thread(self.mark_as_read, *notifications)

    async def mark_all_as_read_async(self) -> int:
        """Async twin of :meth:`mark_all_as_read`."""
        return await asyncio.to_thread(self.mark_all_as_read)
