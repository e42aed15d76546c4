"""The fast lane packs its own RESP commands: byte for byte what redis-py would send."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from tidings.redis.fastpath import _bulk, pack

args = st.lists(
    st.one_of(
        st.binary(max_size=64),
        st.text(max_size=32),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    max_size=8,
)


@given(head=args, tail=args)
def test_pack_is_what_redis_py_packs(head: list[object], tail: list[object]) -> None:
    conn = redis.Connection()
    command = ["EVALSHA", "f" * 40, *head]
    packed = pack(b"".join(_bulk(a) for a in command), len(command), tail)  # type: ignore[arg-type]
    assert packed == b"".join(conn.pack_command(*command, *tail))


def test_bools_are_refused_like_redis_py_does() -> None:
    with pytest.raises(TypeError):
        _bulk(True)
