"""Which Redis errors mean "not now" (retry, or ``QueueUnavailable``) on every topology.

One definition for the worker, the producer, the CLI and the scheduler. Transient:

* the connection: refused, reset, timed out, closed (``ConnectionError``, ``TimeoutError``,
  ``OSError``), a server still loading its data (``BusyLoadingError``);
* a failover or a resharding in progress: ``READONLY`` (the old primary is a replica
  now), ``MASTERDOWN``, ``NOREPLICAS``, ``UNBLOCKED`` (a blocking wait ended because the
  node changed role), ``LOADING``; on Redis Cluster ``CLUSTERDOWN`` (a slot has no
  primary until a replica is promoted), ``MOVED``/``ASK``/``TRYAGAIN`` that redis-py
  could not follow in time, a slot map that cannot be loaded while nodes are down
  (``SlotNotCoveredError``, "Redis Cluster cannot be connected");
* ``OOM`` (memory may be freed) and ``BUSY`` (a long script).

Permanent: everything else, e.g. ``CROSSSLOT`` (a bug: keys of two slots in one
command), ``NOPERM``, ``WRONGTYPE``, a script error.
"""

from __future__ import annotations

import asyncio

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["REDIS_ERRORS", "is_transient", "is_wrong_type"]

REDIS_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ClusterError,  # includes ClusterDownError, MasterDownError
    RedisClusterException,  # SlotNotCoveredError, "cannot be connected"
)
"""Errors a caller catches (with ``ResponseError``) before asking :func:`is_transient`."""

# Reply prefixes (redis-py keeps the code for the generic ResponseError, but strips it
# from the subclasses it maps, so those are matched by type below).
_TRANSIENT_REPLIES = (
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "BUSY ",
    "LOADING",
    "READONLY",
    "UNBLOCKED",
    "MOVED",
    "ASK ",
    "OOM",
)
_TRANSIENT_TYPES = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    OutOfMemoryError,
    ReadOnlyError,
    ClusterDownError,
    ClusterError,
    SlotNotCoveredError,
    AskError,  # and MovedError
    TryAgainError,
)
# The cluster client's own errors are mostly bugs (keys of two slots in one command);
# only "no node could be reached to load the slot map" is an outage.
_CLUSTER_OUTAGE = ("cannot be connected",)


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis error is worth retrying (connection trouble or a transient reply)."""
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    if isinstance(exc, RedisClusterException):
        return any(text in str(exc) for text in _CLUSTER_OUTAGE)
    return isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT_REPLIES)


def reraise_cancel() -> None:
    """Re-raise a cancellation that a library turned into another error.

    redis-py's asyncio client may answer a cancellation in the middle of a command with
    a ConnectionError; a loop that retries those would swallow the cancel and never end.
    """

    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def is_wrong_type(exc: BaseException) -> bool:
    """Whether a Redis error says a key holds another type than the command needs
    (``WRONGTYPE``: someone wrote a string over a queue's list, say). Permanent, and
    confined to that key's queue."""
    if not isinstance(exc, ResponseError):
        return False
    text = str(exc)
    # A pipeline's error names the command first: "Command # 1 (...) of pipeline caused
    # error: WRONGTYPE ...".
    return text.startswith("WRONGTYPE") or "caused error: WRONGTYPE" in text
