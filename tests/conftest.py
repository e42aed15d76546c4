"""Shared fixtures: real Redis on loopback, fault proxies, subprocesses, and a network guard.

Fixtures (all independent of tidings, which this file never imports):

    loopback_only         autouse; refuses any connect/sendto/DNS lookup that is not loopback
                          and yields the list of refused attempts (must be empty at teardown
                          unless the test clears it after asserting on it).
    redis_url             session; ``$TIDINGS_TEST_REDIS_URL`` or one private redis-server
                          (no persistence) shared by the whole run. Never the machine's 6379.
                          Tests marked ``topologies`` get it once per topology: plain Redis,
                          ``redis+cluster://`` (a 6-node cluster) and ``redis+sentinel://``
                          (a master, a replica, 3 sentinels); ``--topology=cluster|sentinel|
                          all`` (or $TIDINGS_TEST_TOPOLOGY) runs every other test on that one.
    redis_topology        session; "plain", "cluster" or "sentinel": what ``redis_url`` is.
    redis_cluster         session; the shared ClusterGroup (started on first use).
    redis_sentinel        session; the shared SentinelGroup (started on first use).
    redis_client          a client on ``redis_url`` (``redis.Redis``, ``RedisCluster`` or
                          Sentinel's master client; bytes responses), closed after.
    prefix                a unique key prefix per test; its keys are deleted at teardown.
    redis_server          a private, started RedisServer (AOF, fsync always) to kill/restart.
    redis_server_factory  ``make(**RedisServer kwargs) -> started RedisServer``, all closed after.
    fault_proxy_factory   ``make(host, port) -> started FaultProxy``, all stopped after.
    spawn_proc            ``spawn(args, name=..., env=..., extra_env=..., cwd=...) -> Proc``
                          (new session, output in tmp_path/<name>.log); survivors are
                          SIGKILLed (with their process group) at teardown.
    tmp_cwd               chdir into tmp_path for the test (e.g. the ./.tidings/ default).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from itertools import count
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis

# `tests.support` must be importable however pytest was launched (python -m pytest puts the
# cwd on sys.path; the `pytest` script does not).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support import FaultProxy, Proc, RedisServer, spawn  # noqa: E402
from tests.support.topology import ClusterGroup, SentinelGroup, client_for_url  # noqa: E402

# -- loopback guard ---------------------------------------------------------------------

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _is_loopback_host(host: str) -> bool:
    """True for loopback IP literals (incl. ::ffff:127.x) and the local host's own names."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        name = host.lower().rstrip(".")
        return name in _LOCAL_NAMES or name.endswith(".localhost")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _host_of(address: Any) -> str | None:
    if isinstance(address, tuple) and address and isinstance(address[0], str | bytes):
        host = address[0]
        return host.decode() if isinstance(host, bytes) else host
    return None


class _Guard:
    """Patches socket entry points; refusals raise before the real call and are recorded."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def refuse(self, what: str) -> None:
        self.attempts.append(what)
        raise AssertionError(f"non-loopback connect attempted: {what}")

    def check_sock(self, op: str, sock: socket.socket, address: Any) -> None:
        if sock.family == socket.AF_UNIX:
            return
        host = _host_of(address)
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or host is None:
            self.refuse(f"{op} family={sock.family!r} address={address!r}")
        elif not _is_loopback_host(host):
            self.refuse(f"{op} {address!r}")

    def install(self, mp: pytest.MonkeyPatch) -> None:
        real_connect = socket.socket.connect
        real_connect_ex = socket.socket.connect_ex
        real_sendto = socket.socket.sendto
        real_create_connection = socket.create_connection
        real_getaddrinfo = socket.getaddrinfo
        own_names = {socket.gethostname().lower()}
        guard = self

        def connect(sock: socket.socket, address: Any) -> None:
            guard.check_sock("connect", sock, address)
            return real_connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            guard.check_sock("connect_ex", sock, address)
            return real_connect_ex(sock, address)

        def sendto(sock: socket.socket, data: Any, *args: Any) -> int:
            if args:  # sendto(data, address) or sendto(data, flags, address)
                guard.check_sock("sendto", sock, args[-1])
            return real_sendto(sock, data, *args)

        def create_connection(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
            host = _host_of(address)
            if host is None or not _is_loopback_host(host):
                guard.refuse(f"create_connection {address!r}")
            return real_create_connection(address, *args, **kwargs)

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            # A lookup of a real name may send DNS packets; numeric hosts never do.
            if host not in (None, "", b""):
                name = host.decode() if isinstance(host, bytes) else str(host)
                ok = _is_ip_literal(name) or _is_loopback_host(name) or name.lower() in own_names
                if not ok:
                    guard.refuse(f"getaddrinfo {name!r}")
            return real_getaddrinfo(host, *args, **kwargs)

        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        mp.setattr(socket.socket, "sendto", sendto)
        mp.setattr(socket, "create_connection", create_connection)
        mp.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(autouse=True)
def fresh_blocking_warning() -> None:
    """Every test starts with the once-per-process BlockingDispatchWarning armed, so a
    sync dispatch on a running loop fails the test that makes it (warnings are errors),
    whatever ran before it."""
    import tidings._blocking

    tidings._blocking._warned_blocking = False


@pytest.fixture(autouse=True)
def loopback_only() -> Iterator[list[str]]:
    """Refuse non-loopback network access for the duration of every test.

    ``socket.socket.connect``/``connect_ex``/``sendto``, ``socket.create_connection`` and
    ``socket.getaddrinfo`` (names other than localhost) raise ``AssertionError`` before
    the real call, so no packet leaves; asyncio and redis-py go through these. Refusals
    are recorded in the yielded list. If the list is not empty at teardown the test errors
    (the refusal may have been swallowed by an ``except Exception``); a test provoking
    refusals on purpose asserts on the list and then calls ``.clear()``.
    Subprocesses are not covered.
    """
    guard = _Guard()
    with pytest.MonkeyPatch.context() as mp:
        guard.install(mp)
        yield guard.attempts
    if guard.attempts:
        pytest.fail(f"non-loopback network access was attempted: {guard.attempts}")


# -- redis ------------------------------------------------------------------------------


TOPOLOGIES = ("plain", "cluster", "sentinel")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--topology",
        default=os.environ.get("TIDINGS_TEST_TOPOLOGY", "plain"),
        choices=(*TOPOLOGIES, "all"),
        help="Redis topology for tests using redis_url (tests marked `topologies` run on "
        "all three anyway): plain, cluster, sentinel or all",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "topologies: run on plain Redis, a Redis Cluster and a Sentinel group"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "redis_url" not in metafunc.fixturenames or os.environ.get("TIDINGS_TEST_REDIS_URL"):
        return
    option = metafunc.config.getoption("--topology")
    if option == "all" or metafunc.definition.get_closest_marker("topologies"):
        wanted = list(TOPOLOGIES)
    else:
        wanted = [option]
    if wanted != ["plain"]:
        metafunc.parametrize("redis_topology", wanted, indirect=True, scope="session")


@pytest.fixture(scope="session")
def redis_topology(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "plain"))


@pytest.fixture(scope="session")
def plain_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis-session"), appendonly=False) as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGroup]:
    """A 6-node Redis Cluster (3 masters, 3 replicas) shared by the session."""
    with ClusterGroup(tmp_path_factory.mktemp("redis-cluster"), node_timeout_ms=2000) as c:
        yield c


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A master, a replica and three sentinels shared by the session."""
    with SentinelGroup(tmp_path_factory.mktemp("redis-sentinel")) as group:
        yield group


@pytest.fixture(scope="session")
def redis_url(redis_topology: str, request: pytest.FixtureRequest) -> str:
    """URL of the Redis shared by the session; isolate keys with the ``prefix`` fixture."""
    external = os.environ.get("TIDINGS_TEST_REDIS_URL")
    if external:
        return external
    if redis_topology == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    if redis_topology == "sentinel":
        return str(request.getfixturevalue("redis_sentinel").url)
    return str(request.getfixturevalue("plain_redis_url"))


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client: redis.Redis = client_for_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique key prefix; keys containing it are deleted from ``redis_url`` afterwards.

    Cleanup only happens when the test also uses ``redis_url`` (so unit tests using a
    prefix never open a socket).
    """
    value = f"t{uuid4().hex[:10]}"
    yield value
    if "redis_url" not in request.fixturenames:
        return
    client = client_for_url(request.getfixturevalue("redis_url"))
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{value}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``make(**kwargs)`` starts a RedisServer in its own tmp dir (kwargs as RedisServer)."""
    servers: list[RedisServer] = []
    numbers = count()

    def make(**kwargs: Any) -> RedisServer:
        data_dir = kwargs.pop("data_dir", None) or tmp_path / f"redis-{next(numbers)}"
        server = RedisServer(data_dir, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in reversed(servers):
            try:
                server.close()
            except Exception:
                server.kill()


@pytest.fixture
def redis_server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    """A private redis-server (appendonly yes, appendfsync always) a test may kill/restart."""
    return redis_server_factory(appendonly=True, appendfsync="always")


# -- proxies and processes --------------------------------------------------------------


@pytest.fixture
def fault_proxy_factory() -> Iterator[Callable[[str, int], FaultProxy]]:
    """``make(host, port)`` starts a FaultProxy to host:port; all stopped at teardown."""
    proxies: list[FaultProxy] = []

    def make(host: str, port: int) -> FaultProxy:
        proxy = FaultProxy(host, port)
        proxies.append(proxy)
        proxy.start()
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.stop()


@pytest.fixture
def spawn_proc(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start subprocesses owned by this test; survivors are SIGKILLed at teardown."""
    started: list[Proc] = []
    numbers = count()

    def run(
        args: Sequence[str],
        *,
        name: str | None = None,
        env: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> Proc:
        log_path = tmp_path / f"{name or 'proc'}-{next(numbers)}.log"
        proc = spawn(args, log_path=log_path, env=env, extra_env=extra_env, cwd=cwd)
        started.append(proc)
        return proc

    try:
        yield run
    finally:
        for proc in started:
            if proc.alive():
                proc.kill(group=True)


@pytest.fixture
def tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with tmp_path as the working directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
