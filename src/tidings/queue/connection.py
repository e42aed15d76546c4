"""redis-py clients built from a URL, with timeouts that suit a job queue.

``redis://``, ``rediss://`` and ``unix://`` URLs go to ``redis.Redis``;
``redis+cluster://host:port`` to ``RedisCluster``. Blocking clients get a socket
timeout above their block time: redis-py 8 defaults it to 5 s, and a blocking pop near
that limit ends in ``TimeoutError`` after retries, leaving an idle worker deaf.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 10.0


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


def _cluster_url(url: str) -> str | None:
    if url.startswith("redis+cluster://"):
        return "redis://" + url[len("redis+cluster://") :]
    if url.startswith("rediss+cluster://"):
        return "rediss://" + url[len("rediss+cluster://") :]
    return None


def sync_client(url: str, *, socket_timeout_s: float | None = SOCKET_TIMEOUT_S) -> redis.Redis:
    """A sync client for ``url``."""
    cluster = _cluster_url(url)
    if cluster is not None:
        return RedisCluster.from_url(cluster, **_options(socket_timeout_s))  # type: ignore[return-value]
    return redis.Redis.from_url(url, **_options(socket_timeout_s))


def async_client(
    url: str, *, socket_timeout_s: float | None = SOCKET_TIMEOUT_S
) -> redis.asyncio.Redis:
    """An asyncio client for ``url``."""
    cluster = _cluster_url(url)
    if cluster is not None:
        return AsyncRedisCluster.from_url(  # type: ignore[return-value]
            cluster, **_options(socket_timeout_s, is_async=True)
        )
    return redis.asyncio.Redis.from_url(url, **_options(socket_timeout_s, is_async=True))
