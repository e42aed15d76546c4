"""The observing side of ``notify-worker``: banner, ``--version``, ``dashboard``,
``workers``, ``monitor --watch``, JSON log lines, plurals.

Plain functions that :mod:`tidings.cli.main` calls, so the worker's own CLI stays small.
Every text that comes from Redis or job data goes through
:func:`tidings.observability.terminal.escape` (JSON output through ``escape_json``)
before it reaches a terminal.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import orjson

from tidings._version import __version__
from tidings.app import App
from tidings.moves.queues import RedisQueue
from tidings.observability.redaction import mask_url, redact
from tidings.observability.terminal import EscapingFormatter, escape, escape_json
from tidings.redis.keys import known_queues_key


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 job``, ``2 jobs``."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


_utc_cache: tuple[int, str] = (-1, "")


def utc_stamp() -> str:
    """UTC ISO-8601 to the second (``2026-11-24T18:55:01Z``), formatted once a second."""
    global _utc_cache
    now = int(time.time())
    if _utc_cache[0] != now:
        _utc_cache = (now, dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _utc_cache[1]


def child_tag() -> str:
    """``[2:4711] `` in a supervised child (its number and pid), else empty."""
    slot = os.environ.get("TIDINGS_CHILD")
    return f"[{slot}:{os.getpid()}] " if slot else ""


def _iso_ms(t: float) -> str:
    stamp = dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def child_number() -> int:
    """The supervised child's number (1..N), 0 when not supervised."""
    slot = os.environ.get("TIDINGS_CHILD", "")
    return int(slot) if slot.isdigit() else 0


def child_fields() -> dict[str, int | str]:
    """``{"child": 2, "pid": 4711}`` in a supervised child (for JSON lines), else empty."""
    slot = os.environ.get("TIDINGS_CHILD")
    if not slot:
        return {}
    return {"child": int(slot) if slot.isdigit() else slot, "pid": os.getpid()}


class JsonFormatter(logging.Formatter):
    """Log records as one JSON object a line, with a UTC ISO-8601 time."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso_ms(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        out.update(child_fields())
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        # Messages carry job data and remote replies: terminal-safe, same JSON data.
        return escape_json(orjson.dumps(out).decode())


def setup_logging(*, json_logs: bool) -> None:
    """Root logging for a worker: JSON lines, or text prefixed with the child tag."""
    handler = logging.StreamHandler()
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        # Redacts secrets and escapes control characters: log lines carry job data.
        handler.setFormatter(EscapingFormatter(
            f"{child_tag()}%(asctime)s %(levelname)s %(name)s: %(message)s"))  # fmt: skip
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def _processes(opts: dict[str, Any]) -> int:
    """Worker processes in this deployment: the supervisor's N in its children."""
    n = os.environ.get("TIDINGS_CHILDREN", "")
    return int(n) if n.isdigit() else int(opts.get("processes") or 1)


def banner_lines(app: App, opts: dict[str, Any], queues: list[str]) -> list[str]:
    """The worker's start-up banner: what it runs on, with every secret masked."""
    s = app.settings
    redis_text = mask_url(s.redis_url)
    if s.embedded:
        redis_text += (
            f"  (embedded: no TIDINGS_REDIS_URL set; directory {s.home}, {s.where('home')})"
        )
    else:
        redis_text += f"  (from {s.where('redis_url')})"
    lines = [
        f"tidings {__version__} worker, pid {os.getpid()}",
        f"  redis:       {redis_text}",
        f"  prefix:      {s.prefix}",
        f"  queues:      {', '.join(queues)} (in priority order)",
        f"  concurrency: {opts.get('concurrency')}   processes: {_processes(opts)}",
        f"  modules:     {', '.join(s.allowed_modules)}",
        f"  mail:        {mask_url(s.mail_url)}",
        f"  sms:         {mask_url(s.sms_url)}",
        f"  metrics:     {'on' if s.metrics else 'off'}"
        + (f", Prometheus on :{opts['metrics_port']}" if opts.get("metrics_port") else ""),
    ]
    warning = embedded_warning(app)
    if warning:
        lines.append(f"  WARNING:     {warning}")
    return [escape(line) for line in lines]


def embedded_warning(app: App) -> str | None:
    """The banner's warning when this process started a new, empty embedded Redis: it
    will find no job pushed to another Redis or from another directory."""
    from tidings.ops.embedded import STARTED

    s = app.settings
    if not (s.embedded and Path(s.home) in STARTED):
        return None
    try:
        if int(app.queue_for(None).client.dbsize()) != 0:
            return None
    except Exception:  # the banner must not fail a start
        return None
    return (
        f"this worker started a new, empty embedded Redis in {s.home} ({s.where('home')}): "
        "jobs pushed to another Redis or from another directory are not seen here; set "
        "TIDINGS_REDIS_URL (or TIDINGS_HOME) to the one your app pushes to"
    )


def mail_warning(app: App) -> str | None:
    """A worker on a real Redis whose mail would go to the outbox directory by default
    (mail nobody reads): the WARNING it logs at start."""
    s = app.settings
    if s.embedded or not s.mail_url.startswith("file:") or "mail_url" in s.sources:
        return None
    return (
        f"mail is written to files in {s.mail_url[len('file://') :]}, not sent: no mail_url "
        "is set while Redis is a real server; set TIDINGS_MAIL_URL (or App(mail_url=...), "
        "settings.TIDINGS['mail_url'], or Django's EMAIL_* settings) to send it"
    )


def print_banner(app: App, opts: dict[str, Any], queues: list[str], *, json_logs: bool) -> None:
    if json_logs:
        s = app.settings
        record = {
            "time": utc_stamp(),
            "status": "Starting",
            "version": __version__,
            "pid": os.getpid(),
            "redis": mask_url(s.redis_url),
            "embedded": s.embedded,
            "queues": queues,
            "concurrency": opts.get("concurrency"),
            "processes": _processes(opts),
            "allowed_modules": list(s.allowed_modules),
            "mail": mask_url(s.mail_url),
            "sms": mask_url(s.sms_url),
            **child_fields(),
        }
        warning = embedded_warning(app)
        if warning:
            record["warning"] = warning
        sys.stdout.write(escape_json(orjson.dumps(record).decode()) + "\n")
    else:
        tag = child_tag()
        sys.stdout.write("".join(f"{tag}{line}\n" for line in banner_lines(app, opts, queues)))
    sys.stdout.flush()
    warning = mail_warning(app)
    if warning:
        logging.getLogger("tidings.worker").warning("%s", warning)


# -- subcommands ---------------------------------------------------------------------------


def _num(value: Any) -> int:
    try:
        return round(float(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def _age(ts: Any) -> str:
    try:
        s = max(0.0, time.time() - float(ts))
    except (TypeError, ValueError):
        return "?"
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m"


def register(main: click.Group, load: Callable[[click.Context], Any]) -> None:
    """Add ``dashboard`` and ``workers`` to ``notify-worker``."""

    @main.command()
    @click.option("--json", "as_json", is_flag=True, help="One JSON array of heartbeats.")
    @click.pass_context
    def workers(ctx: click.Context, as_json: bool) -> None:
        """List live workers (as the dashboard shows them)."""
        from tidings.observability.metrics import live_workers

        rq = load(ctx).queue_for(None)
        beats = live_workers(rq.client, rq.prefix)
        if as_json:
            # A heartbeat's fields are whatever was written to Redis: terminal-safe,
            # same JSON data.
            click.echo(escape_json(orjson.dumps(beats).decode()))
            return
        if not beats:
            click.echo("No live workers.")
            return
        click.echo(
            f"{'host':<24} {'pid':>7} {'pool':<12} {'queues':<24} {'conc':>5} {'running':>7} "
            f"{'processed':>9} {'rss':>8} {'beat':>5}"
        )
        for b in beats:
            raw_queues = b.get("queues")
            queues = ",".join(str(q) for q in raw_queues) if isinstance(raw_queues, list) else ""
            nums = [_num(b.get(k)) for k in ("pid", "concurrency", "running", "processed")]
            click.echo(escape(
                f"{str(b.get('host'))[:24]:<24} {nums[0]:>7} {str(b.get('pool') or '-')[:12]:<12} "
                f"{queues[:24]:<24} "
                f"{nums[1]:>5} {nums[2]:>7} {nums[3]:>9} "
                f"{_num(b.get('rss_mb')):>6}MB {_age(b.get('beat_at')):>5}"))  # fmt: skip
        click.echo(plural(len(beats), "live worker"))

    @main.command()
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
    @click.option("--port", default=8765, show_default=True, help="Port to bind.")
    @click.option("--token", default=None, help="Access token (better: TIDINGS_DASHBOARD_TOKEN).")
    @click.option(
        "--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
        help="A host name the dashboard is reached by (repeat; else TIDINGS_DASHBOARD_HOSTS, "
        "comma-separated). Requests naming another host are refused.",
    )  # fmt: skip
    @click.pass_context
    def dashboard(ctx: click.Context, host: str, port: int, token: str | None,
                  allowed_hosts: tuple[str, ...]) -> None:  # fmt: skip
        """Serve the web dashboard (needs: pip install 'tidings[dashboard]')."""
        try:
            import uvicorn

            from tidings.dashboard import Auth, check_bind, create_app
            from tidings.dashboard.security import AllowedHosts
        except ImportError as exc:
            raise click.ClickException(
                f"the dashboard needs its extra: pip install 'tidings[dashboard]' ({exc})"
            ) from None
        from tidings.errors import ConfigurationError

        try:
            auth = Auth.from_env(token, allowed_hosts)
            check_bind(host, auth)
        except ConfigurationError as exc:
            raise click.ClickException(str(exc)) from None
        app = load(ctx)
        web = create_app(app, auth=auth)
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"tidings {__version__} dashboard on http://{shown}:{port}/ "
                   f"(redis {escape(mask_url(app.settings.redis_url))}; "
                   f"auth: {'on' if auth.configured else 'off, loopback only'}; "
                   f"hosts: {escape(AllowedHosts.of(auth).describe())})")  # fmt: skip
        uvicorn.run(web, host=host, port=port, log_level="warning", access_log=False)


def monitor_watch(read: Callable[[], dict[str, dict[str, int]]], interval_s: float) -> None:
    """``monitor --watch``: a live table of the queues until Ctrl-C."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    def table() -> Table:
        t = Table(title=f"tidings queues · {utc_stamp()} · every {interval_s:g}s (Ctrl-C quits)")
        for col in ("queue", "ready", "delayed", "reserved", "failed"):
            t.add_column(col, justify="left" if col == "queue" else "right")
        for name, s in read().items():
            cells = [Text(str(s[k])) for k in ("ready", "delayed", "reserved", "failed")]
            t.add_row(Text(escape(name)), *cells)
        return t

    console = Console()
    try:
        with Live(table(), console=console, refresh_per_second=4, transient=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(table())
    except KeyboardInterrupt:
        pass


def monitor_lines(
    read: Callable[[], dict[str, dict[str, int]]],
    interval_s: float,
    *,
    as_json: bool = False,
    count: int = 0,
) -> None:
    """``monitor --watch`` when stdout is not a terminal: one line per interval
    (``TIME queue ready=N delayed=N reserved=N failed=N | ...``, or one JSON object
    with ``time`` and ``queues``), flushed, until Ctrl-C (or ``count`` lines)."""
    n = 0
    try:
        while True:
            sizes = read()
            if as_json:
                record = {"time": utc_stamp(), "queues": sizes}
                line = escape_json(orjson.dumps(record).decode())
            else:
                cells = [
                    f"{escape(name)} ready={s['ready']} delayed={s['delayed']} "
                    f"reserved={s['reserved']} failed={s['failed']}"
                    for name, s in sizes.items()
                ]
                line = f"{utc_stamp()} " + " | ".join(cells)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            n += 1
            if count and n >= count:
                return
            time.sleep(interval_s)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


# -- which queues exist, for ``monitor`` -----------------------------------------------
# ``monitor`` lists ``default``, every queue the App dispatched to, schedules on or sends
# its queued listeners to, every queue a worker of the App has listened on (the set
# ``{prefix}:queues``, see :mod:`tidings.moves.queue_names`), and every queue that holds
# a key now.


def _listener_queues(app: App) -> set[str]:
    """The ``queue`` options of the App's queued listeners."""
    out: set[str] = set()
    signals = getattr(getattr(app, "events", None), "_signals", {})
    for signal in list(signals.values()):
        for reg in list(signal.receivers.values()):
            queue = getattr(getattr(reg, "listener", None), "queue", None)
            if isinstance(queue, str) and queue:
                out.add(queue)
    return out


def known_queues(app: App, rq: RedisQueue) -> list[str]:
    """Every queue the App knows of (see the module docstring), sorted."""
    names: set[str] = {"default", *getattr(app, "_queues_used", ())}
    for s in getattr(app, "schedules", ()):
        queue = s.queue or getattr(s.job.option_source(), "queue", None)
        if queue:
            names.add(str(queue))
    names.update(_listener_queues(app))
    raw: Any = rq.client.smembers(known_queues_key(rq.prefix))
    names.update(x.decode() if isinstance(x, bytes) else str(x) for x in raw)
    names.update(rq.queue_names())
    return sorted(names)
