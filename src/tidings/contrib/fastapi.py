"""FastAPI / Starlette: a lifespan that opens the App's Redis client at start-up and
closes its clients at shutdown.

::

    from fastapi import FastAPI
    from tidings.contrib.fastapi import lifespan

    api = FastAPI(lifespan=lifespan(make_app))   # an App, or a callable returning one

    @api.post("/signup")
    async def signup(body: SignupIn) -> dict[str, str]:
        await tidings_app.dispatch_async(UserRegistered(body))   # never event() here

In an async route, use the async twins (``await app.dispatch_async(e)``,
``await job.dispatch_async()``, ``await user.notify_async(n)``): the sync ones block the
event loop on Redis, and tidings warns once (``BlockingDispatchWarning``) when they do.
The lifespan state carries the App as ``request.state.tidings``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from tidings.app import App

AppSource = App | Callable[[], App] | None


def _make(source: AppSource) -> App:
    if source is None:
        return App.from_env()
    if isinstance(source, App):
        return source
    return source()


def lifespan(
    source: AppSource = None,
) -> Callable[[Any], AbstractAsyncContextManager[dict[str, Any]]]:
    """A Starlette/FastAPI ``lifespan``: makes the App current, opens and closes it.

    Args:
        source: the App, a callable creating it (called at start-up), or None for
            ``App.from_env()``.
    """

    @asynccontextmanager
    async def run(_asgi_app: Any) -> AsyncIterator[dict[str, Any]]:
        app = _make(source).make_current()
        if "sqlalchemy.orm" in sys.modules:
            from tidings.contrib.sqlalchemy import install

            install()
        try:
            await app.aopen()
            yield {"tidings": app}
        finally:
            await app.aclose()

    return run
