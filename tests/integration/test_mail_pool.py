"""The SMTP transport's session pool (``?pool=N``) against a real aiosmtpd on 127.0.0.1."""

from __future__ import annotations

import asyncio
import email.message
from dataclasses import dataclass

import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.smtp import Recorder, SmtpServer
from tidings.errors import ConfigurationError
from tidings.notifications.channels.mail import (
    MailTransport,
    SmtpTransport,
    mail_transport_from_url,
)
from tidings.notifications.messages import MailMessage

SENDER = "Acme <noreply@example.org>"


@dataclass
class PoolRecorder(Recorder):
    """Also counts DATA commands in progress at once (the most seen) and QUITs."""

    in_flight: int = 0
    most_in_flight: int = 0
    quits: int = 0

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await super().handle_DATA(server, session, envelope)
        finally:
            with self.lock:
                self.in_flight -= 1

    async def handle_QUIT(self, server: SMTP, session: Session, envelope: Envelope) -> str | None:
        with self.lock:
            self.quits += 1
        return None  # aiosmtpd's own 221 reply


def mail(delivery_id: str) -> email.message.EmailMessage:
    message = MailMessage().subject("Invoice paid").line("Thanks!")
    return message.to_email(to="ada@example.org", mail_from=SENDER, delivery_id=delivery_id)


def transport(server: SmtpServer, pool: int) -> MailTransport:
    url = f"smtp://127.0.0.1:{server.port}?pool={pool}"
    return mail_transport_from_url(url, mail_from=SENDER, timeout_s=5.0)


async def send_together(t: MailTransport, ids: list[str]) -> None:
    await asyncio.gather(*(t.send(mail(i), i) for i in ids))


def run_rounds(t: MailTransport, *rounds: list[str]) -> None:
    async def scenario() -> None:
        try:
            for ids in rounds:
                await send_together(t, ids)
        finally:
            await t.close()

    asyncio.run(scenario())


def test_concurrent_sends_share_at_most_pool_sessions() -> None:
    recorder = PoolRecorder(data_delay_s=0.1)
    with SmtpServer(recorder) as server:
        run_rounds(transport(server, 3), [f"c-{i}" for i in range(8)])
    assert len(server.messages) == 8
    assert 1 < server.sessions <= 3
    assert 1 < recorder.most_in_flight <= 3


def test_sessions_are_reused_not_reopened() -> None:
    with SmtpServer(PoolRecorder(data_delay_s=0.05)) as server:
        run_rounds(transport(server, 2), ["a-1", "a-2"], ["b-1", "b-2"], ["c-1", "c-2"])
    assert len(server.messages) == 6 and server.sessions == 2


def test_pool_of_one_sends_one_mail_at_a_time() -> None:
    recorder = PoolRecorder(data_delay_s=0.05)
    with SmtpServer(recorder) as server:
        run_rounds(transport(server, 1), [f"s-{i}" for i in range(4)])
    assert len(server.messages) == 4
    assert server.sessions == 1 and recorder.most_in_flight == 1


def test_a_dropped_session_is_replaced() -> None:
    # The server hangs up on each session's second MAIL: both pooled sessions are
    # found dead on reuse, and each send reconnects once and still delivers.
    recorder = PoolRecorder(drop_after_messages=1, data_delay_s=0.05)
    with SmtpServer(recorder) as server:
        run_rounds(transport(server, 2), ["a-1", "a-2"], ["b-1", "b-2"])
    ids = sorted(m.data.split(b"Message-ID: <")[1].split(b"@")[0] for m in server.messages)
    assert ids == [b"a-1", b"a-2", b"b-1", b"b-2"]
    assert server.sessions == 4


def test_close_quits_every_session_after_the_sends_in_flight() -> None:
    recorder = PoolRecorder(data_delay_s=0.2)
    with SmtpServer(recorder) as server:
        t = transport(server, 3)

        async def scenario() -> None:
            sends = asyncio.gather(*(t.send(mail(f"q-{i}"), f"q-{i}") for i in range(3)))
            await asyncio.sleep(0.1)  # all three are waiting for their DATA reply
            await t.close()
            await sends

        asyncio.run(scenario())
    assert len(server.messages) == 3
    assert server.sessions == 3 and recorder.quits == 3


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", ""])
def test_invalid_pool_in_the_url_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match="pool"):
        mail_transport_from_url(f"smtp://u:pw-secret@host?pool={value}", mail_from=SENDER)


@pytest.mark.parametrize("pool", [0, -3, True, 2.0])
def test_invalid_pool_argument_is_a_configuration_error(pool: object) -> None:
    with pytest.raises(ConfigurationError, match="pool"):
        SmtpTransport(host="mail.example.org", port=25, mail_from=SENDER, pool=pool)  # type: ignore[arg-type]


def test_pool_defaults_to_four() -> None:
    t = mail_transport_from_url("smtp://mail.example.org", mail_from=SENDER)
    assert isinstance(t, SmtpTransport) and t.pool_size == 4
