"""Cron: dispatch jobs on a schedule from whichever worker holds the scheduler lease.

::

    app.schedule(ProcessReports(), cron="*/5 * * * *")      # five-field cron, UTC
    app.schedule(Digest(), cron="0 9 * * 1-5", tz="Europe/Paris")  # 09:00 Paris time
    app.schedule(Heartbeat(), cron="* * * * * */10")        # sixth field LAST: seconds
    app.schedule(Ping(), every_s=30)                        # every 30 s of Redis time

A six-field expression has its seconds in the *last* field (croniter's order):
``"* * * * * */10"`` is every ten seconds; ``"*/10 * * * * *"`` would be every second of
every tenth minute.

``tz=`` (an IANA zone name, read with :mod:`zoneinfo`) evaluates the expression on that
zone's wall clock; without it, UTC. Across daylight-saving changes each wall-clock time
fires once: a time that does not exist (the hour skipped in spring) fires at the end of
the gap (``30 2 * * *`` runs at 03:00 that day), and a time that occurs twice (the hour
repeated in autumn) fires at its first occurrence only. For a fixed interval in real time
use ``every_s`` (or a UTC cron).

Two schedules of one job class differ by name: the default name holds the class path,
the timing, the zone, the queue and a digest of the job's arguments, so
``Report("daily")`` and ``Report("weekly")`` on the same cron are two schedules. Two
schedules with one name are refused at registration.

Every worker process of the app knows the schedules (importing the app registers them)
and runs a scheduler task, but only the one holding the lease
``{prefix}:schedule:{lease}`` (``lua/lock.lua``: set with an expiry, renewed by its
holder) dispatches. Each tick's job gets an id derived from the schedule's name and the
tick time and is pushed with :func:`~tidings.moves.push_once.push_once`, so a tick is
dispatched once across all workers even when two briefly both believe they lead (a
paused leader whose lease ran out).

Ticks are computed on Redis ``TIME``, not the workers' clocks. The time up to which
ticks were handled is kept in Redis; a new leader dispatches the ticks missed since
(at most :data:`MAX_CATCHUP` per schedule, none older than ``catchup_s``), so a
failover loses no tick. A schedule never run before starts from now.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from croniter import croniter

from tidings.hosts import AppHost
from tidings.jobs.compose import build_body
from tidings.jobs.job import Job, option
from tidings.moves.push_once import push_once_async
from tidings.redis import scripts
from tidings.redis.keys import schedule_lease_key
from tidings.wire.envelope import seal

log = logging.getLogger("tidings.schedule")
MAX_CATCHUP = 10


@dataclass(slots=True)
class Schedule:
    """One scheduled job.

    Attributes:
        name: stable across processes (it names the ticks); defaults to the job's class
            path and its timing.
    """

    job: Job
    name: str
    cron: str | None = None
    every_s: float | None = None
    queue: str | None = None
    tz: str | None = None
    zone: ZoneInfo | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError("give exactly one of cron= or every_s=")
        if self.cron is not None and not croniter.is_valid(self.cron):
            raise ValueError(f"invalid cron expression {self.cron!r}")
        if self.every_s is not None and self.every_s <= 0:
            raise ValueError("every_s must be positive")
        if self.tz is not None:
            if self.cron is None:
                raise ValueError("tz= applies to cron= schedules (every_s counts real time)")
            try:
                self.zone = ZoneInfo(self.tz)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise ValueError(
                    f"unknown time zone {self.tz!r} for schedule {self.name!r}; give an IANA "
                    "name such as 'Europe/Paris' (install the tzdata package if the system "
                    "has no zone database)"
                ) from exc

    def _instants(self, after: float) -> Iterator[float]:
        """Cron tick instants (epoch seconds) after ``after``, increasing, no repeats."""
        assert self.cron is not None
        zone = self.zone
        if zone is None:
            it = croniter(self.cron, after)
            while True:
                yield float(it.get_next(float))
        local = dt.datetime.fromtimestamp(after, zone).replace(tzinfo=None)
        it = croniter(self.cron, local)
        last = after
        while True:
            t = _instant(it.get_next(dt.datetime), zone)
            if t > last:
                last = t
                yield t

    def ticks(self, after: float, until: float) -> list[float]:
        """Tick times t with ``after < t <= until`` (epoch seconds), the last few only."""
        out: list[float] = []
        if self.every_s is not None:
            t = (math.floor(after / self.every_s) + 1) * self.every_s
            first_useful = until - self.every_s * MAX_CATCHUP
            if t < first_useful:
                t = (math.floor(first_useful / self.every_s) + 1) * self.every_s
            while t <= until:
                out.append(round(t, 3))
                t += self.every_s
            return out[-MAX_CATCHUP:]
        instants = self._instants(after)
        for _ in range(1000):
            t = next(instants)
            if t > until:
                break
            out.append(t)
        return out[-MAX_CATCHUP:]

    def next_after(self, now: float) -> float:
        """The first tick after ``now``."""
        if self.every_s is not None:
            return (math.floor(now / self.every_s) + 1) * self.every_s
        return next(self._instants(now))


def _instant(wall: dt.datetime, zone: ZoneInfo) -> float:
    """The instant of a naive wall-clock time in ``zone``: its first occurrence when it
    occurs twice, the end of the gap when it does not occur (clocks jumped over it)."""
    t = wall.replace(tzinfo=zone).timestamp()  # fold=0: the first occurrence
    if dt.datetime.fromtimestamp(t, zone).replace(tzinfo=None) == wall:
        return t
    probe = wall.replace(second=0, microsecond=0)
    for _ in range(24 * 60):
        probe += dt.timedelta(minutes=1)
        t = probe.replace(tzinfo=zone).timestamp()
        if dt.datetime.fromtimestamp(t, zone).replace(tzinfo=None) == probe:
            return t
    raise ValueError(f"no wall-clock time after {wall} exists in {zone}")  # pragma: no cover


class Scheduler:
    """The scheduler task of one worker process.

    Args:
        app: the App (its ``schedules``, queue connection and signer).
        lease_s: how long a lease lasts without renewal (a dead leader's successor
            takes over within it); the App's ``schedule_lease_s`` overrides it.
        catchup_s: the oldest missed tick a new leader still dispatches.
    """

    def __init__(self, app: AppHost, *, lease_s: float = 10.0, catchup_s: float = 600.0) -> None:
        self.app = app
        self.schedules: list[Schedule] = list(app.schedules)
        self.lease_s = float(getattr(app, "schedule_lease_s", lease_s))
        self.catchup_s = catchup_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leading = False
        self.dispatched = 0

    async def run(self) -> None:
        """Lead or wait, dispatching due ticks while leading, until cancelled."""
        if not self.schedules:
            return
        rq = self.app.queue_for(None)
        client = rq.aclient()
        lease = schedule_lease_key(rq.prefix)
        last_key = f"{lease}:last"
        try:
            while True:
                try:
                    wait = await self._step(client, lease, last_key)
                except Exception as exc:  # Redis down, a bad job: never kill the worker
                    log.warning("scheduler: %s: %s", type(exc).__name__, exc)
                    wait = 1.0
                await asyncio.sleep(wait)
        finally:
            if self.leading:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(scripts.UNLOCK.acall(client, [lease], [self.token]), 1.0)

    async def _step(self, client: Any, lease: str, last_key: str) -> float:
        got = await scripts.LOCK.acall(client, [lease], [self.token, int(self.lease_s * 1000)])
        leading = int(got) == 1
        if leading != self.leading:
            log.info("scheduler: %s the lease", "took" if leading else "lost")
        self.leading = leading
        renew = max(0.05, self.lease_s / 3)
        if not leading:
            return renew
        sec, usec = await client.time()
        now = int(sec) + int(usec) / 1e6
        wait = renew
        for s in self.schedules:
            raw = await client.hget(last_key, s.name)
            last = float(raw) if raw is not None else now
            last = max(last, now - self.catchup_s)
            for tick in s.ticks(last, now):
                await self._dispatch(s, tick)
            await client.hset(last_key, s.name, repr(now))
            wait = min(wait, max(0.02, s.next_after(now) - now))
        return wait

    async def _dispatch(self, s: Schedule, tick: float) -> None:
        app = self.app
        rq = app.queue_for(None)
        job_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{rq.prefix}|{s.name}|{int(tick * 1000)}").hex
        queue = str(s.queue or option(s.job.option_source(), "queue") or "default")
        body = build_body(s.job, job_id)
        envelope = seal(body, app.signer, max_bytes=app.max_payload_bytes, queue=queue)
        if await push_once_async(rq, str(queue), job_id, envelope):
            self.dispatched += 1
            log.info("scheduler: dispatched %s for tick %.3f as %s", s.name, tick, job_id)


def make_schedule(
    job: Job,
    *,
    cron: str | None = None,
    every_s: float | None = None,
    queue: str | None = None,
    name: str | None = None,
    tz: str | None = None,
) -> Schedule:
    """A :class:`Schedule` with a default name: the job's class path, timing, zone,
    queue and a digest of its arguments (so two schedules of one class differ)."""
    from tidings.wire.serializer import class_path, encode

    default = f"{class_path(type(job))}@{cron if cron is not None else f'every {every_s}s'}"
    if tz:
        default += f" {tz}"
    if queue:
        default += f" on {queue}"
    data = encode(job)
    if not (isinstance(data, dict) and data.get("__t") == "dc" and not data.get("f")):
        digest = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
        default += f" #{digest[:12]}"
    return Schedule(job, name or default, cron, every_s, queue, tz)
