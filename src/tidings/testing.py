"""Fakes for users' tests: events, the queue and notifications.

::

    with fake_queue(app) as queue:
        signup(...)
    queue.assert_pushed(SendWelcome)

Each is also a pytest fixture (``fake_events``, ``fake_queue``, ``fake_notifications``)
acting on the current App, registered through the ``pytest11`` entry point.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tidings.events.listener import ShouldQueue
from tidings.events.testing import FakeDispatcher, fake_events
from tidings.jobs.job import Job, PendingDispatch
from tidings.notifications.notification import AnonymousNotifiable, Notification

__all__ = [
    "FakeDispatcher",
    "FakeNotifications",
    "FakeQueue",
    "fake_events",
    "fake_notifications",
    "fake_queue",
]


def _name(cls: type[Any]) -> str:
    return cls.__qualname__


class FakeQueue:
    """Records pushed jobs instead of sending them to Redis."""

    def __init__(self) -> None:
        self.pushed: list[PendingDispatch] = []
        self._ids = itertools.count(1)

    def record(self, pending: PendingDispatch) -> str:
        self.pushed.append(pending)
        return f"fake-{next(self._ids)}"

    def jobs(self, cls: type[Job] | None = None) -> list[Job]:
        """Pushed jobs, of class ``cls`` when given."""
        return [p.job for p in self.pushed if cls is None or isinstance(p.job, cls)]

    def assert_pushed(
        self,
        cls: type[Job],
        predicate: Callable[[Any], bool] | None = None,
        times: int | None = None,
    ) -> None:
        """Assert a job of ``cls`` (matching ``predicate``) was pushed (``times`` times)."""
        found = [j for j in self.jobs(cls) if predicate is None or predicate(j)]
        if not found or (times is not None and len(found) != times):
            names = [type(p.job).__qualname__ for p in self.pushed]
            want = f"{times} time(s)" if times is not None else "at least once"
            raise AssertionError(
                f"{_name(cls)} pushed {len(found)} time(s), expected {want}; pushed: {names}"
            )

    def assert_pushed_on(
        self, queue: str, cls: type[Job], predicate: Callable[[Any], bool] | None = None
    ) -> None:
        """Assert a job of ``cls`` was pushed on ``queue``."""
        for p in self.pushed:
            on = p.queue or getattr(p.job.option_source(), "queue", None) or "default"
            if isinstance(p.job, cls) and on == queue and (predicate is None or predicate(p.job)):
                return
        raise AssertionError(f"{_name(cls)} was not pushed on {queue!r}")

    def assert_not_pushed(self, cls: type[Job]) -> None:
        """Assert no job of ``cls`` was pushed."""
        if self.jobs(cls):
            raise AssertionError(f"{_name(cls)} was pushed {len(self.jobs(cls))} time(s)")

    def assert_nothing_pushed(self) -> None:
        """Assert no job at all was pushed."""
        if self.pushed:
            raise AssertionError(
                f"jobs were pushed: {[type(p.job).__qualname__ for p in self.pushed]}"
            )


@contextmanager
def fake_queue(app: Any = None) -> Iterator[FakeQueue]:
    """Swap the app's pushes for a recorder for the duration of the block."""
    from tidings.app import App

    app = app or App.current()
    fake = FakeQueue()

    def push(pending: PendingDispatch) -> str:
        return fake.record(pending)

    async def push_async(pending: PendingDispatch) -> str:
        return fake.record(pending)

    def many(jobs: Any, **_: Any) -> list[str]:
        return [
            fake.record(j if isinstance(j, PendingDispatch) else PendingDispatch(j)) for j in jobs
        ]

    async def many_async(jobs: Any, **_: Any) -> list[str]:
        return many(jobs)

    saved = {
        n: app.__dict__.get(n)
        for n in ("push_pending", "push_pending_async", "dispatch_many", "dispatch_many_async")
    }
    app.push_pending, app.push_pending_async = push, push_async
    app.dispatch_many, app.dispatch_many_async = many, many_async
    try:
        yield fake
    finally:
        for n, v in saved.items():
            if v is None:
                app.__dict__.pop(n, None)
            else:
                app.__dict__[n] = v


class FakeNotifications:
    """Records notifications instead of sending or queueing them."""

    def __init__(self, real: Any) -> None:
        self.channels = real.channels
        self.sent: list[tuple[Any, Notification, list[str]]] = []

    def _record(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        targets = (
            list(notifiables) if isinstance(notifiables, (list, tuple, set)) else [notifiables]
        )
        for n in targets:
            self.sent.append((n, notification, channels or notification.via(n)))
        return []

    def send(self, notifiables: Any, notification: Notification) -> list[str]:
        return self._record(notifiables, notification)

    async def send_async(self, notifiables: Any, notification: Notification) -> list[str]:
        return self._record(notifiables, notification)

    def send_now(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        return self._record(notifiables, notification, channels)

    async def send_now_async(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        return self._record(notifiables, notification, channels)

    def _matching(
        self, notifiable: Any, cls: type[Notification], predicate: Callable[..., bool] | None
    ) -> list[tuple[Any, Notification, list[str]]]:
        return [
            s
            for s in self.sent
            if s[0] is notifiable
            and isinstance(s[1], cls)
            and (predicate is None or predicate(s[1], s[2]))
        ]

    def assert_sent_to(
        self, notifiable: Any, cls: type[Notification], predicate: Callable[..., bool] | None = None
    ) -> None:
        """Assert ``cls`` was sent to ``notifiable``; ``predicate(notification, channels)``."""
        if not self._matching(notifiable, cls, predicate):
            raise AssertionError(
                f"{_name(cls)} was not sent to {notifiable!r}; sent: {self._summary()}"
            )

    def assert_not_sent_to(self, notifiable: Any, cls: type[Notification]) -> None:
        """Assert ``cls`` was not sent to ``notifiable``."""
        if self._matching(notifiable, cls, None):
            raise AssertionError(f"{_name(cls)} was sent to {notifiable!r}")

    def assert_sent_on_demand(
        self, cls: type[Notification], predicate: Callable[..., bool] | None = None
    ) -> None:
        """Assert ``cls`` was sent to an on-demand route (``predicate(notifiable, n)``)."""
        for n, notification, _ in self.sent:
            on_demand = isinstance(n, AnonymousNotifiable) and isinstance(notification, cls)
            if on_demand and (predicate is None or predicate(n, notification)):
                return
        raise AssertionError(f"{_name(cls)} was not sent on demand; sent: {self._summary()}")

    def assert_count(self, n: int) -> None:
        """Assert ``n`` (notifiable, notification) pairs were sent."""
        if len(self.sent) != n:
            raise AssertionError(f"{len(self.sent)} notifications sent, expected {n}")

    def assert_nothing_sent(self) -> None:
        """Assert nothing was sent."""
        if self.sent:
            raise AssertionError(f"notifications were sent: {self._summary()}")

    def _summary(self) -> list[str]:
        return [
            f"{type(n).__qualname__} -> {type(x).__qualname__} via {c}" for n, x, c in self.sent
        ]

    @staticmethod
    def is_queued(notification: Notification) -> bool:
        """Whether ``notification`` would have been queued."""
        return isinstance(notification, ShouldQueue)


@contextmanager
def fake_notifications(app: Any = None) -> Iterator[FakeNotifications]:
    """Record notifications instead of sending them, for the duration of the block."""
    from tidings.app import App

    app = app or App.current()
    real = app.notifications
    fake = FakeNotifications(real)
    app.notifications = fake
    try:
        yield fake
    finally:
        app.notifications = real
