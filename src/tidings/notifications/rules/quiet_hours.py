"""Quiet hours: no interruptive notification (SMS, broadcast) in the recipient's night.

The notifiable says where and when::

    class User(Notifiable):
        timezone = "Europe/Berlin"           # or notification_timezone(); default UTC
        quiet_hours = ("22:00", "07:00")     # or a method; None: no quiet hours

A notification's ``interruptive`` channels (default ``{"sms", "broadcast"}``; set it to
add ``"mail"`` or to empty it for a one-time code that must never wait) are queued with
a delay that ends when the window ends, in the notifiable's zone. The end is computed
with :mod:`zoneinfo` on the calendar date it falls on, so a window across a DST change
lasts its real length (22:00-07:00 on the night clocks spring forward is 8 hours, not 9).
A window end that does not exist that day (inside the spring-forward gap) is read with
the offset before the change (02:30 becomes 03:30 new time).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from tidings.errors import ConfigurationError

__all__ = ["DEFAULT_INTERRUPTIVE", "interruptive_channels", "quiet_until", "window_of", "zone_of"]

#: Channels delayed by quiet hours when a notification does not say otherwise.
DEFAULT_INTERRUPTIVE = frozenset({"sms", "broadcast"})


def _value(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if callable(value):
            value = value()
        if value is not None:
            return value
    return None


def zone_of(notifiable: Any) -> tzinfo:
    """The notifiable's zone: ``notification_timezone`` or ``timezone`` (an IANA name or a
    tzinfo; attribute or method); UTC when it has neither.

    Raises:
        ConfigurationError: an unknown zone name.
    """
    value = _value(notifiable, "notification_timezone", "timezone")
    if value is None:
        return UTC
    if isinstance(value, tzinfo):
        return value
    try:
        return ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"{type(notifiable).__qualname__}.timezone is {str(value)[:64]!r}: not an IANA "
            "time zone (e.g. 'Europe/Berlin')"
        ) from None


def _time(value: Any, which: str, owner: Any) -> time:
    if isinstance(value, time):
        return value
    try:
        return time.fromisoformat(str(value))
    except ValueError:
        raise ConfigurationError(
            f"{type(owner).__qualname__}.quiet_hours {which} is {str(value)[:32]!r}: "
            "give a datetime.time or 'HH:MM'"
        ) from None


def window_of(notifiable: Any) -> tuple[time, time] | None:
    """The notifiable's quiet window ``(start, end)`` in local time, or None.

    Raises:
        ConfigurationError: not a pair of times.
    """
    value = _value(notifiable, "quiet_hours")
    if value is None:
        return None
    try:
        start, end = value
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{type(notifiable).__qualname__}.quiet_hours must be (start, end), "
            "e.g. ('22:00', '07:00')"
        ) from None
    return _time(start, "start", notifiable), _time(end, "end", notifiable)


def interruptive_channels(notification: Any, notifiable: Any) -> frozenset[str]:
    """The channels quiet hours hold for ``notification``: its ``interruptive`` (an
    attribute, or a method taking the notifiable), else :data:`DEFAULT_INTERRUPTIVE`."""
    value = getattr(notification, "interruptive", None)
    if callable(value):
        value = value(notifiable)
    if value is None:
        return DEFAULT_INTERRUPTIVE
    return frozenset([value] if isinstance(value, str) else value)


def _at(day: date, when: time, zone: tzinfo) -> datetime:
    # fold=0: an ambiguous time is its first occurrence, a missing one (the spring gap)
    # is read with the offset before the change.
    return datetime.combine(day, when, tzinfo=zone).astimezone(UTC)


def quiet_until(notifiable: Any, now: datetime | None = None) -> datetime | None:
    """When the notifiable's quiet window ends (UTC), if ``now`` is inside it; else None.

    Args:
        notifiable: has ``quiet_hours`` and a zone (see the module docstring).
        now: an aware time (default: now).
    """
    window = window_of(notifiable)
    if window is None:
        return None
    start, end = window
    if start == end:
        return None
    zone = zone_of(notifiable)
    current = (now or datetime.now(UTC)).astimezone(zone)
    today, clock = current.date(), current.time().replace(tzinfo=None)
    if start < end:  # a window within one day (13:00-14:00)
        inside, end_day = start <= clock < end, today
    elif clock >= start:  # overnight, before midnight
        inside, end_day = True, today + timedelta(days=1)
    else:  # overnight, after midnight
        inside, end_day = clock < end, today
    if not inside:
        return None
    until = _at(end_day, end, zone)
    return until if until > current else None
