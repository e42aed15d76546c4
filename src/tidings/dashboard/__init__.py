"""The tidings dashboard: an ASGI app (Starlette) showing queues, workers, failed jobs,
batches and job status, with Prometheus text at ``/metrics``.

Install with ``pip install 'tidings[dashboard]'``; run ``notify-worker dashboard`` or
mount :func:`create_app` inside a FastAPI / Starlette app (``app.mount("/tidings",
create_app(tidings_app))``) or a Django ASGI app (:class:`PrefixDispatcher`).
"""

from __future__ import annotations

from tidings.dashboard.security import Auth, check_bind
from tidings.dashboard.web import PrefixDispatcher, create_app

__all__ = ["Auth", "PrefixDispatcher", "check_bind", "create_app"]
