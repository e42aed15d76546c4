"""Publishing: one XADD per message per channel, each one Lua script, once.

The script (``redis/lua/broadcast_publish.lua``) remembers each channel's last ``max_len``
message ids (a hash and a list per channel, trimmed with the stream, never a key per
message): a publish re-sent after a lost reply, or a job retried after it published,
returns the stream id of the first write instead of adding a second copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidings.redis import scripts
from tidings.redis.keys import broadcast_ids_keys, broadcast_stream_key

#: Default bound of each channel's stream (``MAXLEN ~``): the replay window.
DEFAULT_MAX_LEN = 1000
#: How long a channel's recent message ids outlive its last publish (a channel nobody
#: publishes to forgets them then; while it is used, the last ``max_len`` are kept).
DEFAULT_RECEIPT_TTL_S = 24 * 3600.0


def publish_args(
    prefix: str,
    channel: str,
    message_id: str,
    event: str,
    data: bytes,
    *,
    max_len: int,
    receipt_ttl_s: float,
) -> tuple[list[str], list[scripts.Arg]]:
    """Keys and arguments of one publish (shared by the sync and async twins)."""
    keys = [broadcast_stream_key(prefix, channel), *broadcast_ids_keys(prefix, channel)]
    ttl_ms = max(1, round(receipt_ttl_s * 1000))
    args: list[scripts.Arg] = [max(1, max_len), ttl_ms, event, data, message_id]
    return keys, args


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def publish(
    client: Any,
    prefix: str,
    channels: Sequence[str],
    message_id: str,
    event: str,
    data: bytes,
    *,
    max_len: int = DEFAULT_MAX_LEN,
    receipt_ttl_s: float = DEFAULT_RECEIPT_TTL_S,
) -> list[str]:
    """Publish on each channel with a sync client; returns the stream ids."""
    ids = []
    for channel in channels:
        keys, args = publish_args(
            prefix, channel, message_id, event, data,
            max_len=max_len, receipt_ttl_s=receipt_ttl_s,
        )  # fmt: skip
        ids.append(_text(scripts.BROADCAST_PUBLISH.call(client, keys, args)))
    return ids


async def apublish(
    client: Any,
    prefix: str,
    channels: Sequence[str],
    message_id: str,
    event: str,
    data: bytes,
    *,
    max_len: int = DEFAULT_MAX_LEN,
    receipt_ttl_s: float = DEFAULT_RECEIPT_TTL_S,
) -> list[str]:
    """Async twin of :func:`publish`."""
    ids = []
    for channel in channels:
        keys, args = publish_args(
            prefix, channel, message_id, event, data,
            max_len=max_len, receipt_ttl_s=receipt_ttl_s,
        )  # fmt: skip
        ids.append(_text(await scripts.BROADCAST_PUBLISH.acall(client, keys, args)))
    return ids
