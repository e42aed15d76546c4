"""redis-py clients built from a URL, with timeouts that suit a job queue.

``redis://``, ``rediss://`` and ``unix://`` URLs go to ``redis.Redis``;
``redis+cluster://host:port`` to ``RedisCluster``;
``redis+sentinel://[user:pass@]host:26379[,host2:26379...]/SERVICE[/DB]`` to the primary
that Redis Sentinel names for ``SERVICE`` (``?sentinel_password=`` authenticates to the
sentinels). Sentinel clients follow a failover (see :class:`FollowingPool`).
Blocking clients get a socket
timeout above their block time: redis-py 8 defaults it to 5 s, and a blocking pop near
that limit ends in ``TimeoutError`` after retries, leaving an idle worker deaf.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from tidings.errors import ConfigurationError

CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 10.0
FOLLOW_EVERY_S = 1.0
"""How often a Sentinel client asks the sentinels which server is the primary."""
FOLLOW_BACKOFF_S = 5.0
"""... and how long it waits after the sentinels could not say."""


def _options(socket_timeout_s: float | None, *, is_async: bool = False) -> dict[str, Any]:
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": socket_timeout_s,
        # One immediate retry re-opens a pooled connection a restart has closed; more would
        # only delay QueueUnavailable while Redis is really gone. An asyncio client needs
        # the asyncio Retry: given the sync one, its retries silently never happen.
        "retry": AsyncRetry(NoBackoff(), 1) if is_async else Retry(NoBackoff(), 1),
        "health_check_interval": 30,
    }


class _AsyncCluster(AsyncRedisCluster):
    """redis-py's asyncio RedisCluster, (re)loading its slot map before a command.

    Commands started together on a client that has no slot map yet (its first use, or
    after a connection error marked the map stale) cut each other's connections in
    redis-py 8 ("Connection closed by server"): a user's jobs on a fresh worker failed
    that way. Waiting for the map first, under the client's own lock, avoids it.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


class _Follow:
    """When a Sentinel pool asks the sentinels for the primary again.

    redis-py asks only when it opens a connection, and after ``SENTINEL FAILOVER`` the
    old primary is demoted seconds after its replica is promoted (10-11 s measured with
    Redis 7): until then it answers the connections clients already hold and takes
    writes that it drops when it resynchronises. So tidings' Sentinel pools ask at
    most every :data:`FOLLOW_EVERY_S` when a connection is checked out (one state per
    process for a service and its sentinels, shared by all its pools: see
    :func:`_follow_for`); a new answer makes redis-py drop that pool's idle connections,
    and a connection checked out from any pool still pointing at the old primary is
    closed before use (it reconnects to the new one).
    That narrows the exposure to the seconds the sentinels take to name the new primary
    (docs/guarantees.md, Topologies).
    """

    __slots__ = ("address", "due")

    def __init__(self) -> None:
        self.due = 0.0
        self.address: tuple[str, int] | None = None
        """The primary the sentinels named last, for every pool of the process."""

    def now(self) -> bool:
        """Whether it is time to ask (and, if so, not again for a while)."""
        t = time.monotonic()
        if t < self.due:
            return False
        self.due = t + FOLLOW_EVERY_S
        return True

    def failed(self) -> None:
        self.due = time.monotonic() + FOLLOW_BACKOFF_S

    def learned(self, address: Any) -> None:
        self.address = (str(address[0]), int(address[1]))


_FOLLOWS: dict[tuple[object, ...], _Follow] = {}
_FOLLOWS_LOCK = threading.Lock()


def _follow_for(pool: Any) -> _Follow:
    """The follow state shared by every pool of this process for one service on one set
    of sentinels: a worker's pools (commands, blocking waits) and a producer's then
    leave an old primary together, and the sentinels are asked once a second per
    process, not per pool."""
    sentinels = tuple(
        (
            c.connection_pool.connection_kwargs.get("host"),
            c.connection_pool.connection_kwargs.get("port"),
        )
        for c in pool.sentinel_manager.sentinels
    )
    key = (pool.service_name, sentinels)
    with _FOLLOWS_LOCK:
        follow = _FOLLOWS.get(key)
        if follow is None:
            follow = _FOLLOWS[key] = _Follow()
        return follow


def _points_elsewhere(pool: Any, follow: _Follow, conn: Any, connected: bool) -> bool:
    address = follow.address or pool.master_address
    return bool(connected and address is not None and (conn.host, conn.port) != tuple(address))


class FollowingPool(redis.sentinel.SentinelConnectionPool):
    """redis-py's Sentinel pool, following a failover promptly (see :class:`_Follow`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._follow = _follow_for(self)

    def follow(self) -> None:
        """Ask the sentinels for the primary, if it is time."""
        if self._follow.now():
            try:
                # A new answer makes redis-py disconnect the idle connections.
                self._follow.learned(self.get_master_address())  # type: ignore[no-untyped-call]
            except (redis.RedisError, OSError):
                self._follow.failed()  # a real outage shows on the next command

    def stale(self, conn: Any) -> bool:
        """Whether ``conn`` is connected to a server that is no longer the primary."""
        connected = getattr(conn, "_sock", None) is not None
        return _points_elsewhere(self, self._follow, conn, connected)

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.follow()
        conn = super().get_connection(*args, **kwargs)
        if self.stale(conn):
            # Reconnect here: connect() asks the sentinels for the primary, while the
            # lazy reconnect of the next command would go back to the old address.
            try:
                conn.disconnect()  # type: ignore[no-untyped-call]
                conn.connect()  # type: ignore[no-untyped-call]
            except BaseException:
                self.release(conn)
                raise
        return conn


class AsyncFollowingPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """The asyncio twin of :class:`FollowingPool`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._follow = _follow_for(self)

    async def follow(self) -> None:
        """Ask the sentinels for the primary, if it is time."""
        if self._follow.now():
            try:
                self._follow.learned(await self.get_master_address())  # type: ignore[no-untyped-call]
            except (redis.RedisError, OSError):
                self._follow.failed()

    def stale(self, conn: Any) -> bool:
        """Whether ``conn`` is connected to a server that is no longer the primary."""
        connected = bool(getattr(conn, "is_connected", False))
        return _points_elsewhere(self, self._follow, conn, connected)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        await self.follow()
        conn = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self.stale(conn):
            try:
                await conn.disconnect()
                await conn.connect()  # (as above)
            except BaseException:
                await self.release(conn)
                raise
        return conn


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return _cluster_url(url) is not None


def _cluster_url(url: str) -> str | None:
    if url.startswith("redis+cluster://"):
        return "redis://" + url[len("redis+cluster://") :]
    if url.startswith("rediss+cluster://"):
        return "rediss://" + url[len("rediss+cluster://") :]
    return None


@dataclass(slots=True)
class SentinelUrl:
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    primary: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for connections to the primary (username, password)."""
    sentinel: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for connections to the sentinels."""


def parse_sentinel_url(url: str) -> SentinelUrl | None:
    """Parse ``redis+sentinel://...`` (None for any other scheme).

    Raises:
        ConfigurationError: no sentinel address or no service name.
    """
    if not url.startswith("redis+sentinel://"):
        return None
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            host, port = item, "26379"
        sentinels.append((host.strip("[]"), int(port)))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not sentinels or not path:
        raise ConfigurationError(
            "a sentinel URL is redis+sentinel://[user:pass@]host:port[,host:port...]/SERVICE[/DB]"
        )
    out = SentinelUrl(sentinels, path[0], int(path[1]) if len(path) > 1 else 0)
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            out.primary["username"] = unquote(user)
        if password:
            out.primary["password"] = unquote(password)
    query = {k: v[0] for k, v in parse_qs(parts.query).items() if v}
    for name in ("username", "password"):
        if f"sentinel_{name}" in query:
            out.sentinel[name] = query[f"sentinel_{name}"]
    return out


def _sentinel_kwargs(s: SentinelUrl, opts: dict[str, Any]) -> dict[str, Any]:
    sentinel_opts = {k: v for k, v in opts.items() if k != "health_check_interval"}
    return {**sentinel_opts, "socket_timeout": CONNECT_TIMEOUT_S, **s.sentinel}


def sync_client(url: str, *, socket_timeout_s: float | None = SOCKET_TIMEOUT_S) -> redis.Redis:
    """A sync client for ``url``."""
    sentinel = parse_sentinel_url(url)
    if sentinel is not None:
        opts = _options(socket_timeout_s)
        sentinels: Any = redis.sentinel.Sentinel  # untyped in redis-py
        primary: redis.Redis = sentinels(
            sentinel.sentinels, sentinel_kwargs=_sentinel_kwargs(sentinel, opts)
        ).master_for(
            sentinel.service,
            connection_pool_class=FollowingPool,
            db=sentinel.db,
            **opts,
            **sentinel.primary,
        )
        return primary
    cluster = _cluster_url(url)
    if cluster is not None:
        return RedisCluster.from_url(cluster, **_options(socket_timeout_s))  # type: ignore[return-value]
    return redis.Redis.from_url(url, **_options(socket_timeout_s))


def async_client(
    url: str, *, socket_timeout_s: float | None = SOCKET_TIMEOUT_S
) -> redis.asyncio.Redis:
    """An asyncio client for ``url``."""
    sentinel = parse_sentinel_url(url)
    if sentinel is not None:
        opts = _options(socket_timeout_s, is_async=True)
        sentinels: Any = redis.asyncio.sentinel.Sentinel  # untyped in redis-py
        primary: redis.asyncio.Redis = sentinels(
            sentinel.sentinels, sentinel_kwargs=_sentinel_kwargs(sentinel, opts)
        ).master_for(
            sentinel.service,
            connection_pool_class=AsyncFollowingPool,
            db=sentinel.db,
            **opts,
            **sentinel.primary,
        )
        return primary
    cluster = _cluster_url(url)
    if cluster is not None:
        return _AsyncCluster.from_url(  # type: ignore[return-value]
            cluster, **_options(socket_timeout_s, is_async=True)
        )
    return redis.asyncio.Redis.from_url(url, **_options(socket_timeout_s, is_async=True))


async def async_pubsub(client: Any) -> Any | None:
    """A pub/sub of the asyncio ``client`` (ignoring subscribe confirmations), or None
    when it has none (the asyncio ``RedisCluster`` of older redis-py releases).

    redis-py's asyncio cluster pub/sub looks the channel's slot up in the client's slot
    map without loading it first: on a client that has not run a command yet it fails
    with ``KeyError`` on its first ``SUBSCRIBE``. The map is loaded here first.
    """
    if not hasattr(client, "pubsub"):
        return None
    if isinstance(client, AsyncRedisCluster) and client._initialize:
        await client.initialize()
    return client.pubsub(ignore_subscribe_messages=True)
