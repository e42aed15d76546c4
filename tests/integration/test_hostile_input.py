"""A Redis writer without the key cannot stop work, nor run a job where it was not signed.

Garbage is written, as an attacker or a careless operator would, into every key the
scripts read (counters, ids, bodies, zset members, done and failed records, the restart
key, batch state); the invariant is
"innocent jobs still run, the worker stays up, nothing stays reserved". Replays of a
finished job are refused, and a job moved to another queue, or to another app's key
prefix, fails verification.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidings import App, Job
from tidings.worker.worker import Worker, WorkerOptions

KEY = "hostile-input-test-key-0123456789"
MODULE = __name__
RUNS: list[str] = []
#: Figures for the closing note: garbage cases tried, and how many stopped a worker.
FIGURES = {"cases": 0, "stopped": 0, "stranded": 0}


@dataclass
class Innocent(Job):
    tag: str

    def handle(self) -> None:
        RUNS.append(self.tag)


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        retry_after=30,
    )
    RUNS.clear()
    try:
        yield a
    finally:
        a.close()


def work(app: App, *, queues: list[str] | None = None, timeout_s: float = 15.0) -> Worker:
    """Run a worker until the queues are empty; it must end by itself, with code 0."""

    async def main() -> Worker:
        worker = Worker(
            app,
            WorkerOptions(
                queues=queues or ["default"], sleep_s=0.1, concurrency=4, stop_when_empty=True
            ),
        )
        worker.exit_code = await asyncio.wait_for(worker.run(), timeout_s)
        return worker

    return asyncio.run(main())


def keys_of(app: App, queue: str = "default") -> Any:
    return app.queue_for(None).keys(queue)


# -- 1. one write no longer stops every worker -------------------------------------------


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda r, k, victim: r.hset(k.attempts, victim, "abc"), id="attempts-abc"),
        pytest.param(lambda r, k, victim: r.hset(k.attempts, f"{victim}:e", "abc"), id="exc-abc"),
        pytest.param(lambda r, k, victim: r.hset(k.attempts, victim, "1e400"), id="attempts-float"),
        pytest.param(lambda r, k, victim: r.lpush(k.ready, b"\xff\xfe" * 16), id="non-utf8-id"),
        pytest.param(
            lambda r, k, victim: (
                r.hset(k.jobs, b"\xc3\x28" * 16, b"{}"),
                r.lpush(k.ready, b"\xc3\x28" * 16),
            ),
            id="non-utf8-id-with-body",
        ),
        pytest.param(lambda r, k, victim: r.lpush(k.ready, "\x1b[2Jid"), id="control-id"),
    ],
)
def test_one_malformed_entry_fails_alone_and_the_worker_runs_the_rest(
    app: App, plant: Callable[[redis.Redis, Any, str], object]
) -> None:
    ids = [Innocent(f"job{i}").dispatch() for i in range(5)]
    victim = ids[0]
    r, k = app.queue_for(None).client, keys_of(app)
    plant(r, k, victim)
    worker = work(app)
    assert worker.exit_code == 0
    sizes = app.queue_for(None).sizes(["default"])["default"]
    assert sizes["reserved"] == 0 and sizes["ready"] == 0
    failed = {f.id: f for f in app.queue_for(None).failed(["default"])}
    ran = set(RUNS)
    # Every job either ran or is in the failed store with the reason; none is stranded.
    for i, job_id in enumerate(ids):
        assert f"job{i}" in ran or job_id in failed
    # Innocent jobs (not the one whose counter was spoiled) all ran.
    assert {f"job{i}" for i in range(1, 5)} <= ran
    if victim in failed:
        assert "attempts counter" in failed[victim].exception
        # The body is kept intact: `failed retry` runs it again with fresh counters.
        assert app.queue_for(None).retry([victim]) == 1
        RUNS.clear()
        assert work(app).exit_code == 0
        assert RUNS == ["job0"]


def test_a_key_of_the_wrong_type_does_not_stop_the_worker_or_other_queues(app: App) -> None:
    r = app.queue_for(None).client
    r.set(keys_of(app, "broken").ready, "not a list")
    Innocent("other").on_queue("default").dispatch()

    async def main() -> Worker:
        worker = Worker(
            app, WorkerOptions(queues=["broken", "default"], sleep_s=0.1, concurrency=2)
        )
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 10
        while "other" not in RUNS and not task.done():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert not task.done(), "the worker died of a wrong-type key"
        worker.stop("test")
        worker.exit_code = await asyncio.wait_for(task, 10)
        return worker

    assert asyncio.run(main()).exit_code == 0
    assert RUNS == ["other"]


def test_status_monitor_and_failed_list_skip_a_queue_whose_keys_have_the_wrong_type(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    a_id = Innocent("on a").on_queue("a").dispatch()
    b_id = Innocent("on b").on_queue("b").dispatch()
    r, k, rq = app.queue_for(None).client, keys_of(app, "b"), app.queue_for(None)
    r.zadd(k.failed, {"gone": 1000})
    r.hset(k.failed_info, "gone", orjson.dumps({"name": "Gone", "exception": "boom"}))
    # A Redis writer without the key replaces every key of queue "a" with a string.
    for name in ("ready", "delayed", "reserved", "jobs", "attempts", "done", "failed",
                 "failed_info", "failed_body"):  # fmt: skip
        r.set(getattr(keys_of(app, "a"), name), "not what you think")
    caplog.set_level("ERROR", logger="tidings.moves.queues")
    assert app.job_status(b_id) == "pending"
    assert app.job_status(a_id) is None  # its record is gone with its keys
    sizes = rq.sizes(["a", "b"])
    assert list(sizes) == ["b"] and sizes["b"]["ready"] == 1 and sizes["b"]["failed"] == 1
    assert [f.id for f in rq.failed(["a", "b"])] == ["gone"]
    assert [f.id for f in rq.failed()] == ["gone"]
    found = rq.find_failed("gone")
    assert found is not None and found.name == "Gone"
    errors = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert errors and all("skipped queue 'a'" in e and "wrong type" in e for e in errors)
    assert {e.split(":")[0] for e in errors} >= {"job_status", "monitor", "failed list"}


def test_a_corrupt_counter_planted_while_the_job_runs_does_not_break_release(app: App) -> None:
    r, k = app.queue_for(None).client, keys_of(app)

    job_id = Innocent("x").dispatch()
    # Reserve it by hand (as a worker's pop would), spoil both counters, then release.
    from tidings.moves.consume import Broker

    async def main() -> bool:
        broker = Broker(app.queue_for(None).aclient(), retry_after_s=30, max_bytes=1 << 20)
        res = await broker.pop(k, 1)
        assert [j.id for j in res.jobs] == [job_id]
        r.hset(k.attempts, job_id, "abc")
        r.hset(k.attempts, f"{job_id}:e", "\xff")
        return await broker.release(k, res.jobs[0], 0, exception=True)

    assert asyncio.run(main()) == 1
    assert work(app).exit_code == 0
    assert RUNS == ["x"]


# -- the garbage fuzz ----------------------------------------------------------------------

NASTY = [
    b"abc",
    b"",
    b"1.5",
    b"1e400",
    b"99999999999999999999",
    b"-",
    b" 1",
    b"0x10",
    b"inf",
    b"nan",
    b"\xff\xfe",
    b"\x1b[2J",
    b'{"sig":"00","body":{}}',
    b"[]",
    b"null",
]
garbage = st.one_of(st.sampled_from(NASTY), st.binary(max_size=48))
ids = st.one_of(
    st.sampled_from([b"\xff" * 32, b"\x1b]52;c;aGk=\x07", b"a" * 300, b"x y", b"0" * 32]),
    st.binary(min_size=1, max_size=40),
)
case = st.one_of(
    st.tuples(st.just("attempts"), st.integers(0, 2), garbage),
    st.tuples(st.just("exceptions"), st.integers(0, 2), garbage),
    st.tuples(st.just("ready-id"), ids, st.none() | garbage),
    st.tuples(st.just("body"), st.integers(0, 2), garbage),
    st.tuples(st.just("delayed-member"), ids, st.none() | garbage),
    st.tuples(st.just("reserved-member"), ids, st.none() | garbage),
    st.tuples(st.just("failed-record"), ids, garbage),
    st.tuples(st.just("done-member"), ids, st.none()),
    st.tuples(st.just("restart"), st.none(), garbage),
    st.tuples(st.just("raw-seq"), ids, garbage),
)
_prefixes = count()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(case, min_size=1, max_size=6))
def test_garbage_in_every_key_never_stops_a_worker(
    redis_url: str, prefix: str, cases: list[tuple[str, Any, Any]]
) -> None:
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=f"{prefix}:{next(_prefixes)}",
        allowed_modules=MODULE,
        retry_after=30,
    )
    try:
        RUNS.clear()
        job_ids = [Innocent(f"job{i}").dispatch() for i in range(3)]
        r, k = app.queue_for(None).client, keys_of(app)
        targeted: set[int] = set()
        for kind, target, value in cases:
            FIGURES["cases"] += 1
            if kind in ("attempts", "exceptions", "body"):
                targeted.add(target)
                field = job_ids[target] + (":e" if kind == "exceptions" else "")
                r.hset(k.jobs if kind == "body" else k.attempts, field, value)
            elif kind == "ready-id":
                if value is not None:
                    r.hset(k.jobs, target, value)
                r.lpush(k.ready, target)
            elif kind in ("delayed-member", "reserved-member"):
                if value is not None:
                    r.hset(k.jobs, target, value)
                r.zadd(k.delayed if kind == "delayed-member" else k.reserved, {target: 0})
            elif kind == "failed-record":
                r.zadd(k.failed, {target: 1})
                r.hset(k.failed_info, target, value)
            elif kind == "raw-seq":
                # The failed store's sequence, and an entry that makes pop use it.
                r.hset(k.failed_info, "_seq", value)
                r.lpush(k.ready, target)
            elif kind == "restart":
                r.set(f"{app.settings.prefix}:restart", value)
            else:
                r.zadd(k.done, {target: 1})
        try:
            worker = work(app)
        except BaseException:
            FIGURES["stopped"] += 1
            raise
        if worker.exit_code != 0:
            FIGURES["stopped"] += 1
        assert worker.exit_code == 0
        sizes = app.queue_for(None).sizes(["default"])["default"]
        if sizes["reserved"] or sizes["ready"]:
            FIGURES["stranded"] += 1
        assert sizes["reserved"] == 0 and sizes["ready"] == 0
        ran = set(RUNS)
        failed = {f.id for f in app.queue_for(None).failed(["default"])}
        for i, job_id in enumerate(job_ids):
            if i in targeted:
                assert f"job{i}" in ran or job_id in failed
            else:
                assert f"job{i}" in ran, f"innocent job{i} did not run"
        assert len(RUNS) == len(ran), "a job ran twice"
        # The failed store stays listable whatever was written to it.
        for record in app.queue_for(None).failed(["default"]):
            orjson.dumps(record.summary())
    finally:
        for key in app.queue_for(None).client.scan_iter(match=f"{app.settings.prefix}:*"):
            app.queue_for(None).client.delete(key)
        app.close()


def test_zz_fuzz_figures() -> None:
    """Print the fuzz figures for the closing note (run after the fuzz, same module)."""
    print(f"\ngarbage fuzz: {FIGURES}")
    assert FIGURES["stopped"] == 0 and FIGURES["stranded"] == 0


# -- 2. replay ------------------------------------------------------------------------------


def _envelope(app: App, job_id: str, queue: str = "default") -> bytes:
    raw = app.queue_for(None).client.hget(keys_of(app, queue).jobs, job_id)
    assert isinstance(raw, bytes)
    return raw


def test_a_replayed_envelope_of_a_finished_job_does_not_run_again(app: App) -> None:
    job_id = Innocent("once").dispatch()
    copied = _envelope(app, job_id)
    assert work(app).exit_code == 0
    assert RUNS == ["once"] and app.job_status(job_id) == "done"
    r, k = app.queue_for(None).client, keys_of(app)
    for _ in range(3):  # as often as the attacker likes
        r.hset(k.jobs, job_id, copied)
        r.rpush(k.ready, job_id)
    assert work(app).exit_code == 0
    assert RUNS == ["once"]
    assert r.hexists(k.jobs, job_id) == 0  # the copy is gone, not kept to run later


def test_a_replayed_envelope_of_a_failed_job_does_not_run(app: App) -> None:
    job_id = Innocent("f").dispatch()
    copied = _envelope(app, job_id)
    r, k = app.queue_for(None).client, keys_of(app)
    r.hset(k.attempts, job_id, "junk")  # fails it (corrupt counter)
    assert work(app).exit_code == 0
    assert app.job_status(job_id) == "failed" and RUNS == []
    r.hset(k.jobs, job_id, copied)
    r.rpush(k.ready, job_id)
    assert work(app).exit_code == 0
    assert RUNS == []


def test_an_envelope_moved_to_another_queue_fails_verification(app: App) -> None:
    job_id = Innocent("moved").on_queue("low").dispatch()
    copied = _envelope(app, job_id, "low")
    r, k = app.queue_for(None).client, keys_of(app, "high")
    r.hset(k.jobs, job_id, copied)
    r.rpush(k.ready, job_id)
    assert work(app, queues=["high"]).exit_code == 0
    assert RUNS == []
    [record] = app.queue_for(None).failed(["high"])
    assert "bad signature" in record.exception and "'high'" in record.exception
    # On its own queue it runs as usual.
    assert work(app, queues=["low"]).exit_code == 0
    assert RUNS == ["moved"]


def test_an_envelope_copied_under_another_id_fails_verification(app: App) -> None:
    """The id is not in the body; the tag binds it: a copy under a fresh id (a second
    run of a job the writer liked) is refused, and the original still runs once."""
    job_id = Innocent("copied").dispatch()
    copied = _envelope(app, job_id)
    other = "f" * 32
    r, k = app.queue_for(None).client, keys_of(app)
    r.hset(k.jobs, other, copied)
    r.rpush(k.ready, other)
    assert work(app).exit_code == 0
    assert RUNS == ["copied"]
    [record] = app.queue_for(None).failed(["default"])
    assert record.id == other and "bad signature" in record.exception
    assert f"as job '{other}'" in record.exception


def test_an_envelope_copied_to_an_app_with_another_prefix_fails_verification(
    app: App, redis_url: str, prefix: str
) -> None:
    # Two apps on one Redis with one key, each under its own prefix.
    other = App(env=False, redis_url=redis_url, key=KEY, prefix=f"{prefix}-other",
                allowed_modules=MODULE, retry_after=30)  # fmt: skip
    app.make_current()
    try:
        job_id = Innocent("ours").dispatch()
        copied = _envelope(app, job_id)
        r, k = other.queue_for(None).client, keys_of(other)
        r.hset(k.jobs, job_id, copied)
        r.rpush(k.ready, job_id)
        assert work(other).exit_code == 0
        assert RUNS == []
        [record] = other.queue_for(None).failed(["default"])
        assert "bad signature" in record.exception and f"'{prefix}-other'" in record.exception
        # Under its own prefix it runs as usual.
        assert work(app).exit_code == 0
        assert RUNS == ["ours"]
    finally:
        for key in other.queue_for(None).client.scan_iter(match=f"{prefix}-other:*"):
            other.queue_for(None).client.delete(key)
        other.close()


def test_failed_list_survives_records_that_are_json_but_not_objects(app: App) -> None:
    r, k = app.queue_for(None).client, keys_of(app)
    for n, raw in enumerate([b"[1, 2]", b'"text"', b"42", b"null", b'{"attempts": "x"}']):
        r.zadd(k.failed, {f"bad{n}": n + 1})
        r.hset(k.failed_info, f"bad{n}", raw)
    r.zadd(k.failed, {b"\xff\xfe": 9})
    records = app.queue_for(None).failed(["default"])
    assert len(records) == 6
    assert [r.exception for r in records[:4]] == ["(unreadable failure record)"] * 4
    assert records[4].attempts == 0
    assert records[5].id == "\\xff\\xfe"


@pytest.mark.parametrize("field", ["pending", "processed", "failed", "callback"])
def test_garbage_in_a_batch_does_not_strand_its_jobs(app: App, field: str) -> None:
    from tidings.redis.keys import BatchKeys
    from tidings.workflows.batch import batch

    batch_id = batch([Innocent("b1"), Innocent("b2")]).then(Innocent("then")).dispatch()
    r = app.queue_for(None).client
    info = BatchKeys.build(app.settings.prefix, batch_id).info
    if field == "callback":
        r.hset(info, "cb:then:b", b"\xff not an envelope")
    else:
        r.hset(info, field, "abc")
    assert work(app).exit_code == 0
    assert {"b1", "b2"} <= set(RUNS)
    sizes = app.queue_for(None).sizes(["default"])["default"]
    assert sizes["reserved"] == 0 and sizes["ready"] == 0


def test_garbage_in_the_restart_key_neither_stops_nor_restarts_a_worker(app: App) -> None:
    from tidings.redis.keys import restart_key

    r = app.queue_for(None).client
    r.set(restart_key(app.settings.prefix), b"\xffnot-a-time")

    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(sleep_s=0.1, concurrency=2))
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)
        r.set(restart_key(app.settings.prefix), "nan")
        await Innocent("after").dispatch_async()
        deadline = time.monotonic() + 10
        while "after" not in RUNS:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.2)  # a housekeeping tick reads the key again
        assert not task.done(), "the worker stopped on a garbage restart key"
        worker.stop("test")
        worker.exit_code = await asyncio.wait_for(task, 10)
        return worker

    assert asyncio.run(main()).exit_code == 0
    assert app.queue_for(None).restart_requested_at() == 0.0


@dataclass
class Limited(Job):
    tag: str

    def middleware(self) -> list[Any]:
        from tidings.jobs.limits import RateLimited, ThrottlesExceptions

        return [RateLimited("hostile", per_second=1000, burst=10), ThrottlesExceptions(3, 60)]

    def handle(self) -> None:
        RUNS.append(self.tag)


@pytest.mark.parametrize("value", [b"abc", b"inf", b"nan", b"1e300", b"\xff"])
def test_garbage_in_limit_state_does_not_fail_the_jobs_under_it(app: App, value: bytes) -> None:
    from tidings.redis.keys import limit_key

    r = app.queue_for(None).client
    prefix = app.settings.prefix
    r.set(limit_key(prefix, "limit", "hostile"), value)
    r.set(limit_key(prefix, "throttle", f"{MODULE}:Limited"), value)
    Limited("limited").dispatch()
    assert work(app).exit_code == 0
    assert RUNS == ["limited"]
    assert app.queue_for(None).failed() == []


def test_a_job_outside_the_allowed_modules_names_the_setting(redis_url: str, prefix: str) -> None:
    narrow = App(
        env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules="elsewhere"
    )
    RUNS.clear()
    try:
        job_id = Innocent("never").dispatch()
        assert work(narrow).exit_code == 0
        [record] = narrow.queue_for(None).failed()
        assert record.id == job_id and RUNS == []
        assert "TIDINGS_ALLOWED_MODULES" in record.exception and "-A" in record.exception
    finally:
        narrow.close()
