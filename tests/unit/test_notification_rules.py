"""Delivery rules without I/O: quiet hours across DST (zoneinfo), digest/once_per settings,
and ``fake_notifications`` asserting what was skipped, digested and delayed.

The App points at a Redis that is not there: the fakes keep throttle marks and digest
windows in memory, and preferences come from a callback (no database).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any, ClassVar

import pytest

from tidings import App, ShouldQueue
from tidings.errors import ConfigurationError
from tidings.notifications import MailMessage, Notifiable, Notification, SmsMessage
from tidings.notifications.rules.digests import digest_window_s
from tidings.notifications.rules.quiet_hours import quiet_until, window_of, zone_of
from tidings.testing import fake_notifications

KEY = "x" * 32


@pytest.fixture(autouse=True)
def no_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a unit test tried to connect: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def app() -> Iterator[App]:
    a = App(env=False, redis_url="redis://127.0.0.1:1", key=KEY, allowed_modules="tests")
    yield a
    a.close()


@dataclass
class Person(Notifiable):
    id: int
    email: str = "p@example.org"
    phone: str = "+15551234567"
    timezone: str | None = None
    quiet_hours: tuple[Any, Any] | None = None


@dataclass
class Alert(Notification, ShouldQueue):
    text: str = "hi"

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject(self.text)

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage(self.text)


class Security(Alert):
    mandatory: ClassVar[bool] = True


class Hourly(Alert):
    once_per: ClassVar[Any] = timedelta(hours=1)

    def once_per_key(self, notifiable: Any) -> str:
        return self.text


class Digested(Alert):
    digest: ClassVar[Any] = {"mail": timedelta(minutes=10)}


class Urgent(Alert):
    interruptive: ClassVar[Any] = frozenset()


def berlin(day: int, month: int, hour: int, minute: int = 0) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime(2026, month, day, hour, minute, tzinfo=ZoneInfo("Europe/Berlin"))


# -- quiet hours ------------------------------------------------------------------------------


def test_quiet_window_across_spring_forward_lasts_its_real_length() -> None:
    p = Person(1, timezone="Europe/Berlin", quiet_hours=("22:00", "07:00"))
    # 29 March 2026: 02:00 CET -> 03:00 CEST. 23:00 CET (22:00 UTC) to 07:00 CEST (05:00 UTC).
    now = berlin(28, 3, 23)
    until = quiet_until(p, now)
    assert until == datetime(2026, 3, 29, 5, 0, tzinfo=UTC)
    assert until - now.astimezone(UTC) == timedelta(hours=7)  # not 8: the night is shorter


def test_quiet_window_across_fall_back_lasts_its_real_length() -> None:
    p = Person(1, timezone="Europe/Berlin", quiet_hours=(time(22), time(7)))
    # 25 October 2026: 03:00 CEST -> 02:00 CET. 23:00 CEST (21:00 UTC) to 07:00 CET (06:00 UTC).
    now = berlin(24, 10, 23)
    until = quiet_until(p, now)
    assert until == datetime(2026, 10, 25, 6, 0, tzinfo=UTC)
    assert until - now.astimezone(UTC) == timedelta(hours=9)


def test_after_midnight_inside_and_outside_and_same_day_windows() -> None:
    p = Person(1, timezone="America/New_York", quiet_hours=("22:00", "07:00"))
    inside = datetime(2026, 6, 10, 8, 30, tzinfo=UTC)  # 04:30 EDT
    assert quiet_until(p, inside) == datetime(2026, 6, 10, 11, 0, tzinfo=UTC)
    outside = datetime(2026, 6, 10, 15, 0, tzinfo=UTC)  # 11:00 EDT
    assert quiet_until(p, outside) is None
    lunch = Person(2, timezone="Asia/Tokyo", quiet_hours=("12:00", "13:00"))
    at = datetime(2026, 6, 10, 3, 15, tzinfo=UTC)  # 12:15 JST
    assert quiet_until(lunch, at) == datetime(2026, 6, 10, 4, 0, tzinfo=UTC)
    assert quiet_until(Person(3), at) is None  # no quiet hours
    assert quiet_until(Person(4, quiet_hours=("04:00", "05:00")), at) is None  # no zone: UTC
    assert quiet_until(Person(4, quiet_hours=("03:00", "05:00")), at) == at.replace(
        hour=5, minute=0
    )


def test_bad_zone_and_window_name_the_attribute() -> None:
    with pytest.raises(ConfigurationError, match=r"Person.timezone .*IANA"):
        zone_of(Person(1, timezone="Mars/Olympus"))
    with pytest.raises(ConfigurationError, match=r"Person.quiet_hours start .*HH:MM"):
        window_of(Person(1, quiet_hours=("late", "07:00")))
    with pytest.raises(ConfigurationError, match=r"quiet_hours must be \(start, end\)"):
        window_of(Person(1, quiet_hours="22:00"))  # type: ignore[arg-type]


def test_digest_and_once_per_settings_are_checked() -> None:
    assert digest_window_s(Digested(), "mail") == 600.0
    assert digest_window_s(Digested(), "sms") is None

    class Bad(Alert):
        digest: ClassVar[Any] = "soon"

    with pytest.raises(ConfigurationError, match=r"Bad.digest must be a timedelta"):
        digest_window_s(Bad(), "mail")

    class Slacky(Alert):
        digest: ClassVar[Any] = timedelta(seconds=5)

    with pytest.raises(ConfigurationError, match=r"no to_slack_digest"):
        digest_window_s(Slacky(), "slack")


# -- fakes --------------------------------------------------------------------------------


def test_fake_records_opt_outs_and_mandatory_ignores_them(app: App) -> None:
    app.notifications.preferences.use(lambda n, x, ch: ch != "sms")
    ann = Person(1)
    with fake_notifications(app) as fake:
        ann.notify(Alert())
        ann.notify(Security())
    fake.assert_skipped(ann, Alert, "sms", reason="opted_out")
    fake.assert_sent_to(ann, Alert, lambda n, channels: channels == ["mail"])
    fake.assert_sent_to(ann, Security, lambda n, channels: channels == ["mail", "sms"])
    with pytest.raises(AssertionError, match="was not skipped"):
        fake.assert_skipped(ann, Security)


def test_fake_throttles_by_key(app: App) -> None:
    ann = Person(1)
    with fake_notifications(app) as fake:
        ann.notify(Hourly("disk"))
        ann.notify(Hourly("disk"))
        ann.notify(Hourly("cpu"))
    fake.assert_count(2)
    fake.assert_skipped(ann, Hourly, "*", reason="throttled")
    assert len(fake.skipped) == 1


def test_fake_digests_per_window(app: App) -> None:
    ann, bob = Person(1), Person(2)
    with fake_notifications(app) as fake:
        for i in range(3):
            ann.notify(Digested(f"a{i}"))
        bob.notify(Digested("b0"))
    fake.assert_digested(ann, Digested, "mail", count=3)
    fake.assert_digested(bob, Digested, "mail", count=1)
    assert [[n.text for n in w] for w in fake.digest_windows(ann, Digested)] == [["a0", "a1", "a2"]]
    fake.assert_sent_to(ann, Digested, lambda n, channels: channels == ["sms"])
    with pytest.raises(AssertionError, match="3 Digested digested"):
        fake.assert_digested(ann, Digested, count=2)


def test_fake_delays_interruptive_channels_in_quiet_hours(app: App) -> None:
    night = Person(1, timezone="Europe/Berlin", quiet_hours=("22:00", "07:00"))
    with fake_notifications(app) as fake:
        fake.now = berlin(28, 3, 23)
        night.notify(Alert())
        night.notify(Urgent())
    until = datetime(2026, 3, 29, 5, 0, tzinfo=UTC)
    fake.assert_delayed(night, Alert, "sms", until=until)
    assert [r.channel for r in fake.delayed] == ["sms"]  # mail is not interruptive
    fake.assert_sent_to(night, Alert, lambda n, channels: channels == ["mail", "sms"])
    with pytest.raises(AssertionError, match="Urgent was not delayed"):
        fake.assert_delayed(night, Urgent)
