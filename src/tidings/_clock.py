"""The one place tidings reads the local clock (tests patch these).

Scheduling decisions never use it: the Lua scripts read Redis ``TIME``, so a worker
with a skewed clock cannot expire or delay jobs early. This clock only stamps
``pushedAt`` and measures durations.
"""

from __future__ import annotations

import time


def now() -> float:
    """Seconds since the epoch, as a float."""
    return time.time()


def monotonic() -> float:
    """A monotonic clock for measuring durations."""
    return time.monotonic()
