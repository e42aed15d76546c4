"""OpenTelemetry traces through the queue (W3C trace context in the job payload).

With ``opentelemetry-api`` installed (``pip install 'tidings[otel]'``) and a tracer
provider configured by the application, one trace shows::

    request ─▶ event UserRegistered ─▶ process SendWelcome (queued listener, in a worker)
            ─▶ process SendQueuedNotifications ─▶ notify mail / notify sms / notify webhook

Dispatch writes the current context into the signed body (``trace``: the
``traceparent``/``tracestate`` headers); the worker continues it in a CONSUMER span
named ``process <job>``, with ``tidings.job.id``, ``messaging.destination.name`` (the
queue), ``tidings.job.attempt`` and ``tidings.job.outcome`` (processed, released,
failed, or exception: retried or failed by the worker's rules).

Without the package nothing is imported and every hook is a constant check.
``TIDINGS_TRACING=0`` turns it off with the package installed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from importlib.util import find_spec
from typing import Any

_OFF = {"0", "false", "no", "off"}


def _available() -> bool:
    if os.environ.get("TIDINGS_TRACING", "").lower() in _OFF:
        return False
    try:
        found = find_spec("opentelemetry") is not None
        return found and find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # pragma: no cover - a broken install
        return False


ENABLED: bool = _available()
"""Whether tracing is on (opentelemetry-api importable and not turned off)."""

_tracer: Any = None


def tracer() -> Any:
    """The ``tidings`` tracer (follows the provider the application sets, even later)."""
    global _tracer
    if _tracer is None:
        from opentelemetry import trace

        from tidings._version import __version__

        _tracer = trace.get_tracer("tidings", __version__)
    return _tracer


def recording() -> bool:
    """Whether the application has set a tracer provider (without one, every span would
    be a no-op: the job path then skips them).

    OpenTelemetry sets the global provider once; after that this is one flag check.
    Before, it is a check of the global (not of the environment, as
    ``get_tracer_provider`` does on each call: two calls a job cost ~4 us)."""
    global _trace, _recording, _named_in_env
    if _recording:
        return True
    if _trace is None:
        from opentelemetry import trace

        _trace = trace
        _named_in_env = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    if not _named_in_env and getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return False  # nothing set yet
    provider = _trace.get_tracer_provider()
    _recording = not isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider)
    return _recording


_UNKNOWN = object()
_recording = False
_named_in_env = False
_trace: Any = None


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers, for a job's body (None: no trace)."""
    global _get_current, _inject
    if not ENABLED:
        return None
    if _inject is None:
        from opentelemetry.context import get_current
        from opentelemetry.propagate import inject

        _get_current, _inject = get_current, inject
    if not _get_current():
        # An empty context holds no span and no baggage: the propagators would write
        # nothing (asking them costs ~2 us a dispatch).
        return None
    out: dict[str, str] = {}
    _inject(out)
    return out or None


_get_current: Any = None
_inject: Any = None


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, kind: str = "INTERNAL"
) -> Iterator[Any]:
    """A span around a block (nothing without OpenTelemetry)."""
    if not ENABLED or not recording():
        yield None
        return
    from opentelemetry.trace import SpanKind

    with tracer().start_as_current_span(name, kind=getattr(SpanKind, kind),
                                        attributes=dict(attributes or {})) as s:  # fmt: skip
        yield s


def event_name(event: object) -> str:
    """The span name part of an event (its class name, or the string event)."""
    return event if isinstance(event, str) else type(event).__name__


async def run_job(run: Any, call: Callable[[], Awaitable[Any]]) -> Any:
    """Run a job's pipeline inside a CONSUMER span continuing the dispatcher's trace."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind, Status, StatusCode

    body = run.body or {}
    headers = body.get("trace")
    parent = extract(headers) if isinstance(headers, dict) else None
    attrs = {
        "messaging.system": "tidings",
        "messaging.operation": "process",
        "messaging.destination.name": run.queue,
        "tidings.job.id": run.job_id,
        "tidings.job.class": str(body.get("job", "")),
        "tidings.job.attempt": int(run.attempts),
    }
    name = f"process {body.get('displayName', 'job')}"
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.CONSUMER,
                                        attributes=attrs, record_exception=False,
                                        set_status_on_exception=False) as s:  # fmt: skip
        try:
            result = await call()
        except BaseException as exc:
            s.set_attribute("tidings.job.outcome", "exception")
            s.record_exception(exc)
            s.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}"))
            raise
        if getattr(run, "failed_exc", None) is not None:
            outcome = "failed"
            s.set_status(Status(StatusCode.ERROR, "failed"))
        elif getattr(run, "released_s", None) is not None:
            outcome = "released"
        else:
            outcome = "processed"
        s.set_attribute("tidings.job.outcome", outcome)
        return result
