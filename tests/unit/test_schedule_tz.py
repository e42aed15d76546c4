"""Cron: ``tz=`` evaluates on a zone's wall clock, DST-correct, and
the six-field form has its seconds last, as the docs now say."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest

from tidings import Job
from tidings.workflows.schedule import Schedule, make_schedule

UTC = dt.UTC


@dataclass
class Report(Job):
    kind: str = "daily"

    def handle(self) -> None:
        pass


def _utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()


def _local(ts: list[float], zone: str) -> list[str]:
    z = ZoneInfo(zone)
    return [dt.datetime.fromtimestamp(t, z).strftime("%m-%d %H:%M %Z") for t in ts]


def test_nine_oclock_in_paris_across_the_spring_change() -> None:
    s = Schedule(Report(), "r", cron="0 9 * * *", tz="Europe/Paris")
    ticks = s.ticks(_utc(2026, 3, 27, 12), _utc(2026, 3, 31, 12))
    # 09:00 CET is 08:00 UTC; from March 29 09:00 CEST is 07:00 UTC.
    assert ticks == [
        _utc(2026, 3, 28, 8),
        _utc(2026, 3, 29, 7),
        _utc(2026, 3, 30, 7),
        _utc(2026, 3, 31, 7),
    ]
    assert s.next_after(_utc(2026, 3, 28, 8)) == _utc(2026, 3, 29, 7)


def test_a_skipped_wall_time_fires_once_at_the_end_of_the_gap() -> None:
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    s = Schedule(Report(), "r", cron="30 2 * * *", tz="America/New_York")
    ticks = s.ticks(_utc(2026, 3, 7), _utc(2026, 3, 10))
    assert _local(ticks, "America/New_York") == [
        "03-07 02:30 EST",
        "03-08 03:00 EDT",
        "03-09 02:30 EDT",
    ]


def test_a_repeated_wall_time_fires_once() -> None:
    # New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    s = Schedule(Report(), "r", cron="30 1 * * *", tz="America/New_York")
    ticks = s.ticks(_utc(2026, 10, 31), _utc(2026, 11, 3))
    assert _local(ticks, "America/New_York") == [
        "10-31 01:30 EDT",
        "11-01 01:30 EDT",
        "11-02 01:30 EST",
    ]
    # A scheduler that already handled the first 01:30 and looks again during the second
    # pass of that hour does not fire it again.
    second_pass = _utc(2026, 11, 1, 6, 40)  # 01:40 EST
    assert s.ticks(_utc(2026, 11, 1, 5, 35), second_pass) == []


def test_every_half_hour_through_both_changes_never_repeats() -> None:
    s = Schedule(Report(), "r", cron="*/30 * * * *", tz="America/New_York")
    spring = s.ticks(_utc(2026, 3, 8, 5), _utc(2026, 3, 8, 8, 1))  # 00:00 EST .. 04:01 EDT
    assert _local(spring, "America/New_York") == [
        "03-08 00:30 EST",
        "03-08 01:00 EST",
        "03-08 01:30 EST",
        "03-08 03:00 EDT",  # 02:00 and 02:30 do not exist: one tick at the end of the gap
        "03-08 03:30 EDT",
        "03-08 04:00 EDT",
    ]
    autumn = s.ticks(_utc(2026, 11, 1, 4), _utc(2026, 11, 1, 8, 1))  # 00:00 EDT .. 03:01 EST
    assert len(autumn) == len(set(autumn)) == 6
    assert autumn == sorted(autumn)


def test_without_tz_cron_is_utc_and_seconds_are_the_last_field() -> None:
    s = Schedule(Report(), "r", cron="0 9 * * *")
    assert s.ticks(_utc(2026, 3, 28, 12), _utc(2026, 3, 29, 12)) == [_utc(2026, 3, 29, 9)]
    every_10s = Schedule(Report(), "r", cron="* * * * * */10")
    assert every_10s.ticks(_utc(2026, 1, 1), _utc(2026, 1, 1, 0, 0, 30)) == [
        _utc(2026, 1, 1, 0, 0, s) for s in (10, 20, 30)
    ]
    # What the old docs showed: every second of every tenth minute.
    wrong = Schedule(Report(), "r", cron="*/10 * * * * *")
    assert len(wrong.ticks(_utc(2026, 1, 1, 0, 10), _utc(2026, 1, 1, 0, 10, 5))) == 5


def test_bad_zones_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        Schedule(Report(), "r", cron="0 9 * * *", tz="Mars/Olympus")
    with pytest.raises(ValueError, match="tz= applies to cron="):
        Schedule(Report(), "r", every_s=5, tz="Europe/Paris")


def test_default_names_tell_apart_arguments_zone_and_queue() -> None:
    """Two schedules of one class with other arguments shared a name."""
    names = {
        make_schedule(Report("daily"), cron="0 9 * * *").name,
        make_schedule(Report("weekly"), cron="0 9 * * *").name,
        make_schedule(Report("daily"), cron="0 9 * * *", tz="Europe/Paris").name,
        make_schedule(Report("daily"), cron="0 9 * * *", queue="reports").name,
    }
    assert len(names) == 4
    # Stable across processes: the same job and timing give the same name.
    a = make_schedule(Report("daily"), cron="0 9 * * *").name
    assert a == make_schedule(Report("daily"), cron="0 9 * * *").name
