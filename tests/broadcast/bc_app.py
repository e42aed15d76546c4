"""The app the broadcast tests run: events, a notification, and who may hear what.

A request's user is the ``user`` cookie or ``X-User`` header (a stand-in for a session);
user N may subscribe to ``private-orders.N`` and ``private-User.N`` only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tidings import App, ShouldQueue
from tidings.broadcasting import BroadcastMessage, ShouldBroadcast
from tidings.notifications import Notifiable, Notification

# In the test process (no TIDINGS_REDIS_URL) a placeholder that never connects: each test
# makes its own App current; the servers and workers it starts read the environment.
app = (
    App.from_env()
    if os.environ.get("TIDINGS_REDIS_URL")
    else App(env=False, redis_url="redis://127.0.0.1:9/0", key="placeholder-key-0123456789abcdef")
)
app.broadcasting.heartbeat_s = float(os.environ.get("BC_HEARTBEAT_S", "15"))
app.broadcasting.max_len = int(os.environ.get("BC_MAX_LEN", "1000"))
app.broadcasting.client_buffer = int(os.environ.get("BC_CLIENT_BUFFER", "1000"))


@app.broadcasting.user_resolver
def user_of(request: Any) -> int | None:
    raw = request.cookies.get("user") or request.headers.get("x-user")
    return int(raw) if raw and raw.isdigit() else None


@app.broadcasting.channel("orders.{order_id}")
def may_hear_order(user: int | None, order_id: str) -> bool:
    return user is not None and str(user) == order_id


@app.broadcasting.channel("User.{user_id}")
async def may_hear_user(user: int | None, user_id: str) -> bool:
    return user is not None and str(user) == user_id


@dataclass
class OrderShipped(ShouldBroadcast):
    order_id: int
    note: str

    def broadcast_on(self) -> list[str]:
        return [f"private-orders.{self.order_id}", "orders"]


@dataclass
class Announcement(ShouldBroadcast):
    text: str

    def broadcast_on(self) -> str:
        return "news"

    def broadcast_as(self) -> str:
        return "news.posted"

    def broadcast_with(self) -> dict[str, Any]:
        return {"text": self.text.upper()}


@dataclass
class User(Notifiable):
    id: int
    email: str = ""


class InvoicePaid(Notification, ShouldQueue):
    def __init__(self, amount: int) -> None:
        self.amount = amount

    def via(self, notifiable: Any) -> list[str]:
        return ["broadcast"]

    def to_broadcast(self, notifiable: Any) -> BroadcastMessage:
        return BroadcastMessage({"amount": self.amount, "text": f"Invoice paid: {self.amount}"})
