"""The App and jobs the dashboard tests run under ``notify-worker -A tests.observe.dash_app:app``.

Built from the environment on first access (``TIDINGS_REDIS_URL``, ``TIDINGS_KEY``,
``TIDINGS_PREFIX``). ``Flaky`` fails until ``<prefix>:test:fixed`` is set, then records
its run in ``<prefix>:test:ran``; ``Hostile`` carries markup and a credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tidings import App, Job

_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = App.from_env(
                allowed_modules=os.environ.get("TIDINGS_ALLOWED_MODULES") or __name__
            )
        return _app
    raise AttributeError(name)


def key(name: str) -> str:
    return f"{App.current().settings.prefix}:test:{name}"


@dataclass
class Flaky(Job):
    """Fails until the test sets ``test:fixed``."""

    tag: str

    async def handle(self) -> None:
        r = App.current().queue_for(None).aclient()
        if not await r.get(key("fixed")):
            raise RuntimeError(f"flaky {self.tag}: not fixed yet")
        await r.hincrby(key("ran"), self.tag, 1)


@dataclass
class Quick(Job):
    n: int

    async def handle(self) -> None:
        return None


@dataclass
class Hostile(Job):
    """A payload a hostile client could push: markup everywhere, a password inside."""

    note: str
    password: str
    api_key: str

    def display_name(self) -> str:
        return "<img src=x onerror=alert(1)>Hostile"

    async def handle(self) -> None:
        raise ValueError(f"<script>alert('boom')</script> {self.note}")


@dataclass
class Leaky(Job):
    """Fails quoting a dict whose keys carry credentials (issue 29)."""

    headers: dict[str, str]

    async def handle(self) -> None:
        raise ValueError(f"bad headers {self.headers}")


@dataclass
class Crawl(Job):
    """A long async job reporting progress (``steps`` of ``pause`` seconds each), with a
    note that may carry control characters. Records ``test:crawl:<tag>`` as
    ``cancelled`` when cancelled (its ``finally`` ran), ``finished`` when it ended."""

    tag: str
    steps: int = 1000
    pause: float = 0.05
    note: str = "page"

    async def handle(self) -> None:
        import asyncio

        r = App.current().queue_for(None).aclient()
        outcome = "finished"
        try:
            for i in range(1, self.steps + 1):
                self.progress(i, self.steps, note=f"{self.note} {i}")
                await asyncio.sleep(self.pause)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            await r.hset(key("crawl"), self.tag, outcome)

    def failed(self, exc: BaseException) -> None:
        App.current().queue_for(None).client.hset(key("crawl-failed"), self.tag, repr(exc))
