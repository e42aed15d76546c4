"""A failed batch member's way back: counted pending in its batch again before ``failed
retry`` moves it to its queue (``lua/batch_retry.lua``).

Part of the failed-store retry (:meth:`~tidings.moves.queues.RedisQueue.retry`), so it
lives with the moves; the batches themselves are :mod:`tidings.workflows.batch`.
"""

from __future__ import annotations

from typing import Any

import redis

from tidings.redis import scripts
from tidings.redis.keys import BatchKeys
from tidings.wire.envelope import read_body

RETRIED_KEEP_MS = 7 * 24 * 3600 * 1000
"""How long the retried set is kept when the batch's id sets had expired."""


def _batch_of(envelope: Any) -> str | None:
    """The batch id in an envelope's body (read only: the worker verifies the signature)."""
    body = read_body(envelope)
    batch_id = body.get("batch") if body is not None else None
    return batch_id if isinstance(batch_id, str) and batch_id else None


def reopen_failed_members(
    client: redis.Redis, prefix: str, ids: list[str], envelopes: list[Any]
) -> int:
    """Before ``failed retry`` sends failed jobs back: count each batch member among them
    as pending again, so that it runs (the batch gate lets it through) and its new
    outcome is counted (see ``lua/batch_retry.lua``). Returns how many were reopened.

    Runs before the move, and is safe to run twice: a crash in between leaves the job in
    the failed store with its batch waiting for it, and retrying again moves it.
    """
    n = 0
    for job_id, envelope in zip(ids, envelopes, strict=True):
        batch_id = _batch_of(envelope) if envelope else None
        if batch_id is None:
            continue
        k = BatchKeys.build(prefix, batch_id)
        keys = [k.info, k.finished, k.failed, k.retried]
        n += int(scripts.BATCH_RETRY.call(client, keys, [job_id, RETRIED_KEEP_MS])) > 0
    return n
