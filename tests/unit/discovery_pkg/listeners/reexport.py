"""Imports a listener defined elsewhere: discovery registers it once, where defined."""

from __future__ import annotations

from .orders import ReserveStock

__all__ = ["ReserveStock"]
