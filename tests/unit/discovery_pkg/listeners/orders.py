"""Concrete listeners, in definition order."""

from __future__ import annotations

from tidings.events import Listener, ShouldQueue

from ..events import OrderCancelled, OrderPlaced, OrderShipped
from .base import AbstractOrderListener


class ReserveStock(Listener):
    def handle(self, event: OrderPlaced) -> str:
        return f"reserved {event.order_id}"


class NotifyCustomer(Listener, ShouldQueue):
    def handle(self, event: OrderShipped | OrderCancelled) -> None:
        return None


class ChargeCard(AbstractOrderListener):
    def handle(self, event: OrderPlaced) -> str:
        return f"charged {event.order_id}"
