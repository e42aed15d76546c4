"""The worker's checks of its Redis (tidings.worker.health), in-process and end to end.

Rows: F8 (persistence off is a WARNING), F12 (maxmemory-policy other than noeviction is a
WARNING), Redis older than 6.2 is refused (exit 78), a data reset is logged, a server that
refuses CONFIG (ACL) degrades quietly, and a worker started before Redis waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.conftest import Rig, exited, figure
from tests.faults.fault_app import Record
from tests.support import RedisServer, free_port, wait_for
from tidings.errors import ConfigurationError
from tidings.redis.clients import async_client
from tidings.worker.health import Findings, ServerWatch, epoch_key, parse_version
from tidings.worker.worker import EXIT_CONFIG

pytestmark = pytest.mark.timeout(60)


def _startup(url: str, prefix: str) -> Findings:
    async def main() -> Findings:
        client = async_client(url)
        try:
            return await ServerWatch(client, prefix).startup()
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_parse_version() -> None:
    assert parse_version("7.0.15") == (7, 0, 15)
    assert parse_version("6.2.14") >= (6, 2)
    assert parse_version("6.0.9") < (6, 2)
    assert parse_version("255.255.255") == (255, 255, 255)
    assert parse_version("7.2.4-rc1") == (7, 2, 4)


@pytest.mark.parametrize(
    ("kwargs", "extra", "warned"),
    [
        ({"appendonly": True}, [], []),
        ({"appendonly": False}, ["--save", "900 1"], []),  # RDB only: persistent
        ({"appendonly": False}, [], ["persistence is off"]),
        (
            {"appendonly": True},
            ["--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru"],
            ["maxmemory-policy is 'allkeys-lru'"],
        ),
    ],
    ids=["aof", "rdb", "no-persistence", "allkeys-lru"],
)
def test_startup_findings(
    redis_server_factory: Callable[..., RedisServer],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    kwargs: dict[str, object],
    extra: list[str],
    warned: list[str],
) -> None:
    # RedisServer always passes --save ""; a later --save wins.
    server = redis_server_factory(**kwargs, extra_args=extra)
    with caplog.at_level(logging.WARNING, logger="tidings.health"):
        found = _startup(server.url, prefix)
    assert found.version and found.run_id
    assert len(found.warnings) == len(warned)
    for text, expected in zip(found.warnings, warned, strict=True):
        assert expected in text
        assert text in caplog.text
    assert server.client().get(epoch_key(prefix)) is not None


def test_data_reset_is_detected_and_logged(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> list[bool]:
        client = async_client(redis_server.url)
        try:
            watch = ServerWatch(client, prefix)
            await watch.startup()
            seen = [await watch.tick()]
            await client.flushdb()  # what a restart without persistence looks like
            seen.append(await watch.tick())
            seen.append(await watch.tick())  # re-armed: once per reset
            return seen
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="tidings.health"):
        assert asyncio.run(main()) == [False, True, False]
    assert caplog.text.count("Redis data reset") == 1


def test_a_server_refusing_config_and_info_degrades_quietly(
    redis_server: RedisServer, prefix: str
) -> None:
    admin = redis_server.client()
    admin.acl_setuser(
        "limited",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        commands=["+@all", "-config", "-info"],
    )
    url = f"redis://limited:pw@{redis_server.host}:{redis_server.port}/0"
    found = _startup(url, prefix)
    assert (found.version, found.maxmemory_policy, found.persistence) == ("", None, None)
    assert found.warnings == []


def test_worker_started_before_redis_waits_for_it(
    tmp_path: Path, make_rig: Callable[..., Rig]
) -> None:
    server = RedisServer(tmp_path / "late", appendonly=True)
    try:
        rig = make_rig(server.url)
        w = rig.worker(name="early")
        wait_for(lambda: "redis unavailable at start-up" in w.output(), 15, message="waiting")
        server.start()
        t0 = time.monotonic()
        Record("late").dispatch()
        rig.wait_executed(["late"], 15)
        figure(f"worker started before Redis ran a job {time.monotonic() - t0:.2f}s after it")
        assert w.alive()
    finally:
        server.close()


# -- a Redis older than 6.2 ---------------------------------------------------------------


class OldRedis:
    """A RESP stub on loopback that claims to be Redis 6.0.9 (answers INFO, OK to the rest)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.commands: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", self.port))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while True:
                head = f.readline()
                if not head.startswith(b"*"):
                    return
                args = []
                for _ in range(int(head[1:])):
                    size = int(f.readline()[1:])
                    args.append(f.read(size + 2)[:-2].decode())
                self.commands.append(" ".join(args))
                if args[0].upper() == "INFO":
                    body = b"# Server\r\nredis_version:6.0.9\r\nrun_id:0123abcd\r\n"
                    conn.sendall(b"$%d\r\n%s\r\n" % (len(body), body))
                else:
                    conn.sendall(b"+OK\r\n")
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()


@pytest.fixture
def old_redis() -> Iterator[OldRedis]:
    stub = OldRedis()
    try:
        yield stub
    finally:
        stub.close()


def test_redis_older_than_6_2_is_refused(old_redis: OldRedis, prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=r"6\.0\.9 is too old"):
        _startup(f"redis://127.0.0.1:{old_redis.port}/0", prefix)


def test_worker_on_redis_older_than_6_2_exits_78(
    old_redis: OldRedis, make_rig: Callable[..., Rig]
) -> None:
    rig = make_rig(f"redis://127.0.0.1:{old_redis.port}/0")
    w = rig.worker(name="old")
    code = exited(w, 20)
    figure(f"worker on Redis 6.0.9 exited {code}: {w.tail(1)}")
    assert code == EXIT_CONFIG
    assert "refusing to start: Redis 6.0.9 is too old" in w.output()
    assert not any(c.upper().startswith(("EVAL", "BLPOP")) for c in old_redis.commands)


def test_supervisor_stops_when_a_worker_refuses_its_configuration(
    old_redis: OldRedis, make_rig: Callable[..., Rig]
) -> None:
    """Exit 78 means "restarting cannot help": the supervisor stops and passes it on."""
    rig = make_rig(f"redis://127.0.0.1:{old_redis.port}/0")
    sup = rig.worker("--processes", "2", name="supervised-old")
    code = exited(sup, 30)
    assert code == EXIT_CONFIG
    assert "refused to start (exit 78); stopping" in sup.output()
