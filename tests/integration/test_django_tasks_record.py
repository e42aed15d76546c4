"""The record a Django task keeps of its failures (``djtask_record.lua``): one Lua call,
and a re-sent call (same token) changes nothing."""

from __future__ import annotations

from uuid import uuid4

import redis

from tidings.redis import scripts


def test_a_resent_record_write_changes_nothing(plain_redis_url: str) -> None:
    client = redis.Redis.from_url(plain_redis_url)
    key = f"t{uuid4().hex[:8]}:djtask:{{abc}}"
    keys = [key, f"{key}:w", f"{key}:e"]
    args: list[scripts.Arg] = [60000, "token-1", "host:1", '{"e": 1}', "1.5", "0",
                               "status", "READY"]  # fmt: skip
    try:
        assert scripts.DJTASK_RECORD.call(client, keys, args) == 1
        assert scripts.DJTASK_RECORD.call(client, keys, args) == 0  # the reply was lost
        assert client.lrange(f"{key}:w", 0, -1) == [b"host:1"]
        assert client.lrange(f"{key}:e", 0, -1) == [b'{"e": 1}']
        assert client.hget(key, "started_at") == b"1.5"
        assert 0 < client.pttl(key) <= 60000
        # the next attempt's write (another token) appends; started_at stays the first
        later: list[scripts.Arg] = [60000, "token-2", "host:2", "", "9.0", "0",
                                    "status", "FAILED"]  # fmt: skip
        assert scripts.DJTASK_RECORD.call(client, keys, later) == 1
        assert client.lrange(f"{key}:w", 0, -1) == [b"host:1", b"host:2"]
        assert client.hget(key, "started_at") == b"1.5"
        assert client.hget(key, "status") == b"FAILED"
        # a cancel's write sets only what is unset
        cancel: list[scripts.Arg] = [60000, "token-3", "", "", "", "1", "status", "X",
                                     "queue", "default"]  # fmt: skip
        assert scripts.DJTASK_RECORD.call(client, keys, cancel) == 1
        assert client.hget(key, "status") == b"FAILED"
        assert client.hget(key, "queue") == b"default"
    finally:
        client.delete(*keys)
        client.close()
