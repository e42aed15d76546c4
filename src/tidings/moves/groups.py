"""Fair groups within a queue: the operator's view and settings (``app.groups``).

Within one queue, ready jobs of different groups are taken round-robin by pop (see
``redis/lua/pop.lua``); each group may have a concurrency (across all workers and hosts),
a rate (GCRA, as :class:`~tidings.jobs.limits.RateLimited` counts) and be paused. The
settings live in Redis (``{Q}:gcfg``), per queue: every key of one queue shares its hash
tag, so one script touches one Redis Cluster slot. A paused or limited group's jobs stay
queued, intact, and never block the other groups.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidings.errors import ValidationError
from tidings.redis import scripts
from tidings.redis.keys import QueueKeys
from tidings.wire.group_key import check_group

_PERIODS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}


def parse_rate(rate: str | float, where: str = "rate") -> float:
    """Jobs per second from ``"100/min"`` (``/s``, ``/min``, ``/hour``, ``/day``) or a
    number (per second).

    Raises:
        ValidationError: anything else, or not positive.
    """
    if isinstance(rate, bool):
        raise ValidationError(f"{where} must be like '100/min' or a number per second")
    if isinstance(rate, int | float):
        per_s = float(rate)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+?)s?\s*", str(rate).lower())
        if not m or m.group(2) not in _PERIODS:
            raise ValidationError(
                f"{where} must be like '100/min' (per s, min, hour or day), not {rate!r}"
            )
        per_s = float(m.group(1)) / _PERIODS[m.group(2)]
    if not per_s > 0:
        raise ValidationError(f"{where} must be positive, not {rate!r}")
    return per_s


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group of one queue as Redis holds it now."""

    name: str
    queue: str
    ready: int
    running: int
    done: int
    """Jobs finished since the group last became active (its record goes when it empties)."""
    failed: int
    """Jobs failed since the group last became active."""
    paused: bool
    concurrency: int | None
    rate_per_s: float | None
    in_turn: bool
    """In the ring (has ready jobs and is taken in turn); False while paused, empty, or
    taken out for garbage in its structures (its next push or ``resume`` brings it back)."""

    @property
    def backlog(self) -> int:
        """Ready jobs waiting."""
        return self.ready


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def group_names(client: Any, k: QueueKeys, kinds: tuple[str, ...] = ("g", "gp")) -> set[str]:
    """The groups of queue ``k`` that have keys of ``kinds`` (``g`` ready list, ``gp``
    priority zset, ``gr`` running set), found by SCAN (an operator's command)."""
    escaped = re.sub(r"([\[\]*?\\])", r"\\\1", k.ready)
    names: set[str] = set()
    for kind in kinds:
        head = f"{k.ready}:{kind}:"
        for key in client.scan_iter(match=f"{escaped}:{kind}:*", count=1000):
            names.add(_text(key)[len(head) :])
    return names


class Keep(enum.Enum):
    """The default of :meth:`Groups.limit`'s limits: keep the current value."""

    KEEP = "keep"

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep.KEEP
KEEP_ARG = "*"  # group_admin's ARGV for "keep the current value" (no value is "*")


class Groups:
    """``app.groups``: limits, pause and resume of a queue's fair groups, and listings.

    ``queue`` defaults to the App's default queue everywhere.
    """

    def __init__(
        self, client: Callable[[], Any], keys: Callable[[str], QueueKeys], default_queue: str
    ):
        self._client = client
        self._keys = keys
        self._default = default_queue

    def _admin(self, group: str, queue: str | None, *args: scripts.Arg) -> None:
        k = self._keys(queue or self._default)
        keys = [k.gcfg, k.gring, k.group("g", group), k.group("gp", group), k.group("gt", group)]
        scripts.GROUP_ADMIN.call(self._client(), keys, [group, *args])

    def limit(
        self,
        group: str,
        *,
        concurrency: int | Keep | None = KEEP,
        rate: str | float | Keep | None = KEEP,
        burst: int | None = None,
        queue: str | None = None,
    ) -> None:
        """Set ``group``'s limits: at most ``concurrency`` of its jobs run at once over
        all workers and hosts; at most ``rate`` start (e.g. ``"100/min"``; ``burst``, 1
        unless given, may start at once after a quiet spell). A limit left out keeps its
        current value; ``None`` removes it (``limit(g, concurrency=None, rate=None)``
        lifts both).

        Raises:
            ValidationError: a bad group key, concurrency below 1, a bad rate, or
                ``burst`` without ``rate``.
        """
        check_group(group, "groups.limit()")
        conc = KEEP_ARG
        if concurrency is None:
            conc = ""
        elif not isinstance(concurrency, Keep):
            if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
                raise ValidationError(
                    f"groups.limit(concurrency=) must be an int of at least 1, not {concurrency!r}"
                )
            conc = str(concurrency)
        spec = KEEP_ARG
        if isinstance(rate, Keep):
            if burst is not None:
                raise ValidationError(
                    "groups.limit(burst=) goes with rate=: give the rate too "
                    '(e.g. rate="100/min", burst=5)'
                )
        elif rate is None:
            spec = ""
        else:
            burst = 1 if burst is None else burst
            if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
                raise ValidationError(f"groups.limit(burst=) must be an int >= 1, not {burst!r}")
            per_s = parse_rate(rate, "groups.limit(rate=)")
            spec = f"{max(1, round(1_000_000 / per_s))} {burst}"
        self._admin(group, queue, "limit", conc, spec)

    def pause(self, group: str, *, queue: str | None = None) -> None:
        """Stop taking ``group``'s jobs (they stay queued, intact; running ones finish)."""
        self._admin(check_group(group, "groups.pause()"), queue, "pause")

    def resume(self, group: str, *, queue: str | None = None) -> None:
        """Take ``group``'s jobs in turn again."""
        self._admin(check_group(group, "groups.resume()"), queue, "resume")

    def _names(self, k: QueueKeys) -> set[str]:
        client = self._client()
        names = group_names(client, k, kinds=("g", "gp", "gr"))
        for member in client.zrange(k.gring, 0, -1):
            if member:
                names.add(_text(member))
        for field in client.hkeys(k.gcfg):
            names.add(_text(field)[2:])
        for field in client.hkeys(k.gstat):
            names.add(_text(field)[2:])
        return names

    def _info(self, k: QueueKeys, names: list[str]) -> list[GroupInfo]:
        client = self._client()
        out: list[GroupInfo] = []
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            pipe = client.pipeline(transaction=False)
            for g in chunk:
                pipe.llen(k.group("g", g))
                pipe.zcard(k.group("gp", g))
                pipe.scard(k.group("gr", g))
                pipe.hmget(k.gcfg, f"p:{g}", f"c:{g}", f"r:{g}")
                pipe.hmget(k.gstat, f"d:{g}", f"f:{g}")
                pipe.zscore(k.gring, g)
            raw = pipe.execute(raise_on_error=False)
            for i, g in enumerate(chunk):
                llen, zcard, running, cfg, stat, turn = raw[i * 6 : i * 6 + 6]
                cfg = cfg if isinstance(cfg, list) else [None, None, None]
                stat = stat if isinstance(stat, list) else [None, None]
                rate = None
                if cfg[2]:
                    try:
                        rate = 1_000_000 / int(_text(cfg[2]).split()[0])
                    except (ValueError, IndexError, ZeroDivisionError):
                        rate = None
                conc = _int(cfg[1]) or None
                out.append(
                    GroupInfo(
                        name=g,
                        queue=k.name,
                        ready=_int(llen if isinstance(llen, int) else 0)
                        + _int(zcard if isinstance(zcard, int) else 0),
                        running=_int(running if isinstance(running, int) else 0),
                        done=_int(stat[0]),
                        failed=_int(stat[1]),
                        paused=bool(cfg[0]),
                        concurrency=conc,
                        rate_per_s=rate,
                        in_turn=turn is not None and not isinstance(turn, Exception),
                    )
                )
        return out

    def list(self, *, queue: str | None = None, top: int | None = 50) -> list[GroupInfo]:
        """The queue's groups (active, or with a setting), the biggest backlog first."""
        k = self._keys(queue or self._default)
        infos = self._info(k, sorted(self._names(k)))
        infos.sort(key=lambda i: (-i.ready, -i.running, i.name))
        return infos if top is None else infos[:top]

    def show(self, group: str, *, queue: str | None = None) -> GroupInfo:
        """One group (all zeros when it has nothing queued or running)."""
        k = self._keys(queue or self._default)
        return self._info(k, [check_group(group, "groups.show()")])[0]
