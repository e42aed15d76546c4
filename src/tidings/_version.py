"""The version of tidings: the one place it is written (pyproject.toml reads it here).

A constant rather than ``importlib.metadata.version()``, which costs ~40 ms at every
worker start."""

from __future__ import annotations

__version__ = "0.1.0"
