"""Broadcasting on each Redis topology: plain Redis, Redis Cluster and Sentinel.

A real ``notify-worker`` publishes what the app dispatches, a real ``broadcast-server``
reads it with one ``XREAD`` over every subscribed channel's stream and streams it to
SSE clients. On Redis Cluster that read names many keys in one command: it works only
because every broadcast key shares the ``{streams}`` hash tag (one slot; a CROSSSLOT
error otherwise). Run once per topology (marker ``topologies``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.broadcast import bc_app
from tests.broadcast.support import APP_SPEC, KEY, NOTIFY_WORKER, env_for, sse, start_server
from tests.support import Proc, wait_for
from tidings import App

pytestmark = pytest.mark.topologies

Spawn = Callable[..., Proc]


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix,
            allowed_modules="tests.broadcast")  # fmt: skip
    try:
        yield a
    finally:
        a.close()


def test_worker_publishes_and_the_sse_endpoint_delivers_on_every_topology(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn, redis_topology: str
) -> None:
    server, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    worker = spawn_proc(
        [NOTIFY_WORKER, "-A", APP_SPEC, "--sleep", "1"],
        name="worker",
        env=env_for(redis_url, prefix),
    )
    with (
        sse(base, ["private-orders.42", "news"], user=42) as u42,
        sse(base, ["private-User.7"], user=7) as u7,
    ):
        for reader in (u42, u7):
            wait_for(lambda r=reader: r.last_id is not None, 20, 0.02, message="opening id")
        app.dispatch(bc_app.OrderShipped(42, "on its way"))
        app.dispatch(bc_app.Announcement("hello"))
        bc_app.User(7).notify(bc_app.InvoicePaid(30))
        try:
            u42.wait_events(2, 60)
            u7.wait_events(1, 60)
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}\nserver:\n{server.tail()}\nworker:\n{worker.tail()}\n"
                f"streams: {_streams(app)}"
            ) from None
        got = sorted((e.event, e.data["channel"]) for e in u42.events)
        assert got == [("OrderShipped", "private-orders.42"), ("news.posted", "news")]
        assert [(e.event, e.data["channel"]) for e in u7.events] == [
            ("notification", "private-User.7")
        ]
        assert u7.events[0].data["data"]["amount"] == 30
        # A channel added while the reader is blocked (on Cluster nothing interrupts the
        # read: it is picked up within block_ms), and a reconnect replaying what it missed.
        last = u42.last_id
        with sse(base, ["orders"]) as late:
            wait_for(lambda: late.last_id is not None, 20, 0.02, message="opening id")
            app.dispatch(bc_app.OrderShipped(42, "again"))
            late.wait_events(1, 60)
            assert late.events[0].data["data"]["note"] == "again"
        u42.wait_events(3, 60)
    with sse(base, ["private-orders.42", "news"], user=42, last_event_id=last) as back:
        back.wait_events(1, 30)
        assert [e.data["data"]["note"] for e in back.events] == ["again"]
    assert worker.alive(), worker.tail()
    for proc in (server, worker):
        out = proc.output()
        assert "CROSSSLOT" not in out and "Traceback" not in out, out[-3000:]
        assert "broadcast reader" not in out, out[-3000:]  # the reader never failed


def _streams(app: App) -> dict[str, int]:
    r = app.queue_for(None).client
    return {
        k.decode(): r.xlen(k) for k in r.scan_iter(match=f"{app.settings.prefix}:broadcast:*:ch:*")
    }
