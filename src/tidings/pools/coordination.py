"""Pools across hosts, through Redis: reports, a leader lease, a plan, measured load.

Every supervisor, once a second:

1. reports itself (``pools_report``: its processes per pool, running jobs, its
   ``max_processes``); the record lives one lease, so a dead host drops out within one;
2. takes or renews the leader lease (``pools_lead``); the leader reads every live host's
   report and the queues' measured wait and backlog, runs the :class:`Balancer` on the
   totals, splits them across the hosts (:func:`tidings.pools.plan.split`) and publishes
   the plan fenced by its lease (``pools_plan``, which also logs the decision and a
   sample of processes per pool for the dashboard);
3. reads the plan and applies its own share.

When Redis does not answer, :meth:`Coordinator.step` raises and the supervisor keeps its
processes as they are until it answers again.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tidings.observability.metrics import HIST_MS, NBUCKETS, Counts, minute_of, queue_minute_key
from tidings.pools.balancer import Balancer, Decision, PoolLimits, PoolLoad
from tidings.pools.plan import HostState, limits_over, split
from tidings.pools.spec import PoolsConfig
from tidings.redis import scripts

KEEP = 720  # decisions and samples kept for the dashboard
SAMPLE_EVERY_S = 5.0  # a sample of processes per pool (720 of them: the last hour)
KEEP_S = 7200


def pools_key(prefix: str, what: str) -> str:
    """``{prefix}:{pools}:<what>`` (one hash slot: the scripts touch several)."""
    return f"{prefix}:{{pools}}:{what}"


@dataclass(slots=True)
class LocalPool:
    """What this host runs of one pool (the supervisor fills it)."""

    alive: int = 0  # processes, draining ones included
    active: int = 0  # processes not draining
    running: int = 0  # jobs running in them


def p95_s(hist: Sequence[int]) -> float | None:
    """The upper bound of the p95 bucket of a wait histogram, in seconds."""
    total = sum(hist)
    if not total:
        return None
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= 0.95 * total:
            return HIST_MS[i] / 1000 if i < len(HIST_MS) else HIST_MS[-1] * 2 / 1000
    return None  # pragma: no cover


@dataclass(slots=True)
class _Window:
    hist: list[int] = field(default_factory=lambda: [0] * NBUCKETS)
    started: int = 0
    run_s: float = 0.0  # runtime of the jobs finished in the window
    since: float = 0.0


class Coordinator:
    """One host's side of the pools (see the module docstring)."""

    def __init__(
        self, config: PoolsConfig, client: Any, prefix: str, ready_keys: Mapping[str, Sequence[str]]
    ) -> None:
        self.config = config
        self.client = client
        self.prefix = prefix
        self.ready_keys = ready_keys  # queue -> its ready list and priority zset keys
        self.host = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_ms = int(config.lease_s * 1000)
        self.leader = False
        self.balancer: Balancer | None = None
        self._seen: dict[tuple[str, int], Counts] = {}
        self._window: dict[str, _Window] = {}  # per pool: the last cooldown's measures
        self._steps: dict[str, list[_Window]] = {}  # per pool: each step's, for a cooldown
        self._first: dict[str, float] = {}  # per pool: when this term began measuring
        self._seq = 0
        self._previous: dict[str, dict[str, int]] = {}
        self._freed: dict[str, int] = {}  # per pool: grants of hosts gone, not yet regranted
        self.last_decision: Decision | None = None
        self._sampled_at = 0.0

    def key(self, what: str) -> str:
        return pools_key(self.prefix, what)

    # -- one step ----------------------------------------------------------------------

    def step(self, local: Mapping[str, LocalPool], now: float) -> dict[str, int] | None:
        """Report, lead if this host holds the lease, and return this host's share
        (None: no plan names this host yet). Raises the client's errors."""
        report = {
            "host": self.host,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "max_processes": self.config.host_max,
            "pools": {
                n: {"alive": p.alive, "active": p.active, "running": p.running}
                for n, p in local.items()
            },
            "at": time.time(),
        }
        scripts.POOLS_REPORT.call(
            self.client,
            [self.key("hosts"), self.key(f"host:{self.host}")],
            [self.host, self.lease_ms, orjson.dumps(report)],
        )
        lead = scripts.POOLS_LEAD.call(
            self.client, [self.key("leader")], [self.host, self.lease_ms]
        )
        if int(lead) == 1:
            if not self.leader:
                self.leader = True
                self.balancer = None  # a new term starts from what it measures
                self._steps, self._first = {}, {}
                self._take_over()
            self._lead(now)
        else:
            self.leader = False
        raw = self.client.get(self.key("plan"))
        if not raw:
            return None
        plan = orjson.loads(raw)
        mine = plan.get("hosts", {}).get(self.host)
        return {str(k): int(v) for k, v in mine.items()} if isinstance(mine, dict) else None

    def leave(self) -> None:
        """A clean stop: drop this host's report and, if it leads, the lease, so the
        others take over at their next step instead of a lease later."""
        self.client.zrem(self.key("hosts"), self.host)
        self.client.delete(self.key(f"host:{self.host}"))
        scripts.UNLOCK.call(self.client, [self.key("leader")], [self.host])
        self.leader = False

    # -- the leader ---------------------------------------------------------------------

    def hosts(self) -> list[tuple[HostState, dict[str, Any]]]:
        """Every live host's last report."""
        ids = [i.decode() if isinstance(i, bytes) else str(i)
               for i in self.client.zrange(self.key("hosts"), 0, -1)]  # fmt: skip
        out: list[tuple[HostState, dict[str, Any]]] = []
        if not ids:
            return out
        pipe = self.client.pipeline(transaction=False)
        for i in ids:
            pipe.get(self.key(f"host:{i}"))
        for i, raw in zip(ids, pipe.execute(), strict=True):
            if not raw:
                continue
            try:
                rep = orjson.loads(raw)
                pools = rep.get("pools", {})
                state = HostState(
                    i,
                    int(rep.get("max_processes", 0)),
                    {str(n): int(v.get("alive", 0)) for n, v in pools.items()},
                )
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                continue
            out.append((state, rep))
        return out

    def _take_over(self) -> None:
        """Start a term from the last plan: its grants count until hosts report."""
        raw = self.client.get(self.key("plan"))
        plan = orjson.loads(raw) if raw else {}
        hosts = plan.get("hosts") if isinstance(plan, dict) else None
        if isinstance(hosts, dict):
            self._previous = {str(h): {str(n): int(v) for n, v in s.items()}
                              for h, s in hosts.items() if isinstance(s, dict)}  # fmt: skip
        seq = plan.get("seq") if isinstance(plan, dict) else None
        self._seq = int(seq) if isinstance(seq, int) else self._seq

    def _measure(
        self, queues: Sequence[str], now: float
    ) -> dict[str, tuple[list[int], int, float]]:
        """Wait histogram and starts per queue since the last read (from the minute
        hashes the workers write: the current and the previous minute)."""
        minute = minute_of(now)
        pipe = self.client.pipeline(transaction=False)
        wanted = [(q, m) for q in queues for m in (minute - 1, minute)]
        for q, m in wanted:
            pipe.hgetall(queue_minute_key(self.prefix, q, m))
        out: dict[str, tuple[list[int], int, float]] = {q: ([0] * NBUCKETS, 0, 0.0) for q in queues}
        for (q, m), raw in zip(wanted, pipe.execute(), strict=True):
            new = Counts.from_fields(raw if isinstance(raw, dict) else {})
            old = self._seen.get((q, m))
            self._seen[(q, m)] = new
            if old is None:
                continue  # the first read is the baseline
            hist, n, run_s = out[q]
            for i in range(NBUCKETS):
                hist[i] += max(0, new.wait_hist[i] - old.wait_hist[i])
            ran = max(0, new.runtime_us - old.runtime_us) / 1e6
            out[q] = (hist, n + max(0, new.wait_n - old.wait_n), run_s + ran)
        for key in [k for k in self._seen if k[1] < minute - 1]:
            del self._seen[key]
        return out

    def _backlog(self, queues: Sequence[str]) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for q in queues:
            ready, prio = self.ready_keys[q]
            pipe.llen(ready)
            pipe.zcard(prio)
        replies = pipe.execute()
        return {q: int(replies[2 * i]) + int(replies[2 * i + 1]) for i, q in enumerate(queues)}

    def _lead(self, now: float) -> None:
        cfg = self.config
        hosts = self.hosts()
        if not hosts:
            return
        states = [h for h, _ in hosts]
        # A host gone (its report lapsed, or it left) frees its grants: capacity, not a
        # load change. The balancer counts them as still running until the hosts left
        # run them, so they are granted again at once, not paced by max_shift.
        live = {h.host for h in states}
        for host, grant in self._previous.items():
            if host not in live:
                for name, n in grant.items():
                    self._freed[name] = self._freed.get(name, 0) + int(n)
        self._previous = {h: g for h, g in self._previous.items() if h in live}
        queues = sorted({q for p in cfg.pools for q in p.queues})
        measured = self._measure(queues, now)
        backlog = self._backlog(queues)
        for p in cfg.pools:  # this step's measures, kept for one cooldown
            step = _Window(since=now)
            for q in p.queues:
                hist, n, ran = measured[q]
                step.hist = [a + b for a, b in zip(step.hist, hist, strict=True)]
                step.started += n
                step.run_s += ran
            kept = [s for s in self._steps.get(p.name, []) if s.since > now - cfg.cooldown_s]
            self._steps[p.name] = [*kept, step]
            first = self._first.setdefault(p.name, now)
            w = _Window(since=max(first, now - cfg.cooldown_s))
            for s in self._steps[p.name]:
                w.hist = [a + b for a, b in zip(w.hist, s.hist, strict=True)]
                w.started += s.started
                w.run_s += s.run_s
            self._window[p.name] = w
        bounds = limits_over(cfg.pools, len(states))
        limits = [PoolLimits(p.name, *bounds[p.name], p.target_wait_s) for p in cfg.pools]
        budget = sum(h.max_processes for h in states)
        if (
            self.balancer is None
            or self.balancer.budget != budget
            or any(self.balancer.limits.get(lim.name) != lim for lim in limits)
        ):
            fresh = Balancer(limits, budget=budget, cooldown_s=cfg.cooldown_s,
                             max_shift=cfg.max_shift)  # fmt: skip
            if self.balancer is not None:
                fresh._mem = self.balancer._mem  # same term, new bounds: keep its memory
            self.balancer = fresh
        loads: dict[str, PoolLoad] = {}
        for p in cfg.pools:
            active = running = 0
            for _, rep in hosts:
                mine = rep.get("pools", {}).get(p.name, {})
                active += int(mine.get("active", 0))
                running += int(mine.get("running", 0))
            freed = self._freed.get(p.name, 0)
            w = self._window[p.name]
            span = max(1e-3, now - w.since)
            capacity = active * p.concurrency
            # Busy: the running jobs now, or (smoother) the runtime the window's jobs
            # used of the slots it had, whichever is more.
            busy = running / capacity if capacity else 0.0
            if capacity and now - w.since >= 1.0:
                busy = max(busy, min(1.0, w.run_s / (span * capacity)))
            if freed:  # the same work over the processes counted
                busy *= active / (active + freed)
            loads[p.name] = PoolLoad(
                p.name,
                active + freed,
                wait_p95_s=p95_s(w.hist),
                backlog=sum(backlog[q] for q in p.queues),
                started_per_s=w.started / span,
                busy=busy,
            )
        decision = self.balancer.decide(loads, now)
        if decision.decided:
            self.last_decision = decision
        shares = split(cfg.pools, decision.targets, states, self._previous)
        for p in cfg.pools:  # freed grants count until the hosts left run them
            granted = sum(s.get(p.name, 0) for s in shares.values())
            running = loads[p.name].processes - self._freed.get(p.name, 0)
            self._freed[p.name] = min(self._freed.get(p.name, 0), max(0, granted - running))
        self._seq += 1
        plan = {"seq": self._seq, "at": time.time(), "leader": self.host, "hosts": shares,
                "targets": decision.targets}  # fmt: skip
        sample: dict[str, Any] | None = None
        if decision.changed or now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sampled_at = now
            sample = {
                "at": time.time(),
                "processes": {
                    p.name: sum(h.processes.get(p.name, 0) for h in states) for p in cfg.pools
                },
                "targets": decision.targets,
                "hosts": len(states),
            }
        logged = ""
        if decision.changed:
            logged = orjson.dumps({
                "at": time.time(), "targets": decision.targets,
                "reasons": [decision.reasons[n] for n in decision.targets
                            if decision.targets[n] != loads[n].processes],
            }).decode()  # fmt: skip
        ok = scripts.POOLS_PLAN.call(
            self.client,
            [self.key("leader"), self.key("plan"), self.key("seq"), self.key("decisions"),
             self.key("samples")],
            [self.host, self._seq, orjson.dumps(plan),
             orjson.dumps(sample) if sample else "", logged, KEEP, KEEP_S],
        )  # fmt: skip
        if int(ok) == 1:
            self._previous = shares


def read_history(client: Any, prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The samples (processes per pool over time) and the decisions, newest first."""
    pipe = client.pipeline(transaction=False)
    pipe.lrange(pools_key(prefix, "samples"), 0, KEEP - 1)
    pipe.lrange(pools_key(prefix, "decisions"), 0, KEEP - 1)
    samples, decisions = pipe.execute()

    def parse(raws: list[Any]) -> list[dict[str, Any]]:
        out = []
        for raw in raws or []:
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    return parse(samples), parse(decisions)
