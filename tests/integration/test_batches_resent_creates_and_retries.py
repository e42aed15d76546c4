"""Batches: a create re-sent after its reply was lost, a producer dying right after
creating, and ``failed retry`` of a failed member.

Real Redis, a TCP proxy that lets a command reach Redis and then drops (or cuts after)
its reply, and real ``notify-worker`` subprocesses.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.integration.breakable_jobs import Mendable
from tests.integration.workflows_app import Callback, Item, make_app
from tests.integration.workflows_support import execs, start_worker, stop_all, wait_until
from tests.support import FaultProxy, Proc
from tidings import App
from tidings.errors import QueueUnavailable
from tidings.redis.keys import BatchKeys
from tidings.redis.scripts import BATCH_CREATE, BATCH_RETRY
from tidings.workflows.batch import BatchInfo, batch, list_batches, prune_batches


class ReplyProxy(FaultProxy):
    """A FaultProxy that, once, acts on the reply to the first request containing
    ``marker``: ``drop`` it (the command ran; the client sees the connection die and
    re-sends it) or ``cut`` everything after it (the producer dies right after)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.marker = b""
        self.action = ""
        self.fired = 0
        self._marked: set[int] = set()

    def arm(self, marker: bytes, action: str) -> None:
        self.marker, self.action = marker, action

    async def _pump(
        self,
        link: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        try:
            while not link.closed:
                data = await reader.read(65536)
                if not data:
                    return
                if upstream and self.marker and self.marker in data:
                    self._marked.add(id(link))
                    self.marker = b""
                if not upstream and id(link) in self._marked:
                    self._marked.discard(id(link))
                    self.fired += 1
                    if self.action == "drop":
                        self._abort(link)
                        return
                    writer.write(data)
                    await writer.drain()
                    await self._apply("reset")
                    return
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            return


@pytest.fixture
def reply_proxy(redis_url: str) -> Iterator[ReplyProxy]:
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = ReplyProxy(host, int(port))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = make_app(redis_url, prefix)
    try:
        yield a
    finally:
        a.close()


def _callbacks(r: redis.Redis, prefix: str) -> dict[str, int]:
    raw: Any = r.hgetall(f"{prefix}:test:callbacks")
    return {k.decode(): int(v) for k, v in raw.items()}


def _by_name(app: App, name: str) -> BatchInfo | None:
    return next((b for b in list_batches(app) if b.name == name), None)


def test_create_resent_after_lost_reply_keeps_the_counts(
    reply_proxy: ReplyProxy, app: App, prefix: str
) -> None:
    """The create ran, its reply was lost, redis-py re-sent it. Before, the second
    run reset the counters and finished the batch at once (then/finally queued)."""
    proxied = make_app(reply_proxy.url(), prefix)
    try:
        batch([Item("warm")]).name("warm").dispatch()  # scripts loaded, connection open
        reply_proxy.arm(b"lost-reply", "drop")
        bid = (
            batch([Item(f"i{n}") for n in range(3)])
            .then(Callback("then"))
            .catch(Callback("catch"))
            .finally_(Callback("finally"))
            .name("lost-reply")
            .dispatch()
        )
    finally:
        proxied.close()
    assert reply_proxy.fired == 1, "the proxy never dropped the create's reply"
    info = app.find_batch(bid)
    assert info is not None
    assert (info.total, info.pending, info.processed, info.failed) == (3, 3, 0, 0)
    assert not info.finished
    # 1 warm-up job + 3 members; no callback was pushed.
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 4
    assert _by_name(app, "lost-reply") is not None


def test_empty_batch_create_resent_pushes_callbacks_once(
    reply_proxy: ReplyProxy, app: App, prefix: str
) -> None:
    proxied = make_app(reply_proxy.url(), prefix)
    try:
        batch([]).name("warm").dispatch()
        before = app.queue_for(None).sizes(["default"])["default"]["ready"]
        reply_proxy.arm(b"empty-lost", "drop")
        bid = batch([]).then(Callback("then")).finally_(Callback("finally")).name("empty-lost")
        bid_s = bid.dispatch()
    finally:
        proxied.close()
    assert reply_proxy.fired == 1
    info = app.find_batch(bid_s)
    assert info is not None and info.finished and info.total == 0
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == before + 2


def test_producer_dying_right_after_create_leaves_a_listed_batch(
    reply_proxy: ReplyProxy, app: App, prefix: str
) -> None:
    """Everything after the create's reply fails (the producer 'dies'). Before,
    the index entry was a second command, so the batch was invisible to list_batches and
    `prune --unfinished`."""
    proxied = make_app(reply_proxy.url(), prefix)
    try:
        batch([]).name("warm").dispatch()
        reply_proxy.arm(b"half-made", "cut")
        with pytest.raises(QueueUnavailable):
            batch([Item("x"), Item("y")]).name("half-made").dispatch()
    finally:
        proxied.close()
    assert reply_proxy.fired == 1
    info = _by_name(app, "half-made")
    assert info is not None and info.total == 2 and info.pending == 2
    assert prune_batches(app, -5.0, unfinished=True) >= 1
    assert app.find_batch(info.id) is None


def test_failed_retry_of_a_batch_member_runs_it(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """Before, the batch gate skipped the retried job (its id was in the finished
    set), acked it as done and the failed record was gone: it never ran again."""
    redis_client.set(f"{prefix}:test:broken:m", 1)
    bid = (
        batch([Mendable("m"), Item("ok")])
        .then(Callback("then"))
        .catch(Callback("catch"))
        .finally_(Callback("finally"))
        .allow_failures()
        .dispatch()
    )
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    try:
        wait_until(lambda: len(_callbacks(redis_client, prefix)) == 2, 20, "catch, finally", w)
        info = app.find_batch(bid)
        assert info is not None and (info.processed, info.failed, info.pending) == (1, 1, 0)
        # The callbacks are pushed as the failure is recorded, before the failed move.
        failed = wait_until(lambda: app.queue_for(None).failed(["default"]), 20, "failed", w)
        assert [f.name for f in failed] == ["Mendable"]
        redis_client.delete(f"{prefix}:test:broken:m")
        assert app.queue_for(None).retry([failed[0].id]) == 1
        reopened = app.find_batch(bid)
        assert reopened is not None and not reopened.finished and reopened.pending == 1
        wait_until(lambda: execs(redis_client, prefix).get("m") == 2, 20, "m ran again", w)
        done = wait_until(
            lambda: (i := app.find_batch(bid)) is not None and i.finished and i, 20, "finished", w
        )
        assert (done.total, done.processed, done.failed, done.pending) == (2, 2, 0, 0)
        # `then` runs now that no failure is left; catch and finally never run twice.
        wait_until(lambda: "then" in _callbacks(redis_client, prefix), 20, "then", w)
        assert _callbacks(redis_client, prefix) == {"catch": 1, "finally": 1, "then": 1}
        assert app.queue_for(None).failed(["default"]) == []
        wait_until(lambda: app.job_status(failed[0].id) == "done", 20, "acked", w)
    finally:
        stop_all(w)


def test_failed_retry_of_a_member_of_a_cancelled_batch_runs_it(
    app: App, redis_client: redis.Redis, prefix: str, spawn_proc: Callable[..., Proc]
) -> None:
    """Without allow_failures the first failure cancels the batch; a member retried by
    hand still runs (it is what the operator asked for), and fails again here."""
    redis_client.set(f"{prefix}:test:broken:c", 1)
    bid = batch([Mendable("c")]).catch(Callback("catch")).dispatch()
    w = start_worker(spawn_proc, app.settings.redis_url, prefix)
    try:
        wait_until(lambda: app.queue_for(None).failed(["default"]), 20, "failed", w)
        job_id = app.queue_for(None).failed(["default"])[0].id
        assert app.queue_for(None).retry([job_id]) == 1
        wait_until(lambda: execs(redis_client, prefix).get("c") == 2, 20, "c ran again", w)
        wait_until(lambda: app.queue_for(None).failed(["default"]), 20, "failed again", w)
        info = wait_until(
            lambda: (i := app.find_batch(bid)) is not None and i.finished and i, 20, "finished", w
        )
        assert (info.total, info.failed, info.processed) == (1, 1, 0)
        wait_until(lambda: _callbacks(redis_client, prefix), 20, "catch", w)
        time.sleep(0.3)  # a second catch would have been pushed with the second failure
        assert _callbacks(redis_client, prefix) == {"catch": 1}
    finally:
        stop_all(w)


def test_batch_retry_script_is_safe_to_run_twice(app: App) -> None:
    rq = app.queue_for(None)
    bid = batch([Item("a")]).dispatch()
    k = BatchKeys.build(rq.prefix, bid)
    member = rq.client.smembers(k.members).pop().decode()  # type: ignore[union-attr]
    rq.client.sadd(k.finished, member)
    rq.client.sadd(k.failed, member)
    rq.client.hset(k.info, mapping={"pending": 0, "failed": 1, "finished_at": 1})
    keys = [k.info, k.finished, k.failed, k.retried]
    assert BATCH_RETRY.call(rq.client, keys, [member, 1000]) == 1
    assert BATCH_RETRY.call(rq.client, keys, [member, 1000]) == 0
    info = app.find_batch(bid)
    assert info is not None and (info.pending, info.failed, info.finished) == (1, 0, False)
    assert BATCH_RETRY.call(rq.client, keys, ["not-a-member", 1000]) == 0


def test_async_create_resent_after_lost_reply_keeps_the_counts(
    reply_proxy: ReplyProxy, app: App, prefix: str
) -> None:
    """The asyncio client re-sends too (its own Retry): same script, same outcome."""
    proxied = make_app(reply_proxy.url(), prefix)

    async def go() -> str:
        await batch([Item("warm")]).name("warm").dispatch_async()
        reply_proxy.arm(b"async-lost", "drop")
        bid = (
            await batch([Item("p"), Item("q")])
            .then(Callback("t"))
            .name("async-lost")
            .dispatch_async()
        )
        await proxied.queue_for(None).aclient().aclose()
        return bid

    try:
        bid = asyncio.run(go())
    finally:
        proxied.close()
    assert reply_proxy.fired == 1
    info = app.find_batch(bid)
    assert info is not None and (info.total, info.pending, info.finished) == (2, 2, False)
    assert _by_name(app, "async-lost") is not None
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 3


def test_batches_on_redis_cluster(
    redis_server_factory: Callable[..., Any], prefix: str, tmp_path: Any
) -> None:
    """On a (one-node) Redis Cluster the index lives in another slot than the batch:
    the producer indexes first, then creates with the same idempotent script."""
    with socket.socket() as probe:  # the bus port: the default (port + 10000) may not fit
        probe.bind(("127.0.0.1", 0))
        bus_port = probe.getsockname()[1]
    server = redis_server_factory(
        appendonly=False,
        extra_args=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(bus_port),
        ],
    )  # fmt: skip
    admin = redis.Redis(host=server.host, port=server.port)
    try:
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_until(
            lambda: b"cluster_state:ok" in admin.execute_command("CLUSTER", "INFO"), 10, "ok"
        )
    finally:
        admin.close()
    app = make_app(f"redis+cluster://{server.host}:{server.port}", prefix)
    try:
        bid = batch([Item("a"), Item("b")]).then(Callback("t")).name("on-cluster").dispatch()
        info = _by_name(app, "on-cluster")
        assert info is not None and info.id == bid
        assert (info.total, info.pending, info.finished) == (2, 2, False)
        # Re-sent create (as after a lost reply): nothing changes.
        rq = app.queue_for(None)
        k = BatchKeys.build(rq.prefix, bid)
        raw = BATCH_CREATE.call(rq.client, [k.info, k.members], [bid, 0, "x", "y"])
        assert int(raw[0]) == 2
        again = app.find_batch(bid)
        assert again is not None and (again.total, again.pending) == (2, 2)
        assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 2
    finally:
        app.close()
