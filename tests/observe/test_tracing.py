"""OpenTelemetry traces through the queue, recorded with the SDK's in-memory exporter.

One trace must hold: request -> event Signup -> process (queued listener, in a worker)
-> process (queued notification) -> notify memo (the channel send), each span the child
of the one before, with the job id, queue, attempt and outcome as attributes. Without
opentelemetry importable, nothing is imported and no trace field is written.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidings import App, Event, Job, Listener, ShouldQueue
from tidings.notifications import Notifiable, Notification
from tidings.observability import tracing
from tidings.worker.worker import Worker, WorkerOptions

KEY = "tracing-test-key-0123456789abcdef"
MODULE = __name__
ROOT = Path(__file__).resolve().parents[2]
SENT: list[str] = []

_EXPORTER = InMemorySpanExporter()
_PROVIDER: TracerProvider | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    global _PROVIDER
    if _PROVIDER is None:  # a process may set its provider once
        _PROVIDER = TracerProvider()
        _PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


@dataclass
class Signup(Event):
    user_id: int


@dataclass
class Member(Notifiable):
    id: int

    def route_notification_for_memo(self, notification: Any) -> str:
        return f"#u{self.id}"


@dataclass
class Hello(Notification, ShouldQueue):
    text: str

    def via(self, notifiable: Any) -> list[str]:
        return ["memo"]


class MemoChannel:
    def __init__(self, app: App) -> None:
        self.app = app

    async def send(self, notifiable: Any, notification: Any) -> str:
        SENT.append(notifiable.route_notification_for("memo", notification))
        return "ok"


class Welcome(Listener, ShouldQueue):
    async def handle(self, event: Signup) -> None:
        await App.current().notify_async(Member(event.user_id), Hello("welcome"))


@dataclass
class Broken(Job):
    async def handle(self) -> None:
        raise ValueError("no")


@pytest.fixture
def app(redis_url: str, prefix: str) -> Iterator[App]:
    a = App(env=False, redis_url=redis_url, key=KEY, prefix=prefix, allowed_modules=MODULE)
    a.extend_channel("memo", MemoChannel)
    try:
        yield a
    finally:
        a.close()


def drain(app: App) -> None:
    assert asyncio.run(Worker(app, WorkerOptions(stop_when_empty=True, sleep_s=0.2)).run()) == 0


def by_name(spans: tuple[ReadableSpan, ...], start: str) -> ReadableSpan:
    found = [s for s in spans if s.name.startswith(start)]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def test_one_trace_from_request_to_channel_send(app: App, spans: InMemorySpanExporter) -> None:
    assert tracing.ENABLED
    SENT.clear()
    app.listen(Signup, Welcome)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request"):
        app.dispatch(Signup(7))
    drain(app)
    assert SENT == ["#u7"]
    got = spans.get_finished_spans()
    request = by_name(got, "request")
    event = by_name(got, "event Signup")
    listener = by_name(got, "process Welcome")
    note = by_name(got, "process Hello")
    send = by_name(got, "notify memo")
    chain = [request, event, listener, note, send]
    assert len({s.context.trace_id for s in chain}) == 1  # one trace
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id, (
            child.name
        )
    assert listener.kind == trace.SpanKind.CONSUMER
    attrs = dict(listener.attributes or {})
    assert attrs["messaging.destination.name"] == "default"
    assert attrs["tidings.job.attempt"] == 1
    assert attrs["tidings.job.outcome"] == "processed"
    assert len(str(attrs["tidings.job.id"])) == 32
    assert dict(send.attributes or {})["tidings.channel"] == "memo"


def test_a_failing_job_span_says_so(app: App, spans: InMemorySpanExporter) -> None:
    job_id = Broken().dispatch()
    drain(app)
    span = by_name(spans.get_finished_spans(), "process Broken")
    attrs = dict(span.attributes or {})
    assert attrs["tidings.job.id"] == job_id
    assert attrs["tidings.job.outcome"] == "exception"
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.parent is None  # dispatched outside any trace: a new root


NO_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed
from tidings import Job
from tidings.observability import tracing
from tidings.jobs.compose import build_body
class J(Job):
    pass
J.__module__ = "tidings.x"
body = build_body(J(), "0" * 32)
assert "trace" not in body, body
assert not tracing.ENABLED
assert not [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]], sys.modules
print("ok")
"""


def test_without_opentelemetry_nothing_is_imported() -> None:
    done = subprocess.run([sys.executable, "-c", NO_OTEL], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
