"""The fault-schedule checker (tests/faults/checker.py) in the test suite: a few seeds in
``make test`` (about 10 s), many in ``pytest -m soak``. Every violation is printed with
its seed; replay one with ``python -m tests.faults.checker --seed N``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.checker import EVERYONE, Span, g0_overlaps, parse_spans, run_seeds
from tests.faults.conftest import figure

pytestmark = pytest.mark.timeout(240)


def _run(
    seeds: list[int],
    redis_url: str,
    tmp_path: Path,
    *,
    state_faults: bool = False,
    groups: bool = False,
    control: bool = False,
) -> list[str]:
    lines: list[str] = []
    outcomes = run_seeds(
        seeds,
        redis_url,
        workdir=tmp_path,
        print_fn=lines.append,
        state_faults=state_faults,
        groups=groups,
        control=control,
    )
    figure("fault-schedule checker\n" + "\n".join(lines))
    assert len(outcomes) == len(seeds)
    assert sum(o.jobs for o in outcomes) > 0
    assert [line for line in lines if "VIOLATION" in line or ": " in line[:14]] == []
    assert all(not o.violations for o in outcomes), "\n".join(lines)
    return lines


def test_a_few_seeds_hold_every_invariant(redis_url: str, tmp_path: Path) -> None:
    _run([11, 12, 27], redis_url, tmp_path)  # restart + drops; reset + stop; every kind


def test_a_few_seeds_hold_with_grouped_producers(redis_url: str, tmp_path: Path) -> None:
    # Fair groups (issue 25): jobs in groups (one at concurrency 1), push_group's replies
    # dropped, the same faults; no group slot or list left once every job settled, and
    # no two runs of the concurrency-1 group overlapped unless a fault waives it.
    _run([11, 12, 27], redis_url, tmp_path, groups=True)


def test_the_group_limit_check_finds_overlapping_runs_and_waives_only_faulted_ones() -> None:
    spans = parse_spans([
        "start a 10 t1 100", "end a 10 t1 200",
        "start b 11 t2 150", "end b 11 t2 250",  # overlaps a: two workers, no fault
        "start c 12 t3 300",                     # never ended (its worker was killed)
        "start d 11 t4 400", "end d 11 t4 450",
    ])  # fmt: skip
    assert spans[2] == Span("c", 12, 300, None)
    pairs = {(x.name, y.name) for x, y in g0_overlaps(spans, set(), set())}
    assert pairs == {("a", "b"), ("c", "d")}
    # Run c was on the killed (or frozen) worker 12: the slot came back after its lease.
    assert {(x.name, y.name) for x, y in g0_overlaps(spans, {12}, set())} == {("a", "b")}
    # b's worker logged its reservation lost: its overlap is waived, c's is not.
    assert {(x.name, y.name) for x, y in g0_overlaps(spans, set(), {"b"})} == {("c", "d")}
    assert g0_overlaps(spans, {EVERYONE}, set()) == []
    assert (
        g0_overlaps(parse_spans(["start a 1 t 1", "end a 1 t 5", "start b 2 u 5"]), set(), set())
        == []
    )


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_soak_many_seeds(redis_url: str, tmp_path: Path) -> None:
    n = int(os.environ.get("TIDINGS_CHECKER_SEEDS", "300"))
    _run(list(range(1, n + 1)), redis_url, tmp_path)


# Faults of the worker's own state (issue 21), one a seed: a job longer than the lease on
# a worker frozen past it (4), wrong-typed keys in one queue of a two-queue worker (3), a
# Redis outage longer than the retry give-up (1; the worker must honour
# TIDINGS_REDIS_GIVE_UP_S), a poison job among ordinary ones (5).


def test_a_few_seeds_hold_under_faults_of_the_workers_own_state(
    redis_url: str, tmp_path: Path
) -> None:
    _run([1, 3, 4, 5], redis_url, tmp_path, state_faults=True)


@pytest.mark.soak
@pytest.mark.timeout(14400)
def test_soak_many_seeds_with_faults_of_the_workers_own_state(
    redis_url: str, tmp_path: Path
) -> None:
    n = int(os.environ.get("TIDINGS_CHECKER_SEEDS", "1000"))
    _run(list(range(1, n + 1)), redis_url, tmp_path, state_faults=True)


# Results, cancels and priorities (issue 23): random priorities, jobs keeping a result, a
# canceller of waiting and running jobs whose replies the proxy may drop (about 12 s).


def test_a_few_seeds_hold_with_results_cancels_and_priorities(
    redis_url: str, tmp_path: Path
) -> None:
    lines = _run([1, 2, 3], redis_url, tmp_path, control=True)
    totals = next(line for line in lines if line.startswith("control checked"))
    # The canceller met jobs waiting and running, and results were written and checked.
    for what in ("cancel cancelled", "cancel cancelling", "results written"):
        assert what in totals, totals


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_soak_many_seeds_with_results_cancels_and_priorities(
    redis_url: str, tmp_path: Path
) -> None:
    n = int(os.environ.get("TIDINGS_CHECKER_SEEDS", "300"))
    _run(list(range(1, n + 1)), redis_url, tmp_path, control=True)
