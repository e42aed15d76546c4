"""The fault-schedule checker (tests/faults/checker.py) in the test suite: a few seeds in
``make test`` (about 10 s), many in ``pytest -m soak``. Every violation is printed with
its seed; replay one with ``python -m tests.faults.checker --seed N``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.checker import run_seeds
from tests.faults.conftest import figure

pytestmark = pytest.mark.timeout(240)


def _run(seeds: list[int], redis_url: str, tmp_path: Path) -> None:
    lines: list[str] = []
    outcomes = run_seeds(seeds, redis_url, workdir=tmp_path, print_fn=lines.append)
    figure("fault-schedule checker\n" + "\n".join(lines))
    assert len(outcomes) == len(seeds)
    assert sum(o.jobs for o in outcomes) > 0
    assert [line for line in lines if "VIOLATION" in line or ": " in line[:14]] == []
    assert all(not o.violations for o in outcomes), "\n".join(lines)


def test_a_few_seeds_hold_every_invariant(redis_url: str, tmp_path: Path) -> None:
    _run([11, 12, 27], redis_url, tmp_path)  # restart + drops; reset + stop; every kind


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_soak_many_seeds(redis_url: str, tmp_path: Path) -> None:
    n = int(os.environ.get("TIDINGS_CHECKER_SEEDS", "300"))
    _run(list(range(1, n + 1)), redis_url, tmp_path)
