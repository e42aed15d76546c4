"""Models as arguments and after-commit dispatch, with SQLAlchemy on a real SQLite file,
Pydantic models, a real Redis and an in-process Worker.

- A mapped object is stored by class and primary key and reloaded in the worker, in a
  worker thread (the decode on the loop raises NeedsThread and is redone there).
- A row deleted after dispatch fails the job with ModelNotFound, or drops it under
  ``missing_models="skip"`` or ``delete_when_missing_models = True``.
- ``after_commit``: pushed when the session's transaction commits; dropped on rollback;
  pushed at once outside a transaction and in a session that only read.
- Pydantic models as events and arguments: validated again on load; a payload that no
  longer validates fails the job, named.
- A sync push on a running event loop warns once, naming ``dispatch_async``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from tidings import App, Job, Listener, ShouldQueue, queued
from tidings.app import BlockingDispatchWarning
from tidings.contrib import sqlalchemy as tsa
from tidings.contrib.models import use_sqlalchemy_sessions
from tidings.errors import ModelNotFound, SerializationError
from tidings.wire import serializer
from tidings.worker.worker import Worker, WorkerOptions

KEY = "m" * 32
SEEN: list[tuple[str, Any, str]] = []
"""(what, value, thread name) recorded in the worker."""


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(100))


@dataclass
class AccountJob(Job):
    account: Account

    def handle(self) -> None:
        SEEN.append(
            ("account", (self.account.id, self.account.email), threading.current_thread().name)
        )


@dataclass
class LenientJob(AccountJob):
    delete_when_missing_models = True


class Signup(pydantic.BaseModel):
    email: str
    at: dt.datetime
    tags: list[str] = []


@dataclass
class SignupJob(Job):
    signup: Signup

    async def handle(self) -> None:
        SEEN.append(("signup", self.signup, ""))


class OnSignup(Listener, ShouldQueue):
    def handle(self, e: Signup) -> None:
        SEEN.append(("listener", e, ""))


@queued(after_commit=True)
def later_listener(e: Signup) -> None:
    SEEN.append(("fn", e.email, ""))


@dataclass
class LaterJob(Job):
    n: int
    after_commit = True

    def handle(self) -> None:
        SEEN.append(("later", self.n, ""))


@dataclass
class NowJob(Job):
    n: int
    after_commit = False

    def handle(self) -> None:
        SEEN.append(("now", self.n, ""))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    use_sqlalchemy_sessions(factory)
    tsa.install()
    yield factory
    use_sqlalchemy_sessions(None)
    engine.dispose()


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    SEEN.clear()
    made = App(redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"])
    yield made
    made.close()


def _work(app: App) -> Worker:
    app.make_current()
    worker = Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.2, timeout_s=15.0))
    assert asyncio.run(worker.run()) == 0
    return worker


def _account(db: sessionmaker[Any], email: str) -> Account:
    with db.begin() as session:
        acc = Account(email=email)
        session.add(acc)
    return acc


def _ready(app: App) -> int:
    return int(app.queue_for(None).client.llen(app.queue_for(None).keys("default").ready))


def test_a_mapped_object_is_stored_by_key_and_reloaded_in_a_worker_thread(
    app: App, db: sessionmaker[Any]
) -> None:
    acc = _account(db, "ada@example.org")
    data = serializer.encode(AccountJob(acc))
    assert data["f"]["account"] == {
        "__t": "x",
        "x": "sqlalchemy",
        "c": "tests.integration.test_contrib_models:Account",
        "v": {"pk": [acc.id]},
    }
    with db.begin() as session:  # changed after dispatch: the worker sees the new row
        AccountJob(acc).dispatch()
        session.get(Account, acc.id).email = "ada@new.example.org"  # type: ignore[union-attr]
    _work(app)
    assert [s[:2] for s in SEEN] == [("account", (acc.id, "ada@new.example.org"))]
    assert SEEN[0][2] != threading.main_thread().name  # loaded and run off the loop


def test_decoding_a_model_on_the_event_loop_asks_for_a_thread(db: sessionmaker[Any]) -> None:
    acc = _account(db, "x@example.org")
    data = serializer.encode(acc)

    async def on_loop() -> Any:
        return serializer.decode(data, lambda p: Account)

    with pytest.raises(serializer.NeedsThread):
        asyncio.run(on_loop())
    assert serializer.decode(data, lambda p: Account).email == "x@example.org"


def test_a_deleted_row_fails_the_job_with_a_clear_reason(app: App, db: sessionmaker[Any]) -> None:
    acc = _account(db, "gone@example.org")
    AccountJob(acc).dispatch()
    with db.begin() as session:
        session.delete(session.get(Account, acc.id))
    _work(app)
    assert SEEN == []
    [record] = app.queue_for(None).failed()
    assert "ModelNotFound" in record.exception
    assert f"Account with primary key {acc.id} no longer exists" in record.exception
    assert "TIDINGS_MISSING_MODELS=skip" in record.exception


@pytest.mark.parametrize("how", ["setting", "attribute"])
def test_a_deleted_row_can_drop_the_job_instead(
    how: str, redis_url: str, prefix: str, db: sessionmaker[Any]
) -> None:
    SEEN.clear()
    options: dict[str, Any] = {"missing_models": "skip"} if how == "setting" else {}
    app = App(redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"], **options)
    try:
        acc = _account(db, "gone@example.org")
        job = AccountJob(acc) if how == "setting" else LenientJob(acc)
        job_id = job.dispatch()
        with db.begin() as session:
            session.delete(session.get(Account, acc.id))
        _work(app)
        assert SEEN == []
        assert app.queue_for(None).failed() == []
        assert app.job_status(str(job_id)) in (None, "done")
    finally:
        app.close()


def test_model_not_found_is_a_serialization_error_naming_the_setting() -> None:
    exc = ModelNotFound("app.models:User", 7)
    assert isinstance(exc, SerializationError) and exc.permanent
    assert "TIDINGS_MISSING_MODELS" in str(exc) and "after_commit" in str(exc)


def test_after_commit_waits_for_commit_and_drops_on_rollback(
    app: App, db: sessionmaker[Any]
) -> None:
    with db.begin() as session:
        session.add(Account(email="a@example.org"))
        LaterJob(1).dispatch()
        NowJob(2).dispatch()  # after_commit = False: at once
        assert _ready(app) == 1
    assert _ready(app) == 2  # committed: pushed
    with pytest.raises(RuntimeError), db.begin() as session:
        session.add(Account(email="b@example.org"))
        LaterJob(3).dispatch()
        raise RuntimeError("roll back")
    session = db()
    session.add(Account(email="c@example.org"))
    session.flush()
    LaterJob(4).dispatch()
    session.rollback()
    session.close()
    LaterJob(5).dispatch()  # no transaction: at once
    with db() as reader:
        reader.query(Account).count()  # only read: nothing to wait for
        LaterJob(6).dispatch()
        assert _ready(app) == 4
    _work(app)
    assert sorted(s[1] for s in SEEN) == [1, 2, 5, 6]


def test_the_app_wide_default_and_notifications_use_after_commit(
    redis_url: str, prefix: str, db: sessionmaker[Any]
) -> None:
    app = App(
        redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"], after_commit=True
    )
    try:
        with db.begin() as session:
            session.add(Account(email="a@example.org"))
            SignupJob(Signup(email="a@example.org", at=dt.datetime.now(dt.UTC))).dispatch()
            ids = app.dispatch_many(
                [NowJob(1), SignupJob(Signup(email="b@x.org", at=dt.datetime.now(dt.UTC)))]
            )
            assert len(ids) == 2
            assert _ready(app) == 1  # NowJob opts out
        assert _ready(app) == 3
    finally:
        app.close()


def test_pydantic_models_as_events_and_arguments(app: App) -> None:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    app.listen(Signup, OnSignup)
    app.dispatch(Signup(email="ada@example.org", at=at, tags=["a"]))
    SignupJob(Signup(email="bob@example.org", at=at)).dispatch()
    _work(app)
    got = sorted((s[0], s[1]) for s in SEEN)
    assert got == [
        ("listener", Signup(email="ada@example.org", at=at, tags=["a"])),
        ("signup", Signup(email="bob@example.org", at=at)),
    ]
    assert isinstance(got[0][1].at, dt.datetime)


def test_a_pydantic_payload_that_no_longer_validates_fails_named() -> None:
    data = serializer.encode(Signup(email="a@x.org", at=dt.datetime.now(dt.UTC)))
    assert data["x"] == "pydantic" and isinstance(data["v"]["at"], str)
    data["v"]["at"] = "not a time"
    with pytest.raises(SerializationError, match=r"malformed 'x' value.*at"):
        serializer.decode(data, lambda p: Signup)


def test_a_sync_push_on_a_running_loop_warns_once(app: App) -> None:
    import tidings._blocking as app_module

    app_module._warned_blocking = False

    async def route() -> None:
        NowJob(1).dispatch()
        NowJob(2).dispatch()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(route())
    blocking = [w for w in caught if issubclass(w.category, BlockingDispatchWarning)]
    assert len(blocking) == 1
    assert "await app.dispatch_async(e)" in str(blocking[0].message)
    assert _ready(app) == 2  # still pushed


def test_a_rolled_back_savepoint_drops_its_pushes_and_a_released_one_waits(
    app: App, db: sessionmaker[Any]
) -> None:
    with db.begin() as session:
        session.add(Account(email="outer@example.org"))
        LaterJob(1).dispatch()
        try:
            with session.begin_nested():
                session.add(Account(email="inner@example.org"))
                LaterJob(2).dispatch()
                raise RuntimeError("roll the savepoint back")
        except RuntimeError:
            pass
        with session.begin_nested():
            LaterJob(3).dispatch()
        assert _ready(app) == 0  # a released savepoint is not a commit
    assert _ready(app) == 2
    _work(app)
    assert sorted(s[1] for s in SEEN) == [1, 3]


def test_one_failing_push_at_commit_does_not_cost_the_others(
    app: App, db: sessionmaker[Any], redis_url: str, prefix: str
) -> None:
    from tidings.errors import QueueUnavailable

    app.settings.connections["down"] = "redis://127.0.0.1:1/0"

    with pytest.raises(QueueUnavailable), db.begin() as session:
        session.add(Account(email="a@example.org"))
        LaterJob(1).dispatch()
        LaterJob(9).on_connection("down").dispatch()  # held: Redis is not asked yet
        LaterJob(2).dispatch()
    assert _ready(app) == 2
    with db() as reader:  # the rows were committed
        assert reader.query(Account).count() == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"__t": "x", "x": "nope", "c": "m:C", "v": {}}, "no serializer extension 'nope'"),
        (
            {
                "__t": "x",
                "x": "pydantic",
                "c": "tests.integration.test_contrib_models:Account",
                "v": {},
            },
            "is not a class the 'pydantic' extension loads",
        ),
        (
            {
                "__t": "x",
                "x": "sqlalchemy",
                "c": "tests.integration.test_contrib_models:Signup",
                "v": {"pk": [1]},
            },
            "is not a class the 'sqlalchemy' extension loads",
        ),
        ({"__t": "x", "x": "pydantic"}, "malformed 'x' value"),
    ],
)
def test_garbage_extension_values_are_refused_by_name(data: Any, message: str) -> None:
    import importlib

    def resolve(path: str) -> Any:
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)

    with pytest.raises(SerializationError, match=message):
        serializer.decode(data, resolve)


def test_an_unsaved_object_cannot_be_queued(db: sessionmaker[Any]) -> None:
    with pytest.raises(SerializationError, match="flush"):
        serializer.encode(AccountJob(Account(email="new@example.org")))


def test_async_sessions_hold_pushes_per_task(app: App, tmp_path: Path) -> None:
    """Two requests on one event loop: each AsyncSession holds its own pushes (the
    context variable follows each task into SQLAlchemy's greenlet)."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    tsa.install()

    async def main() -> list[int]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'async.db'}")
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        factory = async_sessionmaker(engine)
        both_open = asyncio.Event()
        seen: list[int] = []

        async def request(n: int, commit: bool) -> None:
            async with factory() as session:
                await session.begin()  # begun explicitly: pushes wait for it
                await app.dispatch_async(LaterJob(n))
                seen.append(_ready(app))
                if len(seen) == 2:
                    both_open.set()  # both transactions hold a push at once
                await both_open.wait()
                await (session.commit() if commit else session.rollback())

        await asyncio.gather(request(1, True), request(2, False))
        await engine.dispose()
        return seen

    assert asyncio.run(main()) == [0, 0]
    _work(app)
    assert [s[1] for s in SEEN] == [1]


def test_a_queued_function_takes_after_commit(app: App, db: sessionmaker[Any]) -> None:
    app.listen(Signup, later_listener)
    with pytest.raises(RuntimeError), db.begin() as session:
        session.add(Account(email="a@example.org"))
        app.dispatch(Signup(email="dropped@example.org", at=dt.datetime.now(dt.UTC)))
        raise RuntimeError("roll back")
    with db.begin() as session:
        session.add(Account(email="b@example.org"))
        app.dispatch(Signup(email="kept@example.org", at=dt.datetime.now(dt.UTC)))
        assert _ready(app) == 0
    _work(app)
    assert SEEN == [("fn", "kept@example.org", "")]


def test_a_session_dropped_without_close_is_not_kept_alive(app: App, db: sessionmaker[Any]) -> None:
    import gc
    import weakref

    session = db()
    session.add(Account(email="leak@example.org"))
    session.flush()
    LaterJob(1).dispatch()  # held by this session, which is then dropped
    ref = weakref.ref(session)
    del session
    gc.collect()
    assert ref() is None
    LaterJob(2).dispatch()  # nothing open any more: at once
    assert _ready(app) == 1


class SlowThing:
    """Stands for a model whose database hangs while the worker loads it."""

    def __init__(self, key: int) -> None:
        self.key = key


class SlowModels:
    name = "test-slow"
    blocking = True

    def claims(self, cls: type[Any]) -> bool:
        return cls is SlowThing

    def dump(self, value: Any) -> Any:
        return {"key": value.key}

    def load(self, cls: type[Any], data: Any) -> Any:
        import time

        time.sleep(data["key"])
        return SlowThing(data["key"])


@dataclass
class SlowJob(Job):
    thing: SlowThing
    timeout = 0.3

    def handle(self) -> None:
        SEEN.append(("slow", self.thing.key, ""))


def test_a_model_load_past_the_jobs_timeout_fails_it_and_recycles_the_worker(app: App) -> None:
    """A hung database must not hold a job forever: the load runs under the job's
    timeout; a thread cannot be cancelled, so the worker exits 13 for its supervisor."""
    serializer.register_extension(SlowModels())
    try:
        SlowJob(SlowThing(2)).dispatch()
        app.make_current()
        worker = Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.2, timeout_s=15.0))
        assert asyncio.run(worker.run()) == 13
    finally:
        serializer._EXTENSIONS.pop("test-slow", None)
        serializer._CLAIMED.clear()
    assert SEEN == []
    [record] = app.queue_for(None).failed()
    assert "JobTimeout" in record.exception and "loading the job's models" in record.exception


def test_a_skipped_job_still_counts_in_its_batch(
    redis_url: str, prefix: str, db: sessionmaker[Any]
) -> None:
    from tidings import batch

    SEEN.clear()
    app = App(redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=["tests"])
    try:
        kept, gone = _account(db, "kept@example.org"), _account(db, "gone@example.org")
        batch_id = batch([LenientJob(kept), LenientJob(gone)]).dispatch()
        with db.begin() as session:
            session.delete(session.get(Account, gone.id))
        _work(app)
        assert [s[1] for s in SEEN] == [(kept.id, "kept@example.org")]
        info = app.find_batch(batch_id)
        assert info is not None and info.finished and info.pending == 0
        assert app.queue_for(None).failed() == []
    finally:
        app.close()
