"""The warning for a sync push made on a running event loop (it blocks the loop on
Redis); asked by :meth:`tidings.app.App.push_pending` and ``dispatch_many``."""

from __future__ import annotations

import asyncio
import warnings

from tidings.errors import BlockingDispatchWarning

__all__ = ["BlockingDispatchWarning", "warn_blocking"]


_warned_blocking = False


def warn_blocking() -> None:
    """Warn once per process when a sync push runs on an event loop (it blocks it)."""
    global _warned_blocking
    if _warned_blocking or asyncio._get_running_loop() is None:  # no exception raised
        return
    _warned_blocking = True
    warnings.warn(
        "a sync dispatch (event(), job.dispatch(), user.notify()) ran on a running event "
        "loop and blocked it on Redis: use `await app.dispatch_async(e)`, "
        "`await job.dispatch_async()` or `await user.notify_async(n)` in async code",
        BlockingDispatchWarning,
        stacklevel=4,
    )
