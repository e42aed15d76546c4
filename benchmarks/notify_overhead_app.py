"""The App, job, channel and notification of ``benchmarks/notify_overhead.py``."""

from __future__ import annotations

from dataclasses import dataclass

from tidings import App, Job
from tidings.events.listener import ShouldQueue
from tidings.notifications import Notification
from tidings.worker.worker import Worker, WorkerOptions

app = App(allowed_modules=["benchmarks"])


@dataclass
class NoOpJob(Job):
    """The bare job: an async ``handle`` that does nothing."""

    n: int = 0

    async def handle(self) -> None:
        return None


class NoOpChannel:
    """A channel that sends nothing (what is left is tidings' own cost)."""

    async def send(self, notifiable: object, notification: object) -> None:
        return None


app.extend_channel("noop", NoOpChannel)


@dataclass
class User:
    """A notifiable with a route for every channel."""

    id: int

    def route_notification_for(self, channel: str, notification: object) -> str:
        return f"user-{self.id}"


class Hello(Notification, ShouldQueue):
    """A queued notification on the no-op channel."""

    def via(self, notifiable: object) -> list[str]:
        return ["noop"]


def fill(kind: str, n: int) -> None:
    """Queue ``n`` bare jobs or ``n`` queued notifications (one per user)."""
    for start in range(0, n, 1000):
        batch = range(start, min(n, start + 1000))
        if kind == "bare":
            app.dispatch_many([NoOpJob(i) for i in batch])
        else:
            app.notify([User(i) for i in batch], Hello())


async def drain() -> None:
    """Run a bare Worker until the queue is empty."""
    await Worker(app, WorkerOptions(concurrency=16, stop_when_empty=True)).run()
