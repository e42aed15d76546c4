"""``TIDINGS_WAIT_REPLICAS`` on plain Redis with a replica: the producer's fast lane
sends ``WAIT`` on the connection that pushed; a dispatch returns only once the replica
has the job, and raises QueueUnavailable (naming the setting) when the replica is gone.
The Sentinel and Cluster paths: tests/e2e/test_topologies.py and the failover drill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.e2e.jobs_app import Ordered
from tests.support import RedisServer, wait_for
from tidings import App
from tidings.errors import QueueUnavailable


def test_dispatch_returns_once_the_replica_has_it(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    primary = redis_server_factory(appendonly=False)
    replica = redis_server_factory(
        appendonly=False, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    r = replica.client(socket_timeout=2.0)
    wait_for(lambda: r.info("replication").get("master_link_status") == "up", 15, 0.05)
    app = App(
        env=False,
        redis_url=primary.url,
        key="wait-replicas-test-key-0123456789",
        prefix="wr",
        allowed_modules="tests",
        wait_replicas=1,
        wait_replicas_timeout=0.5,
    )
    try:
        keys = app.queue_for(None).keys("default")
        for i in range(20):
            assert Ordered(f"s{i}").dispatch()
            # No waiting: WAIT returned 1, so the replica applied the push already.
            assert r.llen(keys.ready) == i + 1
        assert asyncio.run(Ordered("a").dispatch_async())
        assert r.llen(keys.ready) == 21
        replica.kill()
        with pytest.raises(QueueUnavailable, match=r"0 of 1 replicas.*TIDINGS_WAIT_REPLICAS"):
            Ordered("gone").dispatch()
        with pytest.raises(QueueUnavailable, match="TIDINGS_WAIT_REPLICAS"):
            asyncio.run(Ordered("gone-async").dispatch_async())
        # Not confirmed is not "not pushed": both are queued on the primary.
        assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 23
    finally:
        app.close()
        r.close()
