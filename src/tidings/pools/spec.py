"""What a pool is: :class:`Pool` (declared in code) and :class:`PoolsConfig` (the App's
``pools=``, ``max_processes=``, ``balance=``, ``cooldown_s=``, ``max_shift=``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidings.errors import ConfigurationError

BALANCE_MODES = ("auto", "off")


@dataclass(frozen=True, slots=True)
class Pool:
    """Worker processes for a set of queues (listed in priority order).

    Args:
        name: the pool's name (shown by ``notify-worker workers`` and the dashboard).
        queues: the queues its processes take jobs from, highest priority first.
        min_processes, max_processes: bounds of its processes on one host.
        concurrency: jobs in flight per process.
        target_wait_s: the p95 wait (dispatch to start) to keep; None: share processes in
            proportion to the measured load.
        max_processes_total: bound of its processes over every host that runs it.
    """

    name: str
    queues: Sequence[str] = ("default",)
    min_processes: int = 1
    max_processes: int = 1
    concurrency: int = 16
    target_wait_s: float | None = None
    max_processes_total: int | None = None

    def __post_init__(self) -> None:
        where = f"Pool({self.name!r}, ...)"
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigurationError(f"{where}: name must be letters, digits, '-', '_' or '.'")
        if isinstance(self.queues, str):
            object.__setattr__(self, "queues", (self.queues,))
        object.__setattr__(self, "queues", tuple(self.queues))
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            raise ConfigurationError(f"{where}: queues= must name at least one queue")
        if self.min_processes < 0:
            raise ConfigurationError(f"{where}: min_processes= must be 0 or more")
        if self.max_processes < max(1, self.min_processes):
            raise ConfigurationError(
                f"{where}: max_processes= must be at least 1 and at least min_processes="
            )
        if self.concurrency < 1:
            raise ConfigurationError(f"{where}: concurrency= must be at least 1")
        if self.target_wait_s is not None and not self.target_wait_s > 0:
            raise ConfigurationError(f"{where}: target_wait_s= must be above 0 (or None)")
        if self.max_processes_total is not None and self.max_processes_total < 1:
            raise ConfigurationError(f"{where}: max_processes_total= must be at least 1")


@dataclass(frozen=True, slots=True)
class PoolsConfig:
    """The App's pools and how they balance (``App(pools=[...], max_processes=...)``)."""

    pools: tuple[Pool, ...] = ()
    max_processes: int | None = None
    balance: str = "auto"
    cooldown_s: float = 3.0
    max_shift: int = 2
    lease_s: float = 5.0

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ConfigurationError("App(pools=...): two pools share a name")
        if self.balance not in BALANCE_MODES:
            raise ConfigurationError(
                f"App(balance={self.balance!r}): use 'auto' (balance by measured wait) or "
                "'off' (each pool keeps min_processes)"
            )
        if self.cooldown_s <= 0:
            raise ConfigurationError("App(cooldown_s=...): must be above 0")
        if self.max_shift < 1:
            raise ConfigurationError("App(max_shift=...): must be at least 1")
        if self.max_processes is not None and self.max_processes < sum(
            p.min_processes for p in self.pools
        ):
            raise ConfigurationError(
                "App(max_processes=...): below the sum of the pools' min_processes"
            )

    @property
    def host_max(self) -> int:
        """This host's bound on processes over all pools."""
        if self.max_processes is not None:
            return self.max_processes
        return sum(p.max_processes for p in self.pools)

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)
