"""Mail transports: SMTP (aiosmtplib), ``.eml`` files, or the log.

DSNs (Symfony Mailer style)::

    smtp://user:pass@host:587      STARTTLS when the server offers it
    smtp://host:25?tls=required    STARTTLS or fail;  ?tls=off never (plain text)
    smtps://user:pass@host:465     implicit TLS
    ...?ca=/path/ca.pem            trust this CA bundle (also the tls_ca argument)
    ...?local_hostname=mx.acme.io  name sent in EHLO (default: this host's name)
    ...?pool=4                     SMTP sessions a worker may hold open at once (default 4)
    file:///abs/outbox             one <delivery_id>.eml per message (file://./rel works)
    log://                         a summary line on the ``tidings.mail`` logger

Every transport checks the whole message first — each header of each MIME part for
CR/LF/control characters, each address in From/To/Cc/Bcc — and only then touches
the network or disk, so a malformed or hostile message opens no SMTP session.

One SMTP transaction is four round trips (MAIL, RCPT, DATA, the message), so a worker
sends over up to ``pool`` sessions at once, each reused mail after mail: a new session
is opened only when every open one is busy. ``?pool=1`` is one session, mails in turn.

SMTP outcome mapping: connection refused, timeouts, ``421`` and other ``4xx`` ->
:class:`TransientChannelError`; ``5xx``, authentication failure, TLS certificate
failure -> :class:`PermanentChannelError`. If the server refuses some recipients and
accepts others the message is delivered to the accepted ones and the refusals are
listed in :attr:`DeliveryResult.response` (retrying would duplicate it for the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import tempfile
import urllib.parse
from email.message import EmailMessage
from pathlib import Path
from typing import Literal, Protocol

import aiosmtplib
from aiosmtplib.email import flatten_message, parse_address

from tidings.errors import (
    ChannelError,
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
)
from tidings.notifications.channels.base import (
    DeliveryResult,
    find_cause,
    parse_query,
    redact,
    safe_cause,
    shorten,
)
from tidings.notifications.mime import flatten_for_smtp, prepare_envelope
from tidings.notifications.net import dns_error
from tidings.notifications.validation import validate_sender
from tidings.observability import redaction

__all__ = [
    "FileMailTransport",
    "LogMailTransport",
    "MailTransport",
    "SmtpTransport",
    "mail_transport_from_url",
    "prepare_envelope",
]

_log = logging.getLogger("tidings.mail")
TlsMode = Literal["auto", "required", "off", "implicit"]


class MailTransport(Protocol):
    """Sends finished MIME messages; one instance is shared by a worker's jobs."""

    async def send(self, email: EmailMessage, delivery_id: str) -> DeliveryResult:
        """Deliver ``email``; ``delivery_id`` is stable across retries of the same mail."""
        ...

    async def close(self) -> None:
        """Release connections; the transport may not be used afterwards."""
        ...


def _by_code(code: int, text: str) -> ChannelError:
    if 400 <= code < 500:
        return TransientChannelError(text, channel="mail", code=code)
    if 500 <= code < 600:
        return PermanentChannelError(text, channel="mail", code=code)
    return TransientChannelError(text, channel="mail", code=code)


def _translate(exc: BaseException, host: str) -> ChannelError:
    """Map an aiosmtplib/OS error to a channel error (message not yet redacted)."""
    cert = find_cause(exc, ssl.SSLCertVerificationError)
    if isinstance(cert, ssl.SSLCertVerificationError):
        reason = cert.verify_message or cert.reason or "certificate verify failed"
        return PermanentChannelError(
            f"TLS certificate of {host} rejected: {reason}", channel="mail"
        )
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        refused = ", ".join(
            f"{r.recipient} ({r.code} {shorten(r.message, 80)})" for r in exc.recipients
        )
        codes = [r.code for r in exc.recipients]
        code = next((c for c in codes if 400 <= c < 500), codes[0] if codes else 550)
        return _by_code(code, f"all recipients refused: {refused}")
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError) and exc.code != 454:
        return PermanentChannelError(
            f"SMTP authentication failed: {exc.code} {shorten(exc.message)}",
            channel="mail",
            code=exc.code,
        )
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return _by_code(exc.code, f"SMTP {exc.code} {shorten(exc.message)}")
    if isinstance(exc, TimeoutError):  # SMTPTimeoutError and asyncio deadlines
        return TransientChannelError(f"SMTP server {host} timed out", channel="mail")
    gai = find_cause(exc, socket.gaierror)
    if isinstance(gai, socket.gaierror):
        return dns_error(gai, host, channel="mail")
    if find_cause(exc, ConnectionRefusedError) is not None:
        return TransientChannelError(
            f"SMTP connection to {host} failed: connection refused ({exc})", channel="mail"
        )
    if isinstance(exc, ConnectionError | aiosmtplib.SMTPConnectError):
        return TransientChannelError(f"SMTP connection to {host} failed: {exc}", channel="mail")
    tls = find_cause(exc, ssl.SSLError)
    if isinstance(tls, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return TransientChannelError(f"TLS connection to {host} dropped", channel="mail")
    if isinstance(tls, ssl.SSLError):
        return PermanentChannelError(
            f"TLS handshake with {host} failed: {tls.reason}", channel="mail"
        )
    if isinstance(exc, OSError):
        return TransientChannelError(f"SMTP connection to {host} failed: {exc}", channel="mail")
    # SMTPNotSupported, "STARTTLS not supported", refused address: config or data.
    return PermanentChannelError(f"SMTP error: {exc}", channel="mail")


class SmtpTransport:
    """SMTP over a few reused sessions, one mail at a time each, reopened after a drop."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        mail_from: str,
        username: str | None = None,
        password: str | None = None,
        tls: TlsMode = "auto",
        timeout_s: float = 10.0,
        tls_ca: str | None = None,
        local_hostname: str | None = None,
        pool: int = 4,
    ) -> None:
        """Configure the transport; no connection is made until the first send.

        Args:
            host: SMTP server.
            port: SMTP port.
            mail_from: sender for messages without a From header.
            username: login user, if the server needs one.
            password: login password.
            tls: ``auto`` (STARTTLS if offered), ``required``, ``off`` or ``implicit``.
            timeout_s: bound on connecting (TCP, banner, TLS, login) and, separately,
                on each mail transaction.
            tls_ca: CA bundle to trust instead of the system store.
            local_hostname: name sent in EHLO (default: this machine's host name).
            pool: most sessions open at once. One session carries one transaction at
                a time; with one session, concurrent sends wait for each other's four
                round trips (and for the event loop between them).

        Raises:
            ConfigurationError: ``pool`` is below 1, or the CA bundle cannot be loaded.
        """
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1:
            raise ConfigurationError("SMTP pool size must be a whole number >= 1")
        validate_sender(mail_from)
        self._host, self._port, self._mail_from = host, port, mail_from
        self._username, self._password = username, password
        self._tls, self._timeout_s = tls, timeout_s
        self._secrets = [password, f"{username}:{password}" if username else None]
        redaction.register(*self._secrets)  # every log line and CLI line redacts them
        # Loading the system trust store takes ~25 ms: skip it when TLS is off (a CA
        # bundle named anyway is still loaded, so a bad path is reported here).
        self._tls_context: ssl.SSLContext | None = None
        if tls != "off" or tls_ca is not None:
            try:
                self._tls_context = ssl.create_default_context(cafile=tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"cannot load CA bundle {tls_ca}: {exc}") from None
        name = local_hostname or socket.gethostname()
        self._local_hostname = (
            name if name.isascii() and name.strip() == name and name else "localhost"
        )
        self._pool = pool
        self._idle: list[aiosmtplib.SMTP] = []  # open sessions nobody is using
        self._slots = asyncio.Semaphore(pool)  # held while a send owns a session

    @property
    def pool_size(self) -> int:
        """The most SMTP sessions this transport keeps open at once."""
        return self._pool

    async def send(self, email: EmailMessage, delivery_id: str) -> DeliveryResult:
        """Send ``email`` over an idle session, or a new one while fewer than ``pool`` are open.

        Raises:
            ValidationError: the message is invalid (no connection is opened).
            TransientChannelError: retry later (4xx, timeouts, connection failures).
            PermanentChannelError: do not retry (5xx, auth or TLS certificate failure).
        """
        sender, recipients = prepare_envelope(email, delivery_id, self._mail_from)
        async with self._slots:
            session = _Session(self._idle.pop() if self._idle else None)
            try:
                errors, reply = await self._deliver(session, email, sender, recipients)
            except ChannelError as exc:
                session.drop()
                raise _redacted(exc, self._secrets) from None
            except asyncio.CancelledError:
                session.drop()
                raise
            except Exception as exc:
                # After a refusal aiosmtplib has sent RSET, so the session is reusable;
                # after anything else its state is unknown: start clean next time.
                refusal = aiosmtplib.SMTPResponseException, aiosmtplib.SMTPRecipientsRefused
                if not isinstance(exc, refusal) or getattr(exc, "code", None) == 421:
                    session.drop()
                error = _redacted(_translate(exc, self._host), self._secrets)
                raise error from safe_cause(exc, self._secrets)
            finally:
                if session.smtp is not None:
                    self._idle.append(session.smtp)
        response = shorten(reply)
        if errors:
            refused = ", ".join(
                f"{rcpt} ({r.code} {shorten(r.message, 80)})" for rcpt, r in errors.items()
            )
            response = f"{response}; refused: {refused}"
        response = redact(response, self._secrets)
        return DeliveryResult("mail", delivery_id, response, status=250)

    async def _deliver(
        self, session: _Session, email: EmailMessage, sender: str, recipients: list[str]
    ) -> tuple[dict[str, aiosmtplib.SMTPResponse], str]:
        reused = session.smtp is not None and session.smtp.is_connected
        if not reused:
            session.drop()
            session.smtp = await self._connect()
        smtp = session.smtp
        assert smtp is not None
        try:
            async with asyncio.timeout(self._timeout_s):
                return await _send_message(smtp, email, sender, recipients)
        except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPResponseException) as exc:
            code = getattr(exc, "code", None)
            dropped = isinstance(exc, aiosmtplib.SMTPServerDisconnected) or code == 421
            if not (reused and dropped):
                raise
        # The idle connection had been dropped by the server: reconnect once.
        session.drop()
        session.smtp = smtp = await self._connect()
        async with asyncio.timeout(self._timeout_s):
            return await _send_message(smtp, email, sender, recipients)

    async def _connect(self) -> aiosmtplib.SMTP:
        smtp = aiosmtplib.SMTP(
            hostname=self._host,
            port=self._port,
            timeout=self._timeout_s,
            use_tls=self._tls == "implicit",
            start_tls={"auto": None, "required": True, "off": False, "implicit": False}[self._tls],
            tls_context=self._tls_context,
            local_hostname=self._local_hostname,
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await smtp.connect()
                if self._username is not None:
                    encrypted = smtp.get_transport_info("sslcontext") is not None
                    if not encrypted and self._tls != "off":
                        raise PermanentChannelError(
                            f"{self._host} offers no STARTTLS; not sending credentials in clear "
                            "text (add ?tls=off to allow it)",
                            channel="mail",
                        )
                    await smtp.login(self._username, self._password or "")
        except BaseException:
            smtp.close()
            raise
        return smtp

    async def close(self) -> None:
        """Wait for the sends in flight, then say QUIT (best effort) on every session."""
        for _ in range(self._pool):
            await self._slots.acquire()
        try:
            sessions, self._idle = self._idle, []
            for smtp in sessions:
                if smtp.is_connected:
                    try:
                        async with asyncio.timeout(min(self._timeout_s, 2.0)):
                            await smtp.quit()
                    except (aiosmtplib.SMTPException, OSError, TimeoutError):
                        pass
                smtp.close()
        finally:
            for _ in range(self._pool):
                self._slots.release()


async def _send_message(
    smtp: aiosmtplib.SMTP, email: EmailMessage, sender: str, recipients: list[str]
) -> tuple[dict[str, aiosmtplib.SMTPResponse], str]:
    """``smtp.send_message(email, sender=..., recipients=...)`` with less CPU per mail.

    The same steps as aiosmtplib 5.1's ``send_message`` and ``sendmail``, through its
    public commands: EHLO (HELO if refused) when the session has not greeted yet;
    ``SMTPUTF8`` for a non-ASCII envelope (refused if the server lacks it);
    ``BODY=8BITMIME`` when offered; Bcc left out of the data; every address checked
    by aiosmtplib before anything is sent; ``SIZE=`` when offered; MAIL, one RCPT per
    recipient (all refused -> ``SMTPRecipientsRefused``), DATA (which normalises line
    ends and dot-stuffs); RSET after a refusal, so the session stays usable.

    Two things differ: :func:`flatten_for_smtp` writes the generator's bytes for the
    messages :func:`build_email` makes (others go through the generator), and the
    ``SIZE=`` figure is counted (:func:`smtp_size`) instead of normalising the whole
    message once more only to measure it.
    """
    if smtp.is_ehlo_or_helo_needed:
        try:
            await smtp.ehlo()
        except aiosmtplib.SMTPHeloError:
            if not smtp.is_connected:
                raise
            await smtp.helo()
    options: list[str] = []
    utf8 = not (sender.isascii() and all(r.isascii() for r in recipients))
    if utf8:
        if not smtp.supports_extension("smtputf8"):
            raise aiosmtplib.SMTPNotSupported(
                "An address containing non-ASCII characters was provided, but "
                "SMTPUTF8 is not supported by this server"
            )
        options.append("SMTPUTF8")
    eight_bit = smtp.supports_extension("8BITMIME")
    if eight_bit:
        options.append("BODY=8BITMIME")
    data = flatten_for_smtp(email) if eight_bit and not utf8 else None
    if data is None:
        data = flatten_message(email, utf8=utf8, cte_type="8bit" if eight_bit else "7bit")
    # A bad address must not leave a half-finished envelope on the server.
    for address in (sender, *recipients):
        parse_address(address)
    if smtp.supports_extension("size"):
        options.insert(0, f"size={smtp_size(data)}")
    encoding = "utf-8" if utf8 else "ascii"
    refused: list[aiosmtplib.SMTPRecipientRefused] = []
    try:
        await smtp.mail(sender, options=options, encoding=encoding)
        for recipient in recipients:
            try:
                await smtp.rcpt(recipient, encoding=encoding)
            except aiosmtplib.SMTPRecipientRefused as exc:
                refused.append(exc)
        if len(refused) == len(recipients):
            raise aiosmtplib.SMTPRecipientsRefused(refused)
        response = await smtp.data(data)
    except (aiosmtplib.SMTPResponseException, aiosmtplib.SMTPRecipientsRefused):
        # Reset the envelope; a dropped connection or a bad reply to RSET is not
        # the error to report.
        with contextlib.suppress(ConnectionError, aiosmtplib.SMTPResponseException):
            await smtp.rset()
        raise
    errors = {exc.recipient: aiosmtplib.SMTPResponse(exc.code, exc.message) for exc in refused}
    return errors, response.message


def smtp_size(data: bytes) -> int:
    """The ``SIZE=`` of ``data`` (RFC 1870): its length once every line ends in CRLF.

    What aiosmtplib declares, ``len(normalize_message_line_endings(data))``, counted
    without copying: a lone CR or LF becomes CRLF, and a CRLF is added at the end if
    the data does not end with a line break.
    """
    crlf = data.count(b"\r\n")
    size = len(data) + (data.count(b"\n") - crlf) + (data.count(b"\r") - crlf)
    return size if data[-1:] in (b"\n", b"\r") else size + 2


class _Session:
    """The session one send is using: kept (back to the idle list) unless dropped."""

    __slots__ = ("smtp",)

    def __init__(self, smtp: aiosmtplib.SMTP | None) -> None:
        self.smtp = smtp

    def drop(self) -> None:
        if self.smtp is not None:
            self.smtp.close()
            self.smtp = None


def _redacted(exc: ChannelError, secrets: list[str | None]) -> ChannelError:
    clean = type(exc)(redact(str(exc), secrets), channel=exc.channel, code=exc.code)
    clean.retry_after_s = exc.retry_after_s
    return clean


class FileMailTransport:
    """Writes each message to ``<directory>/<delivery_id>.eml`` (atomically)."""

    def __init__(self, directory: str | os.PathLike[str], *, mail_from: str) -> None:
        """Use ``directory`` (created on first send) as the outbox."""
        validate_sender(mail_from)
        self._directory, self._mail_from = Path(directory), mail_from

    async def send(self, email: EmailMessage, delivery_id: str) -> DeliveryResult:
        """Write the message; a retry with the same id overwrites the same file."""
        prepare_envelope(email, delivery_id, self._mail_from)
        data = email.as_bytes()
        try:
            path = await asyncio.to_thread(self._write, f"{delivery_id}.eml", data)
        except OSError as exc:
            raise TransientChannelError(f"cannot write mail file: {exc}", channel="mail") from exc
        return DeliveryResult("mail", delivery_id, f"written to {path}")

    def _write(self, name: str, data: bytes) -> Path:
        self._directory.mkdir(parents=True, exist_ok=True)
        target = self._directory / name
        # Write beside the target and rename, so a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=self._directory, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    async def close(self) -> None:
        """Nothing to release."""


class LogMailTransport:
    """Logs one summary line per message on the ``tidings.mail`` logger."""

    def __init__(self, *, mail_from: str, logger: logging.Logger | None = None) -> None:
        """Log through ``logger`` (default ``tidings.mail``)."""
        validate_sender(mail_from)
        self._mail_from, self._log = mail_from, logger or _log

    async def send(self, email: EmailMessage, delivery_id: str) -> DeliveryResult:
        """Log who the message is from and to, and its subject."""
        sender, recipients = prepare_envelope(email, delivery_id, self._mail_from)
        self._log.info(
            "mail %s from=%s to=%s subject=%r",
            delivery_id,
            sender,
            ",".join(recipients),
            str(email.get("Subject", "")),
        )
        return DeliveryResult("mail", delivery_id, "logged")

    async def close(self) -> None:
        """Nothing to release."""


def mail_transport_from_url(
    url: str, *, mail_from: str, timeout_s: float = 10.0, tls_ca: str | None = None
) -> MailTransport:
    """Build the transport a ``TIDINGS_MAIL_URL`` names.

    Raises:
        ConfigurationError: unknown scheme or malformed DSN (the message never
            repeats the DSN, which may hold a password).
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    params = parse_query(parts.query)
    if scheme == "log":
        return LogMailTransport(mail_from=mail_from)
    if scheme == "file":
        netloc = urllib.parse.unquote(parts.netloc)
        path = urllib.parse.unquote(parts.path)
        directory = path if netloc in ("", "localhost") else netloc + path
        if not directory:
            raise ConfigurationError("file:// mail URL needs a directory")
        return FileMailTransport(directory, mail_from=mail_from)
    if scheme not in ("smtp", "smtps"):
        raise ConfigurationError(f"unsupported mail URL scheme {scheme!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError("mail URL has an invalid port") from None
    if not parts.hostname:
        raise ConfigurationError("mail URL has no host")
    modes: dict[str, TlsMode] = {"auto": "auto", "required": "required", "off": "off"}
    tls = modes.get(params.get("tls", "auto").lower())
    if scheme == "smtps":
        tls = "implicit"
    if tls is None:
        raise ConfigurationError("mail URL ?tls= must be required or off")
    try:
        pool = int(params.get("pool", "4"))
    except ValueError:
        raise ConfigurationError("mail URL ?pool= must be a whole number >= 1") from None
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return SmtpTransport(
        host=parts.hostname,
        port=port or (465 if scheme == "smtps" else 25),
        mail_from=mail_from,
        username=user,
        password=password,
        tls=tls,
        timeout_s=timeout_s,
        tls_ca=tls_ca or params.get("ca"),
        local_hostname=params.get("local_hostname"),
        pool=pool,
    )
