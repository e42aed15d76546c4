"""The fault-schedule checker's soak (issue 11): many seeds, the seed of any violation.

    .venv/bin/python benchmarks/checker.py --seeds 1000           # seeds 1..1000
    .venv/bin/python benchmarks/checker.py --seed 417             # replay one seed
    .venv/bin/python benchmarks/checker.py --control --seeds 300  # results, cancels,
                                                                  # priorities (issue 23)

A thin entry point to tests/faults/checker.py (read its docstring for the schedule and
the invariants). Starts its own redis-servers on free loopback ports and stops them (and
every worker it started) by PID. Exit status 1 when any seed broke an invariant.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.faults.checker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
