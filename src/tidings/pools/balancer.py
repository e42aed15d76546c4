"""The balancer: measured load in, processes per pool out. Pure (no I/O, no clock).

Input per pool (:class:`PoolLoad`): its processes now, the p95 wait (dispatch to start)
of the jobs it started lately, its backlog (ready jobs on its queues), the jobs it
started per second and its busy fraction (running jobs / capacity). Output
(:class:`Decision`): a target number of processes per pool, each with the reason.

How a pool's need is estimated (``T`` = its ``target_wait_s``, else ``default_wait_s``):

* ``used = busy x processes`` is the processes' worth of work running now, and
  ``speed = started_per_s / used`` what one fully busy process gets through.
* It needs ``used / 0.8 + backlog / (speed x T)`` processes: enough to run what runs now
  at 80 % and to clear the backlog within its wait target.
* It grows when jobs wait and either the measured p95 is over ``T`` or the need exceeds
  its processes (by a quarter) while the p95 is past ``T / 4``: the measured wait, not an
  estimate from a handful of jobs, says when. A backlog with no speed measured yet (no
  job started) grows it by ``max_shift``.
* It shrinks only when calm (p95 under ``T / 2``, backlog clearing in a tenth of ``T``)
  for two cooldowns, never within two cooldowns of growing, and only to what the last
  two cooldowns used: on average at 60 % use and at their busiest at 80 %. A steady
  load, noise included, stays inside the band between the two rules: nothing moves.
* A shrink undone within ``REGROW_S`` cooldowns was wrong: the pool keeps the size it
  shrank from until its load stays under half of what it was then for ``REGROW_S``
  cooldowns.

Tighter targets first: while a pool with a tighter ``target_wait_s`` is over it at its
``max_processes``, pools with looser or no targets do not grow. (No backlog is asked
for: a worker starved of CPU holds its jobs reserved, late, with its queue empty.)

Bounds: each pool stays within ``[min_processes, max_processes]``; the pools together
stay within ``budget``; when their needs add up to more, each gets its minimum and the
rest is shared in proportion to their need above it (the measured load). Every call
judges every pool, but a pool moves at most once per ``cooldown_s`` and by at most
``max_shift`` (a burst on one pool is answered at the next step, not at the next cooldown
shared by all). Shrinks are applied before growths, and growths only into the room left.

Spare budget: a pool whose target is looser than the default goal, with a p95 past that
goal and a backlog of three processes' worth beyond it, may grow into the budget no pool
needs for its own target, to clear the backlog within the default goal; the usual
shrinking rules bring it back once calm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

GROW_USE = 0.8
SHRINK_USE = 0.6
SHRINK_HOLD_COOLDOWNS = 2.0
PRESSURE_CLEAR = 0.25  # processes needed beyond those running before a backlog grows a pool
CALM_CLEAR = 0.1
REGROW_S = 10.0  # cooldowns: a growth this soon after a shrink undoes it
REGROW_RELEASE = 0.5  # ... and waits for the load to stay under half for REGROW_S cooldowns


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """What the balancer knows of a pool's declaration."""

    name: str
    min_processes: int
    max_processes: int
    target_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """A pool's measured load (see the module docstring)."""

    name: str
    processes: int
    wait_p95_s: float | None = None
    backlog: int = 0
    started_per_s: float = 0.0
    busy: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """Target processes per pool and why; ``changed`` when a target differs from now."""

    at: float
    targets: dict[str, int]
    reasons: dict[str, str]
    changed: bool
    decided: bool = True  # False: within the cooldown, the targets are the processes now


@dataclass(slots=True)
class _Memory:
    last_at: float | None = None
    grew_at: dict[str, float] = field(default_factory=dict)
    moved_at: dict[str, float] = field(default_factory=dict)
    low_since: dict[str, float] = field(default_factory=dict)
    shrunk: dict[str, tuple[float, int, float]] = field(default_factory=dict)  # at, from, used
    floor: dict[str, tuple[int, float]] = field(default_factory=dict)  # processes, used
    floor_low: dict[str, float] = field(default_factory=dict)  # load under half since
    recent: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (at, used)


def _fmt(s: float | None) -> str:
    if s is None:
        return "none measured"
    if math.isinf(s):
        return "unbounded"
    return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"


class Balancer:
    """Decides processes per pool (see the module docstring)."""

    def __init__(
        self,
        limits: Sequence[PoolLimits],
        *,
        budget: int,
        cooldown_s: float = 3.0,
        max_shift: int = 2,
        default_wait_s: float | None = None,
    ) -> None:
        self.limits = {p.name: p for p in limits}
        self.budget = budget
        self.cooldown_s = cooldown_s
        self.max_shift = max_shift
        self.default_wait_s = default_wait_s if default_wait_s is not None else cooldown_s
        self._mem = _Memory()

    def _target(self, lim: PoolLimits) -> float:
        return lim.target_wait_s if lim.target_wait_s is not None else self.default_wait_s

    def _eager(self, lim: PoolLimits, load: PoolLoad) -> int:
        """What a pool with a target looser than the default goal would take of a spare
        budget: enough to clear its backlog within the default goal (0: nothing more)."""
        t = self.default_wait_s
        if lim.target_wait_s is None or lim.target_wait_s <= t or load.backlog <= 0:
            return 0
        n = load.processes
        used = max(0.0, min(1.0, load.busy)) * n
        if used <= 0.05 or load.started_per_s <= 1e-6:
            return n + self.max_shift if load.backlog > 0 and used <= 0.05 else 0
        speed = load.started_per_s / used
        clear = min(1e6, load.backlog / (speed * t))
        need = used / GROW_USE + clear
        wait = load.wait_p95_s
        # A backlog of three processes' worth beyond the goal: not a queueing blip.
        if clear >= 3.0 and need > n + PRESSURE_CLEAR and wait is not None and wait > t:
            return max(n + 1, math.ceil(need - 1e-9))
        return 0

    def _need(self, lim: PoolLimits, load: PoolLoad, now: float) -> tuple[int, str]:
        """The processes a pool needs (before bounds and sharing), and why."""
        n = load.processes
        t = self._target(lim)
        used = max(0.0, min(1.0, load.busy)) * n
        speed = load.started_per_s / used if used > 0.05 and load.started_per_s > 1e-6 else None
        wait = load.wait_p95_s
        over = wait is not None and wait > t
        goal = "target" if lim.target_wait_s is not None else "goal"
        why_wait = f"p95 wait {_fmt(wait)} {'>' if over else '<='} {goal} {_fmt(t)}"
        if load.backlog > 0 and speed is None:
            if used > 0.05 and not over:
                # Busy, no finished starts measured yet: judge by use alone.
                return max(n, math.ceil(used / GROW_USE)), f"{why_wait}, busy {load.busy:.0%}"
            return n + self.max_shift, f"{why_wait}, backlog {load.backlog} and no speed yet"
        clear = min(1e6, load.backlog / (speed * t)) if speed else 0.0
        need = used / GROW_USE + clear
        # Grow on a measured p95 over the target with jobs waiting, or on a backlog the
        # processes cannot clear in time once the p95 is past a quarter of the target
        # (the measured wait, not a guess from a few jobs, says when).
        waiting = wait is None or wait > t / 4
        if load.backlog > 0 and (over or (need > n + PRESSURE_CLEAR and waiting)):
            up = max(n + 1, math.ceil(need - 1e-9))
            self._mem.low_since.pop(lim.name, None)
            return up, f"{why_wait}, backlog {load.backlog}, busy {load.busy:.0%}"
        calm = (wait is None or wait < t / 2) and clear < CALM_CLEAR
        if not calm:
            self._mem.low_since.pop(lim.name, None)
            return n, f"{why_wait}, busy {load.busy:.0%}: steady"
        # Shrink to what the last hold used: on average at 60 % use, at its busiest 80 %.
        since = self._mem.low_since.setdefault(lim.name, now)
        seen = [used, *(u for _, u in self._mem.recent.get(lim.name, []))]
        mean, peak = sum(seen) / len(seen), max(seen)
        room = max(mean / SHRINK_USE, peak / GROW_USE) + clear
        down = max(1 if peak > 0 else 0, math.ceil(room - 1e-9))
        floor = self._mem.floor.get(lim.name)
        if floor is not None:
            # A shrink that had to be undone is not repeated until the load falls to half
            # of what it was then.
            if peak >= floor[1] * REGROW_RELEASE:
                self._mem.floor_low.pop(lim.name, None)
            elif now - self._mem.floor_low.setdefault(lim.name, now) >= REGROW_S * self.cooldown_s:
                del self._mem.floor[lim.name]
                floor = None
            if floor is not None:
                down = max(down, floor[0])
        if down >= n:
            return n, f"{why_wait}, busy {load.busy:.0%}: steady"
        grew = self._mem.grew_at.get(lim.name)
        hold = SHRINK_HOLD_COOLDOWNS * self.cooldown_s
        if now - since >= hold and (grew is None or now - grew >= hold):
            return down, f"{why_wait}, busy {load.busy:.0%}, backlog {load.backlog}"
        return n, f"{why_wait}, busy {load.busy:.0%}: waiting before shrinking"

    def decide(self, loads: Mapping[str, PoolLoad], now: float) -> Decision:
        """Targets for ``now``; the current processes when within the cooldown."""
        current = {
            name: loads[name].processes if name in loads else lim.min_processes
            for name, lim in self.limits.items()
        }
        mem = self._mem
        hold = SHRINK_HOLD_COOLDOWNS * self.cooldown_s
        for name, load in loads.items():  # every sample counts for the peak of the hold
            used = max(0.0, min(1.0, load.busy)) * load.processes
            kept = [(at, u) for at, u in mem.recent.get(name, []) if at >= now - hold]
            mem.recent[name] = [*kept, (now, used)]
        # Each pool moves at most once per cooldown; the others are judged at every call,
        # so a burst is answered at the next step, not at the next shared cooldown.
        frozen = {n for n, at in mem.moved_at.items() if now - at < self.cooldown_s}
        if frozen >= set(self.limits):
            return Decision(now, current, {n: "cooling down" for n in current}, False, False)
        mem.last_at = now
        wanted: dict[str, int] = {}
        needs: dict[str, int] = {}
        why: dict[str, str] = {}
        for name, lim in self.limits.items():
            load = loads.get(name, PoolLoad(name, current[name]))
            need, reason = self._need(lim, load, now)
            needs[name] = need
            wanted[name] = max(lim.min_processes, min(lim.max_processes, need))
            why[name] = reason
            if wanted[name] != need:
                why[name] += f" (bounded to {wanted[name]})"
        # Tighter targets first: while a pool with a tighter wait target is over it and
        # cannot grow (at its maximum), pools with looser (or no) targets do not grow. On
        # a host short of CPU more processes for one pool slow every other; the pool that
        # promised less wait keeps it.
        late = [
            (lim.target_wait_s, n) for n, lim in self.limits.items()
            if lim.target_wait_s is not None and n in loads
            and (loads[n].wait_p95_s or 0.0) > lim.target_wait_s
            and current[n] >= lim.max_processes
        ]  # fmt: skip
        for name, lim in self.limits.items():
            mine = lim.target_wait_s if lim.target_wait_s is not None else math.inf
            tighter = sorted(n for t, n in late if t < mine)
            if tighter and wanted[name] > current[name]:
                wanted[name] = max(lim.min_processes, current[name])
                why[name] += f", held: {tighter[0]} (tighter target) is over its target"
        shared = self._share(wanted, needs)
        for name in wanted:
            if shared[name] < wanted[name]:
                why[name] += f", {shared[name]} of the {self.budget} shared by load"
        # Spare budget (what no pool needs for its target): a pool with a backlog and a
        # target looser than the default goal may grow into it to clear the backlog
        # within the default goal; it shrinks back by the usual rules once calm.
        room = self.budget - sum(shared.values())
        for name in sorted(self.limits, key=lambda n: self._target(self.limits[n])):
            lim = self.limits[name]
            if room <= 0 or name not in loads or any(t < self._target(lim) for t, _ in late):
                continue  # (held: a pool with a tighter target is over it at its maximum)
            eager = min(lim.max_processes, self._eager(lim, loads[name]))
            extra = min(room, eager - shared[name])
            if extra > 0:
                shared[name] += extra
                room -= extra
                why[name] += f", +{extra} of the spare budget (backlog {loads[name].backlog})"
        for name in frozen:
            why[name] = "cooling down"
        targets = self._step(current, shared, frozen)
        reasons: dict[str, str] = {}
        for name, target in targets.items():
            delta = target - current[name]
            move = f"{delta:+d} process{'es' if abs(delta) != 1 else ''}" if delta else "no change"
            reasons[name] = f"{name}: {why[name]}, {move}"
            if delta:
                mem.moved_at[name] = now
            if delta < 0:
                used_now = sum(u for _, u in mem.recent.get(name, [])) / max(
                    1, len(mem.recent.get(name, []))
                )
                mem.shrunk[name] = (now, current[name], used_now)
            if delta > 0:
                shrunk = mem.shrunk.pop(name, None)
                if shrunk is not None and now - shrunk[0] <= REGROW_S * self.cooldown_s:
                    mem.floor[name] = (shrunk[1], shrunk[2])  # that shrink was wrong
                mem.grew_at[name] = now
                mem.low_since.pop(name, None)
            # A shrink keeps the calm's start: a pool still calm goes on shrinking.
        return Decision(now, targets, reasons, targets != current)

    def _share(self, wanted: dict[str, int], needs: dict[str, int]) -> dict[str, int]:
        """Fit the wants into the budget: minimums first, the rest in proportion to each
        pool's need above its minimum (none gets more than it wants)."""
        if sum(wanted.values()) <= self.budget:
            return dict(wanted)
        out = {n: self.limits[n].min_processes for n in wanted}
        room = max(0, self.budget - sum(out.values()))
        open_ = {n for n in wanted if wanted[n] > out[n]}
        while room > 0 and open_:
            weight = {n: max(1e-9, needs[n] - self.limits[n].min_processes) for n in open_}
            total = sum(weight.values())
            exact = {n: room * weight[n] / total for n in open_}
            capped = {n for n in open_ if out[n] + exact[n] >= wanted[n]}
            if capped:  # these get all they want; share the rest again
                for n in capped:
                    room -= wanted[n] - out[n]
                    out[n] = wanted[n]
                open_ -= capped
                continue
            for n in open_:
                out[n] += math.floor(exact[n])
            left = self.budget - sum(out.values())
            for n in sorted(open_, key=lambda n: exact[n] - math.floor(exact[n]), reverse=True):
                if left <= 0:
                    break
                out[n] += 1
                left -= 1
            break
        return out

    def _step(
        self, current: dict[str, int], shared: dict[str, int], frozen: set[str]
    ) -> dict[str, int]:
        """At most ``max_shift`` per pool; shrinks first, growths into the room left;
        pools that moved within the cooldown stay (bounds apart)."""
        out: dict[str, int] = {}
        for n, want in shared.items():
            lim = self.limits[n]
            cur = current[n]
            if n in frozen:
                out[n] = cur
            elif want < cur:
                out[n] = max(want, cur - self.max_shift, lim.min_processes)
            else:
                out[n] = max(cur, lim.min_processes) if cur < lim.min_processes else cur
        # Pools below their minimum (a new host) or above their maximum are set right.
        for n in out:
            lim = self.limits[n]
            out[n] = min(max(out[n], lim.min_processes), lim.max_processes)
        # Raising pools to their minimum may overrun the budget: the others then shrink
        # past max_shift (bounds come before pace), the most over their share first.
        while sum(out.values()) > self.budget:
            over = [n for n in out if out[n] > max(shared[n], self.limits[n].min_processes)]
            if not over:
                break
            out[max(over, key=lambda n: out[n] - shared[n])] -= 1
        room = self.budget - sum(out.values())
        growing = sorted((n for n in shared if shared[n] > out[n] and n not in frozen),
                         key=lambda n: shared[n] - out[n], reverse=True)  # fmt: skip
        for n in growing:
            if room <= 0:
                break
            step = min(shared[n] - out[n], self.max_shift, room)
            out[n] += step
            room -= step
        return out
