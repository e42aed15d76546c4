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
from typing import Any

import click
import orjson

from tidings.app import App
from tidings.cli_batches import make_group as make_batches_group
from tidings.cli_db import make_group as make_db_group
from tidings.queue.encryption import encrypted_key_id
from tidings.queue.events import JobFailed, JobProcessed, JobProcessing, JobReleased
from tidings.queue.worker import EXIT_STUCK, Worker, WorkerOptions


def load_app(spec: str | None) -> App:
    """The App named ``module:attribute`` (else ``TIDINGS_APP``, else from the environment)."""
    spec = spec or os.environ.get("TIDINGS_APP")
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
                "time": _stamp(),
                "id": e.job_id,
                "status": status,
                "name": e.name,
                "queue": e.queue,
            }
            record.update(fields)
            out.write(orjson.dumps(record).decode() + "\n")
        else:
            out.write(f"{_stamp()} {e.job_id} {status:<10} {e.name}{extra}\n")
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

    app.listen(JobProcessing, processing)
    app.listen(JobProcessed, processed)
    app.listen(JobFailed, failed)
    app.listen(JobReleased, released)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-A", "--app", "app_spec", help="The App as module:attribute (else TIDINGS_APP).")
@click.option(
    "--queue", "queues", default="default", show_default=True, help="Queues in priority order."
)
@click.option("--connection", default=None, help="Named connection to work on.")
@click.option("--concurrency", default=16, show_default=True, help="Jobs in flight per process.")
@click.option("--processes", default=1, show_default=True, help="Worker processes to supervise.")
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
@click.option("--backoff", default=0.0, show_default=True, help="Default retry delay (s).")
@click.option("--rest", default=0.0, help="Pause after each job (s).")
@click.option(
    "--grace", default=30.0, show_default=True, help="On SIGTERM, wait this long for jobs."
)
@click.option("--json-logs", is_flag=True, help="One JSON object per line.")
@click.pass_context
def main(ctx: click.Context, /, app_spec: str | None, **opts: Any) -> None:
    """Run a tidings worker, or operate the queues (see the subcommands)."""
    ctx.obj = {"app_spec": app_spec}
    if ctx.invoked_subcommand is not None:
        return
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if opts["processes"] > 1:
        from tidings.supervisor import supervise

        grace, timeout = opts["grace"], opts["timeout"]
        sys.exit(supervise(opts["processes"], sys.argv, grace_s=grace, timeout_s=timeout))
    app = load_app(app_spec)
    install_output(app, json_logs=opts["json_logs"])
    options = WorkerOptions(
        queues=[q.strip() for q in opts["queues"].split(",") if q.strip()],
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
        backoff_s=opts["backoff"],
        rest_s=opts["rest"],
        grace_s=opts["grace"],
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


def _app(ctx: click.Context) -> App:
    return load_app(ctx.obj["app_spec"])


@main.command()
@click.pass_context
def restart(ctx: click.Context) -> None:
    """Make every worker exit after its current jobs."""
    _app(ctx).queue_for(None).restart()
    click.echo("Broadcasting queue restart signal.")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--queue", "queues", default=None, help="Comma-separated queues (default: all).")
@click.pass_context
def monitor(ctx: click.Context, as_json: bool, queues: str | None) -> None:
    """Show ready / delayed / reserved / failed counts per queue."""
    names = [q.strip() for q in queues.split(",")] if queues else None
    sizes = _app(ctx).queue_for(None).sizes(names)
    if as_json:
        click.echo(orjson.dumps(sizes).decode())
        return
    click.echo(f"{'queue':<20} {'ready':>8} {'delayed':>8} {'reserved':>8} {'failed':>8}")
    for name, s in sizes.items():
        click.echo(
            f"{name:<20} {s['ready']:>8} {s['delayed']:>8} {s['reserved']:>8} {s['failed']:>8}"
        )


@main.command()
@click.option("--queue", "queue", required=True)
@click.pass_context
def clear(ctx: click.Context, queue: str) -> None:
    """Delete every waiting job of a queue."""
    n = _app(ctx).queue_for(None).clear(queue)
    click.echo(f"Cleared {n} jobs from {queue}.")


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
        click.echo(orjson.dumps([r.summary() for r in records]).decode())
        return
    if not records:
        click.echo("No failed jobs.")
    for r in records:
        when = dt.datetime.fromtimestamp(r.failed_at).strftime("%Y-%m-%d %H:%M:%S")
        first = r.exception.strip().splitlines()[-1] if r.exception.strip() else ""
        click.echo(f"{r.id}  {when}  {r.queue:<10} {r.name:<30} {first[:100]}")


@failed.command("show")
@click.argument("job_id")
@click.pass_context
def failed_show(ctx: click.Context, job_id: str) -> None:
    """Show one failed job: its exception and payload."""
    record = _app(ctx).queue_for(None).find_failed(job_id)
    if record is None:
        raise click.ClickException(f"no failed job {job_id}")
    click.echo(f"id:        {record.id}\nqueue:     {record.queue}\nname:      {record.name}")
    click.echo(f"failed at: {dt.datetime.fromtimestamp(record.failed_at).isoformat()}")
    click.echo(f"attempts:  {record.attempts}")
    sealed = encrypted_key_id(record.payload)
    if sealed is not None:
        click.echo(f"data:      encrypted (AES-256-GCM, key {sealed}); shown sealed")
    click.echo(f"\n{record.exception}\n")
    click.echo(record.payload.decode("utf-8", "replace")[:4096])


@failed.command("retry")
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Retry every failed job.")
@click.pass_context
def failed_retry(ctx: click.Context, ids: tuple[str, ...], all_: bool) -> None:
    """Push failed jobs back onto their queues."""
    if not ids and not all_:
        raise click.UsageError("give job ids or --all")
    n = _app(ctx).queue_for(None).retry(None if all_ else list(ids))
    click.echo(f"Pushed {n} failed jobs back onto their queues.")


@failed.command("forget")
@click.argument("ids", nargs=-1, required=True)
@click.pass_context
def failed_forget(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """Delete failed jobs."""
    n = _app(ctx).queue_for(None).forget(list(ids))
    click.echo(f"Deleted {n} failed jobs.")
    if n == 0:
        sys.exit(1)


@failed.command("flush")
@click.pass_context
def failed_flush(ctx: click.Context) -> None:
    """Delete every failed job."""
    n = _app(ctx).queue_for(None).flush()
    click.echo(f"Deleted {n} failed jobs.")


@failed.command("prune")
@click.option("--hours", default=24.0, show_default=True)
@click.pass_context
def failed_prune(ctx: click.Context, hours: float) -> None:
    """Delete failed jobs older than N hours."""
    n = _app(ctx).queue_for(None).prune(hours * 3600)
    click.echo(f"Deleted {n} failed jobs older than {hours:g} hours.")


main.add_command(make_batches_group(_app), "batches")
main.add_command(make_db_group(_app), "db")


if __name__ == "__main__":  # pragma: no cover
    main()
