"""fake_queue, fake_notifications and fake_events on an App, as context managers and as
the pytest fixtures of the ``tidings`` plugin (``pytest11`` entry point).

The App points at a Redis that is not there (``redis://127.0.0.1:1``), and every test
runs with socket connects refused: neither creating the App nor anything a fake stands
in for may touch the network.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from tidings import App, CallQueuedListener, Event, Job, Listener, ShouldQueue, event, queued
from tidings.notifications import MailMessage, Notifiable, Notification, SmsMessage, route
from tidings.testing import (
    FakeDispatcher,
    FakeNotifications,
    FakeQueue,
    fake_events,
    fake_notifications,
    fake_queue,
)

KEY = "x" * 32


@pytest.fixture(autouse=True)
def no_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a unit test tried to connect: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def app() -> Iterator[App]:
    """An App with no Redis; set up before the plugin's fixtures, so torn down after
    them: its teardown checks that every fake put the real object back."""
    a = App(env=False, redis_url="redis://127.0.0.1:1", key=KEY, allowed_modules="tests")
    real_events = a.events
    yield a
    a.close()
    assert a.events is real_events
    assert not {"push_pending", "push_pending_async", "dispatch_many"} & set(vars(a))
    assert not isinstance(a.notifications, FakeNotifications)


# -- what the code under test uses --------------------------------------------------------


@dataclass
class UserRegistered(Event):
    email: str


@dataclass
class UserDeleted(Event):
    email: str


@dataclass
class User(Notifiable):
    id: int
    email: str
    phone: str = "+15551234567"


class SendWelcome(Listener, ShouldQueue):
    queue = "mail"

    def handle(self, event: UserRegistered) -> None:
        raise AssertionError("a queued listener ran in a test with fakes")


ran: list[object] = []


def audit(e: object) -> None:
    ran.append(e)


@queued(queue="audit")
def queued_audit(e: UserRegistered) -> None:
    raise AssertionError("a queued function ran in a test with fakes")


@dataclass
class SendReport(Job):
    report_id: int
    queue: ClassVar[str | None] = "reports"

    def handle(self) -> None:
        raise AssertionError("a job ran in a test with fakes")


@dataclass
class Cleanup(Job):
    def handle(self) -> None:
        raise AssertionError("a job ran in a test with fakes")


class InvoicePaid(Notification):
    def __init__(self, amount: int) -> None:
        self.amount = amount

    def via(self, notifiable: Any) -> list[str]:
        return ["mail", "sms"] if self.amount > 100 else ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject("Paid")

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage("Paid")


class QueuedInvoicePaid(InvoicePaid, ShouldQueue):
    pass


class AccountClosed(Notification):
    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    ran.clear()
    yield


def register(email: str) -> None:
    """The code under test: dispatches an event."""
    event(UserRegistered(email))


# -- App creation ---------------------------------------------------------------------------


def test_creating_an_app_connects_to_nothing() -> None:
    a = App(env=False, redis_url="redis://127.0.0.1:1", key=KEY)
    assert App.current() is a
    a.close()


# -- fake_queue -----------------------------------------------------------------------------


def test_fake_queue_records_jobs_and_asserts_on_them(app: App) -> None:
    with fake_queue(app) as queue:
        assert isinstance(queue, FakeQueue)
        assert SendReport(1).dispatch() == "fake-1"
        assert SendReport(2).on_queue("urgent").dispatch() == "fake-2"
        assert app.dispatch_many([Cleanup(), SendReport(3)]) == ["fake-3", "fake-4"]
        assert asyncio.run(SendReport(4).dispatch_async()) == "fake-5"

    queue.assert_pushed(SendReport)
    queue.assert_pushed(SendReport, times=4)
    queue.assert_pushed(SendReport, lambda j: j.report_id == 3, times=1)
    queue.assert_pushed(Cleanup, times=1)
    queue.assert_pushed_on("reports", SendReport, lambda j: j.report_id == 1)
    queue.assert_pushed_on("urgent", SendReport)
    queue.assert_pushed_on("default", Cleanup)
    assert [j.report_id for j in queue.jobs(SendReport)] == [1, 2, 3, 4]  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match=r"SendReport pushed 4 time\(s\), expected 2"):
        queue.assert_pushed(SendReport, times=2)
    with pytest.raises(AssertionError, match="not pushed on 'reports'"):
        queue.assert_pushed_on("reports", SendReport, lambda j: j.report_id == 2)
    with pytest.raises(AssertionError, match="Cleanup was pushed 1 time"):
        queue.assert_not_pushed(Cleanup)
    with pytest.raises(AssertionError, match="jobs were pushed"):
        queue.assert_nothing_pushed()


def test_fake_queue_records_queued_listeners_as_call_queued_listener_jobs(app: App) -> None:
    app.listen(UserRegistered, [audit, SendWelcome, queued_audit])
    with fake_queue(app) as queue:
        results = app.dispatch(UserRegistered("ada@example.org"))

    assert results == [None, "fake-1", "fake-2"]
    assert ran == [UserRegistered("ada@example.org")]  # the sync listener still ran
    queue.assert_pushed(CallQueuedListener, times=2)
    queue.assert_pushed_on(
        "mail",
        CallQueuedListener,
        lambda j: (
            j.listener == f"{__name__}:SendWelcome"
            and j.args == (UserRegistered("ada@example.org"),)
        ),
    )
    queue.assert_pushed_on(
        "audit", CallQueuedListener, lambda j: j.listener == f"{__name__}:queued_audit"
    )


def test_fake_queue_restores_the_app_and_an_empty_fake_passes(app: App) -> None:
    real = app.push_pending
    with fake_queue(app) as queue:
        assert app.push_pending != real
        queue.assert_nothing_pushed()
        queue.assert_not_pushed(SendReport)
    assert "push_pending" not in vars(app)
    assert app.push_pending == real


def test_fake_queue_defaults_to_the_current_app(app: App) -> None:
    with fake_queue() as queue:
        SendReport(1).dispatch()
    queue.assert_pushed(SendReport)


# -- fake_notifications ---------------------------------------------------------------------


def test_fake_notifications_records_sends_and_asserts_on_them(app: App) -> None:
    ada, grace = User(1, "ada@example.org"), User(2, "grace@example.org")
    with fake_notifications(app) as sent:
        assert isinstance(sent, FakeNotifications)
        ada.notify(InvoicePaid(250))
        app.notify([ada, grace], InvoicePaid(5))
        grace.notify_now(AccountClosed())
        route("mail", "x@example.org").notify(InvoicePaid(1))

    sent.assert_sent_to(ada, InvoicePaid)
    sent.assert_sent_to(ada, InvoicePaid, lambda n, channels: channels == ["mail", "sms"])
    sent.assert_sent_to(grace, InvoicePaid, lambda n, channels: n.amount == 5)
    sent.assert_sent_to(grace, AccountClosed)
    sent.assert_not_sent_to(ada, AccountClosed)
    sent.assert_sent_on_demand(InvoicePaid, lambda who, n: who.routes == {"mail": "x@example.org"})
    sent.assert_count(5)
    with pytest.raises(AssertionError, match="AccountClosed was not sent to"):
        sent.assert_sent_to(ada, AccountClosed)
    with pytest.raises(AssertionError, match="InvoicePaid was sent to"):
        sent.assert_not_sent_to(ada, InvoicePaid)
    with pytest.raises(AssertionError, match="AccountClosed was not sent on demand"):
        sent.assert_sent_on_demand(AccountClosed)
    with pytest.raises(AssertionError, match="notifications were sent"):
        sent.assert_nothing_sent()
    with pytest.raises(AssertionError, match="5 notifications sent, expected 1"):
        sent.assert_count(1)


def test_fake_notifications_queues_nothing_and_restores_the_sender(app: App) -> None:
    real = app.notifications
    ada = User(1, "ada@example.org")
    with fake_queue(app) as queue, fake_notifications(app) as sent:
        assert app.notifications is sent
        assert ada.notify(QueuedInvoicePaid(500)) == []
        assert asyncio.run(ada.notify_async(QueuedInvoicePaid(7))) == []
    assert app.notifications is real
    queue.assert_nothing_pushed()
    sent.assert_sent_to(ada, QueuedInvoicePaid, lambda n, channels: n.amount == 7)
    assert FakeNotifications.is_queued(QueuedInvoicePaid(1))
    assert not FakeNotifications.is_queued(InvoicePaid(1))


def test_an_empty_fake_notifications_passes(app: App) -> None:
    with fake_notifications() as sent:
        pass
    sent.assert_nothing_sent()
    sent.assert_count(0)


# -- fake_events ----------------------------------------------------------------------------


def test_fake_events_records_and_runs_nothing(app: App) -> None:
    app.listen(UserRegistered, [audit, SendWelcome])
    with fake_queue(app) as queue, fake_events(app) as events:
        assert isinstance(events, FakeDispatcher)
        register("ada@example.org")
        UserRegistered("grace@example.org").dispatch()
        app.dispatch("user.login", 7)

    assert ran == []
    queue.assert_nothing_pushed()  # the queued listener was not pushed either
    events.assert_dispatched(UserRegistered, times=2)
    events.assert_dispatched(UserRegistered, lambda e: e.email == "ada@example.org", times=1)
    events.assert_dispatched("user.login", lambda user_id: user_id == 7)
    events.assert_dispatched("user.*")
    events.assert_not_dispatched(UserDeleted)
    events.assert_listening(UserRegistered, SendWelcome)
    events.assert_listening(UserRegistered, audit)
    with pytest.raises(AssertionError, match="Expected UserDeleted to be dispatched"):
        events.assert_dispatched(UserDeleted)
    with pytest.raises(AssertionError, match="Expected no events to be dispatched"):
        events.assert_nothing_dispatched()
    with pytest.raises(AssertionError, match="to listen to UserDeleted"):
        events.assert_listening(UserDeleted, audit)


def test_fake_events_only_fakes_the_listed_events(app: App) -> None:
    app.listen(UserRegistered, audit)
    app.listen(UserDeleted, audit)
    with fake_events(app, only=[UserDeleted]) as events:
        event(UserRegistered("ada@example.org"))
        event(UserDeleted("grace@example.org"))
    assert ran == [UserRegistered("ada@example.org")]
    events.assert_dispatched(UserDeleted)
    events.assert_not_dispatched(UserRegistered)


def test_fake_events_restores_the_real_dispatcher(app: App) -> None:
    real = app.events
    app.listen(UserRegistered, audit)
    with fake_events(app):
        assert app.events is not real
    assert app.events is real
    register("ada@example.org")
    assert ran == [UserRegistered("ada@example.org")]


# -- the pytest fixtures (plugin ``tidings`` on the pytest11 entry point) -------------------


def test_the_plugin_is_registered_by_its_entry_point(pytestconfig: pytest.Config) -> None:
    import tidings.pytest_plugin

    assert pytestconfig.pluginmanager.get_plugin("tidings") is tidings.pytest_plugin


def test_the_fake_queue_fixture(app: App, fake_queue: FakeQueue) -> None:
    app.listen(UserRegistered, SendWelcome)
    SendReport(9).dispatch()
    register("ada@example.org")
    fake_queue.assert_pushed(SendReport, lambda j: j.report_id == 9)
    fake_queue.assert_pushed_on("mail", CallQueuedListener)


def test_the_fake_notifications_fixture(app: App, fake_notifications: FakeNotifications) -> None:
    ada = User(1, "ada@example.org")
    ada.notify(QueuedInvoicePaid(300))
    fake_notifications.assert_sent_to(ada, QueuedInvoicePaid)
    assert app.notifications is fake_notifications


def test_the_fake_events_fixture(app: App, fake_events: FakeDispatcher) -> None:
    app.listen(UserRegistered, audit)
    register("ada@example.org")
    assert ran == []
    assert app.events is fake_events
    fake_events.assert_dispatched(UserRegistered, lambda e: e.email == "ada@example.org")
    fake_events.assert_listening(UserRegistered, audit)


def test_the_fixtures_together(
    app: App,
    fake_events: FakeDispatcher,
    fake_queue: FakeQueue,
    fake_notifications: FakeNotifications,
) -> None:
    SendReport(1).dispatch()
    User(1, "a@example.org").notify(InvoicePaid(1))
    event(UserDeleted("a@example.org"))
    fake_queue.assert_pushed(SendReport)
    fake_notifications.assert_count(1)
    fake_events.assert_dispatched(UserDeleted)
