"""What a process measures of itself: its resident memory (``--memory``, heartbeats)."""

from __future__ import annotations

import os


def rss_mb() -> float:
    """The resident memory of this process, in MB (peak RSS where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:  # pragma: no cover - non-Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
