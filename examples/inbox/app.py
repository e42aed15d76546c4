"""The inbox example: in-app notifications (the bell icon), Slack, and a sealed payload.

InvoicePaid ──▶ user.notify() ──▶ two jobs, their data encrypted in Redis (ShouldBeEncrypted)
                                  ├─ database → a row in .tidings/notifications.sqlite3
                                  └─ slack    → chat.postMessage on a local stand-in for Slack

Runs on the embedded defaults. ``run.py`` beside this file starts the Slack stand-in
and a worker, then reads the user's notifications back.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidings import App, ShouldBeEncrypted, ShouldQueue
from tidings.notifications import Notifiable, Notification, SlackMessage

app = App.from_env()


@dataclass
class User(Notifiable):
    id: int
    name: str
    email: str
    slack_channel: str = "#billing"


@dataclass
class InvoicePaid(Notification, ShouldQueue, ShouldBeEncrypted):
    invoice: int
    amount: str
    tries = 3

    def via(self, notifiable: User) -> list[str]:
        return ["database", "slack"]

    def to_database(self, notifiable: User) -> dict[str, object]:
        return {"invoice": self.invoice, "amount": self.amount, "email": notifiable.email}

    def to_slack(self, notifiable: User) -> SlackMessage:
        return (
            SlackMessage(f"Invoice {self.invoice} paid by {notifiable.name}")
            .header("Invoice paid")
            .section(
                f"*{notifiable.name}* paid *${self.amount}*", fields={"Invoice": str(self.invoice)}
            )
            .button("View invoice", f"https://example.org/invoices/{self.invoice}", style="primary")
            .context("tidings inbox example")
        )
