"""After-commit dispatch: hold a push until the surrounding database transaction commits.

A job, listener or notification with ``after_commit = True`` (or any, under the App's
``after_commit`` default) is encoded at once, so a value that cannot be queued still
raises at the call, but pushed only when the transaction the caller is in commits, and
dropped when it rolls back. Outside a transaction it is pushed at once.

Which transaction is "surrounding" is asked of the registered hooks, newest first:

- :mod:`tidings.contrib.django` registers one that defers through Django's
  ``transaction.on_commit`` while ``connection.in_atomic_block``;
- :mod:`tidings.contrib.sqlalchemy` one that defers to the SQLAlchemy ``Session`` whose
  transaction is open in this context (begun explicitly, or holding writes).

A hook returns a deferrer (``defer(callback)``) or None when no transaction is open.
"""

from __future__ import annotations

from collections.abc import Callable

Callback = Callable[[], object]
Deferrer = Callable[[Callback], None]
TransactionHook = Callable[[], Deferrer | None]

_hooks: list[TransactionHook] = []


def register_hook(hook: TransactionHook) -> None:
    """Ask ``hook`` (first) whether a transaction is open; registering twice is a no-op."""
    if hook not in _hooks:
        _hooks.insert(0, hook)


def unregister_hook(hook: TransactionHook) -> None:
    """Stop asking ``hook``."""
    if hook in _hooks:
        _hooks.remove(hook)


def deferrer() -> Deferrer | None:
    """The deferrer of the innermost open transaction, or None outside one."""
    for hook in _hooks:
        defer = hook()
        if defer is not None:
            return defer
    return None
