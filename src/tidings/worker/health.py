"""Checks a worker makes of its Redis: once at start-up, and cheaply while it runs.

At start-up (:meth:`ServerWatch.startup`):

* Redis older than 6.2 is refused (:class:`~tidings.errors.ConfigurationError`): the
  scripts and commands tidings relies on are tested on 6.2 and later only.
* ``maxmemory-policy`` other than ``noeviction`` is a WARNING: under memory pressure an
  evicting Redis silently deletes queued jobs (bodies, reservations) instead of refusing
  new ones, which breaks "lost 0".
* Persistence off (no AOF and no RDB ``save`` points) is a WARNING: a restart of Redis
  empties every queue.

While running (:meth:`ServerWatch.tick`, from the worker's housekeeping): a marker key
``{prefix}:epoch`` is created at start-up and checked every tick (one ``GET``). When it
disappears (Redis restarted without persistence, was flushed, or failed over to an empty
replica) the worker logs a WARNING "Redis data reset" with the server's ``run_id`` and
re-creates it: jobs queued before that moment are gone and will not run.

Every check degrades to a DEBUG line when the server refuses the command (an ACL
without ``CONFIG`` or ``INFO``, a managed Redis that renames them).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

from tidings.errors import ConfigurationError

log = logging.getLogger("tidings.health")

MIN_VERSION = (6, 2)


def epoch_key(prefix: str) -> str:
    """The marker key whose disappearance means the data was reset."""
    return f"{prefix}:epoch"


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> ``(7, 0, 15)`` (non-numeric parts end the tuple)."""
    parts: list[int] = []
    for piece in text.split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


@dataclass(slots=True)
class Findings:
    """What :meth:`ServerWatch.startup` found (the warnings are also logged)."""

    version: str = ""
    run_id: str = ""
    maxmemory_policy: str | None = None
    persistence: bool | None = None
    warnings: list[str] = field(default_factory=list)


async def _info(client: redis.asyncio.Redis, section: str) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = await client.info(section)
    except ResponseError as exc:
        log.debug("INFO %s refused (%s): check skipped", section, exc)
        return None
    return info


async def _save_points(client: redis.asyncio.Redis) -> str | None:
    """The ``save`` setting ("" = RDB snapshots off), None when CONFIG is refused."""
    try:
        raw: dict[Any, Any] = await client.config_get("save")
    except ResponseError as exc:
        log.debug("CONFIG GET save refused (%s): RDB check skipped", exc)
        return None
    value = raw.get("save", raw.get(b"save"))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class ServerWatch:
    """Start-up checks and the data-reset watch of one worker's Redis connection."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str) -> None:
        self.client = client
        self.key = epoch_key(prefix)
        self.epoch: bytes | str | None = None
        self.resets = 0

    async def startup(self) -> Findings:
        """Check the server; log warnings; create or read the epoch marker.

        Raises:
            ConfigurationError: Redis is older than 6.2.
            redis.exceptions.ConnectionError: Redis could not be reached (retry later).
        """
        found = Findings()
        server = await _info(self.client, "server")
        if server is not None:
            found.version = str(server.get("redis_version", ""))
            found.run_id = str(server.get("run_id", ""))
            if found.version and parse_version(found.version) < MIN_VERSION:
                raise ConfigurationError(
                    f"Redis {found.version} is too old: tidings needs Redis >= "
                    f"{'.'.join(map(str, MIN_VERSION))}"
                )
        memory = await _info(self.client, "memory")
        if memory is not None and "maxmemory_policy" in memory:
            found.maxmemory_policy = str(memory["maxmemory_policy"])
            if found.maxmemory_policy != "noeviction":
                found.warnings.append(
                    f"Redis maxmemory-policy is {found.maxmemory_policy!r}, not 'noeviction': "
                    "under memory pressure Redis deletes queued jobs instead of refusing "
                    "new ones (set maxmemory-policy noeviction)"
                )
        persistence = await _info(self.client, "persistence")
        if persistence is not None:
            aof = str(persistence.get("aof_enabled", "0")) == "1"
            save = await _save_points(self.client)
            if aof or (save is not None and save.strip() != ""):
                found.persistence = True
            elif save is not None:
                found.persistence = False
                found.warnings.append(
                    "Redis persistence is off (no AOF, no RDB save points): a restart of "
                    "Redis loses every queued job (set appendonly yes)"
                )
        for text in found.warnings:
            log.warning("%s", text)
        await self._mark()
        return found

    async def _mark(self) -> bool:
        """Create the marker if missing; True when it had to be created. A server that
        refuses the write (out of memory, a read-only replica) leaves the watch unarmed
        until a later tick manages it."""
        token = secrets.token_hex(8).encode()
        try:
            created = bool(await self.client.set(self.key, token, nx=True))
        except ResponseError as exc:
            log.debug("could not set %s (%s): data-reset watch not armed yet", self.key, exc)
            return False
        self.epoch = token if created else await self.client.get(self.key)
        return created

    async def tick(self) -> bool:
        """One ``GET``: True (and a WARNING) when the data was reset since the last tick."""
        current = await self.client.get(self.key)
        if self.epoch is None:  # not armed yet
            await self._mark()
            return False
        if current is not None and current == self.epoch:
            return False
        await self._mark()
        self.resets += 1
        server = await _info(self.client, "server")
        run_id = str(server.get("run_id", "?")) if server else "?"
        log.warning(
            "Redis data reset (run_id %s): the marker %s is gone or new, so Redis restarted "
            "without persistence, was flushed, or failed over to an empty replica; jobs "
            "queued before the reset are lost",
            run_id,
            self.key,
        )
        return True
