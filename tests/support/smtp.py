"""SMTP servers on loopback for mail-transport tests: aiosmtpd with scripted replies, a tarpit.

``SmtpServer`` runs aiosmtpd's ``Controller`` in its own thread and records every
accepted message and every TCP session, so a test can prove that invalid input opened
*no* session. Replies are scripted per recipient (``rcpt_replies``) or for DATA
(``data_reply``, ``data_delay_s``, ``close_after_data``). ``Tarpit`` accepts
connections and never sends the 220 banner.

Nothing here imports tidings.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, Session

from .procs import free_port

__all__ = ["Received", "Recorder", "SmtpServer", "Tarpit", "TlsFiles", "make_tls", "wait_until"]


@dataclass
class Received:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    data: bytes


@dataclass
class Recorder:
    """aiosmtpd handler: records sessions and messages, answers as scripted."""

    rcpt_replies: dict[str, str] = field(default_factory=dict)
    data_reply: str | None = None
    data_delay_s: float = 0.0
    close_after_data: bool = False
    drop_after_messages: int | None = None
    messages: list[Received] = field(default_factory=list)
    rcpts_seen: list[str] = field(default_factory=list)
    sessions: int = 0
    auth_attempts: list[tuple[str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        # Hang up without a reply once this session has carried enough messages: what
        # a server's idle timeout looks like to a client that still holds the socket.
        done = getattr(session, "delivered", 0)
        if self.drop_after_messages is not None and done >= self.drop_after_messages:
            if isinstance(server.transport, asyncio.Transport):
                server.transport.abort()
            return "421 4.4.2 idle too long"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        with self.lock:
            self.rcpts_seen.append(address)
        reply = self.rcpt_replies.get(address)
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_delay_s:
            await asyncio.sleep(self.data_delay_s)
        if self.data_reply is not None:
            reply = self.data_reply
        else:
            with self.lock:
                self.messages.append(
                    Received(
                        str(envelope.mail_from),
                        list(envelope.rcpt_tos),
                        envelope.original_content or b"",
                    )
                )
            reply = "250 2.0.0 queued as 42"
            session.delivered = getattr(session, "delivered", 0) + 1  # type: ignore[attr-defined]
        if self.close_after_data and server.transport is not None:
            asyncio.get_running_loop().call_later(0.05, server.transport.close)
        return reply


class _CountingSMTP(SMTP):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        recorder: Recorder = self.event_handler
        with recorder.lock:
            recorder.sessions += 1
        super().connection_made(transport)


class _Controller(Controller):
    def factory(self) -> SMTP:
        return _CountingSMTP(self.handler, **self.SMTP_kwargs)


def failing_authenticator(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
) -> AuthResult:
    """An aiosmtpd authenticator that refuses everyone (535)."""
    return AuthResult(success=False, handled=False)


class SmtpServer:
    """aiosmtpd on 127.0.0.1 (optionally STARTTLS or AUTH), as a context manager.

    Attributes:
        recorder: the handler; ``messages``, ``sessions`` and ``rcpts_seen`` are live.
        port: the listening port.
    """

    def __init__(
        self,
        recorder: Recorder | None = None,
        *,
        tls_context: ssl.SSLContext | None = None,
        require_starttls: bool = False,
        implicit_tls: ssl.SSLContext | None = None,
        authenticator: Any = None,
    ) -> None:
        self.recorder = recorder or Recorder()
        self.port = 0
        self._kwargs: dict[str, Any] = {"server_hostname": "mx.test"}
        if tls_context is not None:
            self._kwargs.update(tls_context=tls_context, require_starttls=require_starttls)
        if implicit_tls is not None:
            self._kwargs.update(ssl_context=implicit_tls)
        if authenticator is not None:
            self._kwargs.update(authenticator=authenticator, auth_require_tls=False)
        self._controller: _Controller | None = None

    @property
    def messages(self) -> list[Received]:
        return self.recorder.messages

    @property
    def sessions(self) -> int:
        return self.recorder.sessions

    def start(self) -> SmtpServer:
        for _ in range(5):
            self.port = free_port()
            controller = _Controller(
                self.recorder, hostname="127.0.0.1", port=self.port, **self._kwargs
            )
            try:
                controller.start()
            except OSError:  # port taken between free_port() and bind: try another
                continue
            self._controller = controller
            # start() makes one probe connection to see the server is up; not a test's.
            with self.recorder.lock:
                self.recorder.sessions = 0
            return self
        raise RuntimeError("could not start aiosmtpd")

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Tarpit:
    """Accepts TCP connections on 127.0.0.1 and never says a word."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tarpit", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(conn)

    def __enter__(self) -> Tarpit:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self._held:
            with contextlib.suppress(OSError):
                conn.close()
        self._listener.close()


def wait_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until true or the timeout passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


@dataclass
class TlsFiles:
    """A server SSL context and the path of the CA file that trusts it."""

    server_context: ssl.SSLContext
    ca_path: str


def make_tls(directory: Any, name: str = "ca") -> TlsFiles:
    """Issue a ``trustme`` certificate for 127.0.0.1/localhost/mx.test under a fresh CA."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost", "mx.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_path = f"{directory}/{name}.pem"
    ca.cert_pem.write_to_path(ca_path)
    return TlsFiles(context, ca_path)
