"""Every Redis key name tidings uses, built in one place.

All keys of one queue share the hash tag ``{queue}``, so each Lua script touches one
slot and runs unchanged on Redis Cluster::

    {prefix}:queue:{Q}                ready list of job ids, oldest first
    {prefix}:queue:{Q}:delayed        zset id -> due time (ms, Redis TIME)
    {prefix}:queue:{Q}:reserved       zset id -> lease expiry (ms, Redis TIME)
    {prefix}:queue:{Q}:notify         list of wake-up tokens for blocking pops
    {prefix}:queue:{Q}:jobs           hash id -> signed envelope (the body, never rewritten)
    {prefix}:queue:{Q}:attempts       hash id -> reservations so far, id:e -> exceptions
    {prefix}:queue:{Q}:done           zset id -> finish time (bounded, for job_status)
    {prefix}:queue:{Q}:failed         zset id -> failure time
    {prefix}:queue:{Q}:failed:info    hash id -> JSON {exception, name, queue, attempts}
    {prefix}:queue:{Q}:failed:body    hash id -> the envelope as it was
    {prefix}:restart                  restart signal (a Redis timestamp)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key names of one queue."""

    name: str
    ready: str
    delayed: str
    reserved: str
    notify: str
    jobs: str
    attempts: str
    done: str
    failed: str
    failed_info: str
    failed_body: str

    @classmethod
    def build(cls, prefix: str, name: str) -> QueueKeys:
        """Key names for queue ``name`` under ``prefix``."""
        base = f"{prefix}:queue:{{{name}}}"
        return cls(
            name=name,
            ready=base,
            delayed=f"{base}:delayed",
            reserved=f"{base}:reserved",
            notify=f"{base}:notify",
            jobs=f"{base}:jobs",
            attempts=f"{base}:attempts",
            done=f"{base}:done",
            failed=f"{base}:failed",
            failed_info=f"{base}:failed:info",
            failed_body=f"{base}:failed:body",
        )


def restart_key(prefix: str) -> str:
    """The key ``notify-worker restart`` sets."""
    return f"{prefix}:restart"


def queue_pattern(prefix: str) -> str:
    """A SCAN pattern matching every queue's jobs hash."""
    return f"{prefix}:queue:{{*}}:jobs"
