"""``notify-worker groups list | show G | limit G | pause G | resume G`` (fair groups)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click
import orjson

from tidings.errors import ValidationError
from tidings.moves.groups import KEEP, GroupInfo, Keep
from tidings.observability.terminal import escape, escape_json


def _rate(info: GroupInfo) -> str:
    if info.rate_per_s is None:
        return "-"
    per_min = info.rate_per_s * 60
    return f"{per_min:g}/min" if per_min < 600 else f"{info.rate_per_s:g}/s"


def _state(info: GroupInfo) -> str:
    if info.paused:
        return "paused"
    if info.ready and not info.in_turn:
        return "out of turn"  # taken out for garbage: `groups resume` tries it again
    return "active" if info.ready or info.running else "idle"


def make_group(load_app: Callable[[click.Context], Any]) -> click.Group:
    """The ``groups`` command group; ``load_app(ctx)`` gives the App."""

    @click.group()
    def group() -> None:
        """Fair groups within a queue: backlog, limits, pause and resume."""

    queue_opt = click.option("--queue", "-q", default="default", show_default=True)

    def _call(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ValidationError as exc:
            raise click.ClickException(escape(str(exc))) from None

    @group.command("list")
    @queue_opt
    @click.option("--top", default=50, show_default=True, help="Show the N biggest backlogs.")
    @click.option("--json", "as_json", is_flag=True)
    @click.pass_context
    def list_(ctx: click.Context, queue: str, top: int, as_json: bool) -> None:
        """The queue's groups, the biggest backlog first."""
        found = load_app(ctx).groups.list(queue=queue, top=top)
        if as_json:
            click.echo(escape_json(orjson.dumps([asdict(i) for i in found]).decode()))
            return
        if not found:
            click.echo(f"No groups on {escape(queue)}.")
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(title=Text(f"fair groups of {escape(queue)} (top {top} by backlog)"))
        for col in ("group", "ready", "running", "done", "failed", "concurrency", "rate", "state"):
            t.add_column(col, justify="left" if col in ("group", "state") else "right")
        for i in found:
            t.add_row(
                Text(escape(i.name)),  # group keys are data: escaped, never markup
                str(i.ready),
                str(i.running),
                str(i.done),
                str(i.failed),
                str(i.concurrency or "-"),
                _rate(i),
                _state(i),
            )
        Console().print(t)

    @group.command("show")
    @click.argument("name")
    @queue_opt
    @click.option("--json", "as_json", is_flag=True)
    @click.pass_context
    def show(ctx: click.Context, name: str, queue: str, as_json: bool) -> None:
        """One group: its backlog, running jobs, limits and state."""
        i = _call(lambda: load_app(ctx).groups.show(name, queue=queue))
        if as_json:
            click.echo(escape_json(orjson.dumps(asdict(i)).decode()))
            return
        click.echo(f"group:       {escape(i.name)}\nqueue:       {escape(i.queue)}")
        click.echo(f"state:       {_state(i)}")
        click.echo(f"ready:       {i.ready}\nrunning:     {i.running}")
        click.echo(f"done:        {i.done}\nfailed:      {i.failed}  (since it became active)")
        click.echo(f"concurrency: {i.concurrency or '-'}\nrate:        {_rate(i)}")

    @group.command("limit")
    @click.argument("name")
    @queue_opt
    @click.option("--concurrency", type=int, default=None, help="Most jobs running at once.")
    @click.option("--no-concurrency", is_flag=True, help="Remove the concurrency limit.")
    @click.option("--rate", default=None, help="Most jobs started, e.g. 100/min.")
    @click.option("--no-rate", is_flag=True, help="Remove the rate limit.")
    @click.option("--burst", type=int, default=None, help="Starts at once after a quiet spell "
                  "(with --rate; default 1).")  # fmt: skip
    @click.pass_context
    def limit(
        ctx: click.Context,
        name: str,
        queue: str,
        concurrency: int | None,
        no_concurrency: bool,
        rate: str | None,
        no_rate: bool,
        burst: int | None,
    ) -> None:
        """Set a group's limits; a limit not named keeps its current value
        (--no-concurrency / --no-rate remove one)."""
        if no_concurrency and concurrency is not None:
            raise click.UsageError("give --concurrency N or --no-concurrency, not both")
        if no_rate and rate is not None:
            raise click.UsageError("give --rate R or --no-rate, not both")
        app = load_app(ctx)
        conc: int | Keep | None = (
            None if no_concurrency else KEEP if concurrency is None else concurrency
        )
        spec: str | Keep | None = None if no_rate else KEEP if rate is None else rate
        _call(lambda: app.groups.limit(name, concurrency=conc, rate=spec, burst=burst, queue=queue))
        i = _call(lambda: app.groups.show(name, queue=queue))
        click.echo(
            f"Group {escape(name)} on {escape(queue)}: concurrency {i.concurrency or '-'}, "
            f"rate {_rate(i)}."
        )

    @group.command("pause")
    @click.argument("name")
    @queue_opt
    @click.pass_context
    def pause(ctx: click.Context, name: str, queue: str) -> None:
        """Stop taking a group's jobs (they stay queued; running ones finish)."""
        _call(lambda: load_app(ctx).groups.pause(name, queue=queue))
        click.echo(f"Paused group {escape(name)} on {escape(queue)}.")

    @group.command("resume")
    @click.argument("name")
    @queue_opt
    @click.pass_context
    def resume(ctx: click.Context, name: str, queue: str) -> None:
        """Take a group's jobs in turn again."""
        _call(lambda: load_app(ctx).groups.resume(name, queue=queue))
        click.echo(f"Resumed group {escape(name)} on {escape(queue)}.")

    return group
