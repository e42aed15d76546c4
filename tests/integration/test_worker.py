"""The asyncio Worker in-process against a real redis-server.

Jobs are defined here at module level (the worker resolves them by ``module:QualName``,
allowed through ``allowed_modules``) and record what they did in ``RUNS``. Each test
runs ``Worker.run()`` under ``asyncio.run``: with ``stop_when_empty``, or stopped by the
test once a condition on Redis or ``RUNS`` holds. Never a bare sleep.

Rows: F13a (async timeout), F13b (sync timeout -> exit 13), F23 (QueueUnavailable),
B3/B4/B5 (nothing imported from a bad payload), B7 (SerializationError at dispatch),
B21 (hostile exceptions), plus retries, backoff, chains and job_status.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
import redis

import tidings.cli.main  # noqa: F401 - imported up front so the sys.modules snapshots are stable
from tests.support import RedisServer, free_port
from tidings import App, Job, chain
from tidings.errors import (
    PayloadTooLarge,
    QueueUnavailable,
    SerializationError,
)
from tidings.jobs.compose import new_id
from tidings.jobs.middleware import release_uncounted
from tidings.observability.lifecycle import JobFailed, JobProcessed, JobReleased
from tidings.wire.envelope import JobBody, seal
from tidings.wire.signing import Signer
from tidings.worker.worker import EXIT_STUCK, MAX_EXCEPTION_TEXT, Worker, WorkerOptions

KEY = "worker-test-key-0123456789abcdef"
MODULE = __name__

RUNS: list[tuple[Any, ...]] = []
HOOKS: list[tuple[Any, ...]] = []
GATES: dict[str, threading.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    HOOKS.clear()
    yield
    for gate in GATES.values():  # never leave a job thread blocked behind a test
        gate.set()
    GATES.clear()


def redis_now() -> float:
    s, us = App.current().queue_for(None).client.time()
    return int(s) + int(us) / 1e6


def runs_of(tag: str) -> list[tuple[Any, ...]]:
    return [r for r in RUNS if r[1] == tag]


# -- jobs ------------------------------------------------------------------------------------


@dataclass
class Record(Job):
    tag: str

    def handle(self) -> None:
        RUNS.append(("sync", self.tag, self.attempts, threading.current_thread().name))


@dataclass
class ARecord(Job):
    tag: str

    async def handle(self) -> None:
        RUNS.append(("async", self.tag, self.attempts, threading.current_thread().name))


@dataclass
class Flaky(Job):
    """Raises on its first ``fails`` attempts, recording Redis time at each start."""

    tag: str
    fails: int
    tries = 3
    backoff = (0.2, 0.4)

    def handle(self) -> None:
        RUNS.append(("flaky", self.tag, self.attempts, redis_now()))
        if self.attempts <= self.fails:
            raise ValueError(f"attempt {self.attempts} fails")

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__, str(exc)))


@dataclass
class NoOptions(Job):
    """Sets no tries/backoff: the worker's --tries/--backoff apply."""

    tag: str

    def handle(self) -> None:
        RUNS.append(("noopt", self.tag, self.attempts, redis_now()))
        raise RuntimeError("always")

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__))


@dataclass
class MaxExc(Job):
    """Releases itself on the first ``releases`` attempts, then raises every time."""

    tag: str
    releases: int = 0
    tries = 10
    max_exceptions = 2

    def handle(self) -> None:
        RUNS.append(("maxexc", self.tag, self.attempts))
        if self.attempts <= self.releases:
            self.release(0)
            return
        raise KeyError("boom")

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__))


@dataclass
class Until(Job):
    tag: str
    tries = 1  # ignored: retry_until wins
    backoff = 0.1
    retry_until = dt.timedelta(seconds=1)

    async def handle(self) -> None:
        RUNS.append(("until", self.tag, self.attempts, redis_now()))
        raise RuntimeError("not yet")

    async def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__))


@dataclass
class SelfRelease(Job):
    tag: str
    tries = 3

    def handle(self) -> None:
        RUNS.append(("selfrelease", self.tag, self.attempts, redis_now()))
        if self.attempts == 1:
            self.release(0.2)


@dataclass
class SelfFail(Job):
    tag: str
    tries = 5

    async def handle(self) -> None:
        RUNS.append(("selffail", self.tag, self.attempts))
        self.fail("refused by the handler")

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, str(exc)))


@dataclass
class ASlow(Job):
    tag: str
    seconds: float = 10.0
    timeout = 0.5
    tries = 2

    async def handle(self) -> None:
        RUNS.append(("aslow-start", self.tag, self.attempts))
        await asyncio.sleep(self.seconds)
        RUNS.append(("aslow-end", self.tag, self.attempts))

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__))


@dataclass
class SSlow(Job):
    """A sync job that blocks its thread until the test opens its gate."""

    tag: str
    timeout = 0.5
    tries: ClassVar[int] = 1

    def handle(self) -> None:
        RUNS.append(("sslow-start", self.tag, self.attempts))
        GATES.setdefault(self.tag, threading.Event()).wait(10)
        RUNS.append(("sslow-end", self.tag, self.attempts))

    def failed(self, exc: BaseException) -> None:
        HOOKS.append(("failed", self.tag, type(exc).__name__))


@dataclass
class SSlowRetry(SSlow):
    tries: ClassVar[int] = 3


@dataclass
class Gate(Job):
    """Waits (in its thread) until the test opens the gate named by its tag."""

    tag: str

    def handle(self) -> None:
        RUNS.append(("gate", self.tag, self.attempts))
        GATES.setdefault(self.tag, threading.Event()).wait(10)


class HostileError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception explodes")


@dataclass
class Hostile(Job):
    tag: str
    kind: str
    tries = 1

    def handle(self) -> None:
        RUNS.append(("hostile", self.tag, self.attempts))
        if self.kind == "huge":
            raise ValueError("x" * (10 * 1024 * 1024))
        raise HostileError()


@dataclass
class Step(Job):
    tag: str

    async def handle(self) -> None:
        RUNS.append(("step", self.tag, self.attempts))


@dataclass
class Boom(Job):
    tag: str
    tries = 1

    def handle(self) -> None:
        RUNS.append(("boom", self.tag, self.attempts))
        raise RuntimeError("link failed")


class Uncounted:
    """Middleware: releases the job twice without using up an attempt."""

    def handle(self, job: Job, call: Callable[[], Any]) -> Any:
        seen = len(runs_of(getattr(job, "tag", "")))
        if seen < 2:
            RUNS.append(("mw-release", getattr(job, "tag", ""), job.attempts))
            release_uncounted(0)
            return None
        return call()


@dataclass
class Limited(Job):
    tag: str
    tries = 1

    def middleware(self) -> list[Any]:
        return [Uncounted()]

    def handle(self) -> None:
        RUNS.append(("limited", self.tag, self.attempts))


class RedisDownOnce:
    """Middleware: its own Redis call fails once (a connection reset), before handle()."""

    def handle(self, job: Job, call: Callable[[], Any]) -> Any:
        tag = getattr(job, "tag", "")
        if not [x for x in RUNS if x[:2] == ("gate-down", tag)]:
            RUNS.append(("gate-down", tag, job.attempts))
            raise redis.ConnectionError("Connection closed by server.")
        return call()


@dataclass
class Gated(Job):
    tag: str
    tries = 1

    def middleware(self) -> list[Any]:
        return [RedisDownOnce()]

    def handle(self) -> None:
        RUNS.append(("gated", self.tag, self.attempts))


@dataclass
class Opaque:
    created_at: object


@dataclass
class Holder:
    user: Opaque


@dataclass
class Unserializable(Job):
    user: Holder

    def handle(self) -> None:  # pragma: no cover - never dispatched successfully
        pass


@dataclass
class Big(Job):
    blob: str

    def handle(self) -> None:  # pragma: no cover
        pass


class NotAJob:
    pass


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        retry_after=3,
    )
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
    """Run a worker until the queues are empty (default) or ``until()`` holds."""
    options.setdefault("sleep_s", 0.2)
    options.setdefault("concurrency", 4)
    options.setdefault("stop_when_empty", until is None)

    async def main() -> Worker:
        worker = Worker(app, WorkerOptions(**options))
        task = asyncio.create_task(worker.run())
        if until is not None:
            deadline = time.monotonic() + timeout_s
            while not until() and not task.done():
                assert time.monotonic() < deadline, "worker condition not met in time"
                await asyncio.sleep(0.02)
            worker.stop("test condition met")
        worker.exit_code = await asyncio.wait_for(task, timeout_s)
        return worker

    return asyncio.run(main())


def sizes(app: App, queue: str = "default") -> dict[str, int]:
    return app.queue_for(None).sizes([queue])[queue]


def failed_by_id(app: App) -> dict[str, Any]:
    return {f.id: f for f in app.queue_for(None).failed()}


# -- running jobs ----------------------------------------------------------------------------


def test_sync_and_async_jobs_each_run_once(app: App) -> None:
    ids = [Record(f"s{i}").dispatch() for i in range(5)] + [
        ARecord(f"a{i}").dispatch() for i in range(5)
    ]
    assert len(set(ids)) == 10
    worker = work(app)
    assert worker.exit_code == 0
    assert sorted(r[1] for r in RUNS) == sorted(
        [f"s{i}" for i in range(5)] + [f"a{i}" for i in range(5)]
    )
    assert all(r[2] == 1 for r in RUNS)
    sync_threads = {r[3] for r in RUNS if r[0] == "sync"}
    async_threads = {r[3] for r in RUNS if r[0] == "async"}
    assert all(t.startswith("job") for t in sync_threads)  # the thread pool
    assert async_threads == {threading.main_thread().name}  # the event loop
    assert all(app.job_status(i) == "done" for i in ids)
    assert sizes(app) == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}


def test_dispatch_sync_runs_inline(app: App, r: redis.Redis) -> None:
    Record("inline").dispatch_sync()
    ARecord("ainline").dispatch_sync()
    assert [x[1] for x in RUNS] == ["inline", "ainline"]
    assert sizes(app)["ready"] == 0


def test_delayed_job_runs_after_its_delay_and_stop_when_empty_waits_for_it(app: App) -> None:
    job_id = Record("later").delay(0.3).dispatch()
    assert app.job_status(job_id) == "delayed"
    work(app)
    assert [x[1] for x in RUNS] == ["later"]
    assert app.job_status(job_id) == "done"


def test_stop_when_empty_never_sits_out_a_blocking_wait_for_its_own_acked_jobs(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pop that ran while the worker's last acks were in flight saw their leases still
    in the reserved set and returned a wait; the worker then blocked for ``--sleep``
    (3 s by default) before it noticed the queue was empty (~1 drain in 8 of 3,000
    no-op jobs). With nothing delayed and nobody else holding a job, a draining worker
    must never block."""
    from tidings.worker import fetch

    blocks: list[float] = []
    block = fetch.Fetcher._block

    async def counted(self: fetch.Fetcher, timeout: float, n: int) -> Any:
        blocks.append(timeout)
        return await block(self, timeout, n)

    monkeypatch.setattr(fetch.Fetcher, "_block", counted)
    for _ in range(12):
        app.dispatch_many([ARecord(f"d{i}") for i in range(300)])
        work(app, concurrency=16, sleep_s=30.0, timeout_s=60.0)
        assert sizes(app) == {"ready": 0, "delayed": 0, "reserved": 0, "failed": 0}
    assert blocks == []
    assert len(RUNS) == 12 * 300


def test_retries_follow_backoff_on_redis_time(app: App) -> None:
    job_id = Flaky("f", fails=2).dispatch()
    work(app)
    runs = runs_of("f")
    assert [x[2] for x in runs] == [1, 2, 3]
    gaps = [runs[1][3] - runs[0][3], runs[2][3] - runs[1][3]]
    assert gaps[0] >= 0.2 - 0.002 and gaps[1] >= 0.4 - 0.002  # never early (ms resolution)
    assert HOOKS == []
    assert app.job_status(job_id) == "done"


def test_tries_exhausted_fails_once_and_runs_the_failed_hook_once(app: App) -> None:
    job_id = Flaky("g", fails=99).dispatch()
    seen: list[JobFailed] = []
    app.listen(JobFailed, seen.append)
    work(app)
    assert [x[2] for x in runs_of("g")] == [1, 2, 3]
    assert HOOKS == [("failed", "g", "ValueError", "attempt 3 fails")]
    record = failed_by_id(app)[job_id]
    assert record.attempts == 3 and "ValueError: attempt 3 fails" in record.exception
    assert record.name == "Flaky" and record.queue == "default"
    assert [e.job_id for e in seen] == [job_id]
    assert app.job_status(job_id) == "failed"


def test_worker_defaults_apply_when_the_job_sets_none(app: App) -> None:
    NoOptions("n").dispatch()
    work(app, tries=3, backoff_s=0.15)
    runs = runs_of("n")
    assert [x[2] for x in runs] == [1, 2, 3]
    assert all(b[3] - a[3] >= 0.15 - 0.002 for a, b in itertools.pairwise(runs))
    assert HOOKS == [("failed", "n", "RuntimeError")]


def test_max_exceptions_fails_before_tries_and_releases_do_not_count(app: App) -> None:
    MaxExc("m").dispatch()
    MaxExc("mr", releases=2).dispatch()
    work(app)
    assert [x[2] for x in runs_of("m")] == [1, 2]
    assert [x[2] for x in runs_of("mr")] == [1, 2, 3, 4]  # 2 releases + 2 exceptions
    assert sorted(HOOKS) == [("failed", "m", "KeyError"), ("failed", "mr", "KeyError")]


def test_retry_until_wins_over_tries(app: App) -> None:
    job_id = Until("u").dispatch()
    work(app)
    runs = runs_of("u")
    assert len(runs) >= 3  # tries = 1 would have allowed one
    assert runs[-1][3] - runs[0][3] <= 1.5
    assert HOOKS == [("failed", "u", "RuntimeError")] or HOOKS == [
        ("failed", "u", "MaxAttemptsExceeded")
    ]
    assert app.job_status(job_id) == "failed"


def test_release_inside_handle_runs_it_again_later(app: App) -> None:
    job_id = SelfRelease("r").dispatch()
    released: list[JobReleased] = []
    app.listen(JobReleased, released.append)
    work(app)
    runs = runs_of("r")
    assert [x[2] for x in runs] == [1, 2]
    assert runs[1][3] - runs[0][3] >= 0.2 - 0.002
    assert [e.delay_s for e in released] == [pytest.approx(0.2)]
    assert app.job_status(job_id) == "done"


def test_fail_inside_handle_fails_at_once(app: App) -> None:
    job_id = SelfFail("x").dispatch()
    work(app)
    assert [x[2] for x in runs_of("x")] == [1]
    assert HOOKS == [("failed", "x", "refused by the handler")]
    assert "refused by the handler" in failed_by_id(app)[job_id].exception


def test_middleware_release_uses_no_attempt(app: App) -> None:
    Limited("l").dispatch()
    work(app)
    assert [(x[0], x[2]) for x in runs_of("l")] == [
        ("mw-release", 1),
        ("mw-release", 1),
        ("limited", 1),
    ]


def test_redis_down_in_a_layer_before_handle_is_not_the_jobs_failure(app: App) -> None:
    """A batch's gate or a rate limit that cannot reach Redis (a reset, an outage) fails
    before handle() ran: the job is released uncounted and runs, even with tries 1
    (before: it went to the failed store as the job's own ConnectionError)."""
    job_id = str(Gated("g").dispatch())
    work(app)
    assert [(x[0], x[2]) for x in runs_of("g")] == [("gate-down", 1), ("gated", 1)]
    assert app.job_status(job_id) == "done"
    assert failed_by_id(app) == {}


# -- timeouts (F13) --------------------------------------------------------------------------


def test_async_timeout_cancels_counts_and_fails_after_tries(app: App) -> None:
    job_id = ASlow("t").dispatch()
    Record("after").dispatch()
    t0 = time.monotonic()
    worker = work(app)
    elapsed = time.monotonic() - t0
    assert worker.exit_code == 0  # the worker goes on
    assert [x[0] for x in runs_of("t")] == ["aslow-start", "aslow-start"]  # never reached the end
    assert [x[2] for x in runs_of("t")] == [1, 2]
    assert HOOKS == [("failed", "t", "JobTimeout")]
    record = failed_by_id(app)[job_id]
    assert "JobTimeout" in record.exception and record.attempts == 2
    assert runs_of("after")
    assert elapsed < 10  # the 10 s sleep was cancelled, not awaited


def test_sync_timeout_fails_the_job_and_exits_13(app: App) -> None:
    job_id = SSlow("st").dispatch()
    Record("other").dispatch()
    worker = work(app, stop_when_empty=False, until=lambda: bool(HOOKS))
    assert worker.exit_code == EXIT_STUCK
    assert HOOKS == [("failed", "st", "JobTimeout")]
    assert "JobTimeout" in failed_by_id(app)[job_id].exception
    assert runs_of("other")
    assert sizes(app)["reserved"] == 0


def test_sync_timeout_with_tries_left_is_released_and_the_worker_exits_13(
    app: App, r: redis.Redis
) -> None:
    job_id = SSlowRetry("sr").dispatch()
    worker = work(app, stop_when_empty=False, until=lambda: False)
    assert worker.exit_code == EXIT_STUCK
    assert HOOKS == []
    assert app.job_status(job_id) in ("pending", "delayed")
    assert sizes(app)["reserved"] == 0
    assert r.hget(app.queue_for(None).keys("default").attempts, job_id) == b"1"


# -- trust: nothing imported or run from a bad payload (B3, B4, B5) ----------------------------


def _inject(app: App, job_id: str, envelope: bytes) -> None:
    k = app.queue_for(None).keys("default")
    c = app.queue_for(None).client
    c.hset(k.jobs, job_id, envelope)
    c.rpush(k.ready, job_id)


def _body(job_id: str, job: str, data: Any) -> JobBody:
    return {
        "uuid": job_id,
        "displayName": "Injected",
        "job": job,
        "data": data,
        "maxTries": 3,
        "maxExceptions": None,
        "backoff": None,
        "timeout": None,
        "retryUntil": None,
        "pushedAt": time.time(),
        "chain": [],
        "chainCatch": None,
    }


def _signed(app: App, job: str, data: Any, *, signer: Signer | None = None) -> tuple[str, bytes]:
    job_id = new_id()
    return job_id, seal(_body(job_id, job, data), signer or app.signer, max_bytes=1 << 20)


def test_bad_payloads_go_to_the_failed_store_and_import_nothing(
    app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = tmp_path / "canary_hit"
    (tmp_path / "canary_mod.py").write_text(
        f"open({str(canary)!r}, 'w').write('imported')\nclass Boom:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pwned = tmp_path / "pwned"
    good_data = {"__t": "dc", "c": f"{MODULE}:Record", "f": {"tag": "never"}}

    Record("warmup").dispatch()
    work(app)  # warm up: whatever the worker imports lazily is imported now
    RUNS.clear()

    cases: dict[str, tuple[str, bytes, str]] = {}

    def add(name: str, job_id: str, env: bytes, reason: str) -> None:
        cases[name] = (job_id, env, reason)

    jid, env = _signed(app, f"{MODULE}:Record", good_data)
    b = bytearray(env)
    b[env.index(b'"never"') + 2] ^= 1
    add("tampered-body", jid, bytes(b), "bad signature")
    jid, env = _signed(app, f"{MODULE}:Record", good_data)
    add(
        "tampered-sig",
        jid,
        env[:10] + (b"0" if env[10:11] != b"0" else b"1") + env[11:],
        "bad signature",
    )
    jid, env = _signed(app, f"{MODULE}:Record", good_data, signer=Signer([b"z" * 32]))
    add("other-key", jid, env, "bad signature")
    jid = new_id()
    add("unsigned", jid, orjson.dumps(_body(jid, f"{MODULE}:Record", good_data)), "bad signature")
    (_, a_env), (b_id, b_env) = (
        _signed(app, f"{MODULE}:Record", good_data),
        _signed(app, f"{MODULE}:Record", good_data),
    )
    add("swapped", b_id, a_env[:30] + b_env[30:], "bad signature")  # a's tag, b's body
    jid, env = _signed(app, f"{MODULE}:Record", good_data)
    add("id-mismatch", new_id(), env, "bad signature")  # the tag binds the id
    for name, path in [
        ("os-system", "os:system"),
        ("subprocess-run", "subprocess:run"),
        ("builtins-eval", "builtins:eval"),
        ("canary", "canary_mod:Boom"),
        ("no-such-job", "no.such.job:Job"),
        ("xml-outside", "xml.dom.minidom:Document"),
        ("re-exported-module", "tidings.cli.main:os.system"),
        ("not-a-job", f"{MODULE}:NotAJob"),
        ("missing-class", f"{MODULE}:NoSuchJob"),
    ]:
        jid, env = _signed(app, path, good_data)
        add(name, jid, env, "unknown job type")
    attack = {"__t": "enum", "c": "tidings.cli.main:os.system", "v": f"touch {pwned}"}
    jid, env = _signed(
        app, f"{MODULE}:Record", {"__t": "dc", "c": f"{MODULE}:Record", "f": {"tag": attack}}
    )
    add("callable-in-data", jid, env, "")
    jid, env = _signed(
        app, f"{MODULE}:Record", {"__t": "dc", "c": f"{MODULE}:ARecord", "f": {"tag": "x"}}
    )
    add("data-of-another-class", jid, env, "data does not hold the named job")

    for job_id, env, _ in cases.values():
        _inject(app, job_id, env)
    Record("after-the-bad-ones").dispatch()

    before = set(sys.modules)
    worker = work(app)
    imported = set(sys.modules) - before

    assert worker.exit_code == 0
    assert imported == set()
    assert not canary.exists() and "canary_mod" not in sys.modules
    assert not pwned.exists()
    assert [x[1] for x in RUNS] == ["after-the-bad-ones"]  # no handler ran for a bad one
    failed = failed_by_id(app)
    assert len(failed) == len(cases)
    for name, (job_id, _, reason) in cases.items():
        assert job_id in failed, name
        assert reason in failed[job_id].exception, (name, failed[job_id].exception[-300:])
        assert failed[job_id].attempts == 1, name  # refused on first sight, never retried
    assert sizes(app) == {"ready": 0, "delayed": 0, "reserved": 0, "failed": len(cases)}

    # Reading and retrying the failed store imports nothing either (B21).
    before = set(sys.modules)
    records = app.queue_for(None).failed()
    app.queue_for(None).find_failed(records[0].id)
    assert app.queue_for(None).retry([records[0].id]) == 1
    assert set(sys.modules) == before


def test_a_module_that_raises_on_import_fails_the_job_once(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_deploy.py").write_text("raise RuntimeError('half-deployed module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=f"{MODULE},broken_deploy",
        retry_after=3,
    )
    try:
        jid, env = _signed(app, "broken_deploy:Job", {})
        _inject(app, jid, env)
        work(app)
        record = failed_by_id(app)[jid]
        assert "half-deployed module" in record.exception
        assert record.attempts == 1
        assert sizes(app)["reserved"] == 0
    finally:
        sys.modules.pop("broken_deploy", None)
        app.close()


# -- hostile exceptions (B21) -----------------------------------------------------------------


def test_hostile_exceptions_are_recorded_truncated_and_the_worker_goes_on(app: App) -> None:
    huge = Hostile("h1", "huge").dispatch()
    weird = Hostile("h2", "str-raises").dispatch()
    Record("next").dispatch()
    failed_events: list[JobFailed] = []
    app.listen(JobFailed, failed_events.append)
    worker = work(app)
    assert worker.exit_code == 0
    failed = failed_by_id(app)
    assert len(failed[huge].exception) <= MAX_EXCEPTION_TEXT + 100
    assert "[truncated]" in failed[huge].exception
    assert "ValueError" in failed[huge].exception
    info = app.queue_for(None).client.hget(app.queue_for(None).keys("default").failed_info, huge)
    assert info is not None and len(info) <= MAX_EXCEPTION_TEXT + 1000
    assert "HostileError" in failed[weird].exception
    assert {e.job_id for e in failed_events} == {huge, weird}
    assert all(len(e.exception) <= 600 for e in failed_events)
    assert runs_of("next")


# -- producing ---------------------------------------------------------------------------------


def test_serialization_error_names_the_path_and_pushes_nothing(app: App, r: redis.Redis) -> None:
    k = app.queue_for(None).keys("default")
    bad = Unserializable(Holder(Opaque(created_at=object())))
    with pytest.raises(SerializationError) as info:
        bad.dispatch()
    assert "user.user.created_at" in str(info.value) or "user.created_at" in str(info.value)
    with pytest.raises(SerializationError):
        app.dispatch_many([Record("fine"), bad, Record("fine too")])
    assert r.exists(k.ready, k.jobs, k.notify, k.delayed) == 0


def test_payload_too_large_pushes_nothing(redis_url: str, prefix: str) -> None:
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        max_payload_bytes=2000,
    )
    try:
        k = app.queue_for(None).keys("default")
        with pytest.raises(PayloadTooLarge, match="limit is 2000"):
            Big("x" * 5000).dispatch()
        with pytest.raises(PayloadTooLarge):
            app.dispatch_many([Big("small"), Big("x" * 5000)])
        assert app.queue_for(None).client.exists(k.ready, k.jobs) == 0
        Big("small").dispatch()
        assert sizes(app)["ready"] == 1
    finally:
        app.close()


def test_queue_unavailable_within_the_connect_timeout(prefix: str) -> None:
    port = free_port()  # nothing listens there
    app = App(env=False, redis_url=f"redis://127.0.0.1:{port}/0", key=KEY, prefix=prefix)
    try:
        t0 = time.monotonic()
        with pytest.raises(QueueUnavailable, match="Redis unavailable"):
            Record("lost").dispatch()
        elapsed = time.monotonic() - t0
        with pytest.raises(QueueUnavailable):
            app.dispatch_many([Record("a"), Record("b")])
        with pytest.raises(QueueUnavailable):
            asyncio.run(Record("c").dispatch_async())
        with pytest.raises(QueueUnavailable):
            app.job_status("0" * 32)
        print(f"F23: QueueUnavailable after {elapsed * 1000:.1f} ms")
        assert elapsed <= 2.0 + 0.5
    finally:
        app.close()


def test_dispatch_many_returns_distinct_ids_in_one_round_trip_per_batch(
    app: App, r: redis.Redis
) -> None:
    Record("warm").dispatch()  # the script is cached after this
    r.config_resetstat()
    ids = app.dispatch_many([Record(f"m{i}") for i in range(2500)], batch_size=1000)
    ids += app.dispatch_many([Record("q").on_queue("other"), Record("d").delay(30)])
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 3 + 2  # 3 batches; then one per (queue, delay)
    assert len(ids) == len(set(ids)) == 2502
    assert sizes(app)["ready"] == 2501
    assert app.job_status(ids[-2], "other") == "pending"
    assert app.job_status(ids[-1]) == "delayed"


# -- job_status ---------------------------------------------------------------------------------


def test_job_status_through_its_life(app: App) -> None:
    ok = Gate("g").dispatch()
    bad = Boom("b").dispatch()
    assert app.job_status(ok) == "pending"
    assert app.job_status("f" * 32) is None
    seen: dict[str, str | None] = {}

    def check() -> bool:
        if runs_of("g") and "reserved" not in seen:
            seen["reserved"] = app.job_status(ok)
            GATES.setdefault("g", threading.Event()).set()
        return app.job_status(ok) == "done" and app.job_status(bad) == "failed"

    work(app, until=check)
    assert seen == {"reserved": "reserved"}
    assert app.job_status(ok) == "done"
    assert app.job_status(bad) == "failed"


# -- chains -------------------------------------------------------------------------------------


def test_chain_runs_links_in_order(app: App) -> None:
    first = chain(Step("a"), Step("b"), Step("c")).dispatch()
    work(app)
    assert [x[1] for x in RUNS] == ["a", "b", "c"]
    assert app.job_status(first) == "done"


def test_chain_failure_calls_catch_once_and_stops(app: App) -> None:
    chain(Step("x"), Boom("y"), Step("z")).catch(Step("caught")).dispatch()
    work(app)
    assert [x[1] for x in RUNS] == ["x", "y", "caught"]
    assert len(failed_by_id(app)) == 1


def test_chain_on_queue(app: App) -> None:
    chain(Step("q1"), Step("q2")).on_queue("chained").dispatch()
    work(app, queues=["chained"])
    assert [x[1] for x in RUNS] == ["q1", "q2"]


# -- lifecycle ------------------------------------------------------------------------------------


def test_processed_events_and_max_jobs(app: App) -> None:
    for i in range(5):
        Record(f"mj{i}").dispatch()
    processed: list[JobProcessed] = []
    app.listen(JobProcessed, processed.append)
    worker = work(app, stop_when_empty=False, max_jobs=2, concurrency=1)
    assert worker.exit_code == 0
    assert len(RUNS) == 2 and len(processed) == 2
    assert sizes(app)["ready"] == 3


def test_restart_signal_stops_a_running_worker(app: App) -> None:
    Record("before").dispatch()

    async def main() -> int:
        worker = Worker(app, WorkerOptions(sleep_s=0.2))
        task = asyncio.create_task(worker.run())
        while not RUNS:
            await asyncio.sleep(0.02)
        app.queue_for(None).restart()
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(main()) == 0


def test_async_and_sync_producers_survive_a_killed_connection(
    redis_server: RedisServer, prefix: str
) -> None:
    """A pooled connection the server closed is re-opened by one immediate retry, for
    the asyncio client too (given redis-py's sync Retry, it silently never retried)."""
    app = App(env=False, redis_url=redis_server.url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    admin = redis_server.client()
    try:

        async def main() -> list[str | None]:
            ids = [await Record("a1").dispatch_async()]
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            ids.append(await Record("a2").dispatch_async())
            return ids

        ids = asyncio.run(main())
        Record("s1").dispatch()
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        ids.append(Record("s2").dispatch())
        assert all(ids) and sizes(app)["ready"] == 4
    finally:
        admin.close()
        app.close()
