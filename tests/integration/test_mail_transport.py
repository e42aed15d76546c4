"""Mail transports against a real aiosmtpd on 127.0.0.1 (RELIABILITY F14-F17, F21, B11-B13, B19)."""

from __future__ import annotations

import asyncio
import email
import email.message
import email.policy
import logging
import socket
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.procs import free_port
from tests.support.smtp import Recorder, SmtpServer, Tarpit, make_tls
from tests.support.smtp import failing_authenticator as refuse_everyone
from tidings.errors import (
    ConfigurationError,
    PermanentChannelError,
    TransientChannelError,
    ValidationError,
)
from tidings.notifications.channels.mail import (
    FileMailTransport,
    MailTransport,
    SmtpTransport,
    mail_transport_from_url,
)
from tidings.notifications.messages import MailMessage

T = TypeVar("T")
SENDER = "Acme <noreply@example.org>"


def run(coro: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coro())  # type: ignore[arg-type]


def mail(
    to: str | list[str] = "ada@example.org", delivery_id: str = "d-1", **kw: list[str]
) -> email.message.EmailMessage:
    message = MailMessage().subject("Invoice paid").line("Thanks!")
    if "bcc" in kw:
        message.bcc(kw["bcc"])
    return message.to_email(to=to, mail_from=SENDER, delivery_id=delivery_id)


def transport(server: SmtpServer, query: str = "", **kw: float | str | None) -> MailTransport:
    url = f"smtp://127.0.0.1:{server.port}{query}"
    return mail_transport_from_url(url, mail_from=SENDER, timeout_s=2.0, **kw)  # type: ignore[arg-type]


async def send_all(
    t: MailTransport, *messages: tuple[email.message.EmailMessage, str]
) -> list[str]:
    try:
        return [(await t.send(m, d)).response for m, d in messages]
    finally:
        await t.close()


def test_delivers_over_one_reused_connection() -> None:
    with SmtpServer() as server:
        t = transport(server)
        batch = [
            (mail(delivery_id=f"d-{i}", bcc=["audit@example.org"]), f"d-{i}") for i in range(3)
        ]
        responses = run(lambda: send_all(t, *batch))
        assert server.sessions == 1
    assert all("queued as 42" in r for r in responses)
    assert len(server.messages) == 3
    first = server.messages[0]
    assert first.mail_from == "noreply@example.org"
    assert first.rcpt_tos == ["ada@example.org", "audit@example.org"]
    parsed = email.message_from_bytes(first.data, policy=email.policy.default)
    assert parsed["Message-ID"] == "<d-0@tidings>"
    assert parsed["Bcc"] is None  # the blind copy is in the envelope only


def test_reopens_the_connection_after_the_server_drops_it() -> None:
    with SmtpServer(Recorder(close_after_data=True)) as server:
        t = transport(server)

        async def scenario() -> None:
            try:
                await t.send(mail(delivery_id="a"), "a")
                await asyncio.sleep(0.2)  # the server hangs up after each message
                await t.send(mail(delivery_id="b"), "b")
            finally:
                await t.close()

        run(scenario)
    assert len(server.messages) == 2 and server.sessions == 2


@pytest.mark.parametrize(
    ("recorder", "error", "code"),
    [
        (
            Recorder(rcpt_replies={"ada@example.org": "451 4.3.0 try later"}),
            TransientChannelError,
            451,
        ),
        (
            Recorder(rcpt_replies={"ada@example.org": "550 5.1.1 no such user"}),
            PermanentChannelError,
            550,
        ),
        (Recorder(data_reply="451 4.3.0 queue full"), TransientChannelError, 451),
        (Recorder(data_reply="552 5.3.4 too big"), PermanentChannelError, 552),
        (
            Recorder(data_reply="421 4.3.2 shutting down", close_after_data=True),
            TransientChannelError,
            421,
        ),
    ],
)
def test_reply_codes_are_classified(recorder: Recorder, error: type[Exception], code: int) -> None:
    with SmtpServer(recorder) as server:
        t = transport(server)
        with pytest.raises(error) as info:
            run(lambda: send_all(t, (mail(), "d-1")))
    assert isinstance(info.value, TransientChannelError | PermanentChannelError)
    assert info.value.code == code and info.value.channel == "mail"
    assert server.messages == []


def test_connection_survives_a_refused_message() -> None:
    recorder = Recorder(rcpt_replies={"gone@example.org": "550 5.1.1 no such user"})
    with SmtpServer(recorder) as server:
        t = transport(server)

        async def scenario() -> None:
            try:
                with pytest.raises(PermanentChannelError):
                    await t.send(mail("gone@example.org", "x"), "x")
                await t.send(mail(delivery_id="y"), "y")
            finally:
                await t.close()

        run(scenario)
    assert len(server.messages) == 1 and server.sessions == 1


def test_partial_refusal_delivers_to_the_accepted_recipient() -> None:
    recorder = Recorder(rcpt_replies={"gone@example.org": "550 5.1.1 no such user"})
    with SmtpServer(recorder) as server:
        t = transport(server)
        [response] = run(lambda: send_all(t, (mail(["ada@example.org", "gone@example.org"]), "p")))
    assert len(server.messages) == 1
    assert server.messages[0].rcpt_tos == ["ada@example.org"]
    assert "refused: gone@example.org (550" in response


def test_all_recipients_refused_uses_their_code() -> None:
    replies = {a: "550 5.1.1 no such user" for a in ("x@example.org", "y@example.org")}
    with SmtpServer(Recorder(rcpt_replies=replies)) as server:
        t = transport(server)
        with pytest.raises(PermanentChannelError) as info:
            run(lambda: send_all(t, (mail(["x@example.org", "y@example.org"]), "r")))
    assert info.value.code == 550 and "x@example.org" in str(info.value)


def test_connection_refused_is_transient() -> None:
    t = mail_transport_from_url(f"smtp://127.0.0.1:{free_port()}", mail_from=SENDER, timeout_s=2)
    started = time.monotonic()
    with pytest.raises(TransientChannelError, match="connection"):
        run(lambda: send_all(t, (mail(), "d")))
    assert time.monotonic() - started < 2


def test_server_that_never_sends_a_banner_times_out() -> None:
    with Tarpit() as tarpit:
        t = mail_transport_from_url(
            f"smtp://127.0.0.1:{tarpit.port}", mail_from=SENDER, timeout_s=1
        )
        started = time.monotonic()
        with pytest.raises(TransientChannelError, match="timed out"):
            run(lambda: send_all(t, (mail(), "d")))
        elapsed = time.monotonic() - started
    assert tarpit.accepted == 1 and elapsed < 2.0


def test_slow_reply_after_data_ends_the_attempt_in_time() -> None:
    with SmtpServer(Recorder(data_delay_s=3)) as server:
        t = mail_transport_from_url(
            f"smtp://127.0.0.1:{server.port}", mail_from=SENDER, timeout_s=1
        )
        started = time.monotonic()
        with pytest.raises(TransientChannelError):
            run(lambda: send_all(t, (mail(delivery_id="slow"), "slow")))
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("query", ["", "?tls=required"])
def test_starttls_with_trusted_ca(tmp_path: Path, query: str) -> None:
    tls = make_tls(tmp_path)
    with SmtpServer(tls_context=tls.server_context, require_starttls=True) as server:
        t = transport(server, query, tls_ca=tls.ca_path)
        run(lambda: send_all(t, (mail(), "tls")))
    assert len(server.messages) == 1


def test_starttls_with_untrusted_certificate_is_permanent(tmp_path: Path) -> None:
    server_tls, other_ca = make_tls(tmp_path, "server"), make_tls(tmp_path, "other")
    with SmtpServer(tls_context=server_tls.server_context, require_starttls=True) as server:
        t = transport(server, tls_ca=other_ca.ca_path)
        with pytest.raises(PermanentChannelError, match="certificate"):
            run(lambda: send_all(t, (mail(), "tls")))
    assert server.messages == []


def test_implicit_tls(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    with SmtpServer(implicit_tls=tls.server_context) as server:
        t = mail_transport_from_url(
            f"smtps://127.0.0.1:{server.port}", mail_from=SENDER, timeout_s=2, tls_ca=tls.ca_path
        )
        run(lambda: send_all(t, (mail(), "smtps")))
    assert len(server.messages) == 1


def test_tls_required_but_not_offered_is_permanent() -> None:
    with SmtpServer() as server:
        t = transport(server, "?tls=required")
        with pytest.raises(PermanentChannelError, match="STARTTLS"):
            run(lambda: send_all(t, (mail(), "d")))
    assert server.messages == []


def test_credentials_are_not_sent_in_clear_text() -> None:
    with SmtpServer(authenticator=refuse_everyone) as server:
        t = mail_transport_from_url(
            f"smtp://user:hunter2-secret@127.0.0.1:{server.port}", mail_from=SENDER, timeout_s=2
        )
        with pytest.raises(PermanentChannelError, match="clear") as info:
            run(lambda: send_all(t, (mail(), "d")))
    assert "hunter2-secret" not in str(info.value) and server.messages == []


def test_auth_failure_is_permanent_and_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    password = "S3cret/P@ss word"
    quoted = "S3cret%2FP%40ss%20word"
    with SmtpServer(authenticator=refuse_everyone) as server:
        url = f"smtp://ada:{quoted}@127.0.0.1:{server.port}?tls=off"
        t = mail_transport_from_url(url, mail_from=SENDER, timeout_s=2)
        with pytest.raises(PermanentChannelError) as info:
            run(lambda: send_all(t, (mail(), "d")))
    assert info.value.code == 535
    rendered = "".join(traceback.format_exception(info.value)) + caplog.text
    for secret in (password, quoted, "UzNjcmV0L1BAc3Mgd29yZA=="):
        assert secret not in rendered
    assert server.messages == []


def compat32_message(**headers: str) -> email.message.EmailMessage:
    """A message built without the default policy's checks, as careless code might."""
    msg = email.message.Message()
    for name, value in {"From": "noreply@example.org", "To": "ada@example.org", **headers}.items():
        msg[name.replace("_", "-")] = value
    msg.set_payload("hello")
    return msg  # type: ignore[return-value]


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            lambda: compat32_message(Subject="Hi\r\nBcc: victim@example.org"), id="crlf-subject"
        ),
        pytest.param(lambda: compat32_message(To="a@b.test\r\nRCPT TO:<x@y.test>"), id="crlf-to"),
        pytest.param(lambda: compat32_message(From="noreply@example.org\nX: y"), id="lf-from"),
        pytest.param(lambda: compat32_message(To="a@b.test> AUTH=<x@y.test>"), id="rcpt-smuggling"),
        pytest.param(
            lambda: compat32_message(To="alice@example.org)<bob@example.org>"), id="cve-2023-27043"
        ),
        pytest.param(lambda: compat32_message(Subject="nul\x00byte"), id="nul"),
        pytest.param(lambda: compat32_message(**{"X:Y": "v"}), id="colon-in-name"),
        pytest.param(lambda: compat32_message(To="user@localhost"), id="localhost"),
        pytest.param(lambda: compat32_message(To="a@b"), id="no-dot"),
        pytest.param(lambda: compat32_message(To="x" * 65 + "@example.org"), id="long-local"),
        pytest.param(lambda: compat32_message(Cc="Smith, John <a@example.org>"), id="comma-name"),
        pytest.param(lambda: compat32_message(To=""), id="no-recipient"),
    ],
)
def test_invalid_messages_open_no_session(
    message: Callable[[], email.message.EmailMessage],
) -> None:
    with SmtpServer() as server:
        t = transport(server)
        with pytest.raises(ValidationError):
            run(lambda: send_all(t, (message(), "d")))
        assert server.sessions == 0 and server.recorder.rcpts_seen == []


def test_invalid_delivery_id_opens_no_session() -> None:
    with SmtpServer() as server:
        t = transport(server)
        with pytest.raises(ValidationError):
            run(lambda: send_all(t, (mail(), "../../etc/cron.d/x")))
        assert server.sessions == 0


@pytest.mark.parametrize(
    ("errno", "error"),
    [(socket.EAI_AGAIN, TransientChannelError), (socket.EAI_NONAME, PermanentChannelError)],
)
def test_dns_failures_are_classified(
    monkeypatch: pytest.MonkeyPatch, errno: int, error: type[Exception]
) -> None:
    lookups: list[str] = []

    def fake_getaddrinfo(host: str, *args: object, **kwargs: object) -> list[object]:
        lookups.append(host)
        raise socket.gaierror(errno, "fake resolver")

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    t = mail_transport_from_url("smtp://mail.example.org:587", mail_from=SENDER, timeout_s=2)
    with pytest.raises(error, match="resolve"):
        run(lambda: send_all(t, (mail(), "d")))
    assert lookups == ["mail.example.org"]


def test_file_transport_writes_atomically_and_retries_overwrite(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    t = mail_transport_from_url(f"file://{outbox}", mail_from=SENDER)
    assert isinstance(t, FileMailTransport)
    run(lambda: send_all(t, (mail(delivery_id="m1"), "m1"), (mail(delivery_id="m1"), "m1")))
    assert [p.name for p in outbox.iterdir()] == ["m1.eml"]
    parsed = email.message_from_bytes((outbox / "m1.eml").read_bytes(), policy=email.policy.default)
    assert parsed["Message-ID"] == "<m1@tidings>" and parsed["To"] == "ada@example.org"


def test_file_transport_relative_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    t = mail_transport_from_url("file://./.tidings/outbox", mail_from="tidings@localhost")
    run(lambda: send_all(t, (mail(delivery_id="rel"), "rel")))
    assert (tmp_path / ".tidings" / "outbox" / "rel.eml").is_file()
    with pytest.raises(ValidationError):
        run(lambda: send_all(t, (compat32_message(Subject="a\nb"), "bad")))
    assert not (tmp_path / ".tidings" / "outbox" / "bad.eml").exists()


def test_log_transport(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidings.mail")
    t = mail_transport_from_url("log://", mail_from=SENDER)
    [response] = run(lambda: send_all(t, (mail(), "logged-1")))
    assert response == "logged"
    assert "logged-1" in caplog.text and "ada@example.org" in caplog.text


@pytest.mark.parametrize(
    "url",
    [
        "ses://key:pw-secret@default",
        "smtp://u:pw-secret@host:99999",
        "smtp://u:pw-secret@host?tls=maybe",
        "smtp://",
    ],
)
def test_bad_dsns_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        mail_transport_from_url(url, mail_from=SENDER)
    assert "pw-secret" not in str(info.value)


def test_smtp_transport_defaults() -> None:
    t = mail_transport_from_url("smtps://u:p@mail.example.org", mail_from=SENDER)
    assert isinstance(t, SmtpTransport)


def test_stale_connection_is_reopened_once_and_the_mail_still_goes() -> None:
    with SmtpServer(Recorder(drop_after_messages=1)) as server:
        t = transport(server)
        run(lambda: send_all(t, (mail(delivery_id="a"), "a"), (mail(delivery_id="b"), "b")))
    assert [m.data.count(b"Message-ID: <") for m in server.messages] == [1, 1]
    assert len(server.messages) == 2 and server.sessions == 2
