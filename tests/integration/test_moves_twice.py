"""Every move run twice with the same arguments has the effect of running it once, and a
stale holder's move is refused (fencing tokens, receipts, stalls).

Each test sends the very same script call twice, as redis-py, the producer's fast lane
or the worker's retry loop do when a reply was lost, and checks Redis holds what one run
would have left. The end-to-end versions (a proxy dropping the reply, real workers) are in
tests/integration/test_seams.py and tests/faults/test_seams.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.integration.test_lua_scripts import envelope, held, k_of, pop, run
from tidings.moves.consume import Broker
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts
from tidings.redis.scripts import UNIQUE_PUSH


@pytest.fixture
def rq(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    queue = RedisQueue(redis_url, prefix)
    try:
        yield queue
    finally:
        queue.close()


INFO = {"exception": "ValueError: no", "name": "T", "queue": "default", "attempts": 1}


def twice(rq: RedisQueue, fn: Any) -> tuple[Any, Any]:
    """Run ``fn(broker)`` twice with one Broker (same worker id, same arguments)."""

    async def both(b: Broker) -> tuple[Any, Any]:
        return await fn(b), await fn(b)

    return run(rq, both)


def test_push_twice_lands_the_id_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    keys = [k.ready, k.notify, k.jobs, k.done, k.failed]
    assert scripts.PUSH.call(r, keys, list(job)) == 1
    assert scripts.PUSH.call(r, keys, list(job)) == 0
    assert r.lrange(k.ready, 0, -1) == [job[0].encode()]
    # ... and once it ran and was acked, a late re-send does not bring it back.
    [res] = pop(rq).jobs
    run(rq, lambda b: b.ack(k, [(res.id, res.token)], b.ack_seq()))
    assert scripts.PUSH.call(r, keys, list(job)) == 0
    assert r.llen(k.ready) == 0 and r.hlen(k.jobs) == 0


def test_later_twice_keeps_one_due_time(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    keys = [k.delayed, k.notify, k.jobs, k.done, k.failed, k.attempts, k.pseq]
    scripts.LATER.call(r, keys, [5000, job[0], 0, job[1]])
    due = r.zscore(k.delayed, job[0])
    scripts.LATER.call(r, keys, [9000, job[0], 0, job[1]])
    assert r.zscore(k.delayed, job[0]) == due and r.zcard(k.delayed) == 1


def test_unique_push_twice_returns_the_id_both_times(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    lock = f"{k.ready}:unique:T:1"
    keys = [k.ready, k.delayed, k.notify, k.jobs, lock, k.done, k.failed]
    args = [job[0], job[1], 0, 60_000]
    first = UNIQUE_PUSH.call(r, keys, args)
    second = UNIQUE_PUSH.call(r, keys, args)
    assert first == second == [1, job[0].encode()]
    assert r.llen(k.ready) == 1


def test_pop_twice_with_one_sequence_hands_out_the_same_jobs(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope(n=i) for i in range(3)])

    async def lost_then_again(b: Broker) -> tuple[Any, Any]:
        keys, args = b.pop_command(k, 2)
        await scripts.POP.acall(b.client, keys, args)  # ran; its reply "lost"
        return await b.pop(k, 2), None  # the same pop again

    first, _ = run(rq, lost_then_again)
    assert len(first.jobs) == 2
    # nothing reserved twice (ZCOUNT to +inf exclusive: not the skiplist mark)
    assert r.zcount(k.reserved, "-inf", "(+inf") == 2 and r.llen(k.ready) == 1
    assert all(j.attempts == 1 for j in first.jobs)


def test_ack_twice_reports_no_lost_reservation(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()])
    [job] = pop(rq).jobs

    async def ack(b: Broker) -> list[str]:
        return await b.ack(k, [(job.id, job.token)], 7)

    assert twice(rq, ack) == ([], [])
    assert r.zscore(k.done, job.id) is not None and r.hlen(k.attempts) == 0


def test_release_twice_counts_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()])
    [job] = pop(rq).jobs

    async def release(b: Broker) -> int:
        return await b.release(k, job, 0, exception=True)

    assert twice(rq, release) == (1, 1)
    assert r.hget(k.attempts, f"{job.id}:e") == b"1"
    assert r.lrange(k.ready, 0, -1) == [job.id.encode()]
    [again] = pop(rq).jobs

    async def uncount(b: Broker) -> int:
        return await b.release(k, again, 0, uncount=True)

    assert twice(rq, uncount) == (1, 1)
    assert r.hget(k.attempts, again.id) == b"1"  # given back once: 2 -> 1, not 0


def test_fail_twice_keeps_the_payload(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)])
    [job] = pop(rq).jobs

    async def fail(b: Broker) -> bool:
        return await b.fail(k, job, INFO)

    assert twice(rq, fail) == (True, True)
    assert r.hget(k.failed_body, job_id) == env
    [record] = rq.failed()
    assert record.payload == env and orjson.loads(r.hget(k.failed_info, job_id) or b"") == INFO


def test_a_stale_holder_cannot_touch_the_new_holder(rq: RedisQueue) -> None:
    """A's lease expired and B reserved the job: A's extend, ack, release and fail are
    refused and B's reservation, lease and payload stay as they were."""
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)])
    [a] = pop(rq, lease_s=0.05).jobs
    time.sleep(0.1)
    [b] = pop(rq).jobs  # the expired lease is a stall: B gets a new token
    assert (b.id, b.stalls, b.attempts) == (job_id, 1, 1) and b.token != a.token
    lease = r.zscore(k.reserved, job_id)

    assert run(rq, lambda br: br.extend(k, [(a.id, a.token)]), lease_s=600.0).lost == [job_id]
    assert r.zscore(k.reserved, job_id) == lease  # B's lease not renewed by A
    assert run(rq, lambda br: br.ack(k, [(a.id, a.token)], 1)) == [job_id]
    assert run(rq, lambda br: br.release(k, a, 0, exception=True)) == -1
    assert run(rq, lambda br: br.fail(k, a, INFO)) is False
    assert r.zscore(k.reserved, job_id) == lease
    assert r.hget(k.jobs, job_id) == env
    assert r.zscore(k.done, job_id) is None and r.zcard(k.failed) == 0
    assert rq.status(job_id, ["default"]) == "reserved"

    # B fails for good: the record keeps the whole payload, and the status is failed only.
    assert run(rq, lambda br: br.fail(k, b, INFO)) is True
    assert r.hget(k.failed_body, job_id) == env
    assert rq.status(job_id, ["default"]) == "failed"
    assert held(rq, job_id).token == 0  # no reservation left


def test_stalls_give_the_attempt_back_and_count_apart(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()])
    tokens = []
    for stall in range(3):
        [job] = pop(rq, lease_s=0.02).jobs
        assert (job.attempts, job.stalls) == (1, stall)
        tokens.append(job.token)
        time.sleep(0.05)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert r.hget(k.attempts, f"{job.id}:s") == b"2"


def test_push_priority_twice_queues_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    a, b, c = envelope(), envelope(), envelope()
    keys = [k.ready, k.notify, k.jobs, k.done, k.failed, k.attempts, k.prio, k.pseq]
    args = [a[0], 7, a[1], b[0], 0, b[1], c[0], -3, c[1]]
    assert scripts.PUSH_PRIORITY.call(r, keys, args) == 3
    seq = r.get(k.pseq)
    assert scripts.PUSH_PRIORITY.call(r, keys, args) == 0
    # Each job once, where its priority says; the re-send took no sequence numbers.
    assert r.zrange(k.prio, 0, -1) == [a[0].encode(), c[0].encode()]
    assert r.lrange(k.ready, 0, -1) == [b[0].encode()]
    assert r.get(k.pseq) == seq == b"2"
    assert r.hget(k.attempts, f"{a[0]}:p") == b"7" and r.hget(k.attempts, f"{c[0]}:p") == b"-3"
    assert not r.hexists(k.attempts, f"{b[0]}:p")
    assert [j.id for j in pop(rq, 3).jobs] == [a[0], b[0], c[0]]


def test_cancel_twice_is_the_same_cancel(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    scripts.PUSH.call(r, [k.ready, k.notify, k.jobs, k.done, k.failed], list(job))
    keys = [k.ready, k.delayed, k.reserved, k.notify, k.jobs, k.attempts, k.done, k.failed,
            k.cancelled]  # fmt: skip
    assert scripts.CANCEL.call(r, keys, [job[0], "chan"]) == b"pending"
    assert scripts.CANCEL.call(r, keys, [job[0], "chan"]) == b"pending"
    [res] = pop(rq).jobs  # the copy at the head, handed out as cancelled
    assert res.cancelled
    assert run(rq, lambda b: b.cancelled(k, res)) is True
    assert run(rq, lambda b: b.cancelled(k, res)) is True  # re-sent: from the receipt
    assert r.zcard(k.cancelled) == 1 and not r.hexists(k.jobs, job[0])
    assert pop(rq).jobs == []  # the stale copy left behind is dropped
    assert scripts.CANCEL.call(r, keys, [job[0], "chan"]) == b"cancelled"


def test_progress_from_a_stale_holder_is_refused(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    scripts.PUSH.call(r, [k.ready, k.notify, k.jobs, k.done, k.failed], list(job))
    [res] = pop(rq).jobs
    assert run(rq, lambda b: b.progress(k, res, b'{"done":1}', 60000)) is True
    stale = type(res)(res.id, res.queue, res.attempts, res.exceptions, res.envelope, res.token + 1)
    assert run(rq, lambda b: b.progress(k, stale, b'{"done":2}', 60000)) is False
    assert r.get(k.progress(res.id)) == b'{"done":1}'


def test_broadcast_publish_twice_adds_one_entry(rq: RedisQueue) -> None:
    from tidings.broadcasting.publish import publish_args

    keys, args = publish_args(rq.prefix, "news", "msg-1", "posted", b'{"n":1}',
                              max_len=100, receipt_ttl_s=60)  # fmt: skip
    first = scripts.BROADCAST_PUBLISH.call(rq.client, keys, args)
    second = scripts.BROADCAST_PUBLISH.call(rq.client, keys, args)
    assert first == second
    assert rq.client.xlen(keys[0]) == 1
    assert rq.client.hlen(keys[1]) == rq.client.llen(keys[2]) == 1  # no key per message


def test_a_release_after_the_lease_expired_takes_the_recovered_priority_copy_out(
    rq: RedisQueue,
) -> None:
    """A's lease expired and a pop put its job of priority 30 back on the priority zset,
    but nobody reserved it since (A's token still holds): A's release with a delay must
    take that copy out, as it does a priority-0 job's copy on the ready list, or the job
    runs again at once, skipping its backoff."""
    k, r = k_of(rq), rq.client
    job = envelope()
    rq.push("default", [job], priority=30)
    [a] = pop(rq, lease_s=0.05).jobs
    time.sleep(0.15)
    assert pop(rq, 0).jobs == []  # recovers the expired lease, reserves nothing
    assert r.zscore(k.prio, job[0]) is not None  # the recovered copy, at priority 30
    assert run(rq, lambda b: b.release(k, a, 60.0)) == 1  # A's token still holds
    assert r.zscore(k.prio, job[0]) is None and r.zscore(k.delayed, job[0]) is not None
    assert pop(rq).jobs == []  # nothing ready: the backoff holds
