"""``notify-worker broadcast-server``: serve browsers their broadcasts (SSE) on their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from tidings._version import __version__


def register(main: click.Group, load: Callable[[click.Context], Any]) -> None:
    """Add ``broadcast-server`` to ``notify-worker``."""

    @main.command("broadcast-server")
    @click.option(
        "-A",
        "--app",
        "app_spec",
        default=None,
        help="The App as module:attribute (else the one given before the command).",
    )
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
    @click.option("--port", default=8766, show_default=True, help="Port to bind.")
    @click.option(
        "--token",
        default=None,
        help="Token every request must carry (better: TIDINGS_BROADCAST_TOKEN).",
    )
    @click.pass_context
    def broadcast_server(ctx: click.Context, app_spec: str | None, host: str, port: int,
                         token: str | None) -> None:  # fmt: skip
        """Serve Server-Sent Events to browsers (needs: pip install 'tidings[broadcast]')."""
        try:
            import uvicorn  # noqa: F401

            from tidings.broadcasting.server import TOKEN_ENV, check_bind, serve
        except ImportError as exc:
            raise click.ClickException(
                f"the broadcast server needs its extra: pip install 'tidings[broadcast]' ({exc})"
            ) from None
        import os

        from tidings.errors import ConfigurationError

        if app_spec:
            ctx.obj["app_spec"] = app_spec
        token = token or os.environ.get(TOKEN_ENV) or None
        app = load(ctx)
        try:
            check_bind(host, token, app.broadcasting.has_authorizers)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from None
        shown = f"[{host}]" if ":" in host else host
        click.echo(
            f"tidings {__version__} broadcast server on http://{shown}:{port}/?channel=NAME "
            f"(token: {'on' if token else 'off'}; private channels: "
            f"{'by the app callback' if app.broadcasting.has_authorizers else 'refused'})"
        )
        serve(app, host=host, port=port, token=token)
