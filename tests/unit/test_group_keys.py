"""Fair groups at dispatch (issue 25): the group a job joins and the check of its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tidings import Job, ValidationError
from tidings.events.call_queued import CallQueuedListener
from tidings.events.listener import Listener
from tidings.jobs.groups import check_group, group_of
from tidings.jobs.job import PendingDispatch
from tidings.moves.groups import parse_rate
from tidings.notifications.notification import Notification
from tidings.notifications.queued import SendQueuedNotification


@dataclass
class Plain(Job):
    def handle(self) -> None:
        pass


@dataclass
class Hooked(Job):
    tenant: Any

    def group(self) -> Any:
        return self.tenant


@dataclass
class Signup:
    tenant: str


class OnSignup(Listener):
    def group(self, event: Signup) -> str:
        return f"tenant-{event.tenant}"

    def handle(self, event: Signup) -> None:
        pass


@dataclass
class User:
    tenant: str


class Welcome(Notification):
    def group(self, notifiable: User) -> str:
        return notifiable.tenant


def test_no_group_unless_asked() -> None:
    assert group_of(PendingDispatch(Plain())) is None
    assert group_of(PendingDispatch(Hooked(None))) is None


def test_on_group_wins_over_the_hook() -> None:
    assert group_of(Hooked("hook").on_group("given")) == "given"
    assert group_of(PendingDispatch(Hooked("hook"))) == "hook"


def test_a_listener_hook_gets_the_event_and_a_notification_hook_the_notifiable() -> None:
    job = CallQueuedListener.for_target(OnSignup, (Signup("7"),))
    assert group_of(PendingDispatch(job)) == "tenant-7"
    sent = SendQueuedNotification(User("acme"), Welcome(), "mail", "d1")
    assert group_of(PendingDispatch(sent)) == "acme"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("x" * 257, "257 bytes"),
        ("é" * 129, "258 bytes"),
        ("a\nb", "U+000A"),
        ("a\x1bb", "U+001B"),
        ("a\x85b", "U+0085"),
        (7, "not int"),
    ],
)
def test_bad_keys_are_refused_naming_the_call_or_the_hook(bad: Any, why: str) -> None:
    with pytest.raises(ValidationError, match="on_group"):
        check_group(bad)
    with pytest.raises(ValidationError, match="group hook of Hooked"):
        group_of(PendingDispatch(Hooked(bad)))
    assert check_group("k" * 256) == "k" * 256


def test_rates() -> None:
    assert parse_rate("100/min") == pytest.approx(100 / 60)
    assert parse_rate("5/s") == 5 and parse_rate("10/hours") == pytest.approx(10 / 3600)
    assert parse_rate(2.5) == 2.5
    for bad in ("fast", "0/min", "5/week", -1, True):
        with pytest.raises(ValidationError, match="rate"):
            parse_rate(bad)
