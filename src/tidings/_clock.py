"""The one place tidings reads the local clock (tests patch these).

Scheduling decisions never use it: the Lua scripts read Redis ``TIME``, so a worker
with a skewed clock cannot expire or delay jobs early. This clock only stamps
``pushedAt`` and measures durations.
"""

from __future__ import annotations

import math
import time


def now() -> float:
    """Seconds since the epoch, as a float."""
    return time.time()


def monotonic() -> float:
    """A monotonic clock for measuring durations."""
    return time.monotonic()


def delay_ms(delay_s: float) -> int:
    """A delay in whole milliseconds for a script that schedules on Redis ``TIME``,
    rounded up so a job never comes due before its time: the scripts read ``TIME``
    truncated to the millisecond (up to 1 ms early), so 1 ms is added to any delay."""
    if delay_s <= 0:
        return 0
    return math.ceil(delay_s * 1000) + 1
