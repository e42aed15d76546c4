"""SQLAlchemy: after-commit dispatch on ORM sessions, and the sessions that reload
mapped objects in a worker.

``install()`` (called by every App when SQLAlchemy is imported, and by the Flask and
FastAPI helpers) listens to the events of every ``Session``. A push whose job,
listener or notification has ``after_commit = True`` made while a session of this
thread or task has a transaction that was begun explicitly (``with session.begin():``)
or holds writes (pending changes, or a flush) waits in ``session.info`` for that
transaction: pushed after it commits, dropped when it rolls back or the session closes
without a commit. A push made inside a savepoint (``begin_nested()``) is dropped when
that savepoint rolls back, and otherwise waits for the outermost commit. When several
pushes wait for one commit and one fails (Redis unreachable), the others still go out
and the first error is raised from ``commit()``; the database has committed by then.
A session that only read (SQLAlchemy begins a transaction for every query) does not
hold pushes back.

``use_sessions(sessionmaker)`` tells the worker how to open a session to load mapped
objects given as arguments (see :mod:`tidings.contrib.models`).
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

from tidings import after_commit
from tidings.contrib.models import use_sqlalchemy_sessions

_PENDING = "tidings_after_commit"
_WROTE = "tidings_wrote"
_COMMITTED = "tidings_committed"
# Sessions with a transaction open in this context, innermost last (weakly: a session
# dropped without close() must not be kept alive by this list).
_open: contextvars.ContextVar[tuple[weakref.ref[Any], ...]] = contextvars.ContextVar(
    "tidings_sqlalchemy_sessions", default=()
)


def _others(session: Any) -> tuple[weakref.ref[Any], ...]:
    return tuple(r for r in _open.get() if r() is not None and r() is not session)


_installed = False


def use_sessions(factory: Any) -> None:
    """The ``sessionmaker`` a worker opens to reload mapped objects given as arguments."""
    use_sqlalchemy_sessions(factory)


def _root(transaction: Any) -> bool:
    return transaction.parent is None


def _after_transaction_create(session: Any, transaction: Any) -> None:
    if _root(transaction):
        session.info[_WROTE] = False
        _open.set((*_others(session), weakref.ref(session)))


def _after_flush(session: Any, _ctx: Any) -> None:
    session.info[_WROTE] = True


def _after_commit(session: Any) -> None:
    # Fired for the root COMMIT and for each savepoint RELEASE, right before that
    # transaction's after_transaction_end: remember that it committed.
    session.info[_COMMITTED] = True


def _after_transaction_end(session: Any, transaction: Any) -> None:
    committed = session.info.pop(_COMMITTED, False)
    pending: dict[Any, list[after_commit.Callback]] = session.info.get(_PENDING, {})
    mine = pending.pop(transaction, [])
    if not _root(transaction):
        # A savepoint: released, its pushes wait for the enclosing transaction; rolled
        # back, they are dropped with it.
        if committed and mine:
            pending.setdefault(transaction.parent, []).extend(mine)
        return
    session.info.pop(_PENDING, None)
    session.info[_WROTE] = False
    _open.set(_others(session))
    if committed:
        _run_all(mine)


def _run_all(callbacks: list[after_commit.Callback]) -> None:
    """Run every held push; the first failure is raised after the others ran (the
    commit has happened: one unreachable push must not cost the others theirs)."""
    error: BaseException | None = None
    for callback in callbacks:
        try:
            callback()
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


def _holding(session: Any) -> bool:
    tx = session.get_transaction()
    if tx is None or not tx.is_active:
        return False
    explicit = getattr(tx, "origin", None)
    begun = explicit is not None and explicit.name == "BEGIN"
    dirty = bool(session.new or session.dirty or session.deleted)
    return begun or dirty or bool(session.info.get(_WROTE))


def _hook() -> after_commit.Deferrer | None:
    for ref in reversed(_open.get()):
        session = ref()
        if session is not None and _holding(session):
            tx = session.get_nested_transaction() or session.get_transaction()
            pending: dict[Any, list[after_commit.Callback]] = session.info.setdefault(_PENDING, {})
            return pending.setdefault(tx, []).append
    return None


def install() -> None:
    """Listen to every Session's transaction events (idempotent)."""
    global _installed
    if _installed:
        return
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    event.listen(Session, "after_transaction_create", _after_transaction_create)
    event.listen(Session, "after_flush", _after_flush)
    event.listen(Session, "after_commit", _after_commit)
    event.listen(Session, "after_transaction_end", _after_transaction_end)
    after_commit.register_hook(_hook)
    _installed = True
