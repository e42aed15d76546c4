"""``notify-worker broadcast-server``: the SSE endpoint on its own (uvicorn), for apps that
serve no ASGI (Flask, WSGI Django), as Laravel's Reverb runs beside a PHP app."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from tidings.errors import ConfigurationError

TOKEN_ENV = "TIDINGS_BROADCAST_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) is loopback only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, has_authorizers: bool) -> None:
    """Refuse a non-loopback address unless a token or an authorisation callback guards it.

    Raises:
        ConfigurationError: naming the two ways to allow it.
    """
    if is_loopback(host) or token or has_authorizers:
        return
    raise ConfigurationError(
        f"refusing to serve broadcasts on {host!r} (not loopback) with nothing guarding "
        f"them: set {TOKEN_ENV} (or --token), or register the app's authorisation "
        "callback (@app.broadcasting.channel('orders.{id}')) and subscribe to private- "
        "channels only"
    )


def build(app: Any, *, token: str | None = None) -> Any:
    """The ASGI app the server runs: the endpoint at every path."""
    from tidings.broadcasting.sse import BroadcastEndpoint

    return BroadcastEndpoint(app, token=token)


def serve(app: Any, *, host: str = "127.0.0.1", port: int = 8766, token: str | None = None) -> None:
    """Run the endpoint with uvicorn until interrupted (the checks of :func:`check_bind`)."""
    import uvicorn

    token = token or os.environ.get(TOKEN_ENV) or None
    check_bind(host, token, app.broadcasting.has_authorizers)
    uvicorn.run(build(app, token=token), host=host, port=port, log_level="warning",
                access_log=False, lifespan="on")  # fmt: skip
