"""Results, progress, cancelling and priorities (issue 23), against a real redis-server.

The worker runs in-process (``Worker.run()`` under ``asyncio.run``) on jobs defined here;
each test names the guarantee it checks, and each would fail on a worker without it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tidings import (
    App,
    Job,
    JobCancelled,
    JobFailedError,
    JobNotFound,
    ResultMissing,
    ValidationError,
    batch,
    chain,
)
from tidings.observability.lifecycle import JobProgressed, JobWasCancelled
from tidings.redis import scripts
from tidings.worker.worker import Worker, WorkerOptions

KEY = "control-test-key-0123456789abcdef"
MODULE = __name__

RUNS: list[tuple[Any, ...]] = []
STARTED: set[str] = set()
EVENTS: list[object] = []


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    STARTED.clear()
    EVENTS.clear()
    yield


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        retry_after=3,
        metrics=False,
    )
    a.events.listen(JobProgressed, EVENTS.append)
    a.events.listen(JobWasCancelled, EVENTS.append)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def r(app: App) -> redis.Redis:
    return app.queue_for(None).client


def work(
    app: App,
    *,
    until: Callable[[], object] | None = None,
    timeout_s: float = 20.0,
    **options: Any,
) -> Worker:
    options.setdefault("sleep_s", 0.2)
    options.setdefault("concurrency", 1)
    options.setdefault("stop_when_empty", until is None)

    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(**options))
        task = asyncio.create_task(worker.run())
        if until is not None:
            deadline = time.monotonic() + timeout_s
            while not until() and not task.done():
                assert time.monotonic() < deadline, "worker condition not met in time"
                await asyncio.sleep(0.01)
            worker.stop("test condition met")
        worker.exit_code = await asyncio.wait_for(task, timeout_s)
        return worker

    return asyncio.run(main())


# -- jobs ------------------------------------------------------------------------------------


@dataclass
class Note(Job):
    tag: str

    def handle(self) -> None:
        RUNS.append((self.tag,))


@dataclass
class Urgent(Job):
    tag: str
    priority = 50

    def handle(self) -> None:
        RUNS.append((self.tag,))


@dataclass
class FailsOnce(Job):
    tag: str
    tries = 2

    def handle(self) -> None:
        RUNS.append((self.tag, self.attempts))
        if self.attempts == 1:
            raise RuntimeError("first try fails")


@dataclass
class Answer:
    n: int
    when: dt.datetime


@dataclass
class Compute(Job):
    n: int
    store_result = True

    def handle(self) -> Any:
        return {"answer": Answer(self.n * 2, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))}


@dataclass
class NoResultKept(Job):
    def handle(self) -> int:
        return 1


@dataclass
class Boom(Job):
    store_result = True

    def handle(self) -> None:
        raise ValueError(f"bad input: key {KEY} in the message")


@dataclass
class Huge(Job):
    store_result = True
    result_max_bytes = 1000

    def handle(self) -> str:
        return "x" * 5000


@dataclass
class Unencodable(Job):
    store_result = True

    def handle(self) -> Any:
        return {"when": object()}


@dataclass
class Counts(Job):
    n: int

    async def handle(self) -> None:
        for i in range(1, self.n + 1):
            self.progress(i, self.n, f"step {i}")
            if i % 100 == 0:
                await asyncio.sleep(0)


@dataclass
class SyncCounts(Job):
    n: int

    def handle(self) -> None:
        for i in range(1, self.n + 1):
            self.progress(i, self.n)


@dataclass
class LongAsync(Job):
    tag: str
    tries = 3

    async def handle(self) -> None:
        STARTED.add(self.tag)
        try:
            await asyncio.sleep(30)
            RUNS.append((self.tag, "finished"))
        finally:
            RUNS.append((self.tag, "finally"))

    def failed(self, exc: BaseException) -> None:
        RUNS.append((self.tag, "failed()"))


@dataclass
class LongSync(Job):
    tag: str

    def handle(self) -> None:
        STARTED.add(self.tag)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.cancelled:
                RUNS.append((self.tag, "saw cancelled"))
                self.check_cancelled()
            time.sleep(0.01)
        RUNS.append((self.tag, "finished"))


@dataclass
class Catcher(Job):
    def handle(self) -> None:
        RUNS.append(("catch",))


# -- priorities ------------------------------------------------------------------------------


def test_higher_priority_runs_first_and_fifo_among_equals(app: App) -> None:
    Note("p0-a").dispatch()
    Note("low").with_priority(-10).dispatch()
    Note("p5-a").with_priority(5).dispatch()
    Urgent("u50-a").dispatch()  # priority from the class
    Note("p0-b").dispatch()
    Note("p5-b").with_priority(5).dispatch()
    Urgent("u50-b").dispatch()
    work(app)
    assert [t for (t,) in RUNS] == ["u50-a", "u50-b", "p5-a", "p5-b", "p0-a", "p0-b", "low"]


def test_a_delayed_job_keeps_its_priority_when_it_becomes_ready(app: App) -> None:
    Note("late-urgent").with_priority(90).delay(0.3).dispatch()
    time.sleep(0.5)  # due now, still in the delayed set until a pop promotes it
    for i in range(3):
        Note(f"plain-{i}").dispatch()
    work(app)
    assert RUNS[0] == ("late-urgent",)


def test_a_retried_job_keeps_its_priority(app: App, r: redis.Redis) -> None:
    for i in range(3):
        Note(f"plain-{i}").dispatch()
    FailsOnce("urgent").with_priority(80).dispatch()
    work(app)  # concurrency 1: the retry (no backoff) goes back at priority 80
    assert RUNS[:2] == [("urgent", 1), ("urgent", 2)]
    assert r.zcard(app.queue_for(None).keys("default").prio) == 0


def test_a_priority_outside_the_range_is_refused_at_dispatch(app: App, r: redis.Redis) -> None:
    k = app.queue_for(None).keys("default")
    with pytest.raises(ValidationError, match="-100 to 100"):
        Note("x").with_priority(101).dispatch()

    @dataclass
    class Bad(Job):
        priority = -101

    with pytest.raises(ValidationError, match=r"priority of .*Bad"):
        Bad().dispatch()
    with pytest.raises(ValidationError):
        Note("x").with_priority(True)  # type: ignore[arg-type]
    assert r.hlen(k.jobs) == 0 and r.llen(k.ready) == 0


def test_a_queue_without_priorities_keeps_the_fast_path(app: App, r: redis.Redis) -> None:
    for i in range(5):
        Note(f"n{i}").dispatch()
    Note("later").delay(0.05).dispatch()
    work(app)
    k = app.queue_for(None).keys("default")
    # No priority key was ever written: pop never looked past the ready list.
    assert not r.exists(k.pseq) and not r.exists(k.prio)
    assert len(RUNS) == 6


def script_calls(r: redis.Redis) -> int:
    """Scripts Redis ran so far (EVALSHA and EVAL): one per round trip of a move."""
    stats: Any = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_dispatch_many_of_mixed_priorities_is_one_push_and_runs_in_order(
    app: App, r: redis.Redis
) -> None:
    app.dispatch_many([Note("warm").with_priority(1)])  # scripts loaded
    work(app)
    RUNS.clear()
    prios = [0, -10, 5, 50, 0, 5, 50, -100, 100, 0]
    before = script_calls(r)
    app.dispatch_many([Note(f"{p}/{i}").with_priority(p) for i, p in enumerate(prios)])
    assert script_calls(r) - before == 1  # one round trip, not one per distinct priority
    work(app)
    expected = sorted(enumerate(prios), key=lambda ip: (-ip[1], ip[0]))
    assert [t for (t,) in RUNS] == [f"{p}/{i}" for i, p in expected]


def test_dispatch_many_delayed_mixed_priorities_is_one_push_and_keeps_them(
    app: App, r: redis.Redis
) -> None:
    app.dispatch_many([Note("warm").delay(0.01).with_priority(1)])
    work(app)
    RUNS.clear()
    before = script_calls(r)
    app.dispatch_many([Note(f"d{p}").delay(0.2).with_priority(p) for p in (-5, 0, 70)])
    assert script_calls(r) - before == 1
    time.sleep(0.4)  # due: promoted by the first pop, each to where its priority says
    Note("p0").dispatch()
    work(app)
    # d0 joins the ready list when promoted, behind p0 pushed before that pop.
    assert [t for (t,) in RUNS] == ["d70", "p0", "d0", "d-5"]


def test_batch_members_of_mixed_priorities_are_one_push(app: App, r: redis.Redis) -> None:
    batch([Note("warm").with_priority(1)]).dispatch()
    work(app)
    RUNS.clear()
    before = script_calls(r)
    batch([Note("m-low").with_priority(-1), Note("m0"), Note("m-high").with_priority(9)]).dispatch()
    assert script_calls(r) - before == 2  # the batch's create and one push of its members
    work(app)
    assert [t for (t,) in RUNS] == ["m-high", "m0", "m-low"]


@dataclass
class OnlyOne(Job):
    tag: str
    unique_for = 30
    priority = 60

    def unique_id(self) -> str:
        return self.tag

    def handle(self) -> None:
        RUNS.append((self.tag,))


@dataclass
class Settled(Job):
    tag: str
    debounce_for = 0.05

    def unique_id(self) -> str:
        return self.tag

    def handle(self) -> None:
        RUNS.append((self.tag,))


@dataclass
class AlwaysFails(Job):
    tag: str
    tries = 1

    def handle(self) -> None:
        RUNS.append((self.tag,))
        raise RuntimeError("fails every time")


def test_unique_jobs_keep_their_priority(app: App, r: redis.Redis) -> None:
    Note("plain-0").dispatch()
    assert OnlyOne("class-60").dispatch() is not None  # priority from the class
    assert OnlyOne("with-90").with_priority(90).dispatch() is not None
    assert OnlyOne("low").with_priority(-5).dispatch() is not None
    assert OnlyOne("with-90").with_priority(90).dispatch() is None  # the duplicate
    # dispatch_many's unique jobs too, and a delayed one
    app.dispatch_many([OnlyOne("many-70").with_priority(70), Note("plain-1")])
    OnlyOne("late-80").with_priority(80).delay(0.05).dispatch()
    time.sleep(0.2)
    work(app)
    assert [t for (t,) in RUNS] == [
        "with-90", "late-80", "many-70", "class-60", "plain-0", "plain-1", "low"
    ]  # fmt: skip


@dataclass
class UniqueCompute(Job):
    n: int
    unique_for = 30
    store_result = True

    def unique_id(self) -> str:
        return str(self.n)

    def handle(self) -> int:
        return self.n * 2


def test_unique_jobs_keep_their_result(app: App) -> None:
    kept = UniqueCompute(4).dispatch()
    plain = OnlyOne("no-result").dispatch()
    assert kept is not None and plain is not None
    work(app)
    assert app.result(kept, timeout_s=5) == 8
    with pytest.raises(ResultMissing):
        app.result(plain, timeout_s=1)


def test_debounced_jobs_keep_their_priority(app: App, r: redis.Redis) -> None:
    Settled("burst").with_priority(40).dispatch()
    Settled("burst").with_priority(40).dispatch()  # replaces the first
    Settled("sunk").with_priority(-40).dispatch()
    time.sleep(0.2)  # both due; plain jobs pushed now are on the list before they move
    for i in range(2):
        Note(f"plain-{i}").dispatch()
    work(app)
    assert [t for (t,) in RUNS] == ["burst", "plain-0", "plain-1", "sunk"]
    k = app.queue_for(None).keys("default")
    assert r.hlen(k.attempts) == 0  # the replaced job left no priority behind


def test_a_failed_job_retried_by_the_operator_comes_back_at_its_priority(
    app: App, r: redis.Redis
) -> None:
    urgent = AlwaysFails("urgent").with_priority(80).dispatch()
    sunk = AlwaysFails("sunk").with_priority(-80).dispatch()
    work(app)
    RUNS.clear()
    for i in range(2):
        Note(f"plain-{i}").dispatch()
    rq = app.queue_for(None)
    assert rq.retry([sunk, urgent]) == 2  # `notify-worker failed retry`, the dashboard's
    assert rq.retry([sunk, urgent]) == 0  # sent twice: nothing more
    work(app)
    assert [t for (t,) in RUNS] == ["urgent", "plain-0", "plain-1", "sunk"]
    # ... and failed again, retried again: still at its priority
    RUNS.clear()
    Note("plain-2").dispatch()
    assert rq.retry(None) == 2
    work(app)
    assert [t for (t,) in RUNS] == ["urgent", "plain-2", "sunk"]


# -- results ---------------------------------------------------------------------------------


def test_result_returns_the_value_through_the_serializer(app: App) -> None:
    job_id = Compute(21).dispatch()
    assert job_id is not None
    work(app)
    assert app.result(job_id, timeout_s=5) == {
        "answer": Answer(42, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    }
    assert asyncio.run(app.aresult(job_id, timeout_s=5))["answer"].n == 42


def test_result_waits_for_the_job_and_wakes_when_it_is_done(app: App) -> None:
    job_id = Compute(1).dispatch()
    assert job_id is not None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(app.result(job_id, timeout_s=15)))
    waiter.start()
    time.sleep(0.2)  # the waiter is subscribed and waiting
    work(app)
    waiter.join(15)
    assert got and got[0]["answer"].n == 2


def test_result_of_a_failed_job_raises_with_class_and_redacted_message(app: App) -> None:
    job_id = Boom().dispatch()
    assert job_id is not None
    work(app)
    with pytest.raises(JobFailedError) as info:
        app.result(job_id, timeout_s=5)
    assert info.value.exception_class == "ValueError"
    assert "bad input" in info.value.exception_message
    assert KEY not in str(info.value)
    assert "Traceback" not in str(info.value)


def test_result_missing_when_not_kept_unknown_or_garbage(app: App) -> None:
    job_id = NoResultKept().dispatch()
    assert job_id is not None
    with pytest.raises(ResultMissing, match="store_result"):
        app.result(job_id, timeout_s=5)  # pending, and will never keep one: at once
    work(app)
    with pytest.raises(ResultMissing, match="no stored result"):
        app.result(job_id, timeout_s=5)
    with pytest.raises(ResultMissing, match="no queue knows"):
        app.result("0" * 32, timeout_s=1)
    with pytest.raises(ResultMissing, match="not a job id"):
        app.result("bad id\n", timeout_s=1)


def test_result_times_out_while_the_job_waits(app: App) -> None:
    job_id = Compute(1).dispatch()
    assert job_id is not None
    with pytest.raises(TimeoutError):
        app.result(job_id, timeout_s=0.3)


def test_store_results_setting_keeps_every_result(redis_url: str, prefix: str) -> None:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE,
            store_results=True, metrics=False)  # fmt: skip
    try:
        job_id = NoResultKept().dispatch()
        assert job_id is not None
        work(a)
        assert a.result(job_id, timeout_s=5) == 1
    finally:
        a.close()


def test_a_result_over_result_max_bytes_fails_the_job_naming_the_setting(app: App) -> None:
    job_id = Huge().dispatch()
    assert job_id is not None
    work(app)
    assert app.job_status(job_id) == "failed"
    with pytest.raises(JobFailedError, match="result_max_bytes"):
        app.result(job_id, timeout_s=5)


def test_a_result_that_cannot_be_encoded_fails_the_job_with_its_path(app: App) -> None:
    job_id = Unencodable().dispatch()
    assert job_id is not None
    work(app)
    with pytest.raises(JobFailedError, match=r"result\.when"):
        app.result(job_id, timeout_s=5)


def test_a_stale_holder_never_writes_a_result_and_a_resent_ack_writes_once(
    app: App, r: redis.Redis
) -> None:
    job_id = Compute(1).dispatch()
    assert job_id is not None
    k = app.queue_for(None).keys("default")
    token = r.hget(k.attempts, f"{job_id}:t")
    assert token is None  # not reserved yet
    r.zadd(k.reserved, {job_id: 10**13})
    r.hset(k.attempts, f"{job_id}:t", "7")

    def ack(tok: str, seq: int, value: bytes) -> Any:
        keys = [k.reserved, k.jobs, k.attempts, k.done, k.receipt("ack:w"), k.result(job_id)]
        return scripts.ACK.call(r, keys, [3600000, 1000, seq, 0, job_id, tok, 60000, value])

    assert ack("6", 1, b"stale") == [job_id.encode()]  # another token: refused
    assert not r.exists(k.result(job_id))
    assert ack("7", 2, b"first") == []
    r.set(k.result(job_id), b"overwritten by someone")
    assert ack("7", 2, b"first") == []  # re-sent: answered from the receipt
    assert r.get(k.result(job_id)) == b"overwritten by someone"


# -- progress --------------------------------------------------------------------------------


def test_progress_is_throttled_and_keeps_the_last_value(app: App) -> None:
    job_id = Counts(3000).dispatch()
    assert job_id is not None
    t0 = time.monotonic()
    work(app)
    elapsed = time.monotonic() - t0
    events = [e for e in EVENTS if isinstance(e, JobProgressed)]
    assert 1 <= len(events) <= 2 + elapsed / 0.1  # at most one write per 100 ms
    assert (events[-1].done, events[-1].total, events[-1].note) == (3000, 3000, "step 3000")
    status = app.job_status(job_id)
    assert status == "done" and status is not None and status.progress is not None
    assert (status.progress.done, status.progress.total) == (3000.0, 3000.0)
    assert status.progress.note == "step 3000" and status.progress.at > 0


def test_progress_from_a_sync_job(app: App) -> None:
    job_id = SyncCounts(500).dispatch()
    assert job_id is not None
    work(app)
    status = app.job_status(job_id)
    assert status is not None and status.progress is not None
    assert status.progress.done == 500


# -- cancelling ------------------------------------------------------------------------------


def test_a_cancelled_pending_job_never_runs_and_is_cancelled(app: App, r: redis.Redis) -> None:
    job_id = Note("never").dispatch()
    keep = Note("kept").dispatch()
    assert job_id is not None and keep is not None
    out = app.cancel(job_id)
    assert out == "cancelled" and out.changed
    assert app.job_status(job_id) == "cancelled"
    assert app.cancel(job_id) == "cancelled"  # re-sent: the same, still cancelled
    work(app)
    assert RUNS == [("kept",)]
    assert app.job_status(job_id) == "cancelled"
    assert next(e for e in EVENTS if isinstance(e, JobWasCancelled)).ran is False
    again = app.cancel(job_id)
    assert again == "cancelled already" and not again.changed
    k = app.queue_for(None).keys("default")
    assert r.zcount(k.reserved, "-inf", "(+inf") == 0 and not r.hexists(k.jobs, job_id)


def test_a_cancelled_delayed_job_never_runs(app: App) -> None:
    job_id = Note("delayed").delay(0.5).dispatch()
    assert job_id is not None
    assert app.job_status(job_id) == "delayed"
    assert app.cancel(job_id) == "cancelled"
    time.sleep(0.6)
    work(app)
    assert RUNS == []
    assert app.job_status(job_id) == "cancelled"
    with pytest.raises(JobCancelled):
        app.result(job_id, timeout_s=1)


def test_a_running_async_job_is_cancelled_its_finally_runs_no_failed_no_retry(
    app: App,
) -> None:
    job_id = LongAsync("long").dispatch()
    assert job_id is not None
    asked: list[float] = []

    def cancel_once_started() -> bool:
        if "long" in STARTED and not asked:
            asked.append(time.monotonic())
            assert app.cancel(job_id) == "cancelling"
        return app.job_status(job_id) == "cancelled"

    work(app, until=cancel_once_started)
    assert RUNS == [("long", "finally")]  # no "finished", no "failed()", no second run
    assert app.job_status(job_id) == "cancelled"
    assert next(e for e in EVENTS if isinstance(e, JobWasCancelled)).ran is True


def test_a_running_sync_job_sees_cancelled_and_check_cancelled_stops_it(app: App) -> None:
    job_id = LongSync("sync").dispatch()
    assert job_id is not None
    asked: list[bool] = []

    def cancel_once_started() -> bool:
        if "sync" in STARTED and not asked:
            asked.append(True)
            app.cancel(job_id)
        return app.job_status(job_id) == "cancelled"

    work(app, until=cancel_once_started)
    assert RUNS == [("sync", "saw cancelled")]


@dataclass
class CancelledThenRaises(Job):
    """Cancels itself, then raises before the worker heard the cancel: a cancel racing
    the job's final failure (tries 1)."""

    tag: str
    tries = 1

    async def handle(self) -> None:
        RUNS.append((self.tag,))
        assert self.job_id is not None
        await App.current().acancel(self.job_id)
        raise RuntimeError("fails right after its cancel")

    def failed(self, exc: BaseException) -> None:
        RUNS.append(("failed() called",))


def test_a_cancel_that_lands_before_the_failure_is_recorded_wins(app: App, r: redis.Redis) -> None:
    job_id = CancelledThenRaises("racer").dispatch()
    assert job_id is not None
    work(app)
    k = app.queue_for(None).keys("default")
    assert RUNS == [("racer",)]  # failed() not called
    assert r.zscore(k.cancelled, job_id) is not None and r.zscore(k.failed, job_id) is None
    assert app.job_status(job_id) == "cancelled"


@dataclass
class CancelledWhileFailing(Job):
    """Raises on its last try; its failed() hook cancels it: a cancel landing after the
    failure opened (the worker's lease check marked the job failing), while the
    failure's hooks run and before fail.lua recorded it."""

    tag: str
    tries = 1

    async def handle(self) -> None:
        RUNS.append((self.tag,))
        raise RuntimeError("fails; its cancel comes too late")

    async def failed(self, exc: BaseException) -> None:
        assert self.job_id is not None
        out = await App.current().acancel(self.job_id)
        RUNS.append(("failed() called", str(out), out.changed))


def test_a_cancel_that_lands_while_the_failure_is_recorded_answers_failing(
    app: App, r: redis.Redis
) -> None:
    job_id = CancelledWhileFailing("late").dispatch()
    assert job_id is not None
    work(app)
    k = app.queue_for(None).keys("default")
    # Not "cancelling" (the job then ends failed): "failing", too late, nothing changed.
    assert RUNS == [("late",), ("failed() called", "failing", False)]
    assert r.zscore(k.failed, job_id) is not None and r.zscore(k.cancelled, job_id) is None
    assert app.job_status(job_id) == "failed"
    again = app.cancel(job_id)
    assert again == "failed" and not again.changed
    # The failing mark went with the job: nothing of it is left beside the queue.
    assert not [f for f in r.hkeys(k.attempts) if f.startswith(job_id.encode())]


def test_cancelling_a_finished_job_changes_nothing_and_garbage_is_no_such_job(
    app: App,
) -> None:
    job_id = Compute(2).dispatch()
    assert job_id is not None
    work(app)
    out = app.cancel(job_id)
    assert out == "done" and not out.changed
    assert app.result(job_id, timeout_s=1)["answer"].n == 4
    with pytest.raises(JobNotFound, match="no such job"):
        app.cancel("0" * 32)
    with pytest.raises(JobNotFound, match="not a job id"):
        app.cancel("../../etc\x00")


def test_a_cancelled_chain_link_stops_the_chain_without_catch(app: App) -> None:
    chain(Note("first"), LongAsync("second"), Note("third")).catch(Catcher()).dispatch()

    def cancel_second() -> bool:
        if "second" in STARTED:
            held = app.queue_for(None).client.zrangebyscore(
                app.queue_for(None).keys("default").reserved, "-inf", "(+inf"
            )  # not the skiplist mark (score +inf)
            for raw in held:
                assert app.cancel(raw.decode()) == "cancelling"
            return not held
        return False

    work(app, until=cancel_second)
    work(app)  # anything left would run now
    assert RUNS == [("first",), ("second", "finally")]


def test_a_cancelled_batch_member_counts_as_cancelled(app: App) -> None:
    batch_id = batch([Note("a"), Note("b"), Note("c")]).then(Catcher()).dispatch()
    info = app.find_batch(batch_id)
    assert info is not None
    k = app.queue_for(None).keys("default")
    ids = [i.decode() for i in app.queue_for(None).client.lrange(k.ready, 0, -1)]
    app.cancel(ids[1])
    work(app)
    info = app.find_batch(batch_id)
    assert info is not None
    assert info.pending == 0 and info.processed == 2
    assert info.cancelled_jobs == 1
    assert ("catch",) not in RUNS  # `then` does not fire for a batch with a cancelled job


def test_notify_worker_cancel_and_status_commands(app: App, prefix: str) -> None:
    from click.testing import CliRunner

    from tidings.cli.main import main

    job_id = Note("via-cli").dispatch()
    assert job_id is not None
    import tests.integration.test_control as here

    here.CLI_APP = app
    runner = CliRunner()
    out = runner.invoke(main, ["-A", f"{MODULE}:CLI_APP", "cancel", job_id, "f" * 32])
    assert f"{job_id}: cancelled" in out.output
    assert f"{'f' * 32}: no such job" in out.output and out.exit_code == 1
    # Sent again before a worker settled it: the same answer (a re-sent cancel), no note.
    out = runner.invoke(main, ["-A", f"{MODULE}:CLI_APP", "cancel", job_id])
    assert out.output.endswith(f"\n{job_id}: cancelled\n") and out.exit_code == 0
    out = runner.invoke(main, ["-A", f"{MODULE}:CLI_APP", "status", job_id, "--json"])
    assert '"status":"cancelled"' in out.output


CLI_APP: App | None = None
