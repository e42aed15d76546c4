"""Fair groups at dispatch: which group a job joins, and the check of a group key.

A job joins a group by ``Job(...).on_group("acme")``, else by a ``group`` hook on its job,
listener or notification class: a method returning the key (called with the listener's
event arguments or the notification's notifiable when it takes them), or an attribute.
No group: the job is queued as before. See docs/groups.md and
:mod:`tidings.moves.groups` for what Redis does with it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from tidings.errors import ValidationError
from tidings.wire.group_key import GROUP_MAX_BYTES, check_group

if TYPE_CHECKING:
    from tidings.jobs.job import PendingDispatch

__all__ = ["GROUP_MAX_BYTES", "check_group", "group_of", "no_group_for_unique"]


def _call_hook(hook: Any, args: tuple[Any, ...]) -> Any:
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return hook()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return hook(*args)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return hook(*args[: len(positional)])


def group_of(pending: PendingDispatch) -> str | None:
    """The group a dispatch joins: ``on_group``, else the ``group`` hook of the job (or
    its listener or notification), else None (no group).

    Raises:
        ValidationError: an empty, over-long or control-character key; nothing is pushed.
    """
    if pending.group is not None:
        return check_group(pending.group, "on_group()")
    job = pending.job
    src = job.option_source()
    hook = getattr(src, "group", None)
    if hook is None:
        return None
    value = _call_hook(hook, job.group_args()) if callable(hook) else hook
    if value is None:
        return None
    return check_group(value, f"the group hook of {job.display_name()}")


def no_group_for_unique(pending: PendingDispatch) -> None:
    """Refuse a unique or debounced job that asks for a group (not supported yet: its
    push is a different script), rather than queue it outside its group silently.

    Raises:
        ValidationError: the job has a group (``on_group`` or a ``group`` hook).
    """
    if group_of(pending) is not None:
        raise ValidationError(
            f"{pending.job.display_name()} is unique or debounced and has a fair group "
            "(on_group() or a group hook): the two do not combine yet; drop one of them"
        )
