"""Bases that discovery must skip: no hint, ``Any``, a type variable, abstract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from tidings.events import Listener

from ..events import OrderPlaced

E = TypeVar("E")


class Unhinted(Listener):
    def handle(self, event):  # type: ignore[no-untyped-def]
        return event


class AnyHinted(Listener):
    def handle(self, event: Any) -> Any:
        return event


class GenericBase(Listener, Generic[E]):
    def handle(self, event: E) -> E:
        return event


class AbstractOrderListener(Listener, ABC):
    @abstractmethod
    def handle(self, event: OrderPlaced) -> str: ...
