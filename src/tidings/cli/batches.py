"""``notify-worker batches list | show ID | cancel ID | prune``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import click
import orjson

from tidings.observability.terminal import escape, escape_json
from tidings.workflows import batch as batches


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _state(b: batches.BatchInfo) -> str:
    if b.finished:
        return "finished"
    return "cancelled" if b.cancelled else "running"


def make_group(load_app: Callable[[click.Context], Any]) -> click.Group:
    """The ``batches`` command group; ``load_app(ctx)`` gives the App."""

    @click.group()
    def group() -> None:
        """Inspect, cancel and prune job batches."""

    @group.command("list")
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--limit", default=50, show_default=True)
    @click.pass_context
    def list_(ctx: click.Context, as_json: bool, limit: int) -> None:
        """List the most recent batches."""
        found = batches.list_batches(load_app(ctx), limit)
        if as_json:
            click.echo(escape_json(orjson.dumps([b.summary() for b in found]).decode()))
            return
        if not found:
            click.echo("No batches.")
        for b in found:
            name = escape(b.name[:20])  # batch names and ids are data: escape
            click.echo(
                f"{escape(b.id)}  {_when(b.created_at)}  {name:<20} {_state(b):<9} "
                f"{b.progress:6.2f}%  {b.processed}/{b.total} done, {b.failed} failed"
            )

    @group.command("show")
    @click.argument("batch_id")
    @click.option("--json", "as_json", is_flag=True)
    @click.pass_context
    def show(ctx: click.Context, batch_id: str, as_json: bool) -> None:
        """Show one batch: its counters, times and failed job ids."""
        app = load_app(ctx)
        b = batches.find_batch(app, batch_id)
        if b is None:
            raise click.ClickException(f"no batch {escape(batch_id)}")
        failed = batches.failed_job_ids(app, batch_id)
        if as_json:
            click.echo(escape_json(orjson.dumps({**b.summary(), "failed_ids": failed}).decode()))
            return
        bid, name = escape(b.id), escape(b.name)
        click.echo(f"id:        {bid}\nname:      {name}\nstate:     {_state(b)}")
        click.echo(f"progress:  {b.progress:.2f}%")
        click.echo(f"total:     {b.total}\npending:   {b.pending}")
        click.echo(f"processed: {b.processed}\nfailed:    {b.failed}")
        click.echo(f"created:   {_when(b.created_at)}\nfinished:  {_when(b.finished_at)}")
        click.echo(f"cancelled: {_when(b.cancelled_at)}")
        for job_id in failed:
            click.echo(f"  failed job {escape(job_id)}")

    @group.command("cancel")
    @click.argument("batch_id")
    @click.pass_context
    def cancel(ctx: click.Context, batch_id: str) -> None:
        """Cancel a batch: its jobs not started yet are skipped."""
        ok = batches.cancel_batch(load_app(ctx), batch_id)
        shown = escape(batch_id)
        click.echo(f"Cancelled {shown}." if ok else f"{shown} was not running.")

    @group.command("prune")
    @click.option("--hours", default=24.0, show_default=True)
    @click.option("--unfinished", is_flag=True, help="Also unfinished batches that old.")
    @click.pass_context
    def prune(ctx: click.Context, hours: float, unfinished: bool) -> None:
        """Delete batches finished more than N hours ago."""
        n = batches.prune_batches(load_app(ctx), hours * 3600, unfinished=unfinished)
        from tidings.cli.observe import plural

        unit = "hour" if hours == 1 else "hours"
        click.echo(f"Deleted {plural(n, 'batch', 'batches')} older than {hours:g} {unit}.")

    return group
