"""Broadcast rules without I/O: channel and event names, private-channel patterns,
Last-Event-ID positions, and the broadcast server's bind check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidings.broadcasting import Broadcasting, check_channel, is_private
from tidings.broadcasting.server import check_bind
from tidings.broadcasting.sse import _positions
from tidings.errors import ConfigurationError, ValidationError


@pytest.mark.parametrize("name", ["orders", "private-orders.42", "App.Models.User.7", "a=b@c,d"])
def test_valid_channel_names(name: str) -> None:
    assert check_channel(name) == name


@pytest.mark.parametrize("name", ["", "has space", "line\n", "x" * 201, "é", None, 5])
def test_invalid_channel_names_are_refused(name: Any) -> None:
    with pytest.raises(ValidationError, match="not a channel name"):
        check_channel(name)


def test_private_channels_follow_the_first_matching_pattern() -> None:
    b = Broadcasting(app=None)

    @b.channel("orders.{order_id}")
    def order(user: Any, order_id: str) -> bool:
        return bool(user == int(order_id))

    @b.channel("private-teams.{team}.{room}")
    async def room(user: Any, team: str, room: str) -> bool:
        return team == "t1" and room == "general"

    def allowed(user: Any, channel: str) -> bool:
        return asyncio.run(b.authorize(user, channel))

    assert is_private("private-orders.1") and not is_private("orders")
    assert allowed(None, "orders")  # public
    assert allowed(1, "private-orders.1") and not allowed(2, "private-orders.1")
    assert not allowed(1, "private-orders.1.extra")  # {param} is one dot-free segment
    assert allowed(9, "private-teams.t1.general") and not allowed(9, "private-teams.t2.general")
    assert not allowed(1, "private-unknown.1")  # no callback: refused


def test_truthy_is_not_true_for_an_authoriser() -> None:
    b = Broadcasting(app=None)
    b.channel("x")(lambda user: "yes")
    assert asyncio.run(b.authorize(1, "private-x")) is False


def test_last_event_id_positions() -> None:
    assert _positions(["a"], "5-0") == {"a": "5-0"}
    assert _positions(["a", "b"], "5-0,7-1") == {"a": "5-0", "b": "7-1"}
    assert _positions(["a", "b"], "5-0") == {"a": "5-0", "b": "5-0"}
    assert _positions(["a", "b"], "1-0,2-0,3-0") is None
    assert _positions(["a"], None) is None


def test_the_server_refuses_other_addresses_with_nothing_guarding_them() -> None:
    check_bind("127.0.0.1", None, False)
    check_bind("::1", None, False)
    check_bind("0.0.0.0", "a-token", False)
    check_bind("0.0.0.0", None, True)
    with pytest.raises(ConfigurationError, match="TIDINGS_BROADCAST_TOKEN"):
        check_bind("0.0.0.0", None, False)
