"""App: ties settings, Redis connections, the event dispatcher and channels together.

Creating an App makes it current (as Celery's apps do), so the module helpers
``event()``, ``dispatch()`` and ``Event.dispatch()`` act on it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import types
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidings import _current, after_commit
from tidings._blocking import BlockingDispatchWarning as BlockingDispatchWarning
from tidings._blocking import warn_blocking
from tidings.config import Settings
from tidings.errors import ConfigurationError, PayloadRejected
from tidings.events.call_queued import CallQueuedListener
from tidings.events.dispatcher import Dispatcher, EventKey, ListenerLike, QueuedTarget
from tidings.events.listener import QueuedFunction, set_current_dispatcher_provider
from tidings.jobs.compose import prepare
from tidings.jobs.groups import group_of, no_group_for_unique
from tidings.jobs.job import Job, PendingDispatch, option
from tidings.moves.groups import Groups
from tidings.moves.queues import RedisQueue
from tidings.observability import redaction, tracing
from tidings.observability.lifecycle import JobQueued
from tidings.wire.signing import Signer, parse_keys
from tidings.workflows.hooks import WorkflowHooks
from tidings.workflows.unique import GuardedPush, guard_for, push_guarded, push_guarded_async

log = logging.getLogger("tidings.app")

if TYPE_CHECKING:
    from tidings.jobs.middleware import Middleware
    from tidings.moves.control import CancelOutcome
    from tidings.observability.metrics import JobStatus
    from tidings.worker.host import RunningWorker


def _version() -> str:
    from tidings._version import __version__

    return __version__


def _caller() -> tuple[str | None, str | None]:
    """The top-level package of the code that created the App, and the directory of its
    module (or script): where its embedded ``.tidings`` goes."""
    frame = sys._getframe(2)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name == "tidings" or name.startswith("tidings.")):
            if name == "__main__":
                spec = frame.f_globals.get("__spec__")
                package = spec.name.partition(".")[0] if spec is not None else None
            else:
                package = name.partition(".")[0] or None
            return package, _anchor(frame.f_globals.get("__file__"), name)
        frame = frame.f_back  # type: ignore[assignment]
    return None, None


def _anchor(file: object, module: str) -> str | None:
    """The directory of the module (or script) ``file`` that created the App: every
    process that creates the App from that file, however it was imported or from
    whichever directory, finds the same embedded ``.tidings`` there."""
    if not isinstance(file, str) or not file:
        return None
    return str(Path(file).resolve().parent)


def _register_secrets(settings: Settings) -> None:
    """Tell the redaction helper every secret this App was configured with."""
    from urllib.parse import unquote, urlsplit

    found: list[str | bytes | None] = [settings.webhook_secret]
    found += [part.strip() for part in settings.key.split(",")]
    found += parse_keys(settings.key)
    urls = (settings.mail_url, settings.sms_url, settings.redis_url, *settings.connections.values())
    for url in urls:
        try:
            password = urlsplit(url).password
        except ValueError:
            continue
        if password:
            found.append(unquote(password))
    redaction.register(*found)


# Class paths that envelopes queued by earlier releases may name (the modules moved; the
# classes did not change). A payload names its class, so these must keep resolving.
LEGACY_CLASS_PATHS = {
    "tidings.queue.chain:CallFunction": "tidings.workflows.chain:CallFunction",
}


_POOL_KEYWORDS = ("pools", "max_processes", "balance", "cooldown_s", "max_shift", "lease_s")


def _pools_config(options: dict[str, Any]) -> Any:
    """Take the pool keywords out of ``options`` (:class:`tidings.pools.PoolsConfig`)."""
    from tidings.pools.spec import Pool, PoolsConfig

    given = {k: options.pop(k) for k in _POOL_KEYWORDS if k in options}
    pools = tuple(given.pop("pools", ()) or ())
    for p in pools:
        if not isinstance(p, Pool):
            raise ConfigurationError(f"App(pools=...): {p!r} is not a tidings.Pool")
    return PoolsConfig(pools=pools, **given)


@dataclass(slots=True)
class _PushBatch:
    """Jobs of one ``dispatch_many`` bound for one connection, queue, delay and fair
    group: their ``(id, envelope)`` items and, alongside, each one's priority (a fair
    group's jobs are batched by priority too: ``push_group`` takes one)."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)


class App:
    """A tidings application.

    Args:
        redis_url, key, mail_url, mail_from, sms_url, webhook_secret, allowed_modules,
        retry_after, prefix, webhook_allow_private, templates, max_payload_bytes,
        schedule_timezone, database_url, slack_url, encrypt, encryption_key, wait_replicas,
        wait_replicas_timeout:
            as the ``TIDINGS_*`` variables of the same name (keywords win).
        connections: extra named Redis URLs for ``on_connection(name)``.
        env: read settings from the environment as well (``from_env`` sets it).
        home: the embedded directory (the embedded Redis, its key, the mail outbox);
            else ``TIDINGS_HOME``, else ``.tidings`` beside the module (or script)
            that creates the App (``anchor`` names another directory to put it in).
        given_in: how errors name where ``options`` came from (``settings.TIDINGS``).
        pools, max_processes, balance, cooldown_s, max_shift, lease_s: the worker pools
            ``notify-worker supervise`` runs on a host (:mod:`tidings.pools`).
    """

    def __init__(
        self,
        *,
        env: bool = True,
        home: str | Path | None = None,
        anchor: str | Path | None = None,
        given_in: str = "App(...)",
        labels: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        package, caller_dir = _caller()
        self.pools = _pools_config(options)
        self.settings = Settings.resolve(
            options,
            None if env else {},
            home=home,
            anchor=anchor or caller_dir,
            app_package=package,
            given_in=given_in,
            labels=labels,
        )
        # Envelopes bind the key prefix: another app on this Redis with the same key
        # but its own prefix does not run this app's jobs (tidings.wire.envelope).
        self.signer = Signer(
            parse_keys(self.settings.key),
            prefix=self.settings.prefix,
            frame=self.settings.envelope_frame,
        )
        _register_secrets(self.settings)
        self._queues: dict[str | None, RedisQueue] = {}
        self._queues_used: set[str] = {"default"}
        self._allowed = tuple(self.settings.allowed_modules)
        self._resolved: dict[str, Any] = {}
        self.events = Dispatcher(
            queue_listener=self._queue_listener, queue_listener_async=self._queue_listener_async
        )
        self._broadcasting: Any = None
        self._listen_for_broadcasts()
        self.job_middleware: list[Middleware] = []
        self.workflow_hooks = WorkflowHooks(self)
        self.channel_limits: dict[str, Any] = {}  # channel -> RateLimited (rate_limit)
        self.schedules: list[Any] = []  # Schedule entries (schedule)
        self._notifications: Any = None
        self._meter: Any = None  # tidings.observability.metrics.Meter, in worker processes
        self._emit_tasks: set[asyncio.Task[None]] = set()  # async lifecycle listeners
        self._async_skipped: set[str] = set()  # events whose async listeners were skipped
        self._keyring: Any = None
        self._database: Any = None
        # Called around every sync job (and model load) in a worker thread: the Django
        # integration closes stale database connections there (see wrap_thread_call).
        self.thread_call_wrappers: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = []
        if self.settings.mail_allow_test_domains:
            from tidings.notifications.validation import allow_test_domains

            allow_test_domains(True)
        import tidings.contrib.models  # noqa: F401  (registers the model/Pydantic extensions)

        if "sqlalchemy.orm" in sys.modules:
            from tidings.contrib.sqlalchemy import install

            install()  # after-commit dispatch on SQLAlchemy sessions

        self.make_current()

    @classmethod
    def from_env(cls, **overrides: Any) -> App:
        """An App configured from ``TIDINGS_*`` variables (keywords override)."""
        return cls(env=True, **overrides)

    def make_current(self) -> App:
        """Make this the App the module helpers use."""
        _current.set_current(self)
        set_current_dispatcher_provider(lambda: _current.current().events)
        return self

    @staticmethod
    def current() -> App:
        """The current App."""
        app: App = _current.current()
        return app

    # -- queue plumbing ----------------------------------------------------------------

    @property
    def keyring(self) -> Any:
        """The :class:`~tidings.wire.encryption.Keyring` of encrypted payloads (made on
        first use, from ``encryption_key`` or else the signing keys)."""
        if self._keyring is None:
            from tidings.wire.encryption import keyring_from_settings

            self._keyring = keyring_from_settings(
                self.settings.encryption_key, parse_keys(self.settings.key)
            )
        return self._keyring

    @property
    def database(self) -> Any:
        """The :class:`~tidings.notifications.channels.database.NotificationStore` of the
        ``database`` channel (``database_url``; needs the ``database`` extra)."""
        if self._database is None:
            from tidings.notifications.channels.database import NotificationStore

            self._database = NotificationStore(self.settings.database_url)
        return self._database

    @property
    def groups(self) -> Groups:
        """Fair groups within a queue: ``limit``, ``pause``, ``resume``, ``list``, ``show``
        (docs/groups.md); on the default connection, the ``default`` queue unless a call
        names another."""
        return Groups(lambda: self.queue_for(None).client, self.queue_for(None).keys, "default")

    @property
    def retry_after_s(self) -> float:
        """Seconds a reservation lasts."""
        return self.settings.retry_after

    @property
    def max_payload_bytes(self) -> int:
        """Largest envelope accepted, at dispatch and at pop."""
        return self.settings.max_payload_bytes

    def queue_for(self, connection: str | None = None) -> RedisQueue:
        """The queues behind the named connection (None: the default)."""
        rq = self._queues.get(connection)
        if rq is None:
            url = self.settings.redis_url
            if connection is not None:
                try:
                    url = self.settings.connections[connection]
                except KeyError:
                    from tidings.errors import ConfigurationError

                    raise ConfigurationError(f"unknown connection {connection!r}") from None
            rq = self._queues[connection] = RedisQueue(
                url,
                self.settings.prefix,
                wait_replicas=self.settings.wait_replicas,
                wait_timeout_ms=max(1, round(self.settings.wait_replicas_timeout * 1000)),
            )
        return rq

    def is_allowed(self, module: str) -> bool:
        """Whether a worker may import ``module`` (by the allowed prefixes)."""
        return any(module == p or module.startswith(p + ".") for p in self._allowed)

    def resolve_class(self, path: str) -> Any:
        """Import ``module:QualName``, only under the allowed module prefixes.

        Raises:
            PayloadRejected: outside the allowed modules, or not found.
        """
        cached = self._resolved.get(path)
        if cached is not None:
            return cached
        module, _, qualname = LEGACY_CLASS_PATHS.get(path, path).partition(":")
        if not module or not qualname or not self.is_allowed(module):
            raise PayloadRejected(
                f"unknown job type {path!r}: not under the allowed modules {self._allowed}; "
                "add its package to TIDINGS_ALLOWED_MODULES (App(allowed_modules=[...])) or "
                "start the worker with -A module:app"
            )
        try:
            obj: Any = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
                if isinstance(obj, types.ModuleType):
                    # ``allowed.module:os.system`` would reach past the allowed prefixes.
                    raise AttributeError(f"{part!r} is a module, not a class")
        except (ImportError, AttributeError) as exc:
            raise PayloadRejected(f"unknown job type {path!r}: {exc}") from exc
        except Exception as exc:
            # A module that raises on import (a half-finished deploy): fail the job with
            # the reason instead of leaving it reserved, to be redelivered forever.
            raise PayloadRejected(f"unknown job type {path!r}: import failed: {exc!r}") from exc
        if isinstance(obj, type | types.FunctionType) and not self.is_allowed(obj.__module__):
            raise PayloadRejected(
                f"unknown job type {path!r}: defined in {obj.__module__!r}, "
                "outside the allowed modules; add its package to TIDINGS_ALLOWED_MODULES"
            )
        # Only successes are cached: the allow-list check above ran once for this path.
        self._resolved[path] = obj
        return obj

    def emit(self, event: object) -> None:
        """Announce a lifecycle event to its listeners (cheap when there are none).

        A listener that raises is logged, not propagated: the job has been pushed (or
        is being run) already, and a broken log line must not fail a dispatch or leave
        a job reserved.
        """
        meter = self._meter
        if meter is not None:
            meter.observe(event)
        cls = type(event)
        if self.events.has_listeners(cls):
            try:
                if self.events.has_async_listeners(cls):
                    self._emit_with_async(event)
                else:
                    self.events.dispatch(event)
            except Exception:
                log.exception("a listener of %s raised", cls.__name__)

    def _emit_with_async(self, event: object) -> None:
        """An event with ``async def`` listeners: on an event loop (a worker, async
        code), all its listeners run in order in a task of that loop (a worker waits
        for these tasks as it stops); without one (a sync ``dispatch()``), the sync and
        queued listeners run now and the async ones are skipped, with a warning."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            name = type(event).__name__
            if name not in self._async_skipped:
                self._async_skipped.add(name)
                log.warning(
                    "async listeners of %s do not run where no event loop runs (a sync "
                    "dispatch()); dispatch with `await ...dispatch_async()`, or make them "
                    "sync or queued (ShouldQueue)",
                    name,
                )
            self.events.dispatch_sync_part(event)
            return
        task = loop.create_task(self._emit_async(event))
        self._emit_tasks.add(task)
        task.add_done_callback(self._emit_tasks.discard)

    async def _emit_async(self, event: object) -> None:
        try:
            await self.events.dispatch_async(event)
        except Exception:
            log.exception("a listener of %s raised", type(event).__name__)

    async def wait_listeners(self, timeout_s: float = 10.0) -> None:
        """Wait (up to ``timeout_s``) for the async lifecycle listeners still running on
        this loop (see :meth:`emit`)."""
        loop = asyncio.get_running_loop()
        mine = [t for t in self._emit_tasks if t.get_loop() is loop and not t.done()]
        if mine:
            await asyncio.wait(mine, timeout=timeout_s)

    def worker_tasks(self, worker: RunningWorker) -> list[Coroutine[Any, Any, None]]:
        """Coroutines a worker process runs beside its jobs: the scheduler, the heartbeat
        its supervisor watches."""
        from tidings.moves.queue_names import remember_queues
        from tidings.ops.supervisor import heartbeat_task
        from tidings.workflows.schedule import Scheduler

        opts = worker.opts
        draining = opts.once or opts.stop_when_empty
        tasks = [Scheduler(self).run()] if self.schedules and not draining else []
        tasks.append(remember_queues(worker.rq, opts.queues))  # for `monitor`
        if self.settings.metrics:
            from tidings.observability.metrics import Meter

            self._meter = Meter(self.settings.prefix, worker=worker, version=_version())
            tasks.append(self._meter.run())
        return tasks + heartbeat_task(worker)

    # -- workflows and flow control -----------------------------------------------------

    def rate_limit(
        self, channel: str, *, per_second: float | None = None, per_minute: float | None = None
    ) -> None:
        """Limit a notification channel across all workers, e.g. ``("sms", per_second=10)``."""
        from tidings.jobs.limits import RateLimited

        key = f"channel:{channel}"
        self.channel_limits[channel] = RateLimited(
            key, per_second=per_second, per_minute=per_minute
        )

    def schedule(
        self,
        job: Job,
        *,
        cron: str | None = None,
        every_s: float | None = None,
        queue: str | None = None,
        name: str | None = None,
        tz: str | None = None,
    ) -> Any:
        """Dispatch ``job`` on a cron schedule or every ``every_s`` seconds, from whichever
        worker holds the scheduler lease (see :mod:`tidings.workflows.schedule`). A cron
        expression reads the wall clock of zone ``tz`` (default: the App's
        ``schedule_timezone``, else UTC).

        Raises:
            ValueError: a bad cron expression or zone, or a second schedule with the
                same name (pass ``name=``).
        """
        from tidings.workflows.schedule import make_schedule

        if tz is None and cron is not None:
            tz = self.settings.schedule_timezone
        entry = make_schedule(job, cron=cron, every_s=every_s, queue=queue, name=name, tz=tz)
        if any(s.name == entry.name for s in self.schedules):
            raise ValueError(
                f"a schedule named {entry.name!r} exists already; two schedules with one "
                "name share their ticks and only one would run: pass name= to app.schedule"
            )
        self.schedules.append(entry)
        return entry

    def find_batch(self, batch_id: str) -> Any:
        """The :class:`~tidings.workflows.batch.BatchInfo` of a batch, or None."""
        from tidings.workflows.batch import find_batch

        return find_batch(self, batch_id)

    def cancel_batch(self, batch_id: str) -> bool:
        """Cancel a batch: its jobs not started yet are skipped."""
        from tidings.workflows.batch import cancel_batch

        return cancel_batch(self, batch_id)

    # -- dispatching jobs --------------------------------------------------------------

    def _prepared(self, pending: PendingDispatch) -> tuple[RedisQueue, str, str, bytes, float, int]:
        s = self.settings
        queue, job_id, envelope, delay, priority = prepare(
            pending,
            self.signer,
            max_bytes=self.max_payload_bytes,
            store_results=s.store_results,
            result_ttl_s=s.result_ttl_s,
            result_max_bytes=s.result_max_bytes,
        )
        conn = pending.connection or option(pending.job.option_source(), "connection")
        self.note_queue(queue)
        return self.queue_for(conn), queue, job_id, envelope, delay, priority

    def note_queue(self, queue: str) -> None:
        """Remember that this process pushed to ``queue`` (``job_status`` looks there)."""
        self._queues_used.add(queue)

    def _deferrer(self, pending: PendingDispatch) -> after_commit.Deferrer | None:
        """Where to hold this push until commit (None: push now); see
        :mod:`tidings.after_commit`."""
        wanted = option(pending.job.option_source(), "after_commit")
        if not (self.settings.after_commit if wanted is None else wanted):
            return None
        return after_commit.deferrer()

    def push_pending(self, pending: PendingDispatch) -> str | None:
        """Push a job with its dispatch options; returns its id (None: a unique duplicate,
        or a unique job held until commit)."""
        return self._push_pending(pending, self._deferrer(pending))

    def _push_pending(
        self, pending: PendingDispatch, defer: after_commit.Deferrer | None
    ) -> str | None:
        guard = guard_for(pending.job)
        if guard is not None:
            no_group_for_unique(pending)
            if defer is not None:
                defer(lambda: push_guarded(self, pending, guard))
                return None
            warn_blocking()
            return push_guarded(self, pending, guard)
        group = group_of(pending)
        rq, queue, job_id, envelope, delay, priority = self._prepared(pending)
        if defer is None:
            warn_blocking()
            rq.push(queue, [(job_id, envelope)], delay, priority, group)
            self._queued(job_id, queue, pending, delay)
            return job_id

        def push() -> None:
            rq.push(queue, [(job_id, envelope)], delay, priority, group)
            self._queued(job_id, queue, pending, delay)

        defer(push)
        return job_id

    def _queued(self, job_id: str, queue: str, pending: PendingDispatch, delay: float) -> None:
        """Emit ``JobQueued``: built only when the meter or a listener takes it."""
        if self._meter is not None or self.events.has_listeners(JobQueued):
            self.emit(JobQueued(job_id, queue, pending.job.display_name(), delay))

    async def push_pending_async(self, pending: PendingDispatch) -> str | None:
        """Async twin of :meth:`push_pending`."""
        defer = self._deferrer(pending)
        if defer is not None:  # held until commit: nothing reaches Redis now
            return self._push_pending(pending, defer)
        guard = guard_for(pending.job)
        if guard is not None:
            no_group_for_unique(pending)
            return await push_guarded_async(self, pending, guard)
        group = group_of(pending)
        rq, queue, job_id, envelope, delay, priority = self._prepared(pending)
        await rq.push_async(queue, [(job_id, envelope)], delay, priority, group)
        self._queued(job_id, queue, pending, delay)
        return job_id

    def _grouped(
        self, jobs: Iterable[Job | PendingDispatch]
    ) -> tuple[list[str | None], dict[Any, _PushBatch], dict[int, GuardedPush]]:
        ids: list[str | None] = []
        # One group per connection, queue and delay; priorities travel per job, so a
        # batch of mixed priorities is still one round trip (push_priority.lua).
        groups: dict[Any, _PushBatch] = {}
        guarded: dict[int, GuardedPush] = {}  # position in ids -> unique/debounced push
        held: dict[Any, _PushBatch] = {}
        defer: after_commit.Deferrer | None = None
        for item in jobs:
            pending = item if isinstance(item, PendingDispatch) else PendingDispatch(item)
            guard = guard_for(pending.job)
            if guard is not None:
                no_group_for_unique(pending)
                guarded[len(ids)] = GuardedPush(self, pending, guard)
                ids.append(None)
                continue
            group = group_of(pending)  # fair groups: one push per (queue, group)
            rq, queue, job_id, envelope, delay, priority = self._prepared(pending)
            later = self._deferrer(pending)
            target = groups if later is None else held
            defer = later or defer
            key = (id(rq), rq, queue, delay, group, None if group is None else priority)
            bucket = target.get(key)
            if bucket is None:
                bucket = target[key] = _PushBatch()
            bucket.items.append((job_id, envelope))
            bucket.priorities.append(priority)
            ids.append(job_id)
        if defer is not None and held:
            defer(lambda: self._push_groups(held, 1000))
        return ids, groups, guarded

    @staticmethod
    def _push_groups(groups: dict[Any, _PushBatch], batch_size: int) -> None:
        for (_, rq, queue, delay, group, _p), bucket in groups.items():
            for start in range(0, len(bucket.items), batch_size):
                end = start + batch_size
                items, priorities = bucket.items[start:end], bucket.priorities[start:end]
                rq.push(queue, items, delay, priorities, group)

    def dispatch_many(
        self, jobs: Iterable[Job | PendingDispatch], *, batch_size: int = 1000
    ) -> list[str]:
        """Push many jobs, one round trip per batch per queue (whatever their
        priorities); returns the ids queued.

        Every job is encoded before anything is pushed, so a SerializationError
        leaves the queues untouched. Unique and debounced jobs go through their checks
        one by one, as :meth:`push_pending` does; a unique duplicate is dropped and has
        no id in the list.
        """
        ids, groups, guarded = self._grouped(jobs)
        if groups or guarded:
            warn_blocking()
        self._push_groups(groups, batch_size)
        for at, push in guarded.items():
            ids[at] = push.push()
        return [i for i in ids if i is not None]

    async def dispatch_many_async(
        self, jobs: Iterable[Job | PendingDispatch], *, batch_size: int = 1000
    ) -> list[str]:
        """Async twin of :meth:`dispatch_many`."""
        ids, groups, guarded = self._grouped(jobs)
        for (_, rq, queue, delay, group, _p), bucket in groups.items():
            for start in range(0, len(bucket.items), batch_size):
                end = start + batch_size
                items, priorities = bucket.items[start:end], bucket.priorities[start:end]
                await rq.push_async(queue, items, delay, priorities, group)
        for at, push in guarded.items():
            ids[at] = await push.push_async()
        return [i for i in ids if i is not None]

    def job_status(self, job_id: str, queue: str | None = None) -> JobStatus | None:
        """pending / delayed / reserved / done / failed / cancelled (``cancelling``: a
        running job asked to stop), or None once no record is left.

        The answer is a ``str`` that also carries the measured ``wait_s`` (dispatch to
        start) and ``runtime_s`` of the job's last run, while that record lasts (an
        hour; None before the job ran, or with metrics off), and ``progress`` (``done``,
        ``total``, ``note``, ``at``) as the job last reported it.
        """
        from tidings.moves.control import progress
        from tidings.observability.metrics import JobStatus, job_timing

        rq = self.queue_for(None)
        queues = [queue] if queue else sorted(self._queues_used)
        state = rq.status(job_id, queues)
        if state is None:
            return None
        reported = None
        for name in queues:
            try:
                reported = progress(rq, job_id, name)
            except Exception:  # a status answer never fails for want of a progress
                log.debug("no progress for %s", job_id, exc_info=True)
            if reported is not None:
                break
        timing = None
        if self.settings.metrics:
            try:
                timing = job_timing(rq.client, rq.prefix, job_id)
            except Exception:  # a status answer never fails for want of a measurement
                log.debug("no timing for %s", job_id, exc_info=True)
        return JobStatus.of(state, timing, reported)

    # -- control: results and cancelling ------------------------------------------------

    def _control_queues(self, queue: str | None) -> list[str]:
        return [queue] if queue else sorted(self._queues_used)

    def result(
        self, job_id: str, timeout_s: float | None = None, *, queue: str | None = None
    ) -> Any:
        """The return value of job ``job_id``, once it is done (waiting up to
        ``timeout_s``; None: as long as it takes). Needs ``store_result`` on the job
        (or ``.with_result()``, or ``TIDINGS_STORE_RESULTS=1``).

        Waits on the job's result channel (Redis pub/sub), not by polling. Looks on
        ``queue``, else on every queue this process dispatched to.

        Raises:
            JobFailedError: the job failed for good (class path and redacted message).
            JobCancelled: the job was cancelled.
            ResultMissing: no result: expired, never kept, or no such job.
            TimeoutError: not finished within ``timeout_s``.
        """
        from tidings.moves.control import result

        warn_blocking()
        return result(
            self.queue_for(None),
            job_id,
            self._control_queues(queue),
            signer=self.signer,
            resolve=self.resolve_class,
            timeout_s=timeout_s,
        )

    async def aresult(
        self, job_id: str, timeout_s: float | None = None, *, queue: str | None = None
    ) -> Any:
        """Async twin of :meth:`result`."""
        from tidings.moves.control import aresult

        return await aresult(
            self.queue_for(None),
            job_id,
            self._control_queues(queue),
            signer=self.signer,
            resolve=self.resolve_class,
            timeout_s=timeout_s,
        )

    def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        """Cancel job ``job_id``: waiting or delayed, it never runs (status
        ``cancelled``); running, an async handler is cancelled within a second (its
        ``finally`` blocks run) and a sync one sees ``self.cancelled``; a cancelled job
        is not retried and ``failed()`` is not called; a chain stops there (no
        ``catch``); a batch counts it as cancelled. Finished already: nothing changes,
        and the answer says so. Safe to call twice.

        Returns:
            ``"cancelled"``, ``"cancelling"`` (running), or ``"done"`` / ``"failed"`` /
            ``"cancelled already"`` / ``"failing"`` (its run failed and the failure is
            being recorded: too late) (``.changed`` False).

        Raises:
            JobNotFound: no such job on ``queue`` (else any queue this process used).
        """
        from tidings.moves.control import cancel

        return cancel(self.queue_for(None), job_id, self._control_queues(queue))

    async def acancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        """Async twin of :meth:`cancel`."""
        from tidings.moves.control import acancel

        return await acancel(self.queue_for(None), job_id, self._control_queues(queue))

    # -- events ------------------------------------------------------------------------

    def _queued_job(self, target: QueuedTarget, args: tuple[Any, ...]) -> PendingDispatch:
        pending = PendingDispatch(CallQueuedListener.for_target(target, args))
        if isinstance(target, QueuedFunction) and target.delay is not None:
            # The producer reads ``delay`` off the listener's class; a queued function
            # keeps its options per instance.
            pending.delay(target.delay)
        return pending

    def _queue_listener(self, target: QueuedTarget, args: tuple[Any, ...]) -> str | None:
        return self.push_pending(self._queued_job(target, args))

    async def _queue_listener_async(
        self, target: QueuedTarget, args: tuple[Any, ...]
    ) -> str | None:
        return await self.push_pending_async(self._queued_job(target, args))

    def listen(self, event: EventKey, listener: ListenerLike | Sequence[ListenerLike]) -> None:
        """Register listener(s) for an event class or name."""
        self.events.listen(event, listener)

    def listener(self, event: EventKey) -> Callable[[Any], Any]:
        """Decorator form of :meth:`listen`."""
        return self.events.listener(event)

    def subscribe(self, subscriber: object) -> None:
        """Register a subscriber (a class or object with ``subscribe(app)``)."""
        self.events.subscribe(subscriber)

    def forget(self, event: EventKey) -> None:
        """Remove every listener of an event."""
        self.events.forget(event)

    def discover(self, package: str) -> list[tuple[type[Any], type[Any]]]:
        """Register every Listener under ``package`` by its ``handle`` type hint."""
        return self.events.discover(package)

    def dispatch(self, event: Any, *args: Any) -> Any:
        """Dispatch an event (object or name) to its listeners; a Job is pushed instead."""
        if isinstance(event, (Job, PendingDispatch)):
            return (
                event if isinstance(event, PendingDispatch) else PendingDispatch(event)
            ).dispatch()
        if tracing.ENABLED and tracing.recording():
            with tracing.span(f"event {tracing.event_name(event)}"):
                return self.events.dispatch(event, *args)
        return self.events.dispatch(event, *args)

    async def dispatch_async(self, event: Any, *args: Any) -> Any:
        """Async twin of :meth:`dispatch`: async listeners are awaited."""
        if isinstance(event, (Job, PendingDispatch)):
            pending = event if isinstance(event, PendingDispatch) else PendingDispatch(event)
            return await pending.dispatch_async()
        if tracing.ENABLED and tracing.recording():
            with tracing.span(f"event {tracing.event_name(event)}"):
                return await self.events.dispatch_async(event, *args)
        return await self.events.dispatch_async(event, *args)

    def until(self, event: Any, *args: Any) -> Any:
        """The first non-None listener result."""
        return self.events.until(event, *args)

    # -- broadcasting (tidings.broadcasting) --------------------------------------------

    def _listen_for_broadcasts(self) -> None:
        """Queue a BroadcastEvent job for every dispatched ShouldBroadcast event."""
        from tidings.broadcasting.events import BroadcastEvent, ShouldBroadcast

        self.events.listen(ShouldBroadcast, BroadcastEvent)

    @property
    def broadcasting(self) -> Any:
        """Broadcast options, private-channel callbacks and publishing
        (:class:`tidings.broadcasting.Broadcasting`, created on first use)."""
        if self._broadcasting is None:
            from tidings.broadcasting.registry import Broadcasting

            self._broadcasting = Broadcasting(self)
        return self._broadcasting

    # -- notifications -----------------------------------------------------------------

    @property
    def notifications(self) -> Any:
        """The NotificationSender (created on first use)."""
        if self._notifications is None:
            from tidings.notifications.sender import NotificationSender

            self._notifications = NotificationSender(self)
        return self._notifications

    @notifications.setter
    def notifications(self, sender: Any) -> None:
        self._notifications = sender

    def notify(self, notifiables: Any, notification: Any) -> list[str]:
        """Send (or queue) ``notification`` to one or many notifiables; returns job ids."""
        ids: list[str] = self.notifications.send(notifiables, notification)
        return ids

    async def notify_async(self, notifiables: Any, notification: Any) -> list[str]:
        """Async twin of :meth:`notify`."""
        ids: list[str] = await self.notifications.send_async(notifiables, notification)
        return ids

    async def worker_stopped(self, worker: RunningWorker | None) -> None:
        """Called by a worker as it exits, on its loop: close that loop's channels
        (QUIT the SMTP connection, close HTTP clients), after its lifecycle listeners."""
        await self.wait_listeners()
        meter = self._meter
        client = worker.client if worker is not None else None
        if meter is not None and worker is not None and meter.worker is worker:
            self._meter = None
            if client is not None:
                await meter.close(client)
        channels = getattr(self._notifications, "channels", None)
        if channels is not None:
            await channels.close_loop()

    def extend_channel(self, name: str, factory: Callable[..., Any]) -> None:
        """Add a notification channel: a class with ``async send(notifiable, notification)``."""
        self.notifications.channels.extend(name, factory)

    # -- integrations ------------------------------------------------------------------

    def wrap_thread_call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped by :attr:`thread_call_wrappers` (a worker calls it in the
        thread that runs a sync job or loads its model arguments)."""
        for wrap in reversed(self.thread_call_wrappers):
            fn = wrap(fn)
        return fn

    def skips_missing_model(self, job_cls: type[Any], data: Any) -> bool:
        """Whether a job whose model argument is gone is dropped (True) or failed
        (see :func:`tidings.contrib.models.skips_missing_model`)."""
        from tidings.contrib.models import skips_missing_model

        return skips_missing_model(self, job_cls, data)

    async def aopen(self) -> None:
        """Open this event loop's Redis client and check it answers (fail at start-up,
        not at the first dispatch)."""
        import redis

        from tidings.errors import QueueUnavailable

        try:
            await self.queue_for(None).aclient().ping()
        except redis.RedisError as exc:
            raise QueueUnavailable(
                f"Redis did not answer at start-up ({exc}); check TIDINGS_REDIS_URL"
            ) from exc

    async def aclose(self) -> None:
        """Close this event loop's Redis clients and channels, then the sync ones."""
        loop = asyncio.get_running_loop()
        for rq in self._queues.values():
            client = rq._async.pop(loop, None)
            if client is not None:
                await client.aclose()
        await self.worker_stopped(None)
        self.close()

    def close(self) -> None:
        """Close sync Redis connections (and the notifications database's pool)."""
        for rq in self._queues.values():
            rq.close()
        if self._database is not None:
            self._database.close()
