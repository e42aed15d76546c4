"""Notification figures: mails/s and webhooks/s through the queue, beside per-message baselines.

Through the queue: N recipients are notified with the app's normal API
(``app.notify([route("mail", addr), ...], BenchMail())``, a queued notification: one
``SendQueuedNotification`` job per recipient), then one ``notify-worker -A
benchmarks.bench_notify_app:app --stop-when-empty`` process delivers them to a sink in
this process. Timed from the worker's ``WorkerStarting`` (wall clock, written to Redis)
to the last message the sink received (its wall clock); the run checks that the sink
got all N, each once (distinct Message-ID / ``webhook-id``), and that the queue has N
done and none failed.

Baselines, in the same run and against the same sink, from a separate process too (so
the client never shares the sink's GIL): stdlib ``smtplib`` with one connection per
message (``SMTP(host, port)`` -> ``sendmail`` -> ``quit``), and one unpooled
``httpx.post(url, ...)`` per webhook. They send what ours sends (the MIME bytes our
worker renders for the mail, a body our worker delivered for the webhook), and are timed
from the client's start (after its imports) to the last message the sink received. A
third mail row, smtplib over one reused connection, is the most one client gets through
this sink; the fourth, four such clients in parallel processes, is the most the sink
accepts at all (aiosmtpd spends ~0.35 ms of CPU on a message even over a reused
connection, ~1 ms with a connection per message): the ceiling of the mail ratio, printed
as a multiple of the baseline.

Sinks: aiosmtpd's ``Controller`` (its own thread and event loop) counting messages in
``handle_DATA``; a minimal asyncio HTTP/1.1 server (keep-alive, Content-Length bodies)
in a thread, answering ``200`` to every request.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.bench_queue import (
    ROOT,
    WORKER_TIMEOUT_S,
    Ctx,
    Row,
    fmt_rate,
    fmt_ratio,
    interleaved,
    rate,
    spawn,
    stderr_tail,
    stop,
    worker_env,
)

N_DEFAULT, N_QUICK, N_SLOW = 2_000, 500, 500
CEILING_CLIENTS = 4
SECRET = "whsec_YmVuY2htYXJrLXNlY3JldC1mb3Itbm90aWZ5LWZpZ3VyZXM="
MAIL_FROM = "shop@example.org"
_PLACEHOLDER = "P" * 32  # the Message-ID the baseline replaces per mail


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Tally:
    """Arrival count, last arrival (wall clock) and delivery ids, shared with a sink thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.count = 0
            self.last = 0.0
            self.ids: set[bytes] = set()
            self.sample: bytes = b""

    def hit(self, ident: bytes, sample: bytes) -> None:
        now = time.time()
        with self.lock:
            self.count += 1
            self.last = now
            self.ids.add(ident)
            if not self.sample:
                self.sample = sample


def _header(raw: bytes, name: bytes) -> bytes:
    """The value of header ``name`` (lower case, with the colon) in ``raw``, or b""."""
    at = raw.lower().find(b"\n" + name)
    if at < 0:
        return b""
    end = raw.find(b"\r\n", at + 1)
    return raw[at + 1 + len(name) : end if end >= 0 else None].strip()


# -- sinks -----------------------------------------------------------------------------


class SmtpSink:
    """aiosmtpd on 127.0.0.1 in its own thread; counts each DATA with its Message-ID."""

    def __init__(self) -> None:
        self.tally = _Tally()
        self.port = 0
        self._controller: Any = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        data = envelope.original_content or b""
        self.tally.hit(_header(data, b"message-id:") or b"-", data)
        return "250 2.0.0 queued"

    def __enter__(self) -> SmtpSink:
        from aiosmtpd.controller import Controller

        for _ in range(5):
            self.port = _free_port()
            controller = Controller(
                self, hostname="127.0.0.1", port=self.port, server_hostname="sink.bench"
            )
            try:
                controller.start()  # makes one probe connection (no DATA)
            except OSError:
                continue
            self._controller = controller
            return self
        raise RuntimeError("could not start aiosmtpd")

    def __exit__(self, *exc: object) -> None:
        if self._controller is not None:
            self._controller.stop()


class _HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 requests with Content-Length bodies, answered 200 with keep-alive."""

    def __init__(self, tally: _Tally) -> None:
        self.tally = tally
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[: end + 2]
            length = int(_header(head, b"content-length:") or 0)
            if len(self.buf) < end + 4 + length:
                return
            request = self.buf[: end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.tally.hit(_header(head, b"webhook-id:") or b"-", request)
            close = _header(head, b"connection:").lower() == b"close"
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n"
                + (b"connection: close\r\n" if close else b"")
                + b"\r\nok"
            )
            if close:
                self.transport.close()
                return


class HttpSink:
    """A minimal asyncio HTTP server on 127.0.0.1 in its own thread."""

    def __init__(self) -> None:
        self.tally = _Tally()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="http-sink", daemon=True
        )
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HttpSink:
        self._thread.start()

        async def serve() -> asyncio.AbstractServer:
            return await self._loop.create_server(
                lambda: _HttpProtocol(self.tally), "127.0.0.1", 0, backlog=1024
            )

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


# -- baselines (a separate process, so the client does not share the sink's GIL) -----

_SMTPLIB_CLIENT = """
import smtplib, sys, time
port, n, sender, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
data = open(path, "rb").read()
print(f"{time.time():.6f}", flush=True)
for i in range(n):
    s = smtplib.SMTP("127.0.0.1", port)
    s.sendmail(sender, [f"user{i}@example.org"], data.replace(b"P" * 32, b"%032d" % i))
    s.quit()
"""

_SMTPLIB_REUSED_CLIENT = """
import smtplib, sys, time
port, n, sender, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
first = int(sys.argv[5]) if len(sys.argv) > 5 else 0
data = open(path, "rb").read()
print(f"{time.time():.6f}", flush=True)
s = smtplib.SMTP("127.0.0.1", port)
for i in range(first, first + n):
    s.sendmail(sender, [f"user{i}@example.org"], data.replace(b"P" * 32, b"%032d" % i))
s.quit()
"""

_HTTPX_CLIENT = """
import sys, time, httpx
url, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = open(path, "rb").read()
print(f"{time.time():.6f}", flush=True)
for i in range(n):
    r = httpx.post(url, content=body, headers={
        "content-type": "application/json", "webhook-id": "%032d" % i})
    r.raise_for_status()
"""


def _run_client(script: str, args: list[str], tally: _Tally, n: int) -> float:
    """Run a baseline client; per second from its start line to the sink's last arrival."""
    return _run_clients(script, [args], tally, n)


def _run_clients(script: str, argvs: list[list[str]], tally: _Tally, n: int) -> float:
    """Run baseline clients at once, each in its own process; per second from the first
    one's start line (printed after its imports) to the sink's last arrival (``n`` in all)."""
    tally.reset()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args in argvs
    ]
    starts: list[float] = []
    for proc in procs:
        out, err = proc.communicate(timeout=WORKER_TIMEOUT_S)
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"baseline client exited with {proc.returncode}: {tail}")
        starts.append(float(out.split()[0]))
    _check_arrivals(tally, n, "baseline")
    return rate(n, tally.last - min(starts))


def _check_arrivals(tally: _Tally, n: int, who: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while tally.count < n and time.monotonic() < deadline:
        time.sleep(0.01)
    with tally.lock:
        count, distinct = tally.count, len(tally.ids)
    if count != n or distinct != n:
        raise RuntimeError(f"{who}: sink received {count} ({distinct} distinct) of {n}")


# -- through the queue -----------------------------------------------------------------


def _drain(ctx: Ctx, kind: str, n: int, tally: _Tally, env: dict[str, str]) -> float:
    """Queue N notifications, run one notify-worker until empty; per second at the sink."""
    from benchmarks import bench_notify_app as na
    from tidings.notifications import route

    ctx.clean()
    tally.reset()
    if kind == "mail":
        recipients = [route("mail", f"user{i}@example.org") for i in range(n)]
        na.app.notify(recipients, na.BenchMail("O-42"))
    else:
        url = env["BENCH_HOOK_URL"]
        recipients = [route("webhook", f"{url}/hooks/{i % 10}") for i in range(n)]
        na.app.notify(recipients, na.BenchHook("O-42"))
    argv = [sys.executable, "-m", "tidings.cli", "-A", "benchmarks.bench_notify_app:app"]
    worker = spawn([*argv, "--stop-when-empty"], env)
    try:
        code = worker.wait(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop(worker, timeout_s=5)
        raise RuntimeError(
            f"{kind}: worker still running after {WORKER_TIMEOUT_S:.0f}s "
            f"({tally.count} of {n} at the sink)"
        ) from None
    if code != 0:
        raise RuntimeError(f"{kind}: worker exited with {code}: {stderr_tail(worker)}")
    _check_arrivals(tally, n, kind)
    k = na.app.queue_for(None).keys("default")
    done, failed = int(ctx.client.zcard(k.done)), int(ctx.client.zcard(k.failed))
    if done != n or failed:
        raise RuntimeError(f"{kind}: expected {n} done, got {done} done and {failed} failed")
    started = float(ctx.client.lrange(na.mark_key("started"), 0, -1)[0])
    return rate(n, tally.last - started)


def _sample_mail(n_id: str) -> bytes:
    """The bytes our worker sends for one BenchMail (Message-ID left as a placeholder)."""
    from benchmarks import bench_notify_app as na
    from tidings.notifications.messages import make_environment

    message = na.BenchMail("O-42").to_mail(None)
    msg = message.to_email(
        to="user0@example.org", mail_from=MAIL_FROM, delivery_id=n_id, env=make_environment()
    )
    return msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))  # CRLF, as aiosmtplib sends


def notify_rows(ctx: Ctx) -> list[Row]:
    """mails/s and webhooks/s through the queue, beside per-message baselines."""
    import tempfile
    from pathlib import Path

    from tidings import App
    from tidings.notifications import verify_webhook

    try:
        previous: App | None = App.current()
    except Exception:
        previous = None

    n = min(ctx.n, N_QUICK if ctx.quick else N_DEFAULT)
    n_slow = min(n, N_SLOW)  # the httpx.post() baseline: ~40/s would take a minute per run
    runs = 1 if ctx.quick else ctx.runs
    rows: list[Row] = []
    try:
        with SmtpSink() as smtp, HttpSink() as http, tempfile.TemporaryDirectory() as tmp:
            env = worker_env(
                ctx,
                TIDINGS_MAIL_URL=f"smtp://127.0.0.1:{smtp.port}?tls=off",
                TIDINGS_MAIL_FROM=MAIL_FROM,
                TIDINGS_WEBHOOK_SECRET=SECRET,
                BENCH_HOOK_URL=http.url,
            )
            mail_file = Path(tmp) / "mail.eml"
            mail_file.write_bytes(_sample_mail(_PLACEHOLDER))

            def ours_mail() -> float:
                return _drain(ctx, "mail", n, smtp.tally, env)

            def base_mail() -> float:
                args = [str(smtp.port), str(n), MAIL_FROM, str(mail_file)]
                return _run_client(_SMTPLIB_CLIENT, args, smtp.tally, n)

            def reused_mail() -> float:
                args = [str(smtp.port), str(n), MAIL_FROM, str(mail_file)]
                return _run_client(_SMTPLIB_REUSED_CLIENT, args, smtp.tally, n)

            def ceiling_mail() -> float:
                # The most this sink accepts: CEILING_CLIENTS processes, each on one reused
                # connection, in parallel. No client, ours included, can get more through.
                per = n // CEILING_CLIENTS
                argvs = [
                    [str(smtp.port), str(per), MAIL_FROM, str(mail_file), str(c * per)]
                    for c in range(CEILING_CLIENTS)
                ]
                total = per * CEILING_CLIENTS
                return _run_clients(_SMTPLIB_REUSED_CLIENT, argvs, smtp.tally, total)

            ours_mail()  # warm-up (imports, .pyc) and a check that the setup works
            mail, mail_base, mail_reused, mail_ceiling = interleaved(
                runs, ours_mail, base_mail, reused_mail, ceiling_mail
            )
            rows += [
                Row(
                    f"mail through the queue -> aiosmtpd, 1 worker, N={n:,}",
                    fmt_rate(mail, "mails/s"),
                    f"smtplib, 1 connection per mail {fmt_rate(mail_base, '/s')}",
                    fmt_ratio(mail, mail_base),
                    ">= 10x",
                ),
                Row(
                    "",
                    "",
                    f"smtplib, 1 reused connection {fmt_rate(mail_reused, '/s')}",
                    fmt_ratio(mail, mail_reused),
                ),
                Row(
                    "",
                    "",
                    f"sink ceiling: {CEILING_CLIENTS} processes x 1 reused connection "
                    f"{fmt_rate(mail_ceiling, '/s')}",
                    fmt_ratio(mail, mail_ceiling),
                    f"ceiling = {mail_ceiling / mail_base:.1f}x the baseline",
                ),
            ]

            def ours_hook() -> float:
                return _drain(ctx, "webhook", n, http.tally, env)

            ours_hook()  # warm-up, and the body the baseline will send
            sample = http.tally.sample
            head, _, body = sample.partition(b"\r\n\r\n")
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (ln.partition(":") for ln in head.decode().split("\r\n")[1:])
            }
            verify_webhook(SECRET, headers, body)  # the worker really signs what it sends
            hook_file = Path(tmp) / "hook.json"
            hook_file.write_bytes(body)

            def base_hook() -> float:
                args = [f"{http.url}/hooks/0", str(n_slow), str(hook_file)]
                return _run_client(_HTTPX_CLIENT, args, http.tally, n_slow)

            hook, hook_base = interleaved(runs, ours_hook, base_hook)
            rows.append(
                Row(
                    f"webhooks through the queue -> loopback HTTP, 1 worker, N={n:,}",
                    fmt_rate(hook, "hooks/s"),
                    f"httpx.post() per call, unpooled, N={n_slow:,} {fmt_rate(hook_base, '/s')}",
                    fmt_ratio(hook, hook_base),
                    ">= 5x",
                )
            )
    finally:
        ctx.clean()
        if previous is not None:
            previous.make_current()
    ctx.notes.append(
        f"notify: N={n:,} per figure (not the queue figures' N; httpx.post() baseline "
        f"N={n_slow:,}); timed worker start -> last arrival at the sink; baselines run in "
        "their own process, same sink"
    )
    return rows
