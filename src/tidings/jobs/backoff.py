"""Retry delays: fixed seconds, a list per attempt, or exponential with jitter."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidings.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Exponential:
    """``base_s * factor ** (attempt - 1)``, capped at ``max_s``, with full jitter."""

    base_s: float = 1.0
    factor: float = 2.0
    max_s: float = 300.0
    jitter: bool = True


def encode_backoff(value: Any) -> Any:
    """The payload form of a ``backoff`` option (None, seconds, list or Exponential)."""
    if value is None:
        return None
    if isinstance(value, Exponential):
        return {"exp": value.base_s, "f": value.factor, "max": value.max_s, "j": value.jitter}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [float(v) for v in value]
    raise ConfigurationError(
        f"backoff must be seconds, a list of seconds or Exponential, not {value!r}"
    )


def delay_for(spec: Any, attempt: int, *, default_s: float = 0.0) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if spec is None:
        return default_s
    if isinstance(spec, list) and spec:
        return max(0.0, float(spec[min(attempt, len(spec)) - 1]))
    if isinstance(spec, dict) and "exp" in spec:
        cap = float(spec["max"])
        try:
            ceiling = min(cap, float(spec["exp"]) * float(spec["f"]) ** (attempt - 1))
        except OverflowError:  # attempt ~1000+ with unlimited tries: long past the cap
            ceiling = cap
        if spec.get("j", True):
            # "Equal jitter": at least half the delay, so retries never bunch at zero.
            return ceiling / 2 + random.uniform(0, ceiling / 2)
        return ceiling
    return default_s
