"""``notify-worker db upgrade | prune --days N [--read-only]``: the database channel's table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from tidings.errors import TidingsError


def make_group(load_app: Callable[[click.Context], Any]) -> click.Group:
    """The ``db`` command group; ``load_app(ctx)`` gives the App."""

    @click.group()
    def group() -> None:
        """The notifications table of the database channel (TIDINGS_DATABASE_URL)."""

    @group.command("upgrade")
    @click.pass_context
    def upgrade(ctx: click.Context) -> None:
        """Create the notifications and notification_preferences tables where missing."""
        store = load_app(ctx).database
        try:
            created = store.upgrade()
        except TidingsError:
            raise
        except Exception as exc:
            raise click.ClickException(str(store.error(exc))) from None
        verb = "Created" if created else "Up to date:"
        click.echo(f"{verb} table {store.table.fullname} in {store.url}")
        click.echo(f"Table {store.preferences_table.fullname} (notification preferences) ready")

    @group.command("prune")
    @click.option("--days", type=float, default=30.0, show_default=True)
    @click.option("--read-only", is_flag=True, help="Only notifications already read.")
    @click.pass_context
    def prune(ctx: click.Context, days: float, read_only: bool) -> None:
        """Delete notifications older than N days."""
        store = load_app(ctx).database
        try:
            n = store.prune(days * 86400, read_only=read_only)
        except TidingsError:
            raise
        except Exception as exc:
            raise click.ClickException(str(store.error(exc))) from None
        kind = "read notifications" if read_only else "notifications"
        click.echo(f"Deleted {n} {kind} older than {days:g} days.")

    return group
