"""Sentinel clients leave the old primary soon after a ``SENTINEL FAILOVER``.

Sentinel demotes the old primary only ~10 s after promoting its replica; until then the
old primary answers every connection clients already hold, and the writes it takes are
dropped when it resynchronises. redis-py asks the sentinels only when it opens a
connection, so a producer's pooled connection kept pushing into that hole for the whole
10 s (the failover drill lost 108 dispatches that way on CI). tidings' Sentinel pools ask
again at most every second (``FOLLOW_EVERY_S``) and close a connection that still points
at the old primary. Here a sync client (the producer's), an asyncio client (the
worker's) and a worker's blocking wait must all reach the new primary within
``FOLLOW_EVERY_S`` + 1 s of the sentinels naming it, while the old one is still a
primary (so it is the follow that moved them, not a ``READONLY`` at the demotion).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.faults.conftest import figure
from tests.support import wait_for
from tests.support.topology import SentinelGroup
from tidings.redis.clients import FOLLOW_EVERY_S, async_client, sync_client
from tidings.worker.wakeup import Waiter

pytestmark = pytest.mark.timeout(90)

SLACK_S = 1.0


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path / "sentinel", down_after_ms=1000) as group:
        yield group


def _run_id(client: redis.Redis) -> str:
    return str(client.info("server")["run_id"])


def test_sync_and_async_clients_and_waits_follow_a_sentinel_failover(
    sentinel: SentinelGroup,
) -> None:
    old = sentinel.server_on(sentinel.current_master_port())
    old_raw = old.client(socket_timeout=1.0)
    old_id = _run_id(old_raw)
    producer = sync_client(sentinel.url)
    assert _run_id(producer) == old_id  # a pooled connection to the old primary

    async def scenario() -> dict[str, float]:
        worker = async_client(sentinel.url)
        blocking = async_client(sentinel.url, socket_timeout_s=5.0)
        waiter = Waiter(blocking)
        try:
            assert (await worker.info("server"))["run_id"] == old_id
            assert await waiter.wait(["follow:notify"], 0.05, None, [], []) is None
            s = sentinel.sentinel_client()
            try:
                s.execute_command("SENTINEL FAILOVER", sentinel.service)
            finally:
                s.close()
            t0 = time.monotonic()
            await asyncio.to_thread(
                wait_for,
                lambda: sentinel.current_master_port() != old.port,
                30,
                0.02,
                message="the sentinels name the new primary",
            )
            named = time.monotonic()
            new = sentinel.server_on(sentinel.current_master_port())
            new_raw = new.client(socket_timeout=1.0)
            new_id = _run_id(new_raw)
            moved: dict[str, float] = {"named": named - t0}
            deadline = named + FOLLOW_EVERY_S + SLACK_S
            while len(moved) < 4 and time.monotonic() < deadline:
                if "sync" not in moved and _run_id(producer) == new_id:
                    moved["sync"] = time.monotonic() - named
                if "async" not in moved and (await worker.info("server"))["run_id"] == new_id:
                    moved["async"] = time.monotonic() - named
                if "wait" not in moved:
                    # A token only the new primary holds: a wait still on the old one
                    # times out empty.
                    new_raw.rpush("follow:notify", "t")
                    token = await waiter.wait(["follow:notify"], 0.05, None, [], [])
                    if token is not None:
                        moved["wait"] = time.monotonic() - named
                    else:
                        new_raw.delete("follow:notify")
                await asyncio.sleep(0.05)
            # Still a primary: the clients moved on their own, before any READONLY.
            moved["old still primary"] = float(old_raw.info("replication")["role"] == "master")
            new_raw.close()
            return moved
        finally:
            await waiter.close()
            await worker.aclose()
            await blocking.aclose()

    try:
        moved = asyncio.run(scenario())
    finally:
        producer.close()
        old_raw.close()
    figure(
        "sentinel follow: the sentinels named the new primary "
        f"{moved['named']:.2f}s after SENTINEL FAILOVER; then moved: "
        + ", ".join(f"{k} {moved[k]:.2f}s" for k in ("sync", "async", "wait") if k in moved)
    )
    assert {"sync", "async", "wait"} <= set(moved), moved
    assert moved["old still primary"] == 1.0, moved
