"""notify-worker: run workers and operate queues from the shell.

Bare ``notify-worker`` runs a worker; the subcommands operate the queues and the failed
store. ``-A module:attribute`` (or ``TIDINGS_APP``) names the App; importing it registers
the app's listeners and classes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import logging
import os
import sys
import time
from typing import Any, NoReturn

import click
import orjson
from redis.exceptions import ResponseError

from tidings._version import __version__
from tidings.app import App
from tidings.cli import broadcast as cli_broadcast
from tidings.cli import observe as cli_observe
from tidings.cli.batches import make_group as make_batches_group
from tidings.cli.db import make_group as make_db_group
from tidings.cli.groups import make_group as make_groups_group
from tidings.errors import QueueUnavailable
from tidings.observability.lifecycle import (
    JobFailed,
    JobProcessed,
    JobProcessing,
    JobReleased,
    JobWasCancelled,
    WorkerStopping,
)
from tidings.observability.redaction import redact, redact_json
from tidings.observability.terminal import escape, escape_json
from tidings.redis.errors import REDIS_ERRORS, is_transient
from tidings.wire.encryption import encrypted_key_id
from tidings.wire.envelope import read_envelope
from tidings.worker.options import short_error
from tidings.worker.worker import EXIT_CONFIG, EXIT_STUCK, Worker, WorkerOptions


def load_app(spec: str | None) -> App:
    """The App named ``module:attribute`` (else ``TIDINGS_APP``, else the Django project's
    when ``DJANGO_SETTINGS_MODULE`` is set, else from the environment)."""
    spec = spec or os.environ.get("TIDINGS_APP")
    if not spec and os.environ.get("DJANGO_SETTINGS_MODULE"):
        from tidings.contrib.django import worker_app

        return worker_app()  # django.setup(), then the App of tidings.contrib.django
    if not spec:
        return App.from_env()
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    app = getattr(module, attr or "app")
    if not isinstance(app, App):
        raise click.UsageError(f"{spec} is not a tidings App")
    app.make_current()
    return app


_stamp_cache: tuple[int, str] = (-1, "")


def _stamp() -> str:
    """Local time to the second, formatted once per second (it is on every job's path)."""
    global _stamp_cache
    now = int(time.time())
    if _stamp_cache[0] != now:
        _stamp_cache = (now, dt.datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S"))
    return _stamp_cache[1]


def install_output(app: App, *, json_logs: bool) -> None:
    """Print one line per job state change, as listeners of the lifecycle events."""
    out = sys.stdout
    flush_pending = False
    tag = cli_observe.child_tag()
    child = cli_observe.child_fields()

    def flush() -> None:
        nonlocal flush_pending
        flush_pending = False
        out.flush()

    def flush_soon() -> None:
        # One flush per event-loop iteration, not one per line: a batch of jobs started
        # or finished together costs one write. Lines still reach a supervisor's log
        # before the worker next waits.
        nonlocal flush_pending
        if flush_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            out.flush()
            return
        flush_pending = True
        loop.call_soon(flush)

    def line(status: str, e: Any, extra: str = "", **fields: Any) -> None:
        if json_logs:
            record = {
                "time": cli_observe.utc_stamp(),
                "id": e.job_id,
                "status": status,
                "name": e.name,
                "queue": e.queue,
            }
            record.update(fields)
            if child:
                record.update(child)
            out.write(escape_json(orjson.dumps(record).decode()) + "\n")
        else:
            # Names, ids and exception texts come from job data: escape them.
            text = f"{_stamp()} {escape(e.job_id)} {status:<10} {escape(e.name)}{escape(extra)}"
            out.write(tag + text + "\n")
        flush_soon()

    def processing(e: JobProcessing) -> None:
        line("Processing", e, attempts=e.attempts, wait_ms=round(e.wait_s * 1000, 2))

    def processed(e: JobProcessed) -> None:
        ms = e.duration_s * 1000
        line("Processed", e, f" {ms:.2f}ms", duration_ms=round(ms, 2))

    def failed(e: JobFailed) -> None:
        ms = e.duration_s * 1000
        line(
            "Failed",
            e,
            f" {ms:.2f}ms {e.exception}",
            duration_ms=round(ms, 2),
            exception=e.exception,
        )

    def released(e: JobReleased) -> None:
        ms = e.duration_s * 1000
        why = f" {e.exception}" if e.exception else ""
        line("Released", e, f" {ms:.2f}ms (retry in {e.delay_s:g}s){why}", delay_s=e.delay_s)

    def stopping(e: WorkerStopping) -> None:
        # Why the worker ends, on its own output: after `notify-worker restart` an
        # unsupervised worker is gone for good, and its log should say so.
        if json_logs:
            record = {"time": cli_observe.utc_stamp(), "status": "Stopping",
                      "reason": e.reason, "exit_code": e.status, **child}  # fmt: skip
            out.write(escape_json(orjson.dumps(record).decode()) + "\n")
        else:
            again = (" (a supervisor starts it again; without one it stays down)"
                     if e.reason == "restart requested" else "")  # fmt: skip
            text = f"{_stamp()} worker stopping: {e.reason or 'stopped'}, exit code {e.status}"
            out.write(tag + escape(text + again) + "\n")
        out.flush()

    def cancelled(e: JobWasCancelled) -> None:
        line("Cancelled", e, "" if e.ran else " (never run)", ran=e.ran)

    app.listen(JobWasCancelled, cancelled)
    app.listen(JobProcessing, processing)
    app.listen(JobProcessed, processed)
    app.listen(JobFailed, failed)
    app.listen(JobReleased, released)
    app.listen(WorkerStopping, stopping)


EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE


class _Group(click.Group):
    """The command group; a command cut short by Redis being away (down, or a failover
    in progress) ends with one clear line and exit code 69, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (QueueUnavailable, *REDIS_ERRORS, ResponseError) as exc:
            if not (isinstance(exc, QueueUnavailable) or is_transient(exc)):
                raise
            click.echo(
                f"notify-worker: Redis unavailable ({escape(short_error(exc))}); the command "
                "did not finish - run it again once Redis is back (TIDINGS_REDIS_URL names the "
                "server)",
                err=True,
            )
            sys.exit(EXIT_UNAVAILABLE)


@click.group(
    cls=_Group,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", prog_name="notify-worker")
@click.option("-A", "--app", "app_spec", help="The App as module:attribute (else TIDINGS_APP).")
@click.option(
    "--queue", "queues", default="default", show_default=True, help="Queues in priority order."
)
@click.option("--connection", default=None, help="Named connection to work on.")
@click.option("--concurrency", default=16, show_default=True, help="Jobs in flight per process.")
@click.option(
    "--processes",
    default=1,
    show_default=True,
    help="Supervise this many worker processes (given: always supervised, 1 included).",
)
@click.option("--once", is_flag=True, help="Run a single job, then exit.")
@click.option("--stop-when-empty", is_flag=True, help="Exit when the queues are empty.")
@click.option("--max-jobs", default=0, help="Exit after this many jobs.")
@click.option("--max-time", default=0.0, help="Exit after this many seconds.")
@click.option("--memory", default=0.0, help="Exit with code 12 above this RSS (MB).")
@click.option("--sleep", default=3.0, show_default=True, help="Longest wait for new jobs (s).")
@click.option(
    "--timeout", default=60.0, show_default=True, help="Default job timeout (s); 0 = none."
)
@click.option("--tries", default=1, show_default=True, help="Default tries; 0 = unlimited.")
@click.option(
    "--max-stalls",
    default=3,
    show_default=True,
    help="How often a job's lease may expire (worker died or froze) before it fails.",
)
@click.option(
    "--give-up",
    default=60.0,
    show_default=True,
    envvar="TIDINGS_REDIS_GIVE_UP_S",
    help="How long a job's Redis move is retried through an outage before the job is "
    "left to its lease (s).",
)
@click.option("--backoff", default=0.0, show_default=True, help="Default retry delay (s).")
@click.option("--rest", default=0.0, help="Pause after each job (s).")
@click.option(
    "--grace", default=30.0, show_default=True, help="On SIGTERM, wait this long for jobs."
)
@click.option("--json-logs", is_flag=True, help="One JSON object per line (UTC ISO-8601 times).")
@click.option(
    "--metrics-port", default=0, help="Serve Prometheus metrics of this worker on this port."
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)
@click.pass_context
def main(ctx: click.Context, /, app_spec: str | None, **opts: Any) -> None:
    """Run a tidings worker, or operate the queues (see the subcommands)."""
    ctx.obj = {"app_spec": app_spec}
    if ctx.invoked_subcommand is not None:
        return
    cli_observe.setup_logging(json_logs=opts["json_logs"])
    _require_app(app_spec)
    # `--processes N` always supervises children, N = 1 included: a job that kills its
    # process then kills a child, never the supervisor (bare notify-worker runs in-process).
    if opts["processes"] < 1:
        raise click.BadParameter("must be at least 1", param_hint="--processes")
    if ctx.get_parameter_source("processes") is not click.core.ParameterSource.DEFAULT:
        from tidings.ops.supervisor import supervise

        grace, timeout = opts["grace"], opts["timeout"]
        sys.exit(supervise(opts["processes"], sys.argv, grace_s=grace, timeout_s=timeout))
    app = load_app(app_spec)
    install_output(app, json_logs=opts["json_logs"])
    queues = [q.strip() for q in opts["queues"].split(",") if q.strip()]
    cli_observe.print_banner(app, opts, queues, json_logs=opts["json_logs"])
    if opts["metrics_port"]:
        from tidings.observability.prometheus import serve_worker_metrics

        # Under --processes N, child k serves on port + k - 1.
        port = opts["metrics_port"] + max(0, cli_observe.child_number() - 1)
        try:
            serve_worker_metrics(app, queues, port, opts["metrics_host"])
        except OSError as exc:
            click.echo(
                f"cannot serve metrics on {opts['metrics_host']}:{port} ({exc}); "
                "choose another --metrics-port",
                err=True,
            )
            sys.exit(78)  # EX_CONFIG: the supervisor does not restart it
    options = WorkerOptions(
        queues=queues,
        connection=opts["connection"],
        concurrency=opts["concurrency"],
        once=opts["once"],
        stop_when_empty=opts["stop_when_empty"],
        max_jobs=opts["max_jobs"],
        max_time_s=opts["max_time"],
        memory_mb=opts["memory"],
        sleep_s=opts["sleep"],
        timeout_s=opts["timeout"],
        tries=opts["tries"],
        max_stalls=opts["max_stalls"],
        backoff_s=opts["backoff"],
        rest_s=opts["rest"],
        grace_s=opts["grace"],
        give_up_s=opts["give_up"],
        fault_point=os.environ.get("TIDINGS_FAULT_POINT") or None,
    )
    worker = Worker(app, options)
    code = asyncio.run(worker.run())
    sys.stdout.flush()
    if code == EXIT_STUCK or worker.threads_left:
        # A thread is still running a stuck job (or one released after the grace period)
        # and cannot be joined: leave now instead of waiting for it at interpreter exit.
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _require_app(app_spec: str | None) -> None:
    """A worker that cannot resolve the classes it exists to run must not consume work."""
    # DJANGO_SETTINGS_MODULE: the Django integration finds the app through it.
    names = ("TIDINGS_APP", "TIDINGS_ALLOWED_MODULES", "DJANGO_SETTINGS_MODULE")
    if app_spec or any(os.environ.get(name) for name in names):
        return
    click.echo(
        "notify-worker: refusing to start: no app given, so no job class could be "
        "imported and every job would fail. Name the app with -A module:app (or "
        f"TIDINGS_APP){_django_hint()}, or list the packages of your job classes in "
        "TIDINGS_ALLOWED_MODULES.",
        err=True,
    )
    sys.exit(EXIT_CONFIG)


def _django_hint() -> str:
    """``, or DJANGO_SETTINGS_MODULE for a Django project`` where Django is installed."""
    import importlib.util

    if importlib.util.find_spec("django") is None:
        return ""
    return ", or set DJANGO_SETTINGS_MODULE=yourproject.settings for a Django project"


def _where_to_point() -> str:
    return (
        "Point it at your Redis: -A module:app (or TIDINGS_APP), TIDINGS_REDIS_URL"
        f"{_django_hint()}, as the workers are started"
    )


def _app(ctx: click.Context) -> App:
    """The App of an operator command (monitor, failed, workers, batches, clear, restart,
    dashboard, db). It never starts an embedded Redis: with no app, no URL and no
    TIDINGS_HOME it refuses, and an embedded server that does not run is an error. Its
    human output opens with the Redis it reads (masked)."""
    from tidings.ops.embedded import EmbeddedNotRunning, never_start

    spec = ctx.obj["app_spec"]
    given = ("TIDINGS_APP", "TIDINGS_REDIS_URL", "REDIS_URL", "TIDINGS_HOME")
    if not spec and not any(os.environ.get(name) for name in (*given, "DJANGO_SETTINGS_MODULE")):
        _refuse(ctx, "no app and no Redis URL given, and operator commands never start an "
                "embedded Redis (a new one would show an empty queue)")  # fmt: skip
    try:
        with never_start():
            app = load_app(spec)
    except EmbeddedNotRunning as exc:
        _refuse(ctx, str(exc))
    if not ctx.params.get("as_json"):
        click.echo(f"Redis: {reading(app)}")
    return app


def reading(app: App) -> str:
    """``redis://:***@host:6379/0 (from TIDINGS_REDIS_URL, prefix tidings)``."""
    from tidings.observability.redaction import mask_url

    s = app.settings
    where = f"embedded in {s.home}" if s.embedded else f"from {s.where('redis_url')}"
    return escape(f"{mask_url(s.redis_url)} ({where}, prefix {s.prefix})")


def _refuse(ctx: click.Context, why: str) -> NoReturn:
    name = ctx.command_path.removeprefix("notify-worker ").strip() or "notify-worker"
    click.echo(f"notify-worker {name}: {why}. {_where_to_point()}.", err=True)
    sys.exit(EXIT_CONFIG)


@main.command()
@click.pass_context
def restart(ctx: click.Context) -> None:
    """Make every worker exit after its current jobs (a supervisor brings them back)."""
    _app(ctx).queue_for(None).restart()
    click.echo(
        "Broadcasting queue restart signal: every worker exits after its current jobs; "
        "workers not run under a supervisor (systemd, Supervisor, --processes N) stay down."
    )


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--queue", "queues", default=None, help="Comma-separated queues (default: all).")
@click.option("--watch", is_flag=True, help="Keep the table on screen, refreshed.")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
@click.pass_context
def monitor(
    ctx: click.Context, as_json: bool, queues: str | None, watch: bool, interval: float
) -> None:
    """Show ready / delayed / reserved / failed counts per queue."""
    app = _app(ctx)
    rq = app.queue_for(None)
    if queues:
        names = [q.strip() for q in queues.split(",") if q.strip()]
    else:
        from tidings.cli.observe import known_queues

        names = known_queues(app, rq)  # empty ones too, with zeros
    if watch:
        read = lambda: rq.sizes(names)  # noqa: E731
        if sys.stdout.isatty():
            cli_observe.monitor_watch(read, max(0.2, interval))
        else:  # piped or logged: one line per interval, no screen redraws
            cli_observe.monitor_lines(read, max(0.2, interval), as_json=as_json)
        return
    sizes = rq.sizes(names)
    if as_json:
        click.echo(escape_json(orjson.dumps(sizes).decode()))
        return
    click.echo(f"{'queue':<20} {'ready':>8} {'delayed':>8} {'reserved':>8} {'failed':>8}")
    for name, s in sizes.items():
        shown = escape(name)
        click.echo(
            f"{shown:<20} {s['ready']:>8} {s['delayed']:>8} {s['reserved']:>8} {s['failed']:>8}"
        )


@main.command()
@click.option("--queue", "queue", required=True)
@click.pass_context
def clear(ctx: click.Context, queue: str) -> None:
    """Delete every waiting job of a queue."""
    n = _app(ctx).queue_for(None).clear(queue)
    click.echo(f"Cleared {cli_observe.plural(n, 'job')} from {escape(queue)}.")


@main.command()
@click.argument("ids", nargs=-1, required=True)
@click.option("--queue", "queue", default=None, help="The job's queue (default: every known one).")
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[str, ...], queue: str | None) -> None:
    """Cancel jobs: waiting or delayed ones never run; running ones are stopped."""
    from tidings.cli.observe import known_queues
    from tidings.errors import JobNotFound

    app = _app(ctx)
    queues = [queue] if queue else known_queues(app, app.queue_for(None))
    missing = 0
    for job_id in ids:
        try:
            out = _cancel_on(app, job_id, queues)
        except JobNotFound:
            missing += 1
            click.echo(f"{escape(job_id)}: no such job")
            continue
        note = f" ({out.note})" if out.note else ""
        click.echo(f"{escape(job_id)}: {out}{note}")
    if missing:
        sys.exit(1)


def _cancel_on(app: App, job_id: str, queues: list[str]) -> Any:
    from tidings.moves.control import cancel as cancel_move

    return cancel_move(app.queue_for(None), job_id, queues)


@main.command()
@click.argument("job_id")
@click.option("--queue", "queue", default=None, help="The job's queue (default: every known one).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, job_id: str, queue: str | None, as_json: bool) -> None:
    """Show a job's state, measured times and last reported progress."""
    from tidings.cli.observe import known_queues

    app = _app(ctx)
    queues = [queue] if queue else known_queues(app, app.queue_for(None))
    state = None
    for name in queues:
        state = app.job_status(job_id, name)
        if state is not None:
            break
    p = state.progress if state is not None else None
    doc = {
        "id": job_id,
        "status": None if state is None else str(state),
        "progress": None if p is None else {"done": p.done, "total": p.total, "note": p.note,
                                            "at": p.at},
    }  # fmt: skip
    if as_json:
        click.echo(escape_json(orjson.dumps(doc).decode()))
        return
    line = f"{escape(job_id)}: {doc['status'] or 'no record'}"
    if p is not None:
        of = f"/{p.total:g}" if p.total is not None else ""
        line += f"  progress {p.done:g}{of}" + (f" ({escape(p.note)})" if p.note else "")
    click.echo(line)
    if state is None:
        sys.exit(1)


@main.group()
def failed() -> None:
    """Inspect and retry failed jobs."""


@failed.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def failed_list(ctx: click.Context, as_json: bool) -> None:
    """List failed jobs."""
    records = _app(ctx).queue_for(None).failed()
    if as_json:
        click.echo(escape_json(orjson.dumps([r.summary() for r in records]).decode()))
        return
    if not records:
        click.echo("No failed jobs.")
        return
    click.echo(f"{'id':<32}  {'failed at':<19}  {'queue':<10} {'job':<30} error")
    for r in records:
        when = dt.datetime.fromtimestamp(r.failed_at).strftime("%Y-%m-%d %H:%M:%S")
        first = r.exception.strip().splitlines()[-1] if r.exception.strip() else ""
        # Everything here comes from job data or Redis: escape before printing.
        name, queue = escape(r.name), escape(r.queue)
        click.echo(f"{escape(r.id)}  {when}  {queue:<10} {name:<30} {escape(first[:100])}")


@failed.command("show")
@click.argument("job_id")
@click.pass_context
def failed_show(ctx: click.Context, job_id: str) -> None:
    """Show one failed job: its exception and payload."""
    record = _app(ctx).queue_for(None).find_failed(job_id)
    if record is None:
        raise click.ClickException(f"no failed job {escape(job_id)}")
    rid, queue, name = escape(record.id), escape(record.queue), escape(record.name)
    click.echo(f"id:        {rid}\nqueue:     {queue}\nname:      {name}")
    click.echo(f"failed at: {dt.datetime.fromtimestamp(record.failed_at).isoformat()}")
    click.echo(f"attempts:  {record.attempts}")
    sealed = encrypted_key_id(record.payload)
    if sealed is not None:
        click.echo(f"data:      encrypted (AES-256-GCM, key {escape(sealed)}); shown sealed")
    exception = escape(redact(record.exception), multiline=True)
    click.echo(f"\n{exception}\n")
    click.echo(escape(_shown_payload(record.payload, record.id)[:4096], multiline=True))


def _shown_payload(raw: bytes, job_id: str) -> str:
    """A failed job's envelope (``{"sig", "body"}``, the body's every field whichever
    frame was stored) with its secrets removed, keys as well as values (the dashboard
    shows it through the same helper); text that is not JSON is redacted as text."""
    envelope = read_envelope(raw, job_id)
    if envelope is None:
        try:
            envelope = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return redact(raw.decode("utf-8", "replace"))
    return orjson.dumps(redact_json(envelope)).decode()


@failed.command("retry")
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Retry every failed job.")
@click.pass_context
def failed_retry(ctx: click.Context, ids: tuple[str, ...], all_: bool) -> None:
    """Push failed jobs back onto their queues."""
    if not ids and not all_:
        raise click.UsageError("give job ids or --all")
    n = _app(ctx).queue_for(None).retry(None if all_ else list(ids))
    click.echo(f"Pushed {cli_observe.plural(n, 'failed job')} back onto their queues.")


@failed.command("forget")
@click.argument("ids", nargs=-1, required=True)
@click.pass_context
def failed_forget(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """Delete failed jobs."""
    n = _app(ctx).queue_for(None).forget(list(ids))
    click.echo(f"Deleted {cli_observe.plural(n, 'failed job')}.")
    if n == 0:
        sys.exit(1)


@failed.command("flush")
@click.pass_context
def failed_flush(ctx: click.Context) -> None:
    """Delete every failed job."""
    n = _app(ctx).queue_for(None).flush()
    click.echo(f"Deleted {cli_observe.plural(n, 'failed job')}.")


@failed.command("prune")
@click.option("--hours", default=24.0, show_default=True)
@click.pass_context
def failed_prune(ctx: click.Context, hours: float) -> None:
    """Delete failed jobs older than N hours."""
    n = _app(ctx).queue_for(None).prune(hours * 3600)
    click.echo(
        f"Deleted {cli_observe.plural(n, 'failed job')} older than {hours:g} "
        f"{'hour' if hours == 1 else 'hours'}."
    )


@main.command()
@click.option("-A", "--app", "app_spec", default=None, help="The App as module:attribute.")
@click.option(
    "--grace", default=30.0, show_default=True, help="On SIGTERM, wait this long for jobs."
)
@click.option("--timeout", default=60.0, show_default=True, help="Default job timeout (s).")
@click.option("--memory", default=0.0, help="A child exits with code 12 above this RSS (MB).")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between balancing steps.")
@click.pass_context
def supervise(ctx: click.Context, app_spec: str | None, grace: float, timeout: float,
              memory: float, interval: float) -> None:  # fmt: skip
    """Run the App's pools on this host, balanced by measured wait (see docs: pools)."""
    from tidings.pools.coordination import Coordinator
    from tidings.pools.supervise import PoolSupervisor
    from tidings.redis.clients import sync_client

    spec = app_spec or ctx.obj["app_spec"] or os.environ.get("TIDINGS_APP")
    if not spec:
        click.echo("notify-worker supervise: name the App with -A module:app (or TIDINGS_APP); "
                   "its pools=[...] say what to run", err=True)  # fmt: skip
        sys.exit(EXIT_CONFIG)
    cli_observe.setup_logging(json_logs=False)
    app = load_app(spec)
    config = app.pools
    if not config.pools:
        click.echo(f"notify-worker supervise: {escape(spec)} declares no pools: give "
                   "App(pools=[Pool(...)], ...)", err=True)  # fmt: skip
        sys.exit(EXIT_CONFIG)
    rq = app.queue_for(None)
    client = sync_client(app.settings.redis_url, socket_timeout_s=2.0)
    queues = {q for p in config.pools for q in p.queues}
    ready = {q: (rq.keys(q).ready, rq.keys(q).prio) for q in queues}
    coordinator = Coordinator(config, client, rq.prefix, ready)
    extra = ["--grace", str(grace), "--timeout", str(timeout)]
    if memory:
        extra += ["--memory", str(memory)]
    names = ", ".join(f"{p.name} ({','.join(p.queues)})" for p in config.pools)
    what = f"supervising pools {names}; balance {config.balance}, at most {config.host_max}"
    click.echo(escape(what) + f" processes on this host; Redis {reading(app)}")
    sup = PoolSupervisor(config, spec, coordinator, extra_args=extra, grace_s=grace,
                         timeout_s=timeout, interval_s=interval)  # fmt: skip
    sys.exit(sup.run())


main.add_command(make_batches_group(_app), "batches")
main.add_command(make_groups_group(_app), "groups")
cli_observe.register(main, _app)
cli_broadcast.register(main, _app)
main.add_command(make_db_group(_app), "db")


if __name__ == "__main__":  # pragma: no cover
    main()
