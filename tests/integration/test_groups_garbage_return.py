"""Fair groups (issue 25): a job coming back (released, stalled, retried) while its
group's structures are garbage is parked in the delayed set, never put on the plain
ready list where it would run outside its group's limits; pop reports the group each
time it tries it again (every 5 s), and once the group is repaired the job runs in its
group, under its limits. Before, it went to the plain list (and with a garbage ring or
settings hash, to both its group's list and the plain list: two copies).
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.integration.test_groups_moves_twice import INFO, groups, pop, rq  # noqa: F401
from tests.integration.test_lua_scripts import envelope, k_of, run
from tidings.moves.queues import RedisQueue


def _due_now(rq: RedisQueue, job_id: str) -> None:
    """Skip the 5 s park (the test need not wait it out)."""
    rq.client.zadd(k_of(rq).delayed, {job_id: 0})


@pytest.mark.parametrize("garbage", ["g", "gring", "gcfg"])
def test_a_released_job_of_a_garbage_group_is_parked_not_run_outside_its_limit(
    rq: RedisQueue, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    k, r = k_of(rq), rq.client
    groups(rq).pause("other")  # a settings hash exists (garbage below replaces it)
    groups(rq).limit("acme", concurrency=1)
    rq.push("default", [envelope(), envelope()], group="acme")
    [job] = pop(rq).jobs
    broken = {"g": k.group("g", "acme"), "gring": k.gring, "gcfg": k.gcfg}[garbage]
    saved = r.dump(broken)
    r.delete(broken)
    r.set(broken, "garbage")
    assert run(rq, lambda b: b.release(k, job, 0)) == 1
    # Not on the plain list, not half in its group: once, in the delayed set, ~5 s out.
    assert r.llen(k.ready) == 0 and r.zcard(k.prio) == 0
    if garbage != "g":
        assert job.id.encode() not in r.lrange(k.group("g", "acme"), 0, -1)
    score = r.zscore(k.delayed, job.id)
    now_ms = r.time()[0] * 1000
    assert score is not None and now_ms + 3000 < score < now_ms + 7000
    if garbage == "gring":
        return  # a garbage ring stops every group's pop (queue-wide), not this job's alone
    # Its pop, once due, reports the group by name and parks it again.
    _due_now(rq, job.id)
    with caplog.at_level(logging.ERROR, logger="tidings"):
        got = pop(rq, 5).jobs
    assert job.id not in [j.id for j in got]
    assert r.zscore(k.delayed, job.id) is not None and r.llen(k.ready) == 0
    assert any("'acme'" in m.getMessage() and job.id in m.getMessage() for m in caplog.records)
    # Repaired: it comes back into its group and runs under the group's limit of 1.
    r.delete(broken)
    if saved is not None:
        r.restore(broken, 0, saved)
    groups(rq).resume("acme")
    _due_now(rq, job.id)
    taken = pop(rq, 5).jobs
    assert len(taken) == 1  # concurrency 1: one of the two, never both
    assert r.sismember(k.group("gr", "acme"), taken[0].id)
    assert r.llen(k.ready) == 0


def test_a_stalled_job_of_a_garbage_group_is_parked_and_its_slot_never_doubles(
    rq: RedisQueue,
) -> None:
    k, r = k_of(rq), rq.client
    groups(rq).limit("acme", concurrency=1)
    rq.push("default", [envelope(), envelope()], group="acme")
    [first] = pop(rq, 5, lease_s=0.3).jobs
    r.delete(k.group("g", "acme"))  # the other job's id goes with it (hand-written garbage)
    r.set(k.group("g", "acme"), "garbage")
    time.sleep(0.5)  # the lease ends
    assert pop(rq, 5).jobs == []
    assert r.zscore(k.delayed, first.id) is not None and r.llen(k.ready) == 0


def test_a_retried_job_of_a_garbage_group_is_parked_until_the_repair(rq: RedisQueue) -> None:
    k, r = k_of(rq), rq.client
    rq.push("default", [envelope()], group="acme")
    [job] = pop(rq).jobs
    run(rq, lambda b: b.fail(k, job, INFO))
    r.set(k.group("g", "acme"), "garbage")
    assert rq.retry([job.id]) == 1
    assert r.llen(k.ready) == 0 and r.zscore(k.delayed, job.id) is not None
    assert r.hget(k.attempts, f"{job.id}:g") == b"acme"
    r.delete(k.group("g", "acme"))
    _due_now(rq, job.id)
    [again] = pop(rq).jobs
    assert again.id == job.id and r.sismember(k.group("gr", "acme"), job.id)
