"""Delivery rules end to end: real Redis, aiosmtpd, the SMS stub, an in-process worker,
and preferences in real SQLite and PostgreSQL.

Preferences and ``once_per`` are decided at ``notify()``: the tests count the jobs
queued (none for a skipped channel) and what arrived. Digests are flushed by the worker
when their window ends: one mail per notifiable with every item, oldest first. Quiet
hours hold an SMS (not the mail) as a delayed job due when the window ends.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from tests.integration import rules_app as m
from tests.integration.database_support import mariadb_admin, mariadb_url, pg_url, postgres_db
from tests.integration.notify_support import KEY, Servers, form, parse, parts, work
from tidings import App
from tidings.cli.main import main
from tidings.notifications import (
    NotificationDelayed,
    NotificationDigested,
    NotificationSent,
    NotificationSkipped,
)
from tidings.notifications.rules import digests, throttling
from tidings.notifications.rules.digests import SEEN_KEEP_MS
from tidings.redis import scripts
from tidings.redis.keys import digest_base

__all__ = ["mariadb_admin", "mariadb_url", "pg_url", "postgres_db"]

AppFactory = Callable[..., App]


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def prefs_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'prefs.sqlite3'}"
    elif request.param == "postgresql":
        yield request.getfixturevalue("pg_url")
    else:
        yield request.getfixturevalue("mariadb_url")


def queued(app: App) -> int:
    rq = app.queue_for(None)
    k = rq.keys("default")
    return int(rq.client.llen(k.ready)) + int(rq.client.zcard(k.delayed))


def sms_to(s: Servers) -> list[str]:
    return [form(h.hit)["To"] for h in s.sms.stamped]


# -- preferences -------------------------------------------------------------------------------


def test_opt_outs_in_the_table_queue_no_job_and_mandatory_ignores_them(
    servers: Servers, app_factory: AppFactory, prefs_url: str
) -> None:
    app = app_factory(servers, database_url=prefs_url)
    app.make_current()
    app.notifications.preferences.use_database()
    assert app.database.upgrade() is True
    assert sa.inspect(app.database.engine).has_table("notification_preferences")
    skipped: list[NotificationSkipped] = []
    app.listen(NotificationSkipped, skipped.append)
    ann, bob, cat = m.Member(1), m.Member(2), m.Member(3)
    ann.opt_out(m.Promo, "sms")
    bob.opt_out()  # everything, every channel
    bob.opt_in(m.Promo, "mail")  # but this: the more specific row wins
    cat.opt_out(m.Promo)

    ids = app.notify([ann, bob, cat], m.Promo("spring"))
    assert len(ids) == 2 and queued(app) == 2  # ann mail, bob mail; nothing for cat
    assert sorted((e.notifiable.id, e.channel, e.reason) for e in skipped) == [
        (1, "sms", "opted_out"), (2, "sms", "opted_out"),
        (3, "mail", "opted_out"), (3, "sms", "opted_out"),
    ]  # fmt: skip
    assert len(app.notify([ann, bob, cat], m.Billing("due"))) == 6  # mandatory: all of them
    work(app)
    got = sorted((msg.rcpt_tos[0], parse(msg)["Subject"]) for msg in servers.smtp.messages)
    assert got == sorted(
        [("member1@example.org", "Promo spring"), ("member2@example.org", "Promo spring")]
        + [(f"member{i}@example.org", "Promo due") for i in (1, 2, 3)]
    )
    assert sorted(sms_to(servers)) == [f"+1555{i:07d}" for i in (1, 2, 3)]  # Billing only

    rows = bob.notification_preferences()
    assert [(p.notification_type, p.channel, p.enabled) for p in rows] == [
        ("*", "*", False), ("tests.integration.rules_app.Promo", "mail", True),
    ]  # fmt: skip
    assert ann.wants_notification(m.Promo(), "mail") and not ann.wants_notification(
        m.Promo(), "sms"
    )
    assert ann.forget_preferences() == 1
    assert len(app.notify(ann, m.Promo("again"))) == 2


def test_db_upgrade_creates_the_preferences_table(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration import database_app

    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    monkeypatch.setattr(database_app, "_app", None)
    env = {"TIDINGS_REDIS_URL": redis_url, "TIDINGS_KEY": KEY, "TIDINGS_PREFIX": prefix,
           "TIDINGS_DATABASE_URL": url}  # fmt: skip
    out = CliRunner().invoke(
        main, ["-A", "tests.integration.database_app:app", "db", "upgrade"], env=env
    )
    assert out.exit_code == 0, out.output
    assert "Table notification_preferences (notification preferences) ready" in out.output
    engine = sa.create_engine(url)
    try:
        assert sa.inspect(engine).has_table("notification_preferences")
        cols = {c["name"] for c in sa.inspect(engine).get_columns("notification_preferences")}
        assert cols == {"notifiable_type", "notifiable_id", "notification_type", "channel",
                        "enabled", "updated_at"}  # fmt: skip
    finally:
        engine.dispose()
        database_app.app.close()


def test_a_callback_decides_and_none_falls_back_to_sending(
    servers: Servers, app_factory: AppFactory
) -> None:
    app = app_factory(servers)
    app.make_current()
    asked: list[tuple[int, str]] = []

    def prefs(notifiable: Any, notification: Any, channel: str) -> bool | None:
        asked.append((notifiable.id, channel))
        return False if (notifiable.id, channel) == (1, "mail") else None

    app.notifications.preferences.use(prefs)
    assert len(app.notify([m.Member(1), m.Member(2)], m.Promo())) == 3
    assert asked == [(1, "mail"), (1, "sms"), (2, "mail"), (2, "sms")]
    work(app)
    assert [msg.rcpt_tos for msg in servers.smtp.messages] == [["member2@example.org"]]


# -- throttling ---------------------------------------------------------------------------------


@pytest.mark.topologies
def test_once_per_drops_repeats_per_key_and_a_resent_command_still_passes(
    servers: Servers, app_factory: AppFactory
) -> None:
    app = app_factory(servers)
    app.make_current()
    skipped: list[NotificationSkipped] = []
    app.listen(NotificationSkipped, skipped.append)
    ann = m.Member(1)
    assert len(ann.notify(m.DiskAlert("sda"))) == 2
    assert ann.notify(m.DiskAlert("sda")) == []
    assert len(ann.notify(m.DiskAlert("sdb"))) == 2  # another key
    assert len(m.Member(2).notify(m.DiskAlert("sda"))) == 2  # another member
    assert [(e.notifiable.id, e.channel, e.reason) for e in skipped] == [(1, "*", "throttled")]
    work(app)
    assert len(servers.smtp.messages) == 3 and len(servers.sms.stamped) == 3

    # The marker holds the token of the notify() that set it: a re-sent command (its
    # reply lost) passes again, another notify() does not; the period is the PTTL.
    n = m.DiskAlert("sdc")
    assert throttling.try_once(app, ann, n, 3600.0, "tok-1")
    assert throttling.try_once(app, ann, n, 3600.0, "tok-1")
    assert not throttling.try_once(app, ann, n, 3600.0, "tok-2")
    rq = app.queue_for(None)
    key = f"{rq.prefix}:notify:once:{{{throttling.throttle_name(ann, n)}}}"
    assert 3_590_000 < int(rq.client.pttl(key)) <= 3_600_000


# -- digests ------------------------------------------------------------------------------------


def test_digest_sends_one_mail_per_notifiable_with_every_item_oldest_first(
    servers: Servers, app_factory: AppFactory
) -> None:
    app = app_factory(servers)
    app.make_current()
    digested: list[NotificationDigested] = []
    sent: list[NotificationSent] = []
    app.listen(NotificationDigested, digested.append)
    app.listen(NotificationSent, sent.append)
    ann, bob = m.Member(1), m.Member(2)
    for i in range(5):
        assert ann.notify(m.Comment(f"a{i}", ("mail", "sms"))) != []  # the SMS job
    for i in range(2):
        assert bob.notify(m.Comment(f"b{i}")) == []  # nothing queued on its own
    for i in range(3):
        ann.notify(m.Reply(f"r{i}"))
    assert [e.opened for e in digested if e.notifiable is ann and e.channel == "mail"] == [
        True, False, False, False, False, True, False, False,
    ]  # fmt: skip
    windows = {e.window_id for e in digested}
    assert len(windows) == 3  # (ann, Comment), (bob, Comment), (ann, Reply)
    work(app)  # runs until the delayed flushes ran too

    mails = {(msg.rcpt_tos[0], parse(msg)["Subject"]): parse(msg) for msg in servers.smtp.messages}
    assert set(mails) == {
        ("member1@example.org", "5 new notifications"),
        ("member2@example.org", "2 new notifications"),
        ("member1@example.org", "3 replies for member 1"),
    }
    text = parts(mails[("member1@example.org", "5 new notifications")])["text/plain"]
    positions = [text.index(f"Comment a{i}") for i in range(5)]
    assert positions == sorted(positions)  # oldest first, default layout
    text = parts(mails[("member1@example.org", "3 replies for member 1")])["text/plain"]
    assert [text.index(f"item:r{i}") for i in range(3)] == sorted(
        text.index(f"item:r{i}") for i in range(3)
    )
    assert len(servers.sms.stamped) == 5  # SMS is not digested
    # The window id is the delivery id (the Message-ID), and nothing is left in Redis.
    ids = {e.delivery_id for e in sent if e.channel == "mail"}
    assert ids == windows
    for msg in mails.values():
        assert email.utils.parseaddr(msg["Message-ID"])[1].split("@")[0] in windows
    rq = app.queue_for(None)
    assert rq.client.keys(f"{rq.prefix}:queue:{{default}}:digest:*") == [
        k for k in rq.client.keys(f"{rq.prefix}:queue:{{default}}:digest:*") if k.endswith(b":seen")
    ]

    # After the flush the next item opens a new window: a second digest.
    ann.notify(m.Comment("late"))
    work(app)
    assert ("member1@example.org", "1 new notifications") in {
        (msg.rcpt_tos[0], parse(msg)["Subject"]) for msg in servers.smtp.messages
    }


@pytest.mark.topologies
def test_a_resent_append_is_not_added_twice_and_a_rerun_claim_resends_or_finds_nothing(
    app_factory: AppFactory,
) -> None:
    app = app_factory()
    app.make_current()
    ann = m.Member(1)
    first = digests.add(app, ann, m.Reply("x"), "mail", 60.0, "item-1")
    again = digests.add(app, ann, m.Reply("x"), "mail", 60.0, "item-1")  # reply was lost
    other = digests.add(app, ann, m.Reply("y"), "mail", 60.0, "item-2")
    assert (first.added, first.opened) == (True, True)
    assert (again.added, again.window_id) == (False, first.window_id)
    assert (other.added, other.opened, other.window_id) == (True, False, first.window_id)
    rq = app.queue_for(None)
    base = digest_base(rq.prefix, "default", digests.digest_name(ann, m.Reply("x"), "mail"))
    assert rq.client.llen(base) == 2
    assert 0 < int(rq.client.pttl(f"{base}:seen")) <= SEEN_KEEP_MS
    claimed = f"{base}:claimed:{first.window_id}"
    keys, args = [base, f"{base}:window", claimed], [first.window_id, 60_000]
    got = scripts.DIGEST_CLAIM.call(rq.client, keys, args)
    assert [digests.decode_item(app, digests.digest_name(ann, m.Reply("x"), "mail"), r)[0]
            for r in got] == ["item-1", "item-2"]  # fmt: skip
    assert scripts.DIGEST_CLAIM.call(rq.client, keys, args) == got  # a re-run: the same
    assert rq.client.llen(claimed) == 2 and not rq.client.exists(base, f"{base}:window")
    late = digests.add(app, ann, m.Reply("z"), "mail", 60.0, "item-3")  # a new window
    assert late.opened and late.window_id != first.window_id
    rq.client.delete(claimed)  # delivered
    assert scripts.DIGEST_CLAIM.call(rq.client, keys, args) == []  # nothing to send again
    assert rq.client.llen(base) == 1  # the new window's item is untouched


# -- quiet hours --------------------------------------------------------------------------------


def test_quiet_hours_delay_the_sms_to_the_window_end_and_not_the_mail(
    servers: Servers, app_factory: AppFactory
) -> None:
    app = app_factory(servers)
    app.make_current()
    delayed: list[NotificationDelayed] = []
    app.listen(NotificationDelayed, delayed.append)
    # A window around "now" in Tokyo: from an hour ago to two hours ahead (local time).
    tokyo = datetime.now(UTC).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    start, end = tokyo - timedelta(hours=1), tokyo + timedelta(hours=2)
    night = m.Member(1, timezone="Asia/Tokyo",
                     quiet_hours=(start.strftime("%H:%M"), end.strftime("%H:%M")))  # fmt: skip
    before = time.time()
    mail_id, sms_id = night.notify(m.Promo("late"))
    assert app.job_status(mail_id) == "pending"
    assert app.job_status(sms_id) == "delayed"
    [event] = delayed
    assert event.channel == "sms"
    expected = end.replace(second=0, microsecond=0).astimezone(UTC)
    assert event.until == expected
    rq = app.queue_for(None)
    due_ms = rq.client.zscore(rq.keys("default").delayed, sms_id)
    assert due_ms is not None
    assert abs(due_ms / 1000 - expected.timestamp()) < 5 + (time.time() - before)
    # The same member outside quiet hours: nothing waits.
    day = m.Member(2, timezone="Asia/Tokyo", quiet_hours=(end.strftime("%H:%M"),
                   (end + timedelta(hours=1)).strftime("%H:%M")))  # fmt: skip
    assert [app.job_status(i) for i in day.notify(m.Promo("day"))] == ["pending", "pending"]


def test_a_preference_cache_sees_local_changes_at_once_and_others_after_cache_s(
    servers: Servers, app_factory: AppFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.notifications.channels.database import NotificationStore
    from tidings.notifications.rules import preferences as prefs_module
    from tidings.notifications.rules.preferences import PreferenceStore

    url = f"sqlite:///{tmp_path / 'cached.sqlite3'}"
    app = app_factory(servers, database_url=url)
    app.make_current()
    app.notifications.preferences.use_database(cache_s=30)
    ann = m.Member(1)
    assert len(ann.notify(m.Promo())) == 2  # read and cached: no rows
    other = NotificationStore(url)  # "another process" opts ann out of SMS
    try:
        PreferenceStore(other).set(
            "tests.integration.rules_app.Member", "1", "tests.integration.rules_app.Promo",
            "sms", False,
        )  # fmt: skip
    finally:
        other.close()
    assert len(ann.notify(m.Promo())) == 2  # not seen yet: the cache holds
    clock = time.monotonic() + 31
    monkeypatch.setattr(prefs_module.time, "monotonic", lambda: clock)
    assert len(ann.notify(m.Promo())) == 1  # seen once cache_s passed
    ann.opt_out(m.Promo, "mail")  # a change made here: seen at once
    assert ann.notify(m.Promo()) == []


def test_an_sms_digest_inside_quiet_hours_waits_with_its_window_open(
    servers: Servers, app_factory: AppFactory
) -> None:
    """The flush comes due inside quiet hours: it puts itself back until they end without
    claiming, items sent meanwhile join the same window, and one SMS carries them all."""
    import threading
    from zoneinfo import ZoneInfo

    from tidings.observability.lifecycle import JobReleased

    app = app_factory(servers)
    app.make_current()
    zone = ZoneInfo("America/Sao_Paulo")
    local = datetime.now(UTC).astimezone(zone)
    end = (local + timedelta(seconds=15)).time().replace(microsecond=0)
    start = (local - timedelta(hours=1)).time().replace(microsecond=0)
    night = m.Member(1, timezone="America/Sao_Paulo", quiet_hours=(start, end))
    quiet_end = datetime.combine(local.date(), end, tzinfo=zone).astimezone(UTC)
    if quiet_end < datetime.now(UTC):  # the end fell after local midnight
        quiet_end += timedelta(days=1)
    released = threading.Event()
    app.listen(JobReleased, lambda e: released.set())
    night.notify(m.Buzz("one"))
    runner = threading.Thread(target=work, args=(app,), kwargs={"timeout_s": 60.0})
    runner.start()
    try:
        assert released.wait(30), "the flush did not put itself back"
        assert servers.sms.stamped == []
        night.notify(m.Buzz("two"))  # the window is still open: no second flush
        night.notify(m.Buzz("three"))
    finally:
        runner.join(90)
    assert not runner.is_alive()
    [hit] = servers.sms.stamped
    assert form(hit.hit)["Body"] == "3 new: Buzz one | Buzz two | Buzz three"
    arrived = datetime.now(UTC) - timedelta(seconds=time.monotonic() - hit.at)
    assert arrived >= quiet_end - timedelta(seconds=1)


def test_an_encrypted_notification_is_stored_encrypted_in_its_digest(
    servers: Servers, app_factory: AppFactory
) -> None:
    app = app_factory(servers)
    app.make_current()
    ann = m.Member(1)
    ann.notify(m.SecretReply("s3cret-diagnosis"))
    rq = app.queue_for(None)
    name = digests.digest_name(ann, m.SecretReply("x"), "mail")
    [record] = rq.client.lrange(digest_base(rq.prefix, "default", name), 0, -1)
    assert b"s3cret-diagnosis" not in record
    assert digests.decode_item(app, name, record)[1].text == "s3cret-diagnosis"
    work(app)
    [msg] = servers.smtp.messages
    assert "item:s3cret-diagnosis" in parts(parse(msg))["text/plain"]


def test_notify_async_applies_the_rules_in_a_thread(
    servers: Servers, app_factory: AppFactory, tmp_path: Path
) -> None:
    import asyncio

    app = app_factory(servers, database_url=f"sqlite:///{tmp_path / 'async.sqlite3'}")
    app.make_current()
    app.notifications.preferences.use_database()
    ann = m.Member(1)
    ann.opt_out(m.Promo, "sms")
    skipped: list[NotificationSkipped] = []
    app.listen(NotificationSkipped, skipped.append)

    async def main() -> tuple[list[str], list[str], list[str]]:
        a = await ann.notify_async(m.Promo("x"))
        b = await ann.notify_async(m.DiskAlert("sda"))
        c = await ann.notify_async(m.DiskAlert("sda"))
        return a, b, c

    a, b, c = asyncio.run(main())
    # Preferences are per type: a subclass (DiskAlert) has its own type name.
    assert (len(a), len(b), c) == (1, 2, [])
    assert [(e.channel, e.reason) for e in skipped] == [("sms", "opted_out"), ("*", "throttled")]


def test_a_notification_that_is_not_queued_sends_now_and_queues_only_what_quiet_hours_hold(
    servers: Servers, app_factory: AppFactory
) -> None:
    from zoneinfo import ZoneInfo

    app = app_factory(servers)
    app.make_current()
    local = datetime.now(UTC).astimezone(ZoneInfo("Australia/Sydney"))
    window = ((local - timedelta(hours=1)).strftime("%H:%M"),
              (local + timedelta(hours=2)).strftime("%H:%M"))  # fmt: skip
    night = m.Member(1, timezone="Australia/Sydney", quiet_hours=window)
    [sms_job] = night.notify(m.Heads("now"))
    assert [parse(x)["Subject"] for x in servers.smtp.messages] == ["Heads now"]  # sent now
    assert servers.sms.stamped == []
    assert app.job_status(sms_job) == "delayed"


def test_redis_down_raises_queue_unavailable_naming_the_move(prefix: str) -> None:
    from tests.integration.notify_support import make_app as make
    from tests.support.procs import free_port
    from tidings.errors import QueueUnavailable

    app = make(f"redis://127.0.0.1:{free_port()}/0", prefix)
    try:
        app.make_current()
        with pytest.raises(QueueUnavailable, match=r"digest on 'default': Redis unavailable"):
            m.Member(1).notify(m.Reply("x"))
        with pytest.raises(QueueUnavailable, match=r"once_per: Redis unavailable"):
            m.Member(1).notify(m.DiskAlert("sda"))
    finally:
        app.close()


def test_a_database_digest_is_one_row_with_every_item(
    servers: Servers, app_factory: AppFactory, tmp_path: Path
) -> None:
    app = app_factory(servers, database_url=f"sqlite:///{tmp_path / 'rows.sqlite3'}")
    app.make_current()
    ann = m.Member(1)
    for who in ("bob", "cat", "dan"):
        assert ann.notify(m.Liked(who)) == []
    work(app)
    [row] = ann.notifications()
    assert row.type == "tests.integration.rules_app.Liked"
    assert row.data == {"digest": True, "count": 3,
                        "items": [{"by": "bob"}, {"by": "cat"}, {"by": "dan"}]}  # fmt: skip
