"""Events the discovered listeners handle; no listeners here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OrderPlaced:
    order_id: int


@dataclass
class OrderShipped:
    order_id: int


@dataclass
class OrderCancelled:
    order_id: int
