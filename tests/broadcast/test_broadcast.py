"""Broadcasting end to end: real Redis, a real worker, real broadcast servers (uvicorn
processes on loopback), httpx streaming clients reading SSE as a browser would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.broadcast import bc_app
from tests.broadcast.support import KEY, NOTIFY_WORKER, env_for, sse, start_server
from tests.support import Proc, wait_for
from tidings import App
from tidings.broadcasting import BroadcastEvent
from tidings.broadcasting.hub import CONTROL_CONNECTIONS
from tidings.errors import ValidationError
from tidings.events.call_queued import CallQueuedListener
from tidings.redis.keys import broadcast_ids_keys, broadcast_stream_key
from tidings.testing import fake_notifications, fake_queue
from tidings.worker.worker import Worker, WorkerOptions

Spawn = Callable[..., Proc]


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix,
            allowed_modules="tests.broadcast", retry_after=3)  # fmt: skip
    # bc_app's authorisation callbacks and resolver, on this test's App
    a.broadcasting._channels = bc_app.app.broadcasting._channels
    a.broadcasting._user = bc_app.app.broadcasting._user
    try:
        yield a
    finally:
        a.close()


def work(app: App) -> None:
    worker = Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.2))
    assert asyncio.run(asyncio.wait_for(worker.run(), 30)) == 0


def entries(app: App, channel: str) -> list[tuple[str, dict[bytes, bytes]]]:
    r = app.queue_for(None).client
    return [(sid.decode(), f) for sid, f in r.xrange(broadcast_stream_key(app.settings.prefix,
                                                                          channel))]  # fmt: skip


# -- publishing ------------------------------------------------------------------------


def test_a_publish_resent_with_its_message_id_adds_nothing(app: App) -> None:
    first = app.broadcasting.publish(["news", "orders"], "posted", {"n": 1}, message_id="m1")
    again = app.broadcasting.publish(["news", "orders"], "posted", {"n": 1}, message_id="m1")
    assert first == again
    assert [sid for sid, _ in entries(app, "news")] == [first[0]]
    assert entries(app, "orders")[0][1] == {
        b"e": b"posted",
        b"d": b'{"n":1}',
        b"m": b"m1",
        b"p": b"0-0",
    }
    # still remembered after other messages on the channel (a worker retry comes later)
    for i in range(50):
        app.broadcasting.publish("news", "posted", {"i": i}, message_id=f"x{i}")
    assert app.broadcasting.publish("news", "posted", {"n": 1}, message_id="m1") == first[:1]
    assert len(entries(app, "news")) == 51


def _broadcast_keys(app: App) -> list[bytes]:
    r = app.queue_for(None).client
    return sorted(r.scan_iter(match=f"{app.settings.prefix}:broadcast:*", count=1000))


def test_publish_memory_is_bounded_by_the_window_not_the_message_count(app: App) -> None:
    """One key per message per channel (the old receipts) made 86 million keys a day at
    1,000 messages/s. Now: a stream and two id keys per channel, each O(max_len)."""
    r = app.queue_for(None).client
    app.broadcasting.max_len = 100
    channels = ["a", "b"]

    def usage() -> int:
        return sum(int(r.memory_usage(k, samples=0) or 0) for k in _broadcast_keys(app))

    def send(start: int, n: int) -> None:
        for i in range(start, start + n):
            app.broadcasting.publish(channels, "tick", {"i": i}, message_id=f"msg-{i}")

    send(0, 500)
    keys_after_500, bytes_after_500 = _broadcast_keys(app), usage()
    send(500, 4500)
    keys_after_5000, bytes_after_5000 = _broadcast_keys(app), usage()
    assert len(keys_after_5000) == len(keys_after_500) == 3 * len(channels)
    ids_hash, ids_list = broadcast_ids_keys(app.settings.prefix, "a")
    assert r.hlen(ids_hash) == r.llen(ids_list) == 100  # the window, not 5,000
    # ten times the messages, about the same memory (MAXLEN ~ trims whole stream nodes)
    assert bytes_after_5000 < 1.5 * bytes_after_500, (bytes_after_500, bytes_after_5000)
    assert r.ttl(ids_hash) > 0 and r.ttl(ids_list) > 0  # an idle channel forgets them
    # the window's ids still deduplicate; one that left the window publishes again
    sid = app.broadcasting.publish(channels, "tick", {"i": 4999}, message_id="msg-4999")
    assert sid == [entries(app, c)[-1][0] for c in channels]


def test_streams_are_bounded_by_max_len(app: App) -> None:
    app.broadcasting.max_len = 100
    for i in range(1000):
        app.broadcasting.publish("busy", "tick", {"i": i})
    n = len(entries(app, "busy"))
    assert 100 <= n < 300  # MAXLEN ~ trims whole macro nodes
    assert entries(app, "busy")[-1][1][b"d"] == b'{"i":999}'


def test_bad_channel_event_names_and_data_are_refused_naming_the_call(app: App) -> None:
    with pytest.raises(ValidationError, match="not a channel name"):
        app.broadcasting.publish("bad channel\n", "x", {})
    with pytest.raises(ValidationError, match="event name"):
        app.broadcasting.publish("ok", "two\nlines", {})
    with pytest.raises(ValidationError, match="not JSON"):
        app.broadcasting.publish("ok", "x", {"when": object()})


# -- events and notifications through the queue ------------------------------------------


def test_a_should_broadcast_event_is_queued_and_the_worker_publishes_it(app: App) -> None:
    ids = app.dispatch(bc_app.OrderShipped(42, "on its way"))
    assert len(ids) == 1 and isinstance(ids[0], str)
    assert entries(app, "orders") == []  # queued, not published at dispatch
    app.dispatch(bc_app.Announcement("hello"))
    work(app)
    for channel in ("private-orders.42", "orders"):
        [(_, fields)] = entries(app, channel)
        assert (fields[b"e"], fields[b"d"]) == (
            b"OrderShipped",
            b'{"order_id":42,"note":"on its way"}',
        )
        assert fields[b"m"] == ids[0].encode()  # the job id is the message id
    [(_, fields)] = entries(app, "news")
    assert (fields[b"e"], fields[b"d"]) == (b"news.posted", b'{"text":"HELLO"}')


def test_a_broadcast_notification_goes_to_the_notifiables_private_channel(app: App) -> None:
    user = bc_app.User(7)
    [job_id] = user.notify(bc_app.InvoicePaid(30))
    work(app)
    [(_, fields)] = entries(app, "private-User.7")
    assert fields[b"e"] == b"notification"
    data = __import__("orjson").loads(fields[b"d"])
    assert data["amount"] == 30 and data["type"] == "InvoicePaid" and len(data["id"]) == 32
    assert job_id


def test_fakes_record_broadcasts(app: App) -> None:
    user = bc_app.User(3)
    with fake_notifications(app) as notes:
        user.notify(bc_app.InvoicePaid(5))
    notes.assert_sent_to(user, bc_app.InvoicePaid, lambda n, channels: channels == ["broadcast"])
    with fake_queue(app) as q:
        app.dispatch(bc_app.OrderShipped(1, "x"))
    q.assert_pushed(BroadcastEvent)
    [job] = q.jobs(BroadcastEvent)
    assert isinstance(job, CallQueuedListener) and job.args[0] == bc_app.OrderShipped(1, "x")


# -- the SSE endpoint, served by notify-worker broadcast-server ---------------------------


def test_two_users_hear_only_their_own_channel_and_a_refusal_is_a_bare_403(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    with (
        sse(base, ["private-orders.1"], user=1) as one,
        sse(base, ["private-orders.2", "orders"], user=2) as two,
        sse(base, ["private-orders.1"], user=2) as thief,
        sse(base, ["private-orders.1"]) as nobody,
    ):
        assert (one.status, two.status) == (200, 200)
        assert (thief.status, thief.body, nobody.status, nobody.body) == (403, b"", 403, b"")
        for i in range(20):
            app.broadcasting.publish(f"private-orders.{1 + i % 2}", "OrderShipped", {"i": i})
        app.broadcasting.publish("orders", "OrderShipped", {"i": "public"})
        one_got = one.wait_events(10)
        two_got = two.wait_events(11)
        time.sleep(0.5)  # anything stray would have arrived by now
        assert [e.data for e in one.events] == [
            {"channel": "private-orders.1", "data": {"i": i}} for i in range(0, 20, 2)
        ]
        assert [e.data["data"]["i"] for e in two.events] == [*range(1, 20, 2), "public"]
        assert {e.data["channel"] for e in two_got} == {"private-orders.2", "orders"}
        assert one_got[0].event == "OrderShipped"


def test_a_reconnecting_browser_replays_what_it_missed_once(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    with sse(base, ["news"]) as first:
        wait_for(lambda: first.last_id is not None, 10, 0.02, message="the opening id")
        app.broadcasting.publish("news", "posted", {"n": 0})
        first.wait_events(1)
        last = first.events[-1].id
    assert last is not None
    for n in range(1, 4):  # while the browser is away
        app.broadcasting.publish("news", "posted", {"n": n})
    with sse(base, ["news"], last_event_id=last) as again:
        again.wait_events(3)
        app.broadcasting.publish("news", "posted", {"n": 4})
        again.wait_events(4)
        time.sleep(0.3)
        assert [e.data["data"]["n"] for e in again.events] == [1, 2, 3, 4]
        ids = [e.id for e in again.events]
        assert ids == sorted(set(ids), key=lambda s: tuple(map(int, s.split("-"))))


def test_a_fresh_connection_carries_its_start_so_a_reconnect_misses_nothing(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    app.broadcasting.publish("a", "old", {"n": "before"})
    with sse(base, ["a", "b"]) as first:
        wait_for(lambda: first.last_id is not None, 10, 0.02, message="the opening id")
        start = first.last_id
    assert start is not None and start.count(",") == 1  # one position per channel
    app.broadcasting.publish("b", "new", {"n": "b1"})
    app.broadcasting.publish("a", "new", {"n": "a1"})
    with sse(base, ["a", "b"], last_event_id=start) as again:
        again.wait_events(2)
        time.sleep(0.3)
        assert sorted(e.data["data"]["n"] for e in again.events) == ["a1", "b1"]


def test_idle_connections_get_heartbeat_comments(
    redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="0.2")
    with sse(base, ["quiet"]) as reader:
        wait_for(lambda: len(reader.comments) >= 3, 15, 0.05, message="three heartbeats")
        assert reader.events == []


def test_one_redis_reader_per_web_process_whatever_the_clients(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    r: redis.Redis = app.queue_for(None).client
    before = len(r.client_list())
    readers = [sse(base, [f"room.{i % 5}"]) for i in range(30)]
    opened = [cm.__enter__() for cm in readers]
    try:
        app.broadcasting.publish([f"room.{i}" for i in range(5)], "hi", {"x": 1})
        for reader in opened:
            reader.wait_events(1)
        # one reader + at most CONTROL_CONNECTIONS for positions, not one per client
        assert len(r.client_list()) - before <= 1 + CONTROL_CONNECTIONS < 30
        blocked = [c for c in r.client_list() if c.get("cmd") == "xread"]
        assert len(blocked) == 1
    finally:
        for cm in readers:
            cm.__exit__(None, None, None)


def test_a_token_guards_the_server_and_other_addresses_need_one(
    redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, "--token", "s3cret-token-value")
    assert httpx.get(base + "/?channel=news", timeout=5).status_code == 401
    with sse(base, ["news"], params={"token": "s3cret-token-value"}) as ok:
        assert ok.status == 200
    bearer = {"authorization": "Bearer s3cret-token-value"}
    with sse(base, ["news"], extra_headers=bearer) as by_header:
        assert by_header.status == 200
    wrong = {"authorization": "Bearer wrong"}
    assert httpx.get(base + "/?channel=news", headers=wrong, timeout=5).status_code == 401
    refused = httpx.get(base + "/?channel=news&token=nope", timeout=5)
    assert refused.status_code == 401 and "Authorization: Bearer" in refused.text
    assert "nope" not in refused.text
    proc = spawn_proc(
        [NOTIFY_WORKER, "broadcast-server", "-A", "tests.broadcast.open_app:app",
         "--host", "0.0.0.0", "--port", "1"],
        env=env_for(redis_url, prefix),
    )  # fmt: skip
    assert proc.wait(30) != 0
    assert "not loopback" in proc.output() and "TIDINGS_BROADCAST_TOKEN" in proc.output()
    assert "s3cret" not in proc.output()


def test_bad_requests_name_the_fix(redis_url: str, prefix: str, spawn_proc: Spawn) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix)
    for query in ("", "?channel=bad%20name%0A", "?channel=" + "x" * 300):
        resp = httpx.get(base + "/" + query, timeout=5)
        assert resp.status_code == 400 and "?channel=NAME" in resp.text
    assert httpx.post(base + "/?channel=a", timeout=5).status_code == 405


def test_connected_browsers_keep_receiving_after_a_redis_restart(
    redis_server: Any, spawn_proc: Spawn
) -> None:
    """RELIABILITY F6 for the reader: Redis restarts (AOF always); the web process's reader
    reconnects by itself and the connected browser gets what is published after, once."""
    url, prefix = redis_server.url, "bcrestart"
    _, base = start_server(spawn_proc, url, prefix, BC_HEARTBEAT_S="0.5")
    app = App(env=False, redis_url=url, key=KEY, prefix=prefix)
    try:
        with sse(base, ["news"]) as reader:
            wait_for(lambda: reader.last_id is not None, 10, 0.02, message="the opening id")
            app.broadcasting.publish("news", "posted", {"n": 1})
            reader.wait_events(1)
            redis_server.restart(0.5)
            # publish one message at a time until the reconnected reader delivers two
            sent = 1

            def step() -> bool:
                nonlocal sent
                if len(reader.events) >= 3:
                    return True
                if len(reader.events) == sent:
                    try:
                        app.broadcasting.publish("news", "posted", {"n": sent + 1})
                        sent += 1
                    except Exception:  # Redis still loading: try again next step
                        pass
                return False

            wait_for(step, 30, 0.2, message="messages after the restart")
            assert [e.data["data"]["n"] for e in reader.events] == [1, 2, 3]
    finally:
        app.close()


def test_a_malformed_broadcast_route_fails_at_notify_and_queues_nothing(app: App) -> None:
    class Odd(bc_app.User):
        def route_notification_for_broadcast(self, notification: Any) -> list[str]:
            return ["fine", "not fine\n"]

    with pytest.raises(ValidationError, match="route_notification_for_broadcast"):
        Odd(1).notify(bc_app.InvoicePaid(1))
    assert app.queue_for(None).sizes(["default"])["default"]["ready"] == 0


def test_a_browser_back_after_the_window_is_told_of_the_gap_then_gets_what_is_left(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    app.broadcasting.max_len = 10
    with sse(base, ["busy"]) as first:
        wait_for(lambda: first.last_id is not None, 10, 0.02, message="the opening id")
        app.broadcasting.publish("busy", "tick", {"n": 0})
        first.wait_events(1)
        last = first.events[-1].id
    for n in range(1, 501):
        app.broadcasting.publish("busy", "tick", {"n": n})
    kept = [orjson_loads(f[b"d"])["n"] for _, f in entries(app, "busy")]
    assert kept[-1] == 500 and kept[0] > 1  # trimmed
    with sse(base, ["busy"], last_event_id=last) as again:
        again.wait_events(1 + len(kept))
        assert again.events[0].event == "tidings.gap"
        assert again.events[0].data == {"channel": "busy"}
        assert [e.data["data"]["n"] for e in again.events[1:]] == kept
    with sse(base, ["busy"], last_event_id=again.events[-1].id) as current:
        app.broadcasting.publish("busy", "tick", {"n": 501})
        current.wait_events(1)
        assert [e.event for e in current.events] == ["tick"]  # no gap when nothing was lost


def test_no_gap_when_the_last_message_trimmed_was_the_browsers_own(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    """The browser's last message is exactly the newest one trimmed: nothing it has not
    seen is gone, so no tidings.gap; one message older than that, and it is told."""
    _, base = start_server(spawn_proc, redis_url, prefix, BC_HEARTBEAT_S="1")
    app.broadcasting.max_len = 10
    sent = [app.broadcasting.publish("edge", "tick", {"n": n})[0] for n in range(500)]
    kept = [sid for sid, _ in entries(app, "edge")]
    assert kept[-1] == sent[-1] and kept[0] != sent[0]  # trimmed
    last_trimmed = sent[sent.index(kept[0]) - 1]
    before_that = sent[sent.index(kept[0]) - 2]
    with sse(base, ["edge"], last_event_id=last_trimmed) as exact:
        exact.wait_events(len(kept))
        assert [e.id for e in exact.events] == kept  # no tidings.gap first
        assert all(e.event == "tick" for e in exact.events)
    with sse(base, ["edge"], last_event_id=before_that) as behind:
        behind.wait_events(1 + len(kept))
        assert behind.events[0].event == "tidings.gap"
        assert [e.id for e in behind.events[1:]] == kept


def orjson_loads(raw: bytes) -> Any:
    import orjson

    return orjson.loads(raw)


def _raw_sse(base: str, channel: str, last_id: str | None) -> Any:
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(base)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    extra = f"Last-Event-ID: {last_id}\r\n" if last_id else ""
    sock.sendall(f"GET /?channel={channel} HTTP/1.0\r\nHost: x\r\n{extra}\r\n".encode())
    return sock


def _read_all(sock: Any) -> list[tuple[str | None, int | None]]:
    """(id, n) of every block until the server closes."""
    buf = b""
    while chunk := sock.recv(65536):
        buf += chunk
    sock.close()
    out: list[tuple[str | None, int | None]] = []
    for block in buf.split(b"\r\n\r\n", 1)[1].split(b"\n\n"):
        fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"data" in fields:
            out.append((fields[b"id"].decode(), orjson_loads(fields[b"data"])["data"]["n"]))
        elif b"id" in fields:
            out.append((fields[b"id"].decode(), None))
    return out


def test_a_browser_too_slow_is_closed_and_replays_losing_nothing(
    app: App, redis_url: str, prefix: str, spawn_proc: Spawn
) -> None:
    """A client that stops reading falls ``client_buffer`` messages behind: its connection
    is closed (memory stays bounded) and, reconnecting with its last id, it gets the rest,
    each message once."""
    _, base = start_server(spawn_proc, redis_url, prefix, BC_CLIENT_BUFFER="20",
                           BC_HEARTBEAT_S="60")  # fmt: skip
    app.broadcasting.max_len = 10_000
    slow = _raw_sse(base, "firehose", None)
    wait_for(lambda: any(c.get("cmd") == "xread" for c in app.queue_for(None).client.client_list()),
             20, 0.05, message="the reader")  # fmt: skip
    time.sleep(0.5)
    pad = "x" * 20_000
    total = 300
    for n in range(total):
        app.broadcasting.publish("firehose", "big", {"n": n, "pad": pad})
    first = _read_all(slow)  # returns: the server closed the connection
    got = [n for _, n in first if n is not None]
    assert 0 < len(got) < total, "the slow browser should have been cut off"
    last_id = first[-1][0]
    again = _read_all_after(base, last_id, total - len(got), app)
    assert got + again == list(range(total))


def _read_all_after(base: str, last_id: str | None, expected: int, app: App) -> list[int]:
    out: list[int] = []
    with sse(base, ["firehose"], last_event_id=last_id) as reader:
        reader.wait_events(expected, 60)
        time.sleep(0.3)
        out = [e.data["data"]["n"] for e in reader.events]
    return out


def test_the_gap_check_reads_streams_written_before_entries_named_their_predecessor(
    app: App,
) -> None:
    """Entries without ``p`` (written by the first publish script) fall back to XINFO's
    counters: a position trimmed away is a gap, one still in the stream is not."""
    from tidings.broadcasting.hub import Hub

    rq = app.queue_for(None)
    key = broadcast_stream_key(app.settings.prefix, "legacy")
    sent = [
        rq.client.xadd(key, {"e": "tick", "d": "1"}, maxlen=10, approximate=True).decode()
        for _ in range(300)
    ]
    kept = [sid for sid, _ in entries(app, "legacy")]
    assert kept[0] != sent[0]
    hub = Hub(rq.url, rq.prefix)

    async def check() -> tuple[bool, bool, bool]:
        try:
            return (
                await hub.trimmed_after("legacy", sent[0]),
                await hub.trimmed_after("legacy", kept[0]),
                await hub.trimmed_after("nothing-here", sent[0]),
            )
        finally:
            await hub.close()

    assert asyncio.run(check()) == (True, False, False)
