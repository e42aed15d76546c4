"""The pools' Redis side on a real Redis: the leader lease, host reports that lapse within
a lease, the plan fenced by the lease and logged once when re-sent, and the dashboard's
pools page reading what the leader wrote.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
import redis

from tidings import App, Pool
from tidings.dashboard import Auth, create_app
from tidings.pools.coordination import Coordinator, LocalPool, pools_key
from tidings.pools.spec import PoolsConfig
from tidings.redis import scripts

POOLS = (Pool("mail", ["mail"], min_processes=1, max_processes=4, target_wait_s=1.0),
         Pool("default", ["default"], min_processes=1, max_processes=2))  # fmt: skip


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key="k" * 32, prefix=prefix, pools=list(POOLS),
            max_processes=5, cooldown_s=1.0, lease_s=1.0)  # fmt: skip
    try:
        yield a
    finally:
        a.close()


def coordinator(app: App, client: redis.Redis) -> Coordinator:
    rq = app.queue_for(None)
    ready = {q: (rq.keys(q).ready, rq.keys(q).prio) for q in ("mail", "default")}
    return Coordinator(app.pools, client, rq.prefix, ready)


def test_app_takes_the_pool_keywords(app: App) -> None:
    assert isinstance(app.pools, PoolsConfig)
    assert app.pools.host_max == 5 and [p.name for p in app.pools.pools] == ["mail", "default"]
    assert App.from_env(redis_url=app.settings.redis_url, key="k" * 32, pools=list(POOLS),
                        balance="off").pools.balance == "off"  # fmt: skip


def test_one_leader_a_fenced_plan_and_a_lapsed_host(
    app: App, redis_client: redis.Redis, prefix: str
) -> None:
    a, b = coordinator(app, redis_client), coordinator(app, redis_client)
    local = {"mail": LocalPool(1, 1, 0), "default": LocalPool(1, 1, 0)}
    share_a = a.step(local, time.time())
    share_b = b.step(local, time.time())
    assert a.leader and not b.leader
    assert share_a == {"mail": 1, "default": 1}
    assert share_b is None  # b was not yet in the plan the leader wrote
    a.step(local, time.time())
    assert b.step(local, time.time()) == {"mail": 1, "default": 1}
    # Only the lease holder's plan is written.
    keys = [pools_key(prefix, w) for w in ("leader", "plan", "seq", "decisions", "samples")]
    assert scripts.POOLS_PLAN.call(redis_client, keys, [b.host, 99, b"{}", "", "", 10, 60]) == 0
    # A re-sent plan (same seq) logs its decision once.
    args = [a.host, 1000, b'{"hosts": {}}', '{"at": 1}', '{"at": 1, "reasons": ["x"]}', 10, 60]
    before = redis_client.llen(keys[3])
    assert scripts.POOLS_PLAN.call(redis_client, keys, args) == 1
    assert scripts.POOLS_PLAN.call(redis_client, keys, args) == 1
    assert redis_client.llen(keys[3]) == before + 1
    # a stops reporting: its record lapses within one lease and b takes the lease.
    deadline = time.monotonic() + 10
    while not b.leader:
        assert time.monotonic() < deadline, "b never took the lease"
        b.step(local, time.time())
        time.sleep(0.1)
    hosts = [h.host for h, _ in b.hosts()]
    assert hosts == [b.host]


def test_the_dashboard_pools_page_shows_processes_and_reasons(
    app: App, redis_client: redis.Redis, prefix: str
) -> None:
    c = coordinator(app, redis_client)
    rq = app.queue_for(None)
    # A backlog on mail with a measured wait over its target: the leader grows it.
    redis_client.rpush(rq.keys("mail").ready, *[f"j{i}" for i in range(50)])
    redis_client.hset(f"{prefix}:stats:{{mail}}:{int(time.time() // 60)}", mapping={"wn": 1})
    c.step({"mail": LocalPool(1, 1, 4), "default": LocalPool(1, 1, 0)}, time.time())
    redis_client.hset(f"{prefix}:stats:{{mail}}:{int(time.time() // 60)}",
                      mapping={"wn": 40, "wh10": 39})  # fmt: skip
    c.step({"mail": LocalPool(1, 1, 16), "default": LocalPool(1, 1, 0)}, time.time() + 2)
    logged = redis_client.lrange(pools_key(prefix, "decisions"), 0, -1)
    decisions = [orjson.loads(d) for d in logged]
    assert decisions and "mail: p95 wait 5 s > target 1 s" in decisions[0]["reasons"][0]

    async def get() -> httpx.Response:
        asgi = create_app(app, auth=Auth())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                     base_url="http://127.0.0.1:8765") as client:  # fmt: skip
            return await client.get("/pools")

    page = asyncio.run(get())
    assert page.status_code == 200
    assert "processes per pool" in page.text and "<svg" in page.text
    assert "mail: p95 wait 5 s &gt; target 1 s" in page.text
    assert 'href="/pools" class="on"' in page.text


def test_a_dead_hosts_share_is_granted_again_at_once_not_paced_by_max_shift(
    redis_url: str, redis_client: redis.Redis, prefix: str
) -> None:
    pools = [Pool("mail", ["mail"], min_processes=1, max_processes=4, max_processes_total=4),
             Pool("default", ["default"], min_processes=1, max_processes=1)]  # fmt: skip
    app = App(env=False, redis_url=redis_url, key="k" * 32, prefix=prefix, pools=pools,
              max_processes=5, cooldown_s=10.0, max_shift=1, lease_s=1.0)  # fmt: skip
    try:
        a, b = coordinator(app, redis_client), coordinator(app, redis_client)
        t0 = time.time()
        a.step({"mail": LocalPool(1, 1, 0), "default": LocalPool(1, 1, 0)}, t0)
        b.step({"mail": LocalPool(3, 3, 0), "default": LocalPool(1, 1, 0)}, t0)
        assert a.leader
        share = a.step({"mail": LocalPool(1, 1, 0), "default": LocalPool(1, 1, 0)}, t0 + 0.1)
        assert share == {"mail": 1, "default": 1}
        assert b.step({"mail": LocalPool(3, 3, 0), "default": LocalPool(1, 1, 0)}, t0) == {
            "mail": 3,
            "default": 1,
        }
        # b dies (stops reporting): its record lapses within the lease.
        deadline = time.monotonic() + 10
        while b.host in [h.host for h, _ in a.hosts()]:
            assert time.monotonic() < deadline, "b's report never lapsed"
            time.sleep(0.1)
        # Within the cooldown (10 s) and with max_shift 1, a is granted b's 3 at once:
        # capacity freed by a dead host is not a load change.
        share = a.step({"mail": LocalPool(1, 1, 0), "default": LocalPool(1, 1, 0)}, t0 + 2)
        assert share == {"mail": 4, "default": 1}
        # Once a runs them, the freed grant is spent: the pool is 4, not 4 + 3.
        share = a.step({"mail": LocalPool(4, 4, 0), "default": LocalPool(1, 1, 0)}, t0 + 3)
        assert share == {"mail": 4, "default": 1}
        assert a._freed == {"mail": 0, "default": 0}
    finally:
        app.close()
