"""The installed version of tidings (from the package metadata)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tidings")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"
