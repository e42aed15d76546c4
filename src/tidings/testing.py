"""Fakes for users' tests: events, the queue and notifications.

::

    with fake_queue(app) as queue:
        signup(...)
    queue.assert_pushed(SendWelcome)

Each is also a pytest fixture (``fake_events``, ``fake_queue``, ``fake_notifications``)
acting on the current App, registered through the ``pytest11`` entry point.

Every ``assert_*`` takes a predicate. Queued listeners are pushed as
:class:`~tidings.events.call_queued.CallQueuedListener` jobs; name the listener class
(or ``@queued`` function) itself to assert on them: ``queue.assert_not_pushed(SendWelcome)``.

The fakes follow transactions as the real pushes do: a push with ``after_commit`` made
inside a transaction is recorded when it commits and never after a rollback
(``follow_transactions=False`` records it at once). Under pytest-django, commit
callbacks run only inside ``django_capture_on_commit_callbacks(execute=True)`` (or a
``transaction=True`` test).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidings.events.call_queued import CallQueuedListener
from tidings.events.listener import Listener, QueuedFunction, ShouldQueue
from tidings.events.testing import FakeDispatcher, fake_events
from tidings.jobs.job import Job, PendingDispatch, option
from tidings.notifications.notification import AnonymousNotifiable, Notification
from tidings.wire.serializer import class_path

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


JobKind = type[Job] | type[Listener] | QueuedFunction | Callable[..., Any]
"""What the queue fake's asserts take: a job class, or a queued listener class or
``@queued`` function (matched against the CallQueuedListener jobs that run it)."""


def _is_kind(job: Job, kind: Any) -> bool:
    """Whether ``job`` is of ``kind``: an instance of a job class, or the
    CallQueuedListener of a listener class / queued function."""
    if isinstance(kind, type) and issubclass(kind, Job):
        return isinstance(job, kind)
    if not isinstance(job, CallQueuedListener):
        return False
    target = getattr(job, "_target", None)
    if target is not None and (target is kind or getattr(target, "fn", None) is kind):
        return True
    if isinstance(kind, QueuedFunction):
        return job.listener == kind.path
    if isinstance(kind, type):
        try:
            return job.listener == class_path(kind)
        except Exception:
            return False
    return False


def _kind_name(kind: Any) -> str:
    return str(getattr(kind, "__qualname__", None) or getattr(kind, "path", None) or kind)


class FakeQueue:
    """Records pushed jobs instead of sending them to Redis."""

    def __init__(self) -> None:
        self.pushed: list[PendingDispatch] = []
        self._ids = itertools.count(1)

    def new_id(self) -> str:
        """The next fake job id."""
        return f"fake-{next(self._ids)}"

    def record(self, pending: PendingDispatch, job_id: str | None = None) -> str:
        """Record a push; returns its fake id."""
        self.pushed.append(pending)
        return job_id or self.new_id()

    def jobs(self, cls: JobKind | None = None) -> list[Job]:
        """Pushed jobs, of ``cls`` when given (a job class, or a queued listener class or
        function: the CallQueuedListener jobs that run it)."""
        return [p.job for p in self.pushed if cls is None or _is_kind(p.job, cls)]

    def _found(self, cls: JobKind | None, predicate: Callable[[Any], bool] | None) -> list[Job]:
        return [j for j in self.jobs(cls) if predicate is None or predicate(j)]

    def _names(self) -> list[str]:
        return [
            p.job.listener if isinstance(p.job, CallQueuedListener) else type(p.job).__qualname__
            for p in self.pushed
        ]

    def assert_pushed(
        self,
        cls: JobKind,
        predicate: Callable[[Any], bool] | None = None,
        times: int | None = None,
    ) -> None:
        """Assert a job of ``cls`` (matching ``predicate(job)``) was pushed (``times``
        times); ``cls`` may be a queued listener class or function."""
        found = self._found(cls, predicate)
        if not found or (times is not None and len(found) != times):
            want = f"{times} time(s)" if times is not None else "at least once"
            raise AssertionError(
                f"{_kind_name(cls)} pushed {len(found)} time(s), expected {want}; "
                f"pushed: {self._names()}"
            )

    def assert_pushed_on(
        self, queue: str, cls: JobKind, predicate: Callable[[Any], bool] | None = None
    ) -> None:
        """Assert a job of ``cls`` (matching ``predicate(job)``) was pushed on ``queue``."""
        for p in self.pushed:
            on = p.queue or getattr(p.job.option_source(), "queue", None) or "default"
            if on == queue and _is_kind(p.job, cls) and (predicate is None or predicate(p.job)):
                return
        raise AssertionError(f"{_kind_name(cls)} was not pushed on {queue!r}")

    def assert_not_pushed(
        self, cls: JobKind, predicate: Callable[[Any], bool] | None = None
    ) -> None:
        """Assert no job of ``cls`` (matching ``predicate(job)``) was pushed; ``cls`` may
        be a queued listener class or function ("listener X was not queued")."""
        found = self._found(cls, predicate)
        if found:
            raise AssertionError(f"{_kind_name(cls)} was pushed {len(found)} time(s)")

    def assert_count(self, n: int, predicate: Callable[[Any], bool] | None = None) -> None:
        """Assert ``n`` jobs (matching ``predicate(job)``) were pushed."""
        found = self._found(None, predicate)
        if len(found) != n:
            raise AssertionError(f"{len(found)} jobs pushed, expected {n}: {self._names()}")

    def assert_nothing_pushed(self, predicate: Callable[[Any], bool] | None = None) -> None:
        """Assert no job at all (none matching ``predicate(job)``) was pushed."""
        if self._found(None, predicate):
            raise AssertionError(f"jobs were pushed: {self._names()}")


def _deferrer(app: Any, source: Any, follow: bool) -> Callable[[Callable[[], object]], None] | None:
    """Where the real App would hold a push with options from ``source`` until commit."""
    if not follow:
        return None
    from tidings import after_commit

    wanted = option(source, "after_commit")
    if not (app.settings.after_commit if wanted is None else wanted):
        return None
    return after_commit.deferrer()


@contextmanager
def fake_queue(app: Any = None, *, follow_transactions: bool = True) -> Iterator[FakeQueue]:
    """Swap the app's pushes for a recorder for the duration of the block.

    Args:
        follow_transactions: record an ``after_commit`` push made in a transaction when
            it commits (none on rollback), as Redis would see it; False: at once.
    """
    from tidings.app import App

    app = app or App.current()
    fake = FakeQueue()

    def push(pending: PendingDispatch) -> str:
        defer = _deferrer(app, pending.job.option_source(), follow_transactions)
        if defer is None:
            return fake.record(pending)
        job_id = fake.new_id()
        defer(lambda: fake.record(pending, job_id))
        return job_id

    async def push_async(pending: PendingDispatch) -> str:
        return push(pending)

    def many(jobs: Any, **_: Any) -> list[str]:
        return [push(j if isinstance(j, PendingDispatch) else PendingDispatch(j)) for j in jobs]

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


@dataclass(frozen=True, slots=True)
class Ruled:
    """What the delivery rules did with one (notifiable, notification, channel) in a fake:
    ``detail`` is the skip reason, the digest window id, or the delayed-until time."""

    notifiable: Any
    notification: Notification
    channel: str
    detail: Any


class FakeNotifications:
    """Records notifications instead of sending or queueing them.

    ``notify()`` applies the app's delivery rules as the real sender does (preferences
    from the app's source, ``once_per``, ``digest`` and quiet hours, the last three kept
    in memory): ``sent`` holds the channels that would be queued (delayed ones included),
    ``skipped``, ``digested`` and ``delayed`` what the rules held back. Set ``now`` (an
    aware datetime) to judge quiet hours at another time. ``notify_now`` records as asked.
    """

    def __init__(self, real: Any, app: Any = None, *, follow_transactions: bool = True) -> None:
        from tidings.notifications.rules.plan import MemoryBackend

        self.channels = real.channels
        self.rules = getattr(real, "rules", None)
        self.sent: list[tuple[Any, Notification, list[str]]] = []
        self.skipped: list[Ruled] = []
        self.digested: list[Ruled] = []
        self.delayed: list[Ruled] = []
        self.backend = MemoryBackend()
        self.now: datetime | None = None
        self._app = app
        self._follow = follow_transactions

    @property
    def preferences(self) -> Any:
        """The real sender's preference source."""
        return None if self.rules is None else self.rules.preferences

    @staticmethod
    def _targets(notifiables: Any) -> list[Any]:
        return list(notifiables) if isinstance(notifiables, (list, tuple, set)) else [notifiables]

    def _record(
        self, notifiables: Any, notification: Notification, channels: list[str] | None = None
    ) -> list[Any]:
        for n in self._targets(notifiables):
            self.sent.append((n, notification, channels or notification.via(n)))
        return []

    def _record_planned(self, notifiables: Any, notification: Notification) -> list[Any]:
        from tidings.notifications.events import (
            NotificationDelayed,
            NotificationDigested,
            NotificationSkipped,
        )

        if self.rules is None:
            return self._record(notifiables, notification)
        targets = self._targets(notifiables)
        plan = self.rules.plan(targets, notification, backend=self.backend, now=self.now)
        for index, n in enumerate(targets):
            channels = [s.channel for s in plan.sends if s.index == index]
            if channels:
                self.sent.append((n, notification, channels))
        for e in plan.events:
            if isinstance(e, NotificationSkipped):
                self.skipped.append(Ruled(e.notifiable, e.notification, e.channel, e.reason))
            elif isinstance(e, NotificationDigested):
                self.digested.append(Ruled(e.notifiable, e.notification, e.channel, e.window_id))
            elif isinstance(e, NotificationDelayed):
                self.delayed.append(Ruled(e.notifiable, e.notification, e.channel, e.until))
        return []

    @staticmethod
    def _find(
        found: list[Ruled], notifiable: Any, cls: type[Notification], channel: str | None
    ) -> list[Ruled]:
        return [
            r
            for r in found
            if r.notifiable is notifiable
            and isinstance(r.notification, cls)
            and (channel is None or r.channel == channel)
        ]

    def assert_skipped(
        self,
        notifiable: Any,
        cls: type[Notification],
        channel: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Assert ``cls`` was skipped for ``notifiable`` (on ``channel``; ``"*"`` when the
        whole notification was throttled), for ``reason`` (``opted_out``/``throttled``)."""
        hits = self._find(self.skipped, notifiable, cls, channel)
        if not [r for r in hits if reason is None or r.detail == reason]:
            raise AssertionError(
                f"{_name(cls)} was not skipped for {notifiable!r}"
                f"{f' on {channel}' if channel else ''}"
                f"{f' ({reason})' if reason else ''}; skipped: "
                f"{[(r.channel, r.detail) for r in self.skipped]}"
            )

    def assert_digested(
        self,
        notifiable: Any,
        cls: type[Notification],
        channel: str | None = None,
        count: int | None = None,
    ) -> None:
        """Assert ``cls`` went into a digest for ``notifiable`` (``count`` items of it)."""
        hits = self._find(self.digested, notifiable, cls, channel)
        if not hits or (count is not None and len(hits) != count):
            raise AssertionError(
                f"{len(hits)} {_name(cls)} digested for {notifiable!r}"
                f"{f' on {channel}' if channel else ''}, expected {count or 'some'}"
            )

    def digest_windows(self, notifiable: Any, cls: type[Notification]) -> list[list[Any]]:
        """The items of each digest window of ``cls`` for ``notifiable``, oldest first."""
        ids = dict.fromkeys(r.detail for r in self._find(self.digested, notifiable, cls, None))
        return [list(self.backend.items.get(i, [])) for i in ids]

    def assert_delayed(
        self,
        notifiable: Any,
        cls: type[Notification],
        channel: str | None = None,
        until: datetime | None = None,
    ) -> None:
        """Assert quiet hours delayed ``cls`` for ``notifiable`` (until ``until``)."""
        hits = self._find(self.delayed, notifiable, cls, channel)
        if not [r for r in hits if until is None or r.detail == until]:
            raise AssertionError(
                f"{_name(cls)} was not delayed for {notifiable!r}"
                f"{f' on {channel}' if channel else ''}"
                f"{f' until {until.isoformat()}' if until else ''}; delayed: "
                f"{[(r.channel, r.detail) for r in self.delayed]}"
            )

    def _queue(self, notifiables: Any, notification: Notification) -> list[str]:
        """A queued notification: recorded when its transaction commits (after_commit)."""
        defer = None
        if self._app is not None and isinstance(notification, ShouldQueue):
            defer = _deferrer(self._app, notification, self._follow)
        if defer is None:
            return self._record_planned(notifiables, notification)
        defer(lambda: self._record_planned(notifiables, notification))
        return []

    def send(self, notifiables: Any, notification: Notification) -> list[str]:
        return self._queue(notifiables, notification)

    async def send_async(self, notifiables: Any, notification: Notification) -> list[str]:
        return self._queue(notifiables, notification)

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

    def assert_not_sent_to(
        self, notifiable: Any, cls: type[Notification], predicate: Callable[..., bool] | None = None
    ) -> None:
        """Assert ``cls`` (matching ``predicate(notification, channels)``) was not sent
        to ``notifiable``."""
        if self._matching(notifiable, cls, predicate):
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

    def _all(self, predicate: Callable[..., bool] | None) -> list[Any]:
        return [s for s in self.sent if predicate is None or predicate(s[0], s[1], s[2])]

    def assert_count(self, n: int, predicate: Callable[..., bool] | None = None) -> None:
        """Assert ``n`` (notifiable, notification) pairs (matching
        ``predicate(notifiable, notification, channels)``) were sent."""
        found = len(self._all(predicate))
        if found != n:
            raise AssertionError(f"{found} notifications sent, expected {n}")

    def assert_nothing_sent(self, predicate: Callable[..., bool] | None = None) -> None:
        """Assert nothing (nothing matching ``predicate(notifiable, notification,
        channels)``) was sent."""
        if self._all(predicate):
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
def fake_notifications(
    app: Any = None, *, follow_transactions: bool = True
) -> Iterator[FakeNotifications]:
    """Record notifications instead of sending them, for the duration of the block.

    Args:
        follow_transactions: record a queued ``after_commit`` notification sent in a
            transaction when it commits (none on rollback); False: at once.
    """
    from tidings.app import App

    app = app or App.current()
    real = app.notifications
    fake = FakeNotifications(real, app, follow_transactions=follow_transactions)
    app.notifications = fake
    try:
        yield fake
    finally:
        app.notifications = real
