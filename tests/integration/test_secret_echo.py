"""Servers that echo our credentials, in every form, leak nothing.

An SMTP stub answers ``535`` with the AUTH blob it was sent (``AUTH PLAIN``
``base64("\\0user\\0password")`` or ``AUTH LOGIN``'s ``base64(password)``) and the
password plain, URL-encoded and hex; an SMS provider stub and a webhook receiver echo
the token and secret the same ways, placed so that the secret straddles the point where
the error text is cut. Jobs run through a real worker; the logs, the worker's own lines,
the failed store and ``notify-worker failed list/show`` must hold none of it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import socketserver
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from tests.support.http import Hit, HttpServer, Reply
from tidings import App, ShouldQueue
from tidings.cli.main import install_output, main
from tidings.notifications import (
    MailMessage,
    Notifiable,
    Notification,
    SmsMessage,
    WebhookMessage,
)
from tidings.notifications.channels.mail import mail_transport_from_url
from tidings.notifications.channels.sms import sms_transport_from_url
from tidings.notifications.messages import RenderedMail
from tidings.notifications.mime import build_email
from tidings.worker.worker import Worker, WorkerOptions

MODULE = __name__
KEY = "secret-echo-app-key-0123456789abcdef"
PASSWORD = "Tr0ub4dor&3 horse/staple"
SID, TOKEN = "ACecho0123456789", "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
WHSEC = "whsec_" + base64.b64encode(b"per-app-webhook-secret-32-bytes!").decode()
CLI_APP: App | None = None
#: Figures for the closing note.
FIGURES = {"planted": 0, "found": 0}


def forms(secret: str, user: str | None = None) -> dict[str, str]:
    """Every encoding a peer might echo ``secret`` in."""
    raw = secret.encode()
    out = {
        "plain": secret,
        "url": urllib.parse.quote(secret, safe=""),
        "url-plus": urllib.parse.quote_plus(secret),
        "hex": binascii.hexlify(raw).decode(),
        "b64": base64.b64encode(raw).decode(),
    }
    if user is not None:
        out["auth-plain"] = base64.b64encode(f"\0{user}\0{secret}".encode()).decode()
        out["basic"] = base64.b64encode(f"{user}:{secret}".encode()).decode()
    return out


def echo_text(secret: str, user: str | None, pad: int) -> str:
    """The forms, after ``pad`` characters so the first one straddles a cut."""
    return "x" * pad + " " + " ".join(f"{k}={v}" for k, v in forms(secret, user).items())


def leaks(text: str, secret: str, user: str | None = None, window: int = 10) -> list[str]:
    """Forms of ``secret`` (or any ``window``-long piece of one) found in ``text``."""
    found = []
    for name, form in forms(secret, user).items():
        pieces = {form[i : i + window] for i in range(max(1, len(form) - window + 1))}
        if any(piece in text for piece in pieces):
            found.append(name)
    return found


# -- an SMTP server that echoes the AUTH exchange ------------------------------------------


class _EchoSmtp(socketserver.StreamRequestHandler):
    server: Any

    def reply(self, line: str) -> None:
        self.wfile.write(line.encode("utf-8", "surrogateescape") + b"\r\n")
        self.wfile.flush()

    def handle(self) -> None:
        self.reply("220 echo.test ESMTP")
        user_b64 = ""
        while True:
            raw = self.rfile.readline(65536)
            if not raw:
                return
            line = raw.decode("utf-8", "surrogateescape").rstrip("\r\n")
            verb = line.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250-echo.test")
                self.reply(f"250 AUTH {self.server.mechanism}")
            elif verb == "AUTH" and line.upper().startswith("AUTH LOGIN"):
                parts = line.split(" ")
                user_b64 = parts[2] if len(parts) > 2 else ""
                self.reply("334 UGFzc3dvcmQ6")
                pw_b64 = self.rfile.readline().decode().strip()
                self.echo(f"login {user_b64} {pw_b64}")
            elif verb == "AUTH":
                self.echo(line)
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("250 OK")

    def echo(self, what: str) -> None:
        # What careless servers do: repeat the credentials they refused, in several
        # forms, after enough text that a 300-character cut falls inside them.
        decoded = base64.b64decode(what.split(" ")[-1] + "==", validate=False)
        password = decoded.split(b"\0")[-1].decode("utf-8", "replace")
        extra = echo_text(password, None, 0) if "\0" in decoded.decode("latin-1") else ""
        self.reply(f"535 5.7.8 {'y' * 220} rejected {what} {extra}")


class EchoSmtpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mechanism: str) -> None:
        super().__init__(("127.0.0.1", 0), _EchoSmtp)
        self.mechanism = mechanism
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05})

    def __enter__(self) -> EchoSmtpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def _sms_echo(hit: Hit) -> Reply:
    # Twilio-shaped 400 whose message repeats the Authorization header and the token,
    # the token starting 138 characters in, so the 160-character cut falls inside it.
    message = echo_text(TOKEN, SID, 130) + f" auth={hit.headers.get('authorization', '')}"
    return Reply(400, json.dumps({"code": 20003, "message": message}).encode())


def _webhook_echo(hit: Hit) -> Reply:
    secret = ENDPOINT_SECRET if "/tenant" in hit.path else WHSEC
    body = echo_text(secret, None, 270) + " sig=" + hit.headers.get("webhook-signature", "")
    return Reply(400, body.encode())


ENDPOINT_SECRET = "whsec_" + base64.b64encode(b"tenant-endpoint-secret-32-bytes!").decode()


# -- the app: one notification on three echoing channels ---------------------------------


@dataclass
class Customer(Notifiable):
    email: str
    phone: str
    webhook_url: str


@dataclass
class Receipt(Notification, ShouldQueue):
    channel: str
    tries: ClassVar[int | None] = 1

    def via(self, notifiable: Any) -> list[str]:
        return [self.channel]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject("Receipt").line("Thanks")

    def to_sms(self, notifiable: Any) -> SmsMessage:
        return SmsMessage("Thanks")

    def to_webhook(self, notifiable: Any) -> WebhookMessage:
        if notifiable.webhook_url.endswith("/tenant"):
            return WebhookMessage({"ok": True}, secret=ENDPOINT_SECRET)
        return WebhookMessage({"ok": True})


@pytest.fixture
def servers() -> Iterator[tuple[EchoSmtpServer, HttpServer, HttpServer]]:
    with (
        EchoSmtpServer("PLAIN") as smtp,
        HttpServer(_sms_echo) as sms,
        HttpServer(_webhook_echo) as hook,
    ):
        yield smtp, sms, hook


def test_no_echoed_secret_reaches_logs_worker_lines_failed_store_or_cli(
    redis_url: str,
    prefix: str,
    servers: tuple[EchoSmtpServer, HttpServer, HttpServer],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    global CLI_APP
    caplog.set_level(logging.DEBUG, logger="tidings")
    smtp, sms, hook = servers
    quoted = urllib.parse.quote(PASSWORD, safe="")
    app = App(
        env=False,
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        allowed_modules=MODULE,
        mail_url=f"smtp://ada:{quoted}@127.0.0.1:{smtp.port}?tls=off",
        sms_url=f"twilio://{SID}:{TOKEN}@default?from=%2B15550001111&base_url={sms.url}",
        webhook_secret=WHSEC,
        webhook_allow_private=True,
    )
    CLI_APP = app
    try:
        base = Customer("ada@example.org", "+15551234567", f"{hook.url}/hook")
        tenant = Customer("bob@example.org", "+15557654321", f"{hook.url}/tenant")
        for channel in ("mail", "sms", "webhook"):
            base.notify(Receipt(channel))
        tenant.notify(Receipt("webhook"))
        install_output(app, json_logs=False)

        async def run() -> int:
            worker = Worker(app, WorkerOptions(sleep_s=0.1, stop_when_empty=True))
            return await asyncio.wait_for(worker.run(), 30)

        assert asyncio.run(run()) == 0
        records = app.queue_for(None).failed()
        assert len(records) == 4, [r.exception for r in records]
        runner = CliRunner()
        spec = ["-A", f"{MODULE}:CLI_APP"]
        cli = [runner.invoke(main, [*spec, "failed", "list"]).output]
        cli.append(runner.invoke(main, [*spec, "failed", "list", "--json"]).output)
        cli += [runner.invoke(main, [*spec, "failed", "show", r.id]).output for r in records]
        stored = [r.exception for r in records]
        text = "\n".join([caplog.text, capsys.readouterr().out, *cli, *stored])
        # The failures say what happened, without the secrets.
        assert "535" in text and "HTTP 400" in text
        assert text.count("[REDACTED]") >= 4  # the echoes arrived, and were cleaned
        planted = [
            (PASSWORD, "ada"),
            (TOKEN, SID),
            (WHSEC, None),
            (WHSEC.removeprefix("whsec_"), None),
            (ENDPOINT_SECRET, None),
            (ENDPOINT_SECRET.removeprefix("whsec_"), None),
        ]
        found = {secret[:6]: leaks(text, secret, user) for secret, user in planted}
        FIGURES["planted"] += sum(len(forms(s, u)) for s, u in planted)
        FIGURES["found"] += sum(len(v) for v in found.values())
        print(f"\nsecret echo: {FIGURES}")
        assert not any(found.values()), found
    finally:
        CLI_APP = None
        app.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN"])
def test_smtp_auth_blob_echoed_in_535_is_redacted(mechanism: str) -> None:
    password = f"{mechanism}-pa55word-never-shown"
    with EchoSmtpServer(mechanism) as smtp:
        url = f"smtp://someone%40example.org:{password}@127.0.0.1:{smtp.port}?tls=off"
        t = mail_transport_from_url(url, mail_from="noreply@example.org", timeout_s=5)
        rendered = RenderedMail("s", "<p>h</p>", "h")
        msg = build_email(
            rendered, to="a@example.org", mail_from="noreply@example.org", message_id="d1"
        )

        async def go() -> str:
            try:
                await t.send(msg, "d1")
            except Exception as exc:
                return f"{exc!s} {exc!r}"
            finally:
                await t.close()
            return "sent?"

        text = asyncio.run(go())
    assert "535" in text
    assert leaks(text, password) == []
    # The user name is not a secret, but no piece of the blob's password part survives.
    for form in ("auth-plain", "basic"):
        tail = forms(password, "someone@example.org")[form][-28:]
        assert not any(tail[i : i + 10] in text for i in range(len(tail) - 9)), form


def test_twilio_token_straddling_the_cut_is_redacted_whole() -> None:
    with HttpServer(_sms_echo) as sms:
        t = sms_transport_from_url(
            f"twilio://{SID}:{TOKEN}@default?from=%2B15550001111&base_url={sms.url}"
        )

        async def go() -> str:
            try:
                await t.send("+15551234567", SmsMessage("hi"), "d2")
            except Exception as exc:
                return f"{exc!s}"
            finally:
                await t.close()
            return "sent?"

        text = asyncio.run(go())
    assert "HTTP 400" in text
    assert leaks(text, TOKEN, SID, window=8) == []


VONAGE_KEY, VONAGE_SECRET = "vonagekey42", "vonage-secret-Qx81-never-shown"


def _vonage_echo(hit: Hit) -> Reply:
    # Vonage sends the key and secret as form fields; a careless 200 with status 4 echoes
    # them (and the raw form) in error-text, the secret across the 120-character cut.
    text = echo_text(VONAGE_SECRET, VONAGE_KEY, 100) + " form=" + hit.body.decode()
    body = {"messages": [{"status": "4", "error-text": text}]}
    return Reply(200, json.dumps(body).encode())


def test_vonage_secret_echoed_in_error_text_is_redacted() -> None:
    with HttpServer(_vonage_echo) as server:
        t = sms_transport_from_url(
            f"vonage://{VONAGE_KEY}:{VONAGE_SECRET}@default?from=Acme&base_url={server.url}"
        )

        async def go() -> str:
            try:
                await t.send("+15551234567", SmsMessage("hi"), "d3")
            except Exception as exc:
                return f"{exc!s}"
            finally:
                await t.close()
            return "sent?"

        text = asyncio.run(go())
    assert "vonage status 4" in text
    assert leaks(text, VONAGE_SECRET, VONAGE_KEY, window=8) == []
