"""``dispatch_many`` applies the unique and debounce checks one dispatch would."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.integration.workflows_app import Debounced, Record, Unique, make_app
from tests.support import free_port
from tidings import App
from tidings.errors import QueueUnavailable


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _sizes(app: App) -> dict[str, int]:
    return app.queue_for(None).sizes(["default"])["default"]


def test_dispatch_many_drops_unique_duplicates(app: App) -> None:
    first = Unique("k", 0).dispatch()
    assert first is not None
    ids = app.dispatch_many(
        [Unique("k", n) for n in range(1, 6)] + [Record("plain"), Unique("fresh", 0)]
    )
    # The five duplicates are dropped (no id); the plain job and the new unique id queue.
    assert len(ids) == 2 and first not in ids
    assert _sizes(app)["ready"] == 3
    # Two of one new id in one call: the first takes the lock, the second is dropped.
    assert len(app.dispatch_many([Unique("twice", 1), Unique("twice", 2)])) == 1
    assert _sizes(app)["ready"] == 4


def test_dispatch_many_async_debounces(app: App) -> None:
    async def go() -> list[str]:
        return await app.dispatch_many_async([Debounced("d", n) for n in range(4)])

    ids = asyncio.run(go())
    assert len(ids) == 4
    # One waiting job per debounce id: each dispatch replaced the previous one.
    assert _sizes(app)["delayed"] == 1
    assert app.job_status(ids[-1]) == "delayed"
    assert app.job_status(ids[0]) is None


def test_dispatch_many_unique_pushes_raise_only_queue_unavailable(prefix: str) -> None:
    """A Redis that cannot be reached: the unique and debounced pushes of dispatch_many
    raise QueueUnavailable, as every producer call does, not redis-py's
    ConnectionError."""
    dead = make_app(f"redis://127.0.0.1:{free_port()}/0", prefix)
    try:
        with pytest.raises(QueueUnavailable):
            dead.dispatch_many([Unique("down", 0)])
        with pytest.raises(QueueUnavailable):
            asyncio.run(dead.dispatch_many_async([Debounced("down", 0)]))
    finally:
        dead.close()
