"""``redis+sentinel://`` URLs (tidings.redis.clients.parse_sentinel_url); the failover
itself is tested in tests/faults/test_failover.py."""

from __future__ import annotations

import pytest

from tidings.errors import ConfigurationError
from tidings.redis.clients import parse_sentinel_url


def test_other_schemes_are_not_sentinel() -> None:
    assert parse_sentinel_url("redis://127.0.0.1:6379/0") is None
    assert parse_sentinel_url("redis+cluster://127.0.0.1:7000") is None


def test_hosts_service_db_and_credentials() -> None:
    s = parse_sentinel_url(
        "redis+sentinel://app:p%40ss@10.0.0.1:26379,10.0.0.2,[::1]:26380/mymaster/2"
        "?sentinel_password=sp"
    )
    assert s is not None
    assert s.sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380)]
    assert (s.service, s.db) == ("mymaster", 2)
    assert s.primary == {"username": "app", "password": "p@ss"}
    assert s.sentinel == {"password": "sp"}


def test_defaults() -> None:
    s = parse_sentinel_url("redis+sentinel://127.0.0.1:26379/svc")
    assert s is not None and s.db == 0 and s.primary == {} and s.sentinel == {}


@pytest.mark.parametrize(
    "url", ["redis+sentinel://127.0.0.1:26379", "redis+sentinel:///svc", "redis+sentinel://"]
)
def test_incomplete_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_sentinel_url(url)


@pytest.mark.parametrize("value", ["-1", "1.5", "two"])
def test_wait_replicas_must_be_a_whole_number(value: str) -> None:
    from tidings.config import Settings

    env = {"TIDINGS_REDIS_URL": "redis://127.0.0.1:1", "TIDINGS_KEY": "k" * 32}
    with pytest.raises(ConfigurationError, match=r"wait_replicas|TIDINGS_WAIT_REPLICAS"):
        Settings.resolve({}, {**env, "TIDINGS_WAIT_REPLICAS": value})


def test_wait_replicas_from_the_environment_and_keywords() -> None:
    from tidings.config import Settings

    env = {"TIDINGS_REDIS_URL": "redis://127.0.0.1:1", "TIDINGS_KEY": "k" * 32}
    s = Settings.resolve({}, {**env, "TIDINGS_WAIT_REPLICAS": "2"})
    assert (s.wait_replicas, s.wait_replicas_timeout) == (2, 0.1)
    s = Settings.resolve({"wait_replicas": 1, "wait_replicas_timeout": 0.5}, env)
    assert (s.wait_replicas, s.wait_replicas_timeout) == (1, 0.5)
    with pytest.raises(ConfigurationError, match="TIDINGS_WAIT_REPLICAS_TIMEOUT"):
        Settings.resolve({}, {**env, "TIDINGS_WAIT_REPLICAS_TIMEOUT": "0"})
