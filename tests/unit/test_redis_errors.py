"""Which Redis errors are transient (tidings.redis.errors), on every topology."""

from __future__ import annotations

import pytest
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    CrossSlotTransactionError,
    DataError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

from tidings.errors import QueueUnavailable
from tidings.moves.queues import unavailable_guard
from tidings.redis.errors import REDIS_ERRORS, is_transient, is_wrong_type


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionError("refused"),
        TimeoutError("timed out"),
        OSError("reset"),
        BusyLoadingError("loading"),
        OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        ReadOnlyError("You can't write against a read only replica."),
        ClusterDownError("The cluster is down"),  # redis-py strips the CLUSTERDOWN code
        MasterDownError("Link with MASTER is down"),
        MovedError("3999 127.0.0.1:7002"),
        AskError("3999 127.0.0.1:7002"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        ClusterError("TTL exhausted."),
        SlotNotCoveredError("Slot 42 not covered by the cluster."),
        RedisClusterException("Redis Cluster cannot be connected."),
        ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"),
        ResponseError("NOREPLICAS Not enough good replicas to write."),
        ResponseError("BUSY Redis is busy running a script."),
        ResponseError("LOADING Redis is loading the dataset in memory"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)
    assert isinstance(exc, (*REDIS_ERRORS, ResponseError))  # what the worker's loops catch


@pytest.mark.parametrize(
    "exc",
    [
        ClusterCrossSlotError("Keys in request don't hash to the same slot"),
        CrossSlotTransactionError("cross slot"),
        RedisClusterException("BLPOP - all keys must map to the same key slot"),
        NoPermissionError("no permissions"),
        NoScriptError("No matching script"),
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ResponseError("ERR Error running script"),
        DataError("bad value"),
    ],
    ids=lambda e: type(e).__name__ + str(e)[:8],
)
def test_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [ClusterDownError("The cluster is down"), MovedError("1 127.0.0.1:1"), SlotNotCoveredError()],
)
def test_producers_see_only_queue_unavailable(exc: BaseException) -> None:
    with pytest.raises(QueueUnavailable) as info, unavailable_guard("push to 'default'"):
        raise exc
    assert "push to 'default'" in str(info.value)


def test_permanent_errors_pass_through_the_guard() -> None:
    with pytest.raises(ClusterCrossSlotError), unavailable_guard("push"):
        raise ClusterCrossSlotError("Keys in request don't hash to the same slot")


def test_wrong_type_is_recognised_alone_and_inside_a_pipeline_error() -> None:
    text = "WRONGTYPE Operation against a key holding the wrong kind of value"
    assert is_wrong_type(ResponseError(text))
    in_pipeline = f"Command # 1 (ZSCORE k x) of pipeline caused error: {text}"
    assert is_wrong_type(ResponseError(in_pipeline))
    assert not is_wrong_type(ResponseError("ERR unknown command"))
    assert not is_wrong_type(ResponseError("ERR value is not WRONGTYPE"))
    assert not is_wrong_type(ConnectionError(text))
