"""Fair groups (issue 25): every group move run twice has the effect of running it once,
and a group's concurrency slot is tied to the reservation, so it comes back when the
lease ends and never doubles (see tests/integration/test_moves_twice.py for the rest).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_lua_scripts import envelope, k_of, run
from tidings.moves.consume import Broker, PopResult
from tidings.moves.groups import Groups
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts

INFO = {"exception": "ValueError: no", "name": "T", "queue": "default", "attempts": 1}


@pytest.fixture
def rq(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    queue = RedisQueue(redis_url, prefix)
    try:
        yield queue
    finally:
        queue.close()


def groups(rq: RedisQueue) -> Groups:
    return Groups(lambda: rq.client, rq.keys, "default")


def twice(rq: RedisQueue, fn: Any, **kw: Any) -> tuple[Any, Any]:
    async def both(b: Broker) -> tuple[Any, Any]:
        return await fn(b), await fn(b)

    return run(rq, both, **kw)


def pop(rq: RedisQueue, n: int = 1, **kw: Any) -> PopResult:
    return run(rq, lambda b: b.pop(k_of(rq), n), **kw)


def group_push_args(rq: RedisQueue, group: str, items: list[tuple[str, bytes]]) -> Any:
    return rq._push_move("default", items, 0.0, 0, group)


def test_push_group_twice_lands_the_id_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    script, keys, args = group_push_args(rq, "acme", [job])
    assert script is scripts.PUSH_GROUP
    assert script.call(r, keys, args) == 1
    assert script.call(r, keys, args) == 0
    assert r.lrange(k.group("g", "acme"), 0, -1) == [job[0].encode()]
    assert r.zrange(k.gring, 0, -1) == [b"acme"]
    assert r.hget(k.attempts, f"{job[0]}:g") == b"acme"
    # ... and once it ran and was acked, a late re-send does not bring it back.
    [res] = pop(rq).jobs
    run(rq, lambda b: b.ack(k, [(res.id, res.token)], b.ack_seq()))
    assert script.call(r, keys, args) == 0
    assert not r.exists(k.group("g", "acme"), k.gring, k.group("gr", "acme"))


def test_grouped_pop_twice_hands_out_the_same_jobs_and_holds_each_slot_once(
    rq: RedisQueue,
) -> None:
    k, r = k_of(rq), rq.client
    for g in ("a", "b", "c"):
        rq.push("default", [envelope(), envelope()], group=g)

    async def lost_then_again(b: Broker) -> tuple[Any, Any]:
        keys, args = b.pop_command(k, 2)
        await scripts.POP.acall(b.client, keys, args)  # ran; its reply "lost"
        return await b.pop(k, 2), None

    first, _ = run(rq, lost_then_again)
    assert len(first.jobs) == 2
    # Round robin: one job of a and one of b, nothing reserved twice.
    assert r.zcount(k.reserved, "-inf", "(+inf") == 2
    assert r.scard(k.group("gr", "a")) == 1 and r.scard(k.group("gr", "b")) == 1
    assert r.llen(k.group("g", "a")) == r.llen(k.group("g", "b")) == 1
    assert r.llen(k.group("g", "c")) == 2
    assert all(j.attempts == 1 for j in first.jobs)


def test_ack_twice_frees_the_slot_once_and_leaves_no_group_key(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], group="acme")
    [job] = pop(rq).jobs
    assert r.smembers(k.group("gr", "acme")) == {job.id.encode()}

    async def ack(b: Broker) -> list[str]:
        return await b.ack(k, [(job.id, job.token)], 7)

    assert twice(rq, ack) == ([], [])
    assert not r.exists(k.group("gr", "acme"), k.group("g", "acme"), k.gstat)
    assert r.hlen(k.attempts) == 0


def test_release_twice_puts_the_job_back_into_its_group_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], group="acme")
    [job] = pop(rq).jobs

    async def release(b: Broker) -> int:
        return await b.release(k, job, 0, exception=True)

    assert twice(rq, release) == (1, 1)
    assert r.lrange(k.group("g", "acme"), 0, -1) == [job.id.encode()]
    assert r.llen(k.ready) == 0 and not r.exists(k.group("gr", "acme"))
    assert r.zrange(k.gring, 0, -1) == [b"acme"]
    assert r.hget(k.attempts, f"{job.id}:e") == b"1"


def test_fail_twice_counts_one_failure_of_the_group(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope(), envelope()], group="acme")
    job = pop(rq).jobs[0]

    async def fail(b: Broker) -> bool:
        return await b.fail(k, job, INFO)

    assert twice(rq, fail) == (True, True)
    assert r.hget(k.gstat, "f:acme") == b"1"  # the group is still active (one job left)
    assert groups(rq).show("acme").failed == 1
    assert not r.exists(k.group("gr", "acme"))


def test_group_settings_twice_are_the_same_as_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], group="acme")
    g = groups(rq)
    for _ in range(2):
        g.limit("acme", concurrency=2, rate="120/min")
        g.pause("acme")
    assert r.hgetall(k.gcfg) == {b"c:acme": b"2", b"r:acme": b"500000 1", b"p:acme": b"1"}
    assert r.zcard(k.gring) == 0
    for _ in range(2):
        g.resume("acme")
    assert r.zrange(k.gring, 0, -1) == [b"acme"]
    g.limit("acme")  # nothing named: the limits stay
    assert r.hgetall(k.gcfg) == {b"c:acme": b"2", b"r:acme": b"500000 1"}
    for _ in range(2):
        g.limit("acme", concurrency=None, rate=None)
    assert r.hgetall(k.gcfg) == {}


def test_a_slot_held_past_its_lease_comes_back_and_never_doubles(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    groups(rq).limit("acme", concurrency=1)
    rq.push("default", [envelope(), envelope()], group="acme")
    # A worker takes the one slot, then dies (its lease is short and never renewed).
    [_first] = pop(rq, 5, lease_s=0.3).jobs
    assert pop(rq, 5).jobs == []  # at its concurrency: nothing more from acme
    assert r.scard(k.group("gr", "acme")) == 1
    import time

    deadline = time.monotonic() + 10
    got: list[Any] = []
    while not got:
        assert time.monotonic() < deadline, "the slot never came back"
        time.sleep(0.1)
        got = pop(rq, 5).jobs
    # The stalled job went back into its group; one job holds the one slot, never two.
    assert len(got) == 1
    assert r.scard(k.group("gr", "acme")) == 1
    assert r.zcount(k.reserved, "-inf", "(+inf") == 1
    assert pop(rq, 5).jobs == []


def test_a_slot_leaked_by_a_missed_move_is_taken_back_by_the_next_pop(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    groups(rq).limit("acme", concurrency=1)
    rq.push("default", [envelope()], group="acme")
    r.sadd(k.group("gr", "acme"), "f" * 32)  # an id no longer reserved (left by hand)
    assert len(pop(rq).jobs) == 1
    assert r.scard(k.group("gr", "acme")) == 1


def test_a_failed_grouped_job_retried_comes_back_into_its_group(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], group="acme")
    [job] = pop(rq).jobs
    run(rq, lambda b: b.fail(k, job, INFO))
    assert not r.exists(k.group("g", "acme"), k.group("gr", "acme"))
    assert rq.retry([job.id]) == 1
    assert r.lrange(k.group("g", "acme"), 0, -1) == [job.id.encode()]
    assert r.zrange(k.gring, 0, -1) == [b"acme"] and r.llen(k.ready) == 0
    assert r.hget(k.attempts, f"{job.id}:g") == b"acme"
    assert not r.hexists(k.failed_info, f"{job.id}:g")
    [again] = pop(rq).jobs
    assert again.id == job.id and r.sismember(k.group("gr", "acme"), job.id)


def test_clear_deletes_the_waiting_jobs_of_every_group_paused_or_not(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope(), envelope()], group="acme")
    rq.push("default", [envelope()], group="beta")
    rq.push("default", [envelope()], group="beta", priority=5)
    rq.push("default", [envelope()])
    groups(rq).pause("beta")
    assert rq.clear("default") == 5
    assert r.hlen(k.jobs) == 0 and r.hlen(k.attempts) == 0
    assert not r.exists(k.gring, k.group("g", "acme"), k.group("g", "beta"), k.group("gp", "beta"))
