"""NotificationSender.deliver's direct call of a channel's send (issue 28, goal 4): a
``send`` with or without the delivery id, sync or async, the base ``should_send`` not
called but an override asked, and a channel replaced by ``extend_channel`` after a send.
No Redis: ``notify_now`` sends in this process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tidings import App
from tidings.notifications import Notification

KEY = "deliver-paths-test-key-0123456789abcdef"
SENT: list[tuple[str, Any]] = []


@dataclass
class User:
    id: int

    def route_notification_for(self, channel: str, notification: object) -> str:
        return f"user-{self.id}"


class TwoArgsSync:
    def send(self, notifiable: Any, notification: Any) -> str:
        SENT.append(("two-sync", notifiable.id))
        return "two-sync"


class ThreeArgsAsync:
    async def send(self, notifiable: Any, notification: Any, delivery_id: str) -> str:
        SENT.append(("three-async", len(delivery_id)))
        return "three-async"


class Replacement:
    async def send(self, notifiable: Any, notification: Any) -> str:
        SENT.append(("replacement", notifiable.id))
        return "replacement"


class Hello(Notification):
    def via(self, notifiable: Any) -> list[str]:
        return ["a", "b"]


class Gated(Hello):
    asked: list[str] = []

    def should_send(self, notifiable: Any, channel: str) -> bool:
        self.asked.append(channel)
        return channel == "b"


def app() -> App:
    a = App(env=False, redis_url="redis://127.0.0.1:1", key=KEY)
    a.extend_channel("a", TwoArgsSync)
    a.extend_channel("b", ThreeArgsAsync)
    return a


def test_sends_with_and_without_the_delivery_id_sync_and_async() -> None:
    SENT.clear()
    a = app()
    assert a.notifications.send_now([User(1)], Hello()) == ["two-sync", "three-async"]
    assert SENT == [("two-sync", 1), ("three-async", 32)]


def test_an_overridden_should_send_is_asked_per_channel() -> None:
    SENT.clear()
    Gated.asked = []
    a = app()
    assert a.notifications.send_now([User(2)], Gated()) == [None, "three-async"]
    assert Gated.asked == ["a", "b"]
    assert SENT == [("three-async", 32)]


def test_a_channel_replaced_after_a_send_is_the_one_used() -> None:
    SENT.clear()
    a = app()

    async def twice() -> list[Any]:
        sender = a.notifications
        first = await sender.send_now_async([User(3)], Hello(), ["a"])
        a.extend_channel("a", Replacement)
        return [*first, *(await sender.send_now_async([User(3)], Hello(), ["a"]))]

    assert asyncio.run(twice()) == ["two-sync", "replacement"]
    assert SENT == [("two-sync", 3), ("replacement", 3)]
