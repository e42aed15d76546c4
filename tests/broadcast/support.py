"""Helpers of the broadcast tests: a broadcast server process and an SSE reader."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support import Proc, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
NOTIFY_WORKER = str(Path(sys.executable).parent / "notify-worker")
APP_SPEC = "tests.broadcast.bc_app:app"
KEY = "broadcast-test-key-0123456789abcdef"


def env_for(url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDINGS_", "BC_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        TIDINGS_REDIS_URL=url,
        TIDINGS_KEY=KEY,
        TIDINGS_PREFIX=prefix,
        TIDINGS_ALLOWED_MODULES="tests.broadcast",
        **extra,
    )
    return env


def start_server(
    spawn: Callable[..., Proc], url: str, prefix: str, *args: str, **extra: str
) -> tuple[Proc, str]:
    """``notify-worker broadcast-server`` on a free loopback port; returns (proc, base URL)."""
    port = free_port()
    proc = spawn(
        [NOTIFY_WORKER, "broadcast-server", "-A", APP_SPEC, "--port", str(port), *args],
        name="broadcast-server",
        env=env_for(url, prefix, **extra),
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not proc.alive():
            raise AssertionError(f"broadcast-server exited:\n{proc.tail()}")
        try:
            return httpx.get(base + "/tidings-broadcast.js", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 30.0, 0.1, message="the broadcast server to answer")
    return proc, base


@dataclass
class Event:
    id: str | None
    event: str | None
    data: Any


@dataclass
class SseReader:
    """Reads one SSE response on a thread: events, comments, the ids seen."""

    status: int = 0
    body: bytes = b""
    events: list[Event] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    last_id: str | None = None
    opened: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def wait_events(self, n: int, timeout_s: float = 20.0) -> list[Event]:
        wait_for(lambda: len(self.events) >= n or self.done.is_set(), timeout_s, 0.02,
                 message=f"{n} SSE events (got {len(self.events)})")  # fmt: skip
        return self.events


@contextmanager
def sse(
    base: str,
    channels: list[str],
    *,
    user: int | None = None,
    last_event_id: str | None = None,
    params: dict[str, str] | None = None,
    extra_headers: dict[str, str] | None = None,
) -> Iterator[SseReader]:
    """Open ``base/?channel=...`` as a browser would; the reader fills on a thread."""
    reader = SseReader()
    headers = {"accept": "text/event-stream", **(extra_headers or {})}
    if user is not None:
        headers["x-user"] = str(user)
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    query = [("channel", c) for c in channels] + list((params or {}).items())

    def run() -> None:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(5.0, read=None)) as client,
                client.stream("GET", base + "/", params=query, headers=headers) as resp,
            ):
                reader.status = resp.status_code
                if resp.status_code != 200:
                    reader.body = resp.read()
                    reader.opened.set()
                    return
                reader.opened.set()
                fields: dict[str, str] = {}
                for line in resp.iter_lines():
                    if reader.stop.is_set():
                        return
                    if line == "":
                        if "id" in fields:
                            reader.last_id = fields["id"]
                        if "data" in fields:
                            reader.events.append(Event(fields.get("id"), fields.get("event"),
                                                       orjson.loads(fields["data"])))  # fmt: skip
                        fields = {}
                    elif line.startswith(":"):
                        reader.comments.append(line)
                    else:
                        name, _, value = line.partition(":")
                        fields[name] = value[1:] if value.startswith(" ") else value
        except BaseException as exc:
            reader.error = exc
        finally:
            reader.opened.set()
            reader.done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not reader.opened.wait(20.0):
        raise AssertionError("the SSE request got no answer")
    try:
        yield reader
    finally:
        reader.stop.set()
        # The thread ends at the next line (a heartbeat) or when the server closes.
        thread.join(0.1)


def settle(seconds: float = 0.0) -> None:
    time.sleep(seconds)
