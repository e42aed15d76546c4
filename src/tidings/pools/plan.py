"""Splitting the pools' processes across hosts (pure): the leader's plan.

Every host runs at least each pool's ``min_processes`` and at most its
``max_processes`` and the host's own ``max_processes``. A pool's total over the hosts
stays within ``max_processes_total`` at every moment, not only once hosts caught up: a
host's *exposure* is the most processes it may run before it reads the next plan
(``max(running now, its previous grant, its new grant)``), and a host is granted more only
while the exposures add up to no more than the total. A host that shrinks frees its room
one plan later, when its report shows the processes gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidings.pools.spec import Pool


@dataclass(frozen=True, slots=True)
class HostState:
    """One host as its last report shows it."""

    host: str
    max_processes: int
    processes: Mapping[str, int] = field(default_factory=dict)  # alive, draining included


def limits_over(pools: Sequence[Pool], hosts: int) -> dict[str, tuple[int, int]]:
    """Each pool's (min, max) over ``hosts`` hosts."""
    out: dict[str, tuple[int, int]] = {}
    for p in pools:
        top = p.max_processes * hosts
        if p.max_processes_total is not None:
            top = min(top, p.max_processes_total)
        out[p.name] = (min(p.min_processes * hosts, top), top)
    return out


def split(
    pools: Sequence[Pool],
    targets: Mapping[str, int],
    hosts: Sequence[HostState],
    previous: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, int]]:
    """Processes per pool per host for the pools' total ``targets``."""
    share: dict[str, dict[str, int]] = {h.host: {} for h in hosts}
    for p in pools:
        for h in hosts:
            now = h.processes.get(p.name, 0)
            share[h.host][p.name] = max(p.min_processes, min(p.max_processes, now))

    def used(host: str) -> int:
        return sum(share[host].values())

    room = {h.host: h.max_processes for h in hosts}
    for p in pools:  # shrink first: what one pool gives up another may take
        want = targets.get(p.name, 0)
        while sum(share[h.host][p.name] for h in hosts) > want:
            h = max(hosts, key=lambda h: (share[h.host][p.name], h.host))
            if share[h.host][p.name] <= p.min_processes:
                break
            share[h.host][p.name] -= 1
    for p in pools:
        want = targets.get(p.name, 0)
        while sum(share[h.host][p.name] for h in hosts) < want:
            open_ = [
                h
                for h in hosts
                if share[h.host][p.name] < p.max_processes and used(h.host) < room[h.host]
            ]
            if not open_:
                break
            h = min(open_, key=lambda h: (share[h.host][p.name], used(h.host), h.host))
            share[h.host][p.name] += 1
    for p in pools:
        if p.max_processes_total is None:
            continue

        def exposure(h: HostState, p: Pool = p) -> int:
            before = previous.get(h.host, {}).get(p.name, 0)
            return max(h.processes.get(p.name, 0), before, share[h.host][p.name])

        while sum(exposure(h) for h in hosts) > p.max_processes_total:
            growing = [h for h in hosts
                       if share[h.host][p.name] > max(h.processes.get(p.name, 0),
                                                      previous.get(h.host, {}).get(p.name, 0))
                       and share[h.host][p.name] > p.min_processes]  # fmt: skip
            if not growing:
                break  # only shrinking hosts are over: their reports free the room
            h = max(growing, key=lambda h: (share[h.host][p.name], h.host))
            share[h.host][p.name] -= 1
    return share
