"""Each Lua script alone, against a real redis-server, through RedisQueue and Broker.

Rows: B1 (malformed entries go to the failed store inside pop), B6 (oversize bodies
diverted), B8 (bodies byte-exact through pop -> release -> migrate -> pop), B20
(duplicate ids), L5 (20,000 expired reservations migrate in bounded chunks).
Time is always Redis ``TIME``: assertions compare scores with the ``now`` a script
returned, never with this process's clock.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import orjson
import pytest
import redis

from tidings.jobs.compose import new_id
from tidings.moves.consume import Broker, PopResult, Reserved
from tidings.moves.queues import RedisQueue
from tidings.redis import scripts
from tidings.redis.clients import async_client
from tidings.redis.keys import QueueKeys
from tidings.wire.envelope import JobBody, open_envelope, read_body, seal
from tidings.wire.signing import Signer

T = TypeVar("T")
LEASE_S = 3.0
MAX_BYTES = 1024 * 1024
SIGNER = Signer([b"s" * 32])


@pytest.fixture
def rq(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    queue = RedisQueue(redis_url, prefix)
    try:
        yield queue
    finally:
        queue.close()


def run(
    rq: RedisQueue,
    fn: Callable[[Broker], Awaitable[T]],
    *,
    lease_s: float = LEASE_S,
    max_bytes: int = MAX_BYTES,
) -> T:
    """Run ``fn(broker)`` on a fresh event loop and asyncio client."""

    async def main() -> T:
        client = async_client(rq.url)
        try:
            return await fn(Broker(client, retry_after_s=lease_s, max_bytes=max_bytes))
        finally:
            await client.aclose()

    return asyncio.run(main())


def pop(rq: RedisQueue, n: int = 1, **kw: Any) -> PopResult:
    return run(rq, lambda b: b.pop(rq.keys("default"), n), **kw)


def held(rq: RedisQueue, job_id: str) -> Reserved:
    """``job_id`` as its current holder knows it (the token of its reservation)."""
    raw = rq.client.hget(rq.keys("default").attempts, f"{job_id}:t")
    return Reserved(job_id, "default", 0, 0, b"", int(raw) if raw else 0)


def ack(rq: RedisQueue, ids: list[str]) -> int:
    """Ack ``ids`` as their current holders."""
    jobs = [(i, held(rq, i).token) for i in ids]
    return len(run(rq, lambda b: b.ack(rq.keys("default"), jobs, b.ack_seq())))


def envelope(**data: Any) -> tuple[str, bytes]:
    """A real signed envelope (the pop script only checks the frame, but be realistic)."""
    job_id = new_id()
    body: JobBody = {
        "uuid": job_id,
        "displayName": "T",
        "job": "app:T",
        "data": data,
        "maxTries": None,
        "maxExceptions": None,
        "backoff": None,
        "timeout": None,
        "retryUntil": None,
        "pushedAt": 0.0,
        "chain": [],
        "chainCatch": None,
    }
    return job_id, seal(body, SIGNER, max_bytes=MAX_BYTES)


def redis_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def wait_until(predicate: Callable[[], T], timeout_s: float = 10.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def k_of(rq: RedisQueue) -> QueueKeys:
    return rq.keys("default")


# -- keys ----------------------------------------------------------------------------------


def test_every_key_of_a_queue_shares_one_hash_tag(prefix: str) -> None:
    k = QueueKeys.build(prefix, "mail")
    names = [getattr(k, f) for f in k.__dataclass_fields__ if f != "name"]
    assert len(set(names)) == len(names)
    for name in names:
        assert re.search(r"\{([^}]*)\}", name).group(1) == "mail"  # type: ignore[union-attr]


# -- push / pop / ack ------------------------------------------------------------------------


def test_push_pop_ack(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    items = [envelope(n=i) for i in range(3)]
    rq.push("default", items)
    assert r.lrange(k.ready, 0, -1) == [i.encode() for i, _ in items]
    assert r.hlen(k.jobs) == 3
    assert r.llen(k.notify) == 3  # one wake-up token per job
    assert rq.status(items[0][0], ["default"]) == "pending"

    res = pop(rq, 2)
    assert [(j.id, j.attempts, j.exceptions, j.envelope) for j in res.jobs] == [
        (items[0][0], 1, 0, items[0][1]),
        (items[1][0], 1, 0, items[1][1]),
    ]
    assert res.wait_s == 0.0  # more are ready
    now_ms = round(res.now_s * 1000)
    for job in res.jobs:
        assert r.zscore(k.reserved, job.id) == now_ms + int(LEASE_S * 1000)
    assert rq.status(items[0][0], ["default"]) == "reserved"

    last = pop(rq, 5)
    assert [j.id for j in last.jobs] == [items[2][0]]
    assert r.exists(k.notify) == 0  # list drained: stale tokens removed
    assert last.wait_s is not None and 0 < last.wait_s <= LEASE_S  # until the first lease ends

    lost = ack(rq, [i for i, _ in items])
    assert lost == 0
    assert r.zcount(k.reserved, "-inf", "(+inf") == 0
    assert r.hlen(k.jobs) == 0
    assert r.hlen(k.attempts) == 0
    assert r.zcard(k.done) == 3
    assert rq.status(items[0][0], ["default"]) == "done"
    # An ack for a job no longer reserved reports it as lost.
    assert ack(rq, [items[0][0]]) == 1

    empty = pop(rq, 5)
    assert empty.jobs == [] and empty.wait_s is None and empty.dropped == 0


def test_pop_reserves_at_most_n_and_keeps_fifo_order(rq: RedisQueue) -> None:
    items = [envelope(n=i) for i in range(10)]
    rq.push("default", items)
    got: list[str] = []
    for n in (1, 3, 0, 4, 5):
        res = pop(rq, n)
        assert len(res.jobs) == min(n, 10 - len(got))
        got += [j.id for j in res.jobs]
    assert got == [i for i, _ in items]


# -- later: delays measured on Redis TIME ------------------------------------------------------


def test_later_promotes_when_redis_time_reaches_the_due_time(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)], delay_s=0.4)
    due = r.zscore(k.delayed, job_id)
    assert due is not None and r.llen(k.ready) == 0
    assert rq.status(job_id, ["default"]) == "delayed"
    first = pop(rq)
    assert first.jobs == []
    assert first.wait_s is not None and 0 < first.wait_s <= 0.4
    assert first.now_s * 1000 < due

    pops_before_due = 0
    while True:
        res = pop(rq)
        if res.jobs:
            break
        assert res.now_s * 1000 < due
        pops_before_due += 1
        time.sleep(0.02)
    assert res.now_s * 1000 >= due  # promoted only once Redis time reached it
    assert res.jobs[0].envelope == env and res.jobs[0].attempts == 1
    assert r.zcard(k.delayed) == 0


def test_delayed_scores_are_compared_with_redis_time_only(rq: RedisQueue) -> None:
    """Scores written directly: one a second in the past (by Redis time) and one a minute
    ahead. Whatever this process's clock says, only the first is promoted."""
    k, r = k_of(rq), rq.client
    past, future = envelope(), envelope()
    now = redis_ms(r)
    r.hset(k.jobs, mapping={past[0]: past[1], future[0]: future[1]})
    r.zadd(k.delayed, {past[0]: now - 1000, future[0]: now + 60_000})
    res = pop(rq, 5)
    assert [j.id for j in res.jobs] == [past[0]]
    assert r.zrange(k.delayed, 0, -1) == [future[0].encode()]
    assert res.wait_s == LEASE_S  # the next thing due is the lease just taken, not the minute


def test_a_delayed_job_never_comes_due_before_its_time(rq: RedisQueue) -> None:
    """Redis ``TIME`` is read truncated to the millisecond and a delay of 50.9 ms is not a
    whole number of them: the due score is rounded up, never down, so a job delayed to a
    moment is not handed out before it (Django's ``run_after`` saw a task start 34 µs
    early when the delay was truncated). Every push that schedules is checked."""
    k, r = k_of(rq), rq.client
    pushes: list[Callable[[float], object]] = [
        lambda d: rq.push("default", [envelope()], delay_s=d),
        lambda d: rq.push("default", [envelope()], delay_s=d, priority=5),
        lambda d: rq.push("default", [envelope()], delay_s=d, group="g"),
    ]
    for push in pushes:
        for delay_s in (0.0509, 0.0001, 1.2345678):
            s, us = r.time()
            before_us = int(s) * 1_000_000 + int(us)
            push(delay_s)
            scores = r.zrange(k.delayed, 0, -1, withscores=True)
            assert len(scores) == 1
            assert scores[0][1] * 1000 >= before_us + delay_s * 1_000_000
            r.delete(k.delayed)


def test_later_wakes_a_sleeper_only_for_a_new_head(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], delay_s=30)
    assert r.llen(k.notify) == 1
    rq.push("default", [envelope()], delay_s=60)  # later than the head: no token
    assert r.llen(k.notify) == 1
    rq.push("default", [envelope()], delay_s=10)  # new head: a sleeper must shorten its wait
    assert r.llen(k.notify) == 2


# -- release ---------------------------------------------------------------------------------


def test_release_now_later_uncounted_and_after_exception(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    other = envelope()
    rq.push("default", [(job_id, env), other])
    assert pop(rq).jobs[0].attempts == 1

    # Release now: to the back of the ready list, the attempt stays counted.
    assert run(rq, lambda b: b.release(k, held(rq, job_id), 0)) == 1
    assert r.zscore(k.reserved, job_id) is None
    assert r.lrange(k.ready, 0, -1) == [other[0].encode(), job_id.encode()]
    res = pop(rq, 2)
    assert [(j.id, j.attempts) for j in res.jobs] == [(other[0], 1), (job_id, 2)]

    # Release with a delay: onto the delayed zset, due at Redis now + delay.
    before = redis_ms(r)
    assert run(rq, lambda b: b.release(k, held(rq, job_id), 0.3)) == 1
    score = r.zscore(k.delayed, job_id)
    assert score is not None and before + 300 <= score <= redis_ms(r) + 301  # rounded up
    assert pop(rq).jobs == []
    res = pop(rq)
    while not res.jobs:
        time.sleep(0.02)
        res = pop(rq)
    assert res.now_s * 1000 >= score
    assert res.jobs[0].attempts == 3

    # Release uncounted (middleware: rate limit, overlap): the attempt is given back.
    assert run(rq, lambda b: b.release(k, held(rq, job_id), 0, uncount=True)) == 1
    assert pop(rq).jobs[0].attempts == 3

    # Release after an exception: counts toward maxExceptions.
    assert run(rq, lambda b: b.release(k, held(rq, job_id), 0, exception=True)) == 1
    again = pop(rq).jobs[0]
    assert (again.attempts, again.exceptions) == (4, 1)

    # A job that finished elsewhere cannot be released back to life.
    ack(rq, [job_id])
    assert run(rq, lambda b: b.release(k, held(rq, job_id), 0)) == 0
    assert run(rq, lambda b: b.release(k, held(rq, "f" * 32), 0)) == 0
    assert r.llen(k.ready) == 0 and r.zcard(k.delayed) == 0


# -- fail, the failed store, retry ---------------------------------------------------------------


def _fail(rq: RedisQueue, job_id: str, text: str = "boom", body: bytes = b"") -> None:
    info = {"exception": text, "name": "T", "queue": "default", "attempts": 1}
    if body:  # an operator's move (no reservation): the given body is kept
        k = k_of(rq)
        keys = [k.reserved, k.jobs, k.attempts, k.failed, k.failed_info, k.failed_body]
        keys.append(k.receipt("-"))
        scripts.FAIL.call(rq.client, keys, [job_id, orjson.dumps(info), body, ""])
        return
    run(rq, lambda b: b.fail(k_of(rq), held(rq, job_id), info))


def test_fail_moves_reserved_to_the_failed_store(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)])
    pop(rq)
    before = redis_ms(r)
    _fail(rq, job_id, "ValueError: nope")
    assert r.zscore(k.reserved, job_id) is None
    assert r.hexists(k.jobs, job_id) == 0
    assert r.hlen(k.attempts) == 0
    assert r.hget(k.failed_body, job_id) == env
    score = r.zscore(k.failed, job_id)
    assert score is not None and score >= before
    [record] = rq.failed()
    assert (record.id, record.queue, record.name, record.attempts) == (job_id, "default", "T", 1)
    assert record.exception == "ValueError: nope"
    assert record.payload == env
    assert record.failed_at == pytest.approx(score / 1000)
    assert rq.find_failed(job_id) == record
    assert rq.find_failed("0" * 32) is None
    assert rq.status(job_id, ["default"]) == "failed"
    assert rq.sizes() == {"default": {"ready": 0, "delayed": 0, "reserved": 0, "failed": 1}}


def test_fail_keeps_the_given_body_when_the_jobs_hash_has_none(rq: RedisQueue) -> None:
    _fail(rq, "x" * 32, body=b"raw bytes")
    assert rq.client.hget(k_of(rq).failed_body, "x" * 32) == b"raw bytes"


def test_retry_forget_prune_flush(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    items = [envelope(n=i) for i in range(4)]
    rq.push("default", items)
    pop(rq, 4)
    run(rq, lambda b: b.release(k, held(rq, items[0][0]), 0, exception=True))  # counters to reset
    pop(rq)
    for job_id, _ in items:
        _fail(rq, job_id)
    assert len(rq.failed()) == 4

    assert rq.retry([items[0][0], "0" * 32]) == 1
    assert r.lrange(k.ready, 0, -1) == [items[0][0].encode()]
    again = pop(rq).jobs[0]
    assert (again.id, again.attempts, again.exceptions, again.envelope) == (
        items[0][0],
        1,
        0,
        items[0][1],
    )
    assert len(rq.failed()) == 3

    assert rq.forget([items[1][0]]) == 1
    assert rq.forget([items[1][0]]) == 0
    assert r.hexists(k.failed_info, items[1][0]) == 0
    assert r.hexists(k.failed_body, items[1][0]) == 0

    assert rq.prune(3600) == 0  # all failed just now
    assert rq.retry(None) == 2  # --all
    assert {j.id for j in pop(rq, 5).jobs} == {items[2][0], items[3][0]}
    for job_id, _ in items[2:]:
        _fail(rq, job_id)
    _fail(rq, items[1][0])  # forgotten, held by no one: refused, no record (no empty body)
    assert rq.prune(-1) == 2  # everything failed before "now + 1 s"
    _fail(rq, items[0][0])
    assert rq.flush() == 1
    assert rq.failed() == []
    for key in (k.failed, k.failed_info, k.failed_body):
        assert r.exists(key) == 0


# -- extend -----------------------------------------------------------------------------------


def test_extend_renews_leases_and_returns_lost_ids(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    a, b = envelope(), envelope()
    rq.push("default", [a, b])
    res = pop(rq, 2, lease_s=1.0)
    first = r.zscore(k.reserved, a[0])
    tokens = {j.id: j.token for j in res.jobs}
    jobs = [(a[0], tokens[a[0]]), (b[0], tokens[b[0]]), ("9" * 32, 1)]
    lost = run(rq, lambda br: br.extend(k, jobs), lease_s=30.0).lost
    assert lost == ["9" * 32]
    renewed = r.zscore(k.reserved, a[0])
    assert renewed is not None and first is not None
    assert renewed >= res.now_s * 1000 + 30_000 > first
    ack(rq, [a[0]])
    assert run(rq, lambda br: br.extend(k, jobs[:2])).lost == [a[0]]
    # A stale token (the job was handed out again) renews nothing.
    assert run(rq, lambda br: br.extend(k, [(b[0], tokens[b[0]] - 1)])).lost == [b[0]]


def test_extend_failing_marks_the_job_so_a_cancel_answers_failing(rq: RedisQueue) -> None:
    from tidings.moves.control import cancel

    k, r = k_of(rq), rq.client
    a, b = envelope(), envelope()
    rq.push("default", [a, b])
    res = pop(rq, 2, lease_s=30.0)
    tokens = {j.id: j.token for j in res.jobs}
    # b was cancelled first: the failure's check reports it and marks nothing.
    assert cancel(rq, b[0], ["default"]) == "cancelling"
    for _ in range(2):  # run twice: the same mark, the same answer
        renewed = run(
            rq,
            lambda br: br.extend(k, [(a[0], tokens[a[0]]), (b[0], tokens[b[0]])], failing=True),
        )
        assert renewed.lost == [] and renewed.cancelled == [b[0]]
        assert r.hget(k.attempts, f"{a[0]}:f") == str(tokens[a[0]]).encode()
        assert r.hget(k.attempts, f"{b[0]}:f") is None
    for _ in range(2):
        out = cancel(rq, a[0], ["default"])
        assert out == "failing" and not out.changed
    assert r.hget(k.attempts, f"{a[0]}:c") is None  # not marked cancelled
    # A plain renewal marks nothing; a stale token marks nothing.
    assert run(rq, lambda br: br.extend(k, [(b[0], tokens[b[0]] - 1)], failing=True)).lost == [b[0]]
    assert r.hget(k.attempts, f"{b[0]}:f") is None


def test_a_stale_failing_mark_means_nothing_and_pop_drops_it(rq: RedisQueue) -> None:
    """A worker marked its job failing, then froze past its lease: the job stalls and is
    handed out again; the old mark names the old token, so a cancel of the new run is
    'cancelling', and the pop that handed it out deleted the mark."""
    from tidings.moves.control import cancel

    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)])
    first = pop(rq, lease_s=0.2).jobs[0]
    run(rq, lambda br: br.extend(k, [(job_id, first.token)], failing=True), lease_s=0.2)
    assert cancel(rq, job_id, ["default"]) == "failing"
    time.sleep(0.25)
    again = pop(rq, lease_s=30.0)
    while not again.jobs:
        time.sleep(0.02)
        again = pop(rq, lease_s=30.0)
    assert again.jobs[0].token != first.token and again.jobs[0].stalls == 1
    assert r.hget(k.attempts, f"{job_id}:f") is None
    assert cancel(rq, job_id, ["default"]) == "cancelling"


def test_expired_lease_is_migrated_and_counted_as_a_stall(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id, env = envelope()
    rq.push("default", [(job_id, env)])
    first = pop(rq, lease_s=0.2).jobs[0]
    assert first.attempts == 1
    assert pop(rq).jobs == []  # still leased
    score = r.zscore(k.reserved, job_id)
    assert score is not None
    res = pop(rq)
    while not res.jobs:
        time.sleep(0.02)
        res = pop(rq)
    assert res.now_s * 1000 >= score
    again = res.jobs[0]
    # A stall, not an attempt: the attempt is given back, the stall counted, a new token.
    assert (again.id, again.attempts, again.stalls, again.envelope) == (job_id, 1, 1, env)
    assert again.token > first.token


# -- B1: malformed entries go to the failed store inside pop -------------------------------------


@pytest.mark.parametrize(
    ("body", "handed_out"),
    [
        (b'{"s":"' + b"A" * 22 + b'","j":1 not json}', True),  # the frame: not decoded here
        (b'{"sig":"' + b"0" * 64 + b'","body":{not json}', True),  # the previous frame
        (b'{"s":"' + b"A" * 21 + b'","j":1 not json}', False),  # a short tag: off the frame
        (b'{"s":"' + b"A" * 22 + b'","j":1 not json', False),  # no closing brace
        (b'{"s":"' + b"A" * 22 + b'",', False),
    ],
    ids=["current", "previous", "short-tag", "unclosed", "cut"],
)
def test_the_pop_checks_the_frame_of_either_version(
    rq: RedisQueue, body: bytes, handed_out: bool
) -> None:
    """Bodies on a frame go to the worker undecoded (it verifies and parses every one);
    only those off it are decoded, and failed here when they are not JSON."""
    k, r = k_of(rq), rq.client
    job_id = uuid.uuid4().hex
    r.hset(k.jobs, job_id, body)
    r.rpush(k.ready, job_id)
    res = pop(rq, 10)
    assert [j.id for j in res.jobs] == ([job_id] if handed_out else [])
    record = rq.find_failed(job_id)
    if handed_out:
        assert record is None
    else:
        assert record is not None and record.exception == "malformed payload: not JSON"
        assert record.payload == body


def test_malformed_entries_are_failed_inside_pop_and_valid_jobs_still_run(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    good1, good2 = envelope(n=1), envelope(n=2)
    bad_json_id = uuid.uuid4().hex
    truncated_id, truncated = envelope(n=3)
    rq.push("default", [good1])
    r.rpush(k.ready, "not-json{")  # a raw payload pushed by hand: not an id at all
    r.hset(k.jobs, bad_json_id, "not-json{")
    r.rpush(k.ready, bad_json_id)
    r.hset(k.jobs, truncated_id, truncated[: len(truncated) // 2])
    r.rpush(k.ready, truncated_id)
    rq.push("default", [good2])

    res = pop(rq, 10)
    assert [j.id for j in res.jobs] == [good1[0], good2[0]]
    assert r.llen(k.ready) == 0
    assert r.hkeys(k.jobs) and set(r.hkeys(k.jobs)) == {good1[0].encode(), good2[0].encode()}

    records = {f.id: f for f in rq.failed()}
    assert len(records) == 3
    raw_ids = [i for i in records if i.startswith("raw-")]
    assert len(raw_ids) == 1
    assert records[raw_ids[0]].exception == "malformed queue entry: not a job id"
    assert records[raw_ids[0]].payload == b"not-json{"
    assert records[bad_json_id].exception == "malformed payload: not JSON"
    assert records[bad_json_id].payload == b"not-json{"
    assert records[truncated_id].payload == truncated[: len(truncated) // 2]
    assert all(f.name == "(unreadable)" for f in records.values())

    # Retrying a malformed record cannot loop: it lands in the failed store again.
    assert rq.retry([bad_json_id]) == 1
    assert pop(rq, 10).jobs == []
    assert rq.find_failed(bad_json_id) is not None


def test_stale_id_with_no_body_is_dropped_not_failed(rq: RedisQueue) -> None:
    r, k = rq.client, k_of(rq)
    r.rpush(k.ready, uuid.uuid4().hex)  # a job that finished: its body is gone
    res = pop(rq, 5)
    assert (res.jobs, res.dropped) == ([], 1)
    assert rq.failed() == []


# -- B6: oversize bodies are diverted before any decode -------------------------------------------


def test_oversize_body_is_diverted_with_a_preview(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    big_id, big = envelope(blob="x" * 50_000)
    small = envelope()
    rq.push("default", [(big_id, big), small])
    res = pop(rq, 5, max_bytes=10_000)
    assert [j.id for j in res.jobs] == [small[0]]
    record = rq.find_failed(big_id)
    assert record is not None
    assert record.exception == f"payload too large: {len(big)} bytes"
    assert record.payload == big[:4096]
    assert r.hexists(k.jobs, big_id) == 0


def test_injected_body_over_the_default_limit(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job_id = uuid.uuid4().hex
    r.hset(k.jobs, job_id, b'"' + b"y" * (2 * 1024 * 1024) + b'"')
    r.rpush(k.ready, job_id)
    assert pop(rq, 5).jobs == []
    record = rq.find_failed(job_id)
    assert record is not None and record.exception.startswith("payload too large")
    assert len(record.payload) == 4096


# -- B8: byte-exact bodies through every move ------------------------------------------------------

RAW_BODIES = [
    b'{"a":[],"b":{},"c":[[],{}]}',
    b'{"big":123456789012345678901234567890,"neg":-9007199254740993,"f":1.0000000000000002}',
    b'{"s":"a\\/b","u":"\\u00e9\\ud83d\\ude00","raw":"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"}',
    b'{"z":1,"a":2,"m":{"y":[3,2,1],"b":null}}',
    b'{ "spaced" : [ 1 , 2 ] ,\n "e": 1e2 }',
]


def _exact_fixtures() -> list[tuple[str, bytes]]:
    # Framed as envelopes (the pop checks the frame, not the signature): the bodies'
    # bytes are what must come through every move unchanged.
    frame = b'{"sig":"' + b"0" * 64 + b'","body":'
    fixtures = [(uuid.uuid4().hex, frame + raw + b"}") for raw in RAW_BODIES]
    fixtures.append(
        envelope(
            empty_list=[], empty_obj={}, big=2**63 - 1, slash="/", text="\u00e9\u4e2d\U0001f600"
        )
    )
    return fixtures


def test_bodies_are_byte_exact_through_every_move(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    fixtures = _exact_fixtures()
    want = dict(fixtures)
    n = len(fixtures)
    rq.push("default", fixtures)

    def drain(**kw: Any) -> dict[str, bytes]:
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + 10
        while len(got) < n:
            assert time.monotonic() < deadline
            got.update({j.id: j.envelope for j in pop(rq, n, **kw).jobs})
            time.sleep(0.01)
        return got

    assert drain(lease_s=0.2) == want  # push -> pop
    assert drain() == want  # expired leases -> migrate -> pop
    for job_id in want:
        run(rq, lambda b, i=job_id: b.release(k, held(rq, i), 0.05))
    assert drain() == want  # release -> delayed -> promote -> pop
    for job_id in want:
        run(rq, lambda b, i=job_id: b.release(k, held(rq, i), 0))
    assert drain() == want  # release now -> pop
    for job_id in want:
        _fail(rq, job_id)
    assert {f.id: f.payload for f in rq.failed()} == want  # fail keeps the bytes
    assert rq.retry(None) == n
    assert drain() == want  # failed -> retry -> pop
    sealed_id = fixtures[-1][0]
    assert open_envelope(want[sealed_id], SIGNER, job_id=sealed_id)["data"]["empty_list"] == []
    assert r.zcard(k.delayed) == 0


# -- B20: duplicate ids ---------------------------------------------------------------------------


def test_duplicate_ids_in_one_pop_run_once(rq: RedisQueue) -> None:
    """Documented outcome: two byte-identical entries (same id) in the ready list share
    one body; the first is reserved, the second is dropped (counted in ``dropped``) while
    the first is reserved, and dropped as stale once it finished. The job runs once.
    (A push of the same id twice lands it once; the second entry is put there by hand.)"""
    k, r = k_of(rq), rq.client
    job = envelope()
    rq.push("default", [job, job])
    assert (r.llen(k.ready), r.hlen(k.jobs)) == (1, 1)
    r.rpush(k.ready, job[0])
    res = pop(rq, 5)
    assert ([j.id for j in res.jobs], res.dropped) == ([job[0]], 1)
    assert r.llen(k.ready) == 0


def test_a_suspect_inside_a_batch_ends_the_pop_and_the_rest_keep_their_order(
    rq: RedisQueue,
) -> None:
    """The pop takes a plain queue's ids in one LPOP: a suspect (stalled before) met
    after other jobs ends the pop there, and it and the ids behind it go back to the
    head in their order; the next pop hands it out alone."""
    k, r = k_of(rq), rq.client
    jobs = [envelope(n=i) for i in range(5)]
    rq.push("default", jobs)
    ids = [j[0] for j in jobs]
    r.hset(k.attempts, f"{ids[2]}:s", 1)
    res = pop(rq, 5)
    assert [j.id for j in res.jobs] == ids[:2]
    assert [x.decode() for x in r.lrange(k.ready, 0, -1)] == ids[2:]
    alone = pop(rq, 5).jobs
    assert [(j.id, j.stalls) for j in alone] == [(ids[2], 1)]
    assert [j.id for j in pop(rq, 5).jobs] == ids[3:]
    assert r.zcount(k.reserved, "-inf", "(+inf") == 5


def test_the_attempts_hash_is_a_hashtable_while_jobs_are_held_and_goes_when_empty(
    rq: RedisQueue,
) -> None:
    """pop keeps one long field in the attempts hash so that Redis stores it as a
    hashtable (a lookup a field, not a listpack scan); ack and fail delete the key once
    that field is all it holds, and a fresh pop puts it back."""
    k, r = k_of(rq), rq.client
    jobs = [envelope(n=i) for i in range(3)]
    rq.push("default", jobs)
    held_jobs = pop(rq, 2).jobs
    assert r.object("encoding", k.attempts) == b"hashtable"
    assert r.hlen(k.attempts) == 2 * 2 + 1
    ack(rq, [held_jobs[0].id])
    assert r.object("encoding", k.attempts) == b"hashtable"
    ack(rq, [held_jobs[1].id])
    assert not r.exists(k.attempts)  # only the encoding field was left: the key went
    last = pop(rq, 1).jobs[0]
    assert r.object("encoding", k.attempts) == b"hashtable"
    failed = run(rq, lambda b: b.fail(k, last, {"exception": "x", "name": "T", "attempts": 1}))
    assert failed and not r.exists(k.attempts)


def test_the_reserved_zset_is_a_skiplist_while_jobs_are_held_and_goes_when_empty(
    rq: RedisQueue,
) -> None:
    """pop keeps one long member (score +inf) in the reserved zset so that Redis stores
    it as a skiplist (a lookup a member, not a listpack scan); it is no job: sizes, the
    wait and recover leave it out, and ack, fail and release delete the key once it is
    all the zset holds."""
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope(n=i) for i in range(4)])
    held_jobs = pop(rq, 2).jobs
    assert r.object("encoding", k.reserved) == b"skiplist"
    assert r.zcard(k.reserved) == 3
    assert rq.sizes(["default"])["default"]["reserved"] == 2
    (name,) = r.zrangebyscore(k.reserved, "+inf", "+inf")
    assert rq.status(name.decode(), ["default"]) is None  # the mark's name is no job
    assert rq.status(held_jobs[0].id, ["default"]) == "reserved"
    ack(rq, [held_jobs[0].id])
    assert r.object("encoding", k.reserved) == b"skiplist"
    ack(rq, [held_jobs[1].id])
    assert not r.exists(k.reserved)  # only the mark was left: the key went
    last = pop(rq, 1).jobs[0]
    failed = run(rq, lambda b: b.fail(k, last, {"exception": "x", "name": "T", "attempts": 1}))
    assert failed and not r.exists(k.reserved)
    back = pop(rq, 1).jobs[0]
    assert run(rq, lambda b: b.release(k, back, 0)) == 1 and not r.exists(k.reserved)
    # A pop with only the mark left behind (a lease it recovered) waits for no lease.
    held = pop(rq, 1).jobs
    assert len(held) == 1 and r.zcard(k.reserved) == 2
    r.zadd(k.reserved, {held[0].id: 0})  # its lease ended
    res = pop(rq, 0)
    assert not res.jobs and not r.exists(k.reserved)
    # The mark alone (left by hand) is no lease to wait for, and no job to recover.
    assert [j.id for j in pop(rq, 1).jobs] == [held[0].id]  # the recovered job
    (mark,) = r.zrangebyscore(k.reserved, "+inf", "+inf")
    r.zrem(k.reserved, held[0].id)
    res = pop(rq, 1)
    assert not res.jobs and res.wait_s is None and r.zrange(k.reserved, 0, -1) == [mark]


def test_pop_hands_out_exceptions_stalls_and_the_cancel_mark(rq: RedisQueue) -> None:
    """The pop reply carries a job's exceptions, stalls and cancel mark in one entry (0
    when none): each reaches the worker as it is in Redis."""
    k, r = k_of(rq), rq.client
    jobs = [envelope(n=i) for i in range(3)]
    rq.push("default", jobs)
    ids = [j[0] for j in jobs]
    r.hset(k.attempts, mapping={f"{ids[0]}:e": 2, f"{ids[0]}:s": 3, f"{ids[1]}:c": 1})
    got = pop(rq, 1).jobs + pop(rq, 2).jobs  # the suspect (stalled) comes alone
    assert [(j.id, j.exceptions, j.stalls, j.cancelled) for j in got] == [
        (ids[0], 2, 3, False),
        (ids[1], 0, 0, True),
        (ids[2], 0, 0, False),
    ]


def test_the_same_id_twice_in_one_ack_settles_once(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    job = envelope()
    rq.push("default", [job])
    got = pop(rq, 1).jobs[0]
    lost = run(
        rq,
        lambda b: b.ack(k, [(got.id, got.token), (got.id, got.token)], b.ack_seq()),
    )
    assert lost == [got.id]  # the second entry found its job settled by the first
    assert r.zscore(k.done, got.id) is not None
    assert (r.hlen(k.attempts), r.zcount(k.reserved, "-inf", "(+inf"), r.hlen(k.jobs)) == (0, 0, 0)


def test_duplicate_id_popped_while_reserved_or_after_ack(rq: RedisQueue) -> None:
    k = k_of(rq)
    job = envelope()
    rq.push("default", [job])
    rq.client.rpush(k.ready, job[0])
    assert [j.id for j in pop(rq, 1).jobs] == [job[0]]
    res = pop(rq, 1)  # the copy while the first is reserved
    assert (res.jobs, res.dropped) == ([], 1)
    ack(rq, [job[0]])
    rq.client.rpush(k.ready, job[0])  # a copy seen after the ack: a stale id
    res = pop(rq, 1)
    assert (res.jobs, res.dropped) == ([], 1)
    assert rq.failed() == []


def test_producer_ids_are_distinct() -> None:
    ids = {new_id() for _ in range(100_000)}
    assert len(ids) == 100_000
    assert all(len(i) == 32 for i in list(ids)[:100])


# -- L5: big backlogs move in bounded chunks -------------------------------------------------------


def _seed(r: redis.Redis, k: QueueKeys, zset: str, n: int) -> list[str]:
    ids = [f"{i:032x}" for i in range(n)]
    pipe = r.pipeline(transaction=False)
    for start in range(0, n, 5000):
        chunk = ids[start : start + 5000]
        pipe.hset(
            k.jobs, mapping={i: b'{"sig":"' + b"0" * 64 + b'","body":{"n":1}}' for i in chunk}
        )
        pipe.zadd(zset, {i: 1 for i in chunk})  # due/expired long ago
    pipe.execute()
    return ids


@pytest.mark.parametrize("which", ["reserved", "delayed"])
def test_20000_due_entries_migrate_in_chunks(rq: RedisQueue, which: str) -> None:
    k, r = k_of(rq), rq.client
    ids = _seed(r, k, getattr(k, which), 20_000)
    calls, slowest = 0, 0.0
    while r.zcard(getattr(k, which)):
        t0 = time.perf_counter()
        res = pop(rq, 0)  # migrate only
        slowest = max(slowest, time.perf_counter() - t0)
        assert res.jobs == []
        calls += 1
        assert calls <= 25
    assert calls == 20  # 1,000 per call, never one unpack() of everything
    ready = r.lrange(k.ready, 0, -1)
    assert len(ready) == 20_000 and {i.decode() for i in ready} == set(ids)
    res = pop(rq, 100)
    if which == "reserved":
        # Recovered from an expired lease, each is a suspect: handed out alone.
        assert len(res.jobs) == 1 and res.jobs[0].stalls == 1 and res.jobs[0].attempts == 1
    else:
        assert len(res.jobs) == 100 and all(j.attempts == 1 for j in res.jobs)
    print(f"L5 {which}: {calls} pop calls, slowest {slowest * 1000:.1f} ms (incl. round trip)")
    assert rq.clear("default") == 20_000 - len(res.jobs)
    assert r.hlen(k.jobs) == len(res.jobs)  # the reserved ones keep their bodies


def test_clear_deletes_ready_and_delayed_with_bodies(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope() for _ in range(1500)])
    rq.push("default", [envelope() for _ in range(700)], delay_s=60)
    kept = envelope()
    rq.push("default", [kept])
    r.lrem(k.ready, 0, kept[0])
    r.zadd(k.reserved, {kept[0]: redis_ms(r) + 60_000})
    assert rq.clear("default") == 2200
    assert (r.llen(k.ready), r.zcard(k.delayed)) == (0, 0)
    assert r.hkeys(k.jobs) == [kept[0].encode()]  # a running job is not cleared


def test_scripts_are_reloaded_after_script_flush(rq: RedisQueue) -> None:
    rq.client.script_flush()
    job = envelope()
    rq.push("default", [job])
    rq.client.script_flush()
    assert pop(rq).jobs[0].envelope == job[1]


def test_push_to_a_named_queue_uses_its_own_keys(rq: RedisQueue) -> None:
    rq.push("mail", [envelope()])
    assert rq.sizes(["mail", "default"]) == {
        "mail": {"ready": 1, "delayed": 0, "reserved": 0, "failed": 0},
        "default": {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0},
    }
    assert "mail" in rq.queue_names()
    res = run(rq, lambda b: b.pop(rq.keys("mail"), 5))
    assert len(res.jobs) == 1 and res.jobs[0].queue == "mail"
    assert read_body(res.jobs[0].envelope)["displayName"] == "T"  # type: ignore[index]
