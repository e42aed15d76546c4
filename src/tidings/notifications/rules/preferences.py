"""Preferences: a notifiable opts out of a notification type on a channel.

Decided at ``notify()``, before any job is queued: an opted-out channel gets no job and
a :class:`~tidings.notifications.events.NotificationSkipped` (reason ``"opted_out"``).
A notification with ``mandatory = True`` (security, billing) ignores opt-outs.

Two sources, chosen on the App once::

    app.notifications.preferences.use_database()          # the notification_preferences table
    app.notifications.preferences.use(lambda notifiable, notification, channel: ...)

The table lives beside the database channel's ``notifications`` table (same URL,
``TIDINGS_DATABASE_URL``; ``notify-worker db upgrade`` creates both)::

    notifiable_type, notifiable_id   who (as the database channel names notifiables)
    notification_type                the notification's type name, or "*" for every type
    channel                          a channel, or "*" for every channel
    enabled                          False: opted out; True: opted in (overrides a "*" row)
    updated_at                       when it was last set (UTC)

The most specific row wins: (type, channel), then (type, "*"), then ("*", channel),
then ("*", "*"); no row: enabled. A callback returns True/False, or None to fall back
to the table when the table is in use too (else enabled).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidings import _current
from tidings.errors import ConfigurationError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from tidings.notifications.channels.database import NotificationStore

__all__ = [
    "ANY",
    "HasNotificationPreferences",
    "Preference",
    "PreferenceCallback",
    "PreferenceStore",
    "Preferences",
    "is_mandatory",
    "preferences_table",
    "type_name",
]

#: The wildcard of ``notification_type`` and ``channel``.
ANY = "*"

PreferenceCallback = Callable[[Any, Any, str], "bool | None"]


def preferences_table(
    metadata: sa.MetaData, name: str = "notification_preferences", schema: str | None = None
) -> sa.Table:
    """The ``notification_preferences`` table on ``metadata`` (Alembic can take it too)."""
    import sqlalchemy as sa_
    from sqlalchemy.dialects import mysql

    stamp = sa_.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    table: sa.Table = sa_.Table(
        name,
        metadata,
        # The primary key is 701 characters: 2,804 bytes in utf8mb4, under InnoDB's
        # 3,072-byte key limit (MySQL/MariaDB).
        sa_.Column("notifiable_type", sa_.String(191), primary_key=True),
        sa_.Column("notifiable_id", sa_.String(255), primary_key=True),
        sa_.Column("notification_type", sa_.String(191), primary_key=True),
        sa_.Column("channel", sa_.String(64), primary_key=True),
        sa_.Column("enabled", sa_.Boolean, nullable=False),
        sa_.Column("updated_at", stamp, nullable=False),
        schema=schema,
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mysql_engine="InnoDB",
    )
    return table


def type_name(notification: Any) -> str:
    """The type name preferences use: a ``preference_type`` class attribute, else
    ``module.QualName`` (a class or an instance may be given)."""
    if isinstance(notification, str):
        return notification
    cls = notification if isinstance(notification, type) else type(notification)
    custom = getattr(cls, "preference_type", None)
    if isinstance(custom, str) and custom:
        return custom
    return f"{cls.__module__}.{cls.__qualname__}"


def is_mandatory(notification: Any) -> bool:
    """Whether ``notification`` ignores opt-outs (``mandatory = True``)."""
    return bool(getattr(notification, "mandatory", False))


@dataclass(frozen=True, slots=True)
class Preference:
    """One stored row."""

    notification_type: str
    channel: str
    enabled: bool
    updated_at: datetime | None


def _decide(rows: dict[tuple[str, str], bool], ntype: str, channel: str) -> bool | None:
    for key in ((ntype, channel), (ntype, ANY), (ANY, channel), (ANY, ANY)):
        if key in rows:
            return rows[key]
    return None


class PreferenceStore:
    """The ``notification_preferences`` table, on the database channel's store (sync
    calls; async code runs them in a thread)."""

    def __init__(self, store: NotificationStore) -> None:
        self.store = store
        self._statement: Any = None

    @property
    def table(self) -> sa.Table:
        """The table (defined on the store's MetaData, so ``upgrade`` creates it)."""
        table: sa.Table = self.store.preferences_table
        return table

    def set(
        self, ntype: str, nid: str, notification_type: str, channel: str, enabled: bool
    ) -> None:
        """Store one preference (insert or replace)."""
        self.store._ensure()
        t = self.table
        row = {
            "notifiable_type": ntype, "notifiable_id": nid,
            "notification_type": notification_type, "channel": channel,
            "enabled": bool(enabled), "updated_at": datetime.now(UTC),
        }  # fmt: skip
        engine = self.store.engine
        dialect = engine.dialect.name
        try:
            with engine.begin() as conn:
                if dialect in ("sqlite", "postgresql"):
                    from sqlalchemy.dialects import postgresql, sqlite

                    module: Any = sqlite if dialect == "sqlite" else postgresql
                    stmt = module.insert(t).values(row)
                    stmt = stmt.on_conflict_do_update(
                        index_elements=[c.name for c in t.primary_key.columns],
                        set_={"enabled": row["enabled"], "updated_at": row["updated_at"]},
                    )
                    conn.execute(stmt)
                elif dialect in ("mysql", "mariadb"):
                    from sqlalchemy.dialects import mysql

                    stmt = mysql.insert(t).values(row)
                    conn.execute(
                        stmt.on_duplicate_key_update(
                            enabled=row["enabled"], updated_at=row["updated_at"]
                        )
                    )
                else:
                    conn.execute(
                        t.delete().where(self._row(ntype, nid, notification_type, channel))
                    )
                    conn.execute(t.insert().values(row))
        except Exception as exc:
            raise self.store.error(exc) from None

    def _row(self, ntype: str, nid: str, notification_type: str, channel: str) -> Any:
        t = self.table
        return (
            (t.c.notifiable_type == ntype)
            & (t.c.notifiable_id == nid)
            & (t.c.notification_type == notification_type)
            & (t.c.channel == channel)
        )

    def forget(
        self, ntype: str, nid: str, notification_type: str | None = None, channel: str | None = None
    ) -> int:
        """Delete a notifiable's preferences (of one type and/or channel when given)."""
        self.store._ensure()
        t = self.table
        cond = (t.c.notifiable_type == ntype) & (t.c.notifiable_id == nid)
        if notification_type is not None:
            cond = cond & (t.c.notification_type == notification_type)
        if channel is not None:
            cond = cond & (t.c.channel == channel)
        with self.store.engine.begin() as conn:
            count: int = conn.execute(t.delete().where(cond)).rowcount
        return count

    def for_notifiable(self, ntype: str, nid: str) -> list[Preference]:
        """A notifiable's stored preferences."""
        import sqlalchemy as sa_

        self.store._ensure()
        t = self.table
        cond = (t.c.notifiable_type == ntype) & (t.c.notifiable_id == nid)
        query = sa_.select(t).where(cond).order_by(t.c.notification_type, t.c.channel)
        with self.store.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            Preference(r["notification_type"], r["channel"], bool(r["enabled"]), r["updated_at"])
            for r in rows
        ]

    def _lookup_statement(self) -> Any:
        # Built once per store: building a SELECT costs about as much as running it.
        stmt = self._statement
        if stmt is None:
            import sqlalchemy as sa_

            t = self.table
            cols = [t.c.notifiable_type, t.c.notifiable_id, t.c.notification_type,
                    t.c.channel, t.c.enabled]  # fmt: skip
            stmt = self._statement = sa_.select(*cols).where(
                (t.c.notifiable_type == sa_.bindparam("nt"))
                & t.c.notifiable_id.in_(sa_.bindparam("ids", expanding=True))
                & t.c.notification_type.in_(sa_.bindparam("types", expanding=True))
            )
        return stmt

    def lookup(
        self, keys: Sequence[tuple[str, str]], notification_type: str
    ) -> dict[tuple[str, str], dict[tuple[str, str], bool]]:
        """The rows of ``notification_type`` (and ``*``) of many notifiables, in one
        query per notifiable type (500 ids a query):
        ``{(ntype, nid): {(type, channel): enabled}}``."""
        out: dict[tuple[str, str], dict[tuple[str, str], bool]] = {k: {} for k in keys}
        if not keys:
            return out
        self.store._ensure()
        stmt = self._lookup_statement()
        by_type: dict[str, list[str]] = {}
        for ntype, nid in keys:
            by_type.setdefault(ntype, []).append(nid)
        types = [notification_type, ANY]
        with self.store.engine.connect() as conn:
            for ntype, ids in by_type.items():
                unique = sorted(set(ids))
                for start in range(0, len(unique), 500):
                    params = {"nt": ntype, "ids": unique[start : start + 500], "types": types}
                    for r in conn.execute(stmt, params):
                        out.setdefault((r[0], r[1]), {})[(r[2], r[3])] = bool(r[4])
        return out


class Preferences:
    """The App's preference source (``app.notifications.preferences``); off until
    :meth:`use_database` or :meth:`use` is called."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.callback: PreferenceCallback | None = None
        self.database = False
        self.cache_s = 0.0
        self._cache: dict[tuple[str, str, str], tuple[float, dict[tuple[str, str], bool]]] = {}
        self._store: PreferenceStore | None = None

    @property
    def enabled(self) -> bool:
        """Whether any source is in use."""
        return self.database or self.callback is not None

    def use_database(self, *, cache_s: float = 0.0) -> Preferences:
        """Read preferences from the ``notification_preferences`` table.

        Args:
            cache_s: keep what was read for this many seconds in this process (0: read
                on every ``notify()``). A change made in another process is seen after
                at most ``cache_s``; one made here (``opt_out()``...) at once.
        """
        self.database = True
        self.cache_s = max(0.0, float(cache_s))
        self._cache.clear()
        return self

    def invalidate(self, notifiable_type: str, notifiable_id: str) -> None:
        """Forget what the cache holds of one notifiable."""
        for key in [k for k in self._cache if k[:2] == (notifiable_type, notifiable_id)]:
            self._cache.pop(key, None)

    def use(self, callback: PreferenceCallback) -> Preferences:
        """Ask ``callback(notifiable, notification, channel)``: True (send), False (opted
        out) or None (the table decides when in use, else send)."""
        if not callable(callback):
            raise ConfigurationError(
                "preferences.use() takes a callable(notifiable, notification, channel)"
            )
        self.callback = callback
        return self

    def off(self) -> Preferences:
        """No preferences (the default)."""
        self.callback, self.database = None, False
        return self

    @property
    def store(self) -> PreferenceStore:
        """The table of the App's database (``TIDINGS_DATABASE_URL``)."""
        database = self.app.database
        if self._store is None or self._store.store is not database:
            self._store = PreferenceStore(database)
        return self._store

    def _rows(
        self, keys: list[tuple[str, str]], ntype: str
    ) -> dict[tuple[str, str], dict[tuple[str, str], bool]]:
        if self.cache_s <= 0:
            return self.store.lookup(keys, ntype)
        now = time.monotonic()
        found: dict[tuple[str, str], dict[tuple[str, str], bool]] = {}
        missing = []
        for key in keys:
            hit = self._cache.get((*key, ntype))
            if hit is not None and hit[0] > now:
                found[key] = hit[1]
            else:
                missing.append(key)
        if missing:
            fresh = self.store.lookup(missing, ntype)
            if len(self._cache) > 100_000:
                self._cache.clear()
            for key, rows in fresh.items():
                self._cache[(*key, ntype)] = (now + self.cache_s, rows)
                found[key] = rows
        return found

    # -- deciding ------------------------------------------------------------------------

    def allowed(self, notifiables: Sequence[Any], notification: Any) -> Callable[[int, str], bool]:
        """``check(index, channel) -> bool`` for the notifiables of one ``notify()``: the
        table is read once for them all (blocking I/O: async callers use a thread)."""
        if not self.enabled or is_mandatory(notification):
            return lambda _index, _channel: True
        ntype = type_name(notification)
        rows: list[dict[tuple[str, str], bool]] = [{} for _ in notifiables]
        if self.database:
            from tidings.notifications.channels.database import notifiable_key

            keys: list[tuple[str, str] | None] = []
            for n in notifiables:
                try:
                    keys.append(notifiable_key(n, notification))
                except Exception:  # no id (an on-demand route): no stored preferences
                    keys.append(None)
            found = self._rows([k for k in keys if k is not None], ntype)
            rows = [found.get(k, {}) if k is not None else {} for k in keys]
        callback = self.callback

        def check(index: int, channel: str) -> bool:
            if callback is not None:
                said = callback(notifiables[index], notification, channel)
                if said is not None:
                    return bool(said)
            decided = _decide(rows[index], ntype, channel)
            return True if decided is None else decided

        return check


def _store_and_key(notifiable: Any) -> tuple[PreferenceStore, str, str]:
    from tidings.notifications.channels.database import notifiable_key

    app = _current.current()
    kind, ident = notifiable_key(notifiable)
    prefs = getattr(app.notifications, "preferences", None)
    if isinstance(prefs, Preferences):
        return prefs.store, kind, ident
    return PreferenceStore(app.database), kind, ident


def _changed(kind: str, ident: str) -> None:
    """A change made in this process is seen at once, whatever ``cache_s``."""
    prefs = getattr(_current.current().notifications, "preferences", None)
    if isinstance(prefs, Preferences):
        prefs.invalidate(kind, ident)


def _names(notification: Any, channels: str | Iterable[str]) -> tuple[str, list[str]]:
    ntype = ANY if notification is None else type_name(notification)
    return ntype, [channels] if isinstance(channels, str) else list(channels)


class HasNotificationPreferences:
    """Preferences on notifiables (part of ``Notifiable``); stored in the current App's
    ``notification_preferences`` table."""

    def opt_out(self, notification: Any = None, channels: str | Iterable[str] = ANY) -> None:
        """Stop ``notification`` (a class, an instance or a type name; None: every type)
        on ``channels`` (default every channel)."""
        store, kind, ident = _store_and_key(self)
        ntype, names = _names(notification, channels)
        for channel in names:
            store.set(kind, ident, ntype, channel, False)
        _changed(kind, ident)

    def opt_in(self, notification: Any = None, channels: str | Iterable[str] = ANY) -> None:
        """Allow ``notification`` on ``channels`` again (overrides a wider opt-out)."""
        store, kind, ident = _store_and_key(self)
        ntype, names = _names(notification, channels)
        for channel in names:
            store.set(kind, ident, ntype, channel, True)
        _changed(kind, ident)

    def forget_preferences(self, notification: Any = None, channel: str | None = None) -> int:
        """Delete stored preferences (all, or of one type and/or channel)."""
        store, kind, ident = _store_and_key(self)
        ntype = None if notification is None else type_name(notification)
        count = store.forget(kind, ident, ntype, channel)
        _changed(kind, ident)
        return count

    def notification_preferences(self) -> list[Preference]:
        """The stored preferences of this notifiable."""
        store, kind, ident = _store_and_key(self)
        return store.for_notifiable(kind, ident)

    def wants_notification(self, notification: Any, channel: str) -> bool:
        """Whether the stored preferences allow ``notification`` on ``channel``."""
        store, kind, ident = _store_and_key(self)
        if is_mandatory(notification):
            return True
        ntype = type_name(notification)
        rows = store.lookup([(kind, ident)], ntype).get((kind, ident), {})
        decided = _decide(rows, ntype, channel)
        return True if decided is None else decided

    async def opt_out_async(
        self, notification: Any = None, channels: str | Iterable[str] = ANY
    ) -> None:
        """Async twin of :meth:`opt_out`."""
        await asyncio.to_thread(self.opt_out, notification, channels)

    async def opt_in_async(
        self, notification: Any = None, channels: str | Iterable[str] = ANY
    ) -> None:
        """Async twin of :meth:`opt_in`."""
        await asyncio.to_thread(self.opt_in, notification, channels)
