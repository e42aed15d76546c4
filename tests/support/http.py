"""Scripted HTTP servers on loopback for SMS-provider and webhook tests.

``HttpServer`` is a threaded ``http.server`` that records every request (``hits``) and
answers with :class:`Reply` objects: from a fixed list (the last one repeats) or from
a function of the request. A reply can delay, drip its body a byte at a time, stream
an endless chunked body, or announce a huge Content-Length. An ``HttpServer`` nobody
should reach doubles as a *canary*: its ``hits`` must stay empty.

Nothing here imports tidings.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["Hit", "HttpServer", "Reply"]


@dataclass
class Hit:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client: str


@dataclass
class Reply:
    """How to answer one request.

    Attributes:
        status: HTTP status.
        body: response body (or the unit an endless/huge body repeats).
        headers: extra headers.
        delay_s: sleep before answering at all.
        drip_s: send the body one byte per ``drip_s`` seconds.
        endless: stream chunks of ``body`` forever (chunked encoding).
        content_length: announce this length and keep sending ``body`` until the
            client goes away (a "100 MB" body without sending 100 MB up front).
    """

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drip_s: float | None = None
    endless: bool = False
    content_length: int | None = None


Script = Sequence[Reply] | Callable[[Hit], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: HttpServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        hit = Hit(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            self.client_address[0],
        )
        owner = self.server.owner
        reply = owner.record(hit)
        try:
            self._answer(reply, owner.stopping)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = _handle

    def _wait(self, seconds: float, stopping: threading.Event) -> bool:
        return not stopping.wait(seconds)

    def _answer(self, reply: Reply, stopping: threading.Event) -> None:
        if reply.delay_s and not self._wait(reply.delay_s, stopping):
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.endless:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = reply.body or b"x" * 16384
            while not stopping.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        if reply.content_length is not None:
            self.send_header("Content-Length", str(reply.content_length))
            self.end_headers()
            chunk = reply.body or b"x" * 65536
            sent = 0
            while sent < reply.content_length and not stopping.is_set():
                self.wfile.write(chunk)
                sent += len(chunk)
            return
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.drip_s is None:
            self.wfile.write(reply.body)
            return
        for i in range(len(reply.body)):
            self.wfile.write(reply.body[i : i + 1])
            self.wfile.flush()
            if not self._wait(reply.drip_s, stopping):
                return


class HttpServer:
    """A scripted HTTP/1.1 server on ``host`` (default 127.0.0.1), as a context manager.

    Attributes:
        hits: every request received, in order.
        port: the listening port.
    """

    def __init__(
        self,
        script: Script = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.script = script
        self.hits: list[Hit] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server((host, port), _Handler)
        self._server.owner = self
        self.scheme = "http"
        if tls_context is not None:
            # Handshakes run in accept(); a failed one is an OSError the server ignores.
            self._server.socket = tls_context.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def record(self, hit: Hit) -> Reply:
        with self._lock:
            self.hits.append(hit)
            index = len(self.hits) - 1
        if callable(self.script):
            return self.script(hit)
        if not self.script:
            return Reply()
        return self.script[min(index, len(self.script) - 1)]

    def start(self) -> HttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def wait_for_hits(server: HttpServer, count: int, timeout_s: float = 5.0) -> bool:
    """Poll until ``server`` has at least ``count`` hits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(server.hits) >= count:
            return True
        time.sleep(0.02)
    return len(server.hits) >= count
