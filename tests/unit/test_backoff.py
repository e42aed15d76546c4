"""Retry delays: the payload form of ``backoff`` and the delay chosen per attempt."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tidings.errors import ConfigurationError
from tidings.jobs.backoff import Exponential, delay_for, encode_backoff


@pytest.mark.parametrize(
    ("option", "encoded"),
    [
        (None, None),
        (5, [5.0]),
        (0.25, [0.25]),
        ([1, 5, 10], [1.0, 5.0, 10.0]),
        ((2, 3), [2.0, 3.0]),
        ([], []),
        (Exponential(), {"exp": 1.0, "f": 2.0, "max": 300.0, "j": True}),
        (Exponential(0.2, 3.0, 5.0, jitter=False), {"exp": 0.2, "f": 3.0, "max": 5.0, "j": False}),
    ],
    ids=repr,
)
def test_encode_backoff(option: Any, encoded: Any) -> None:
    assert encode_backoff(option) == encoded


@pytest.mark.parametrize("bad", [True, "5", {"a": 1}, object(), [1, "x"]], ids=repr)
def test_encode_backoff_refuses_other_values(bad: Any) -> None:
    with pytest.raises((ConfigurationError, ValueError)):
        encode_backoff(bad)


def test_fixed_and_list_delays_per_attempt() -> None:
    assert delay_for([3.0], 1) == 3.0
    assert delay_for([3.0], 7) == 3.0
    spec = encode_backoff([1, 5, 10])
    assert [delay_for(spec, a) for a in (1, 2, 3, 4, 10)] == [1.0, 5.0, 10.0, 10.0, 10.0]
    assert delay_for([-5.0], 1) == 0.0  # never negative


def test_default_applies_when_the_job_sets_none() -> None:
    assert delay_for(None, 1, default_s=2.5) == 2.5
    assert delay_for([], 1, default_s=2.5) == 2.5
    assert delay_for(None, 3) == 0.0


def test_exponential_without_jitter_doubles_and_caps() -> None:
    spec = encode_backoff(Exponential(base_s=0.5, factor=2.0, max_s=3.0, jitter=False))
    assert [delay_for(spec, a) for a in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_exponential_with_jitter_stays_between_half_and_full() -> None:
    spec = encode_backoff(Exponential(base_s=1.0, factor=2.0, max_s=10.0))
    rng_state = random.getstate()
    try:
        random.seed(1234)
        for attempt in range(1, 8):
            ceiling = min(10.0, 2.0 ** (attempt - 1))
            delays = [delay_for(spec, attempt) for _ in range(200)]
            assert all(ceiling / 2 <= d <= ceiling for d in delays)
            assert len(set(delays)) > 1  # actually jittered
    finally:
        random.setstate(rng_state)


def test_huge_attempt_numbers_do_not_overflow_past_the_cap() -> None:
    spec = encode_backoff(Exponential(base_s=1.0, factor=2.0, max_s=60.0, jitter=False))
    assert delay_for(spec, 1000) == 60.0
    assert delay_for(spec, 5000) == 60.0  # 2.0 ** 4999 would overflow a float
