"""The pools' balancer and plan split, as pure functions (no Redis, no clock).

Properties: targets stay within every bound (pool min/max, the budget) and move at most
``max_shift`` per cooldown; a steady load (noisy or not) settles and then never changes
direction; pools without a wait target share a short budget in proportion to their load;
a backlog with a p95 over target grows the pool, with the reason saying so. The split
across hosts never lets a pool's exposure exceed ``max_processes_total``, and a dead
host's share goes to the hosts left.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings import ConfigurationError, Pool
from tidings.pools.balancer import Balancer, PoolLimits, PoolLoad
from tidings.pools.plan import HostState, split
from tidings.pools.spec import PoolsConfig

LIMITS = [PoolLimits("a", 1, 8, 1.0), PoolLimits("b", 2, 6, None), PoolLimits("c", 0, 5, 0.2)]

loads_st = st.fixed_dictionaries({
    name: st.builds(
        PoolLoad, st.just(name), st.integers(0, 12),
        st.one_of(st.none(), st.floats(0, 120)), st.integers(0, 100_000),
        st.floats(0, 5_000), st.floats(0, 1),
    )
    for name in ("a", "b", "c")
})  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(loads_st, min_size=1, max_size=8), st.integers(3, 20), st.integers(1, 4))
def test_targets_stay_within_bounds_and_move_at_most_max_shift(
    rounds: list[dict[str, PoolLoad]], budget: int, shift: int
) -> None:
    b = Balancer(LIMITS, budget=budget, cooldown_s=3.0, max_shift=shift)
    for i, loads in enumerate(rounds):
        d = b.decide(loads, now=10.0 * i)
        # Pools outside their bounds (or over the budget) are set right first: then
        # the pace gives way to the bounds.
        inside = sum(ld.processes for ld in loads.values()) <= budget and all(
            lim.min_processes <= loads[lim.name].processes <= lim.max_processes for lim in LIMITS
        )
        for lim in LIMITS:
            t = d.targets[lim.name]
            assert lim.min_processes <= t <= lim.max_processes
            if inside:
                assert abs(t - loads[lim.name].processes) <= shift
        # The budget holds whenever the pools were within it before the decision.
        if sum(ld.processes for ld in loads.values()) <= budget:
            assert sum(d.targets.values()) <= budget


def test_within_its_cooldown_a_pool_that_moved_does_not_move_but_the_others_may() -> None:
    b = Balancer(LIMITS, budget=20, cooldown_s=3.0, max_shift=2)
    hot = {"a": PoolLoad("a", 1, 9.0, 1000, 10.0, 1.0)}
    first = b.decide(hot, now=100.0)
    assert first.targets["a"] == 3 and first.changed
    # One second later a burst on c: c grows at once; a (moved 1 s ago) holds.
    burst = {"a": PoolLoad("a", 3, 9.0, 1000, 30.0, 1.0), "c": PoolLoad("c", 0, None, 500)}
    again = b.decide(burst, now=101.0)
    assert again.targets["a"] == 3 and "cooling down" in again.reasons["a"]
    assert again.targets["c"] == 2
    held = b.decide({"a": PoolLoad("a", 3, 9.0, 1000, 30.0, 1.0),
                     "c": PoolLoad("c", 2, 0.5, 500, 100.0, 1.0)}, now=102.0)  # fmt: skip
    assert held.targets == {"a": 3, "b": 2, "c": 2} and not held.changed
    later = b.decide({"a": PoolLoad("a", 3, 9.0, 1000, 30.0, 1.0)}, now=103.0)
    assert later.targets["a"] == 5


def test_a_backlog_over_target_grows_the_pool_with_the_reason() -> None:
    b = Balancer([PoolLimits("mail", 1, 8, 1.0)], budget=10, cooldown_s=3.0, max_shift=2)
    d = b.decide({"mail": PoolLoad("mail", 2, 4.2, 500, 40.0, 1.0)}, now=0.0)
    assert d.targets["mail"] == 4
    assert d.reasons["mail"].startswith("mail: p95 wait 4.2 s > target 1 s")
    assert d.reasons["mail"].endswith("+2 processes")


def _steady(n0: int, rate: float, noise: float, seconds: int) -> list[int]:
    """A pool under a constant (noisy) arrival rate, one decision a second: its processes.

    Each process runs 4 jobs of 50 ms at a time (80 jobs/s)."""
    rnd = random.Random(7)
    b = Balancer([PoolLimits("p", 1, 20, 0.5)], budget=20, cooldown_s=1.0, max_shift=2)
    n, backlog, out = n0, 0.0, []
    for t in range(seconds):
        arrivals = rate * (1 + rnd.uniform(-noise, noise))
        capacity = n * 80.0
        served = min(backlog + arrivals, capacity)
        backlog = backlog + arrivals - served
        wait = backlog / capacity + 0.05
        d = b.decide({"p": PoolLoad("p", n, wait, int(backlog), served, served / capacity)},
                     now=float(t))  # fmt: skip
        n = d.targets["p"]
        out.append(n)
    return out


def _direction_changes(series: list[int]) -> int:
    moves = [b - a for a, b in itertools.pairwise(series) if b != a]
    return sum(1 for x, y in itertools.pairwise(moves) if (x > 0) != (y > 0))


@pytest.mark.parametrize("noise", [0.0, 0.1, 0.25])
@pytest.mark.parametrize("start", [1, 12])
def test_a_steady_load_settles_and_never_oscillates(noise: float, start: int) -> None:
    series = _steady(start, rate=250.0, noise=noise, seconds=900)
    settled = series[60:]
    assert _direction_changes(settled) == 0, settled
    assert 4 <= settled[-1] <= 6  # 250 jobs/s at 80 per process: 3.1 busy, 80 % use


def test_pools_without_targets_share_a_short_budget_by_load() -> None:
    lims = [PoolLimits("x", 1, 20), PoolLimits("y", 1, 20)]
    b = Balancer(lims, budget=10, cooldown_s=1.0, max_shift=20)
    # Load is work in process-seconds: x's backlog takes three times y's to clear at the
    # speed each measured; both need far more than the budget.
    loads = {"x": PoolLoad("x", 4, 30.0, 90_000, 300.0, 1.0),
             "y": PoolLoad("y", 4, 30.0, 10_000, 100.0, 1.0)}  # fmt: skip
    d = b.decide(loads, now=0.0)
    assert sum(d.targets.values()) == 10
    assert d.targets["x"] > d.targets["y"]
    assert d.targets["x"] == pytest.approx(1 + 8 * 0.75, abs=1)


def test_a_idle_pool_shrinks_only_after_the_hold_and_not_below_its_minimum() -> None:
    b = Balancer([PoolLimits("p", 2, 8, 1.0)], budget=10, cooldown_s=1.0, max_shift=2)
    idle = {"p": PoolLoad("p", 8, None, 0, 0.0, 0.0)}
    assert b.decide(idle, now=0.0).targets["p"] == 8  # calm only just began
    assert b.decide(idle, now=1.0).targets["p"] == 8
    assert b.decide(idle, now=2.0).targets["p"] == 6
    seen = [b.decide({"p": PoolLoad("p", n, None, 0, 0.0, 0.0)}, now=3.0 + i).targets["p"]
            for i, n in enumerate([6, 4, 2, 2])]  # fmt: skip
    assert seen == [4, 2, 2, 2]


def test_split_keeps_the_total_within_max_processes_total_while_hosts_catch_up() -> None:
    pool = Pool("p", ["q"], min_processes=1, max_processes=4, max_processes_total=5)
    # h1 was granted 4 and still runs 4; the target moves load to h2. Each round the
    # hosts apply their grants one step at a time (h2 grows by one, h1 shrinks by one).
    running = {"h1": 4, "h2": 1}
    previous: dict[str, dict[str, int]] = {"h1": {"p": 4}, "h2": {"p": 1}}
    for _ in range(8):
        hosts = [HostState(h, 4, {"p": n}) for h, n in running.items()]
        plan = split([pool], {"p": 5}, hosts, previous)
        # What a host may run before it reads the next plan.
        exposure = sum(max(running[h], previous[h]["p"], plan[h]["p"]) for h in running)
        assert exposure <= 5
        for h in running:
            goal = plan[h]["p"]
            running[h] += (goal > running[h]) - (goal < running[h])
        previous = plan
    assert sum(previous[h]["p"] for h in previous) == 5


def test_split_gives_a_dead_hosts_share_to_the_hosts_left() -> None:
    pool = Pool("p", ["q"], min_processes=1, max_processes=6, max_processes_total=6)
    both = [HostState("h1", 6, {"p": 3}), HostState("h2", 6, {"p": 3})]
    plan = split([pool], {"p": 6}, both, {})
    assert plan == {"h1": {"p": 3}, "h2": {"p": 3}}
    alone = split([pool], {"p": 6}, [HostState("h1", 6, {"p": 3})], plan)
    assert alone == {"h1": {"p": 6}}


def test_bad_pool_declarations_name_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="max_processes="):
        Pool("p", ["q"], min_processes=3, max_processes=2)
    with pytest.raises(ConfigurationError, match="queues="):
        Pool("p", [])
    with pytest.raises(ConfigurationError, match="balance="):
        PoolsConfig(pools=(Pool("p", ["q"]),), balance="sometimes")
    with pytest.raises(ConfigurationError, match="max_processes="):
        PoolsConfig(pools=(Pool("p", ["q"], min_processes=3, max_processes=3),), max_processes=2)


def test_a_pool_over_a_tighter_target_holds_the_growth_of_looser_ones() -> None:
    lims = [PoolLimits("fast", 1, 2, 0.5), PoolLimits("slow", 1, 8, 1.0)]
    b = Balancer(lims, budget=12, cooldown_s=1.0, max_shift=2)
    slow_late = PoolLoad("slow", 2, 9.0, 4000, 80.0, 1.0)
    d = b.decide({"fast": PoolLoad("fast", 1, 0.1, 0, 50.0, 0.2), "slow": slow_late}, now=0.0)
    assert d.targets["slow"] == 4  # fast meets its target: slow grows
    # fast is over its target and can still grow: it grows, and so does slow.
    d = b.decide({"fast": PoolLoad("fast", 1, 2.5, 300, 50.0, 1.0),
                  "slow": PoolLoad("slow", 4, 9.0, 4000, 160.0, 1.0)}, now=1.0)  # fmt: skip
    assert d.targets["fast"] == 2 and d.targets["slow"] == 6
    # fast is over its target at its maximum: slow holds.
    d = b.decide({"fast": PoolLoad("fast", 2, 2.5, 300, 50.0, 1.0),
                  "slow": PoolLoad("slow", 6, 9.0, 4000, 240.0, 1.0)}, now=2.0)  # fmt: skip
    assert d.targets["slow"] == 6
    assert "held: fast (tighter target) is over its target" in d.reasons["slow"]
