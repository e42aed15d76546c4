"""The App and notifications the notification benchmarks queue and drain.

Configured from the environment that ``benchmarks/run.py`` sets (``TIDINGS_REDIS_URL``,
``TIDINGS_KEY``, ``TIDINGS_PREFIX``), plus what ``benchmarks/bench_notify.py`` gives the
worker it spawns: ``TIDINGS_MAIL_URL`` (``smtp://127.0.0.1:<sink>?tls=off``) and
``TIDINGS_WEBHOOK_SECRET``::

    notify-worker -A benchmarks.bench_notify_app:app --stop-when-empty

The sinks listen on 127.0.0.1, which the webhook SSRF guard refuses by default; this
App sets the documented ``webhook_allow_private=True`` (``TIDINGS_WEBHOOK_ALLOW_PRIVATE``
in docs/security.md), in the producer (routes are vetted at ``notify()`` time) and in
the worker alike.

``WorkerStarting`` appends the worker's wall clock to a bench-only list under the prefix
(:func:`mark_key`), so a drain is timed from the worker's start, not from Python start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tidings import App, ShouldQueue
from tidings.notifications import MailMessage, Notification, WebhookMessage
from tidings.observability.lifecycle import WorkerStarting

app = App(allowed_modules=["benchmarks"], webhook_allow_private=True)


def mark_key(name: str) -> str:
    """Key of a bench-only record (outside every queue's keys)."""
    return f"{app.settings.prefix}:bench:notify:{name}"


@dataclass
class BenchMail(Notification, ShouldQueue):
    """A short queued mail: subject, greeting, two lines and a button (HTML + text)."""

    order: str = "O-1"

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return (
            MailMessage()
            .subject(f"Order {self.order} shipped")
            .greeting("Hello,")
            .line(f"Your order {self.order} is on its way.")
            .action("Track it", "https://example.org/track")
            .line("Thanks for shopping with us.")
        )


@dataclass
class BenchHook(Notification, ShouldQueue):
    """A queued, signed webhook with a small JSON body."""

    order: str = "O-1"

    def via(self, notifiable: Any) -> list[str]:
        return ["webhook"]

    def to_webhook(self, notifiable: Any) -> WebhookMessage:
        return WebhookMessage({"order": self.order, "status": "shipped"}, type="order.shipped")


def _on_starting(event: WorkerStarting) -> None:
    app.queue_for(None).client.rpush(mark_key("started"), f"{time.time():.6f}")


app.listen(WorkerStarting, _on_starting)
