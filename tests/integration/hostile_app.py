"""The App ``notify-worker -A tests.integration.hostile_app:app`` runs in the CLI escaping tests.

Built on first access from ``TIDINGS_REDIS_URL``, ``TIDINGS_KEY``, ``TIDINGS_PREFIX``.
Its one job raises, and its ``failed()`` hook raises too, with whatever text it carries:
control sequences from job data reach the worker's lines and its log through both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tidings import App, Job

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(allowed_modules=__name__)
        return _app
    raise AttributeError(name)


@dataclass
class Hostile(Job):
    """Fails with ``text`` in its exception and in its failed() hook's."""

    text: str
    tries: ClassVar[int | None] = 1

    def handle(self) -> None:
        raise RuntimeError(f"handler says {self.text}")

    def failed(self, exc: BaseException) -> None:
        raise ValueError(f"hook says {self.text}")
