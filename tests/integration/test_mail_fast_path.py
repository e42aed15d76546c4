"""The SMTP transport's fast path against aiosmtplib's own ``send_message``, on aiosmtpd.

``SmtpTransport`` flattens the messages ``build_email`` makes itself and drives MAIL,
RCPT and DATA through aiosmtplib's public commands instead of ``send_message``. Here
the same ``EmailMessage`` goes both ways, to two aiosmtpd servers on 127.0.0.1, and
what the servers received must be identical: the data byte for byte, the MAIL
options (``SIZE=``, ``BODY=8BITMIME``) and the envelope.
"""

from __future__ import annotations

import asyncio
import email.message
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiosmtplib
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.support.smtp import Recorder, SmtpServer
from tidings.errors import ConfigurationError
from tidings.notifications.channels.mail import SmtpTransport, mail_transport_from_url
from tidings.notifications.messages import Attachment, MailMessage, RenderedMail, build_email
from tidings.notifications.mime import flatten_for_smtp, prepare_envelope

SENDER = "Acme <noreply@example.org>"
TRICKY = "From here on\n.\n. a dot\n..two\r\nlone\rcarriage\nprice = 10 =?utf-8?q?x?=\n\tend"
LONG = "<p>" + "word " * 60 + "</p>"


@dataclass
class OptionsRecorder(Recorder):
    """Also keeps the MAIL options of each accepted message."""

    mail_options: list[list[str]] = field(default_factory=list)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        with self.lock:
            self.mail_options.append(list(envelope.mail_options))
        return await super().handle_DATA(server, session, envelope)


class SevenBitServer(SmtpServer):
    """aiosmtpd with ``decode_data=True``: it does not offer 8BITMIME."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(recorder)
        self._kwargs["decode_data"] = True


def rendered(subject: str, text: str, html: str) -> RenderedMail:
    return RenderedMail(subject, html, text)


MESSAGES: dict[str, dict[str, Any]] = {
    "ascii": {"rendered": rendered("Order O-42 shipped", "Hello,\nshipped.", "<p>Hi</p>")},
    "non-ascii": {"rendered": rendered("Grüße ✓", "Grüße\nçà", "<p>Grüße ✓</p>")},
    "long-lines": {"rendered": rendered("word " * 30, LONG, LONG)},
    "dots-and-line-ends": {"rendered": rendered("dots", TRICKY, TRICKY)},
    "empty": {"rendered": rendered("", "", "")},
    "cc-bcc-tags": {
        "rendered": rendered("s", "t", "<p>h</p>"),
        "cc": ["c@example.org"],
        "bcc": ["hidden@example.org"],
        "reply_to": ["r@example.org"],
        "tags": ["invoice", "eu"],
    },
    "attachment": {
        "rendered": rendered("s", "see attached", "<p>see attached</p>"),
        "attachments": [Attachment(b"%PDF-1.4\n\x00\xff" * 50, "a.pdf", "application/pdf")],
    },
}


def build(case: str, delivery_id: str) -> email.message.EmailMessage:
    kw = dict(MESSAGES[case])
    return build_email(
        kw.pop("rendered"),
        to=["ada@example.org", "bob@example.org"],
        mail_from=SENDER,
        message_id=delivery_id,
        **kw,
    )


async def send_with_aiosmtplib(port: int, msg: email.message.EmailMessage) -> None:
    sender, recipients = prepare_envelope(msg, "ref", SENDER)
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, start_tls=False) as smtp:
        await smtp.send_message(msg, sender=sender, recipients=recipients)


async def send_with_transport(port: int, msg: email.message.EmailMessage, did: str) -> str:
    t = mail_transport_from_url(f"smtp://127.0.0.1:{port}?tls=off", mail_from=SENDER)
    try:
        return (await t.send(msg, did)).response
    finally:
        await t.close()


def both_ways(
    case: str, server_type: type[SmtpServer] = SmtpServer
) -> tuple[OptionsRecorder, OptionsRecorder]:
    ours, theirs = OptionsRecorder(), OptionsRecorder()
    msg = build(case, "d-1")
    with server_type(ours) as mine, server_type(theirs) as reference:
        asyncio.run(send_with_aiosmtplib(reference.port, msg))
        asyncio.run(send_with_transport(mine.port, msg, "d-1"))
    assert len(ours.messages) == len(theirs.messages) == 1
    return ours, theirs


@pytest.mark.parametrize("case", list(MESSAGES))
def test_the_server_receives_what_send_message_sends(case: str) -> None:
    ours, theirs = both_ways(case)
    assert ours.messages[0] == theirs.messages[0]  # envelope and data, byte for byte
    assert ours.mail_options == theirs.mail_options
    [options] = ours.mail_options
    size = [o for o in options if o.upper().startswith("SIZE=")]
    assert size == [f"SIZE={len(ours.messages[0].data)}"] or size == [
        f"size={len(ours.messages[0].data)}"
    ]
    data = ours.messages[0].data
    assert b"Message-ID: <d-1@tidings>\r\n" in data
    assert b"hidden@example.org" not in data
    if case == "cc-bcc-tags":
        assert "hidden@example.org" in ours.messages[0].rcpt_tos


@pytest.mark.parametrize("case", ["ascii", "non-ascii", "dots-and-line-ends", "attachment"])
def test_a_server_without_8bitmime_gets_what_send_message_sends(case: str) -> None:
    ours, theirs = both_ways(case, SevenBitServer)
    assert ours.messages[0] == theirs.messages[0]
    assert ours.mail_options == theirs.mail_options
    assert not any("8BITMIME" in o.upper() for o in ours.mail_options[0])
    assert ours.messages[0].data.isascii()


def test_the_fast_flattening_is_used_for_built_messages_only() -> None:
    assert flatten_for_smtp(build("ascii", "d-1")) is not None
    assert flatten_for_smtp(build("attachment", "d-1")) is None
    by_hand = email.message.EmailMessage()
    by_hand["Subject"] = "hi"
    by_hand.set_content("body")
    assert flatten_for_smtp(by_hand) is None


def test_a_message_changed_after_building_is_sent_as_changed() -> None:
    recorder = OptionsRecorder()
    msg = build("ascii", "d-2")
    msg.replace_header("Subject", "Changed after build")
    msg.get_payload()[0].set_content("a new text part\n")  # type: ignore[union-attr]
    with SmtpServer(recorder) as server:
        asyncio.run(send_with_transport(server.port, msg, "d-2"))
    [received] = recorder.messages
    assert b"Subject: Changed after build\r\n" in received.data
    assert b"a new text part\r\n" in received.data


def test_many_mails_over_one_session_each_arrive_whole() -> None:
    recorder = OptionsRecorder()
    with SmtpServer(recorder) as server:
        t = mail_transport_from_url(
            f"smtp://127.0.0.1:{server.port}?tls=off&pool=1", mail_from=SENDER
        )

        async def scenario() -> None:
            try:
                for i in range(20):
                    message = MailMessage().subject(f"Mail {i}").line(f".line {i}")
                    e = message.to_email(
                        to="ada@example.org", mail_from=SENDER, delivery_id=f"m{i}"
                    )
                    await t.send(e, f"m{i}")
            finally:
                await t.close()

        asyncio.run(scenario())
    assert server.sessions == 1 and len(recorder.messages) == 20
    for i, received in enumerate(recorder.messages):
        assert f"Message-ID: <m{i}@tidings>\r\n".encode() in received.data
        assert f"Subject: Mail {i}\r\n".encode() in received.data
        assert f"\r\n.line {i}\r\n".encode() in received.data  # dot-stuffed, then unstuffed
        assert f"SIZE={len(received.data)}" in [o.upper() for o in recorder.mail_options[i]]


def test_tls_off_loads_no_trust_store(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    with SmtpServer() as server:
        response = asyncio.run(send_with_transport(server.port, build("ascii", "t-1"), "t-1"))
        assert len(server.messages) == 1 and "queued as 42" in response
    assert built == []
    auto = mail_transport_from_url("smtp://127.0.0.1:25", mail_from=SENDER)
    assert isinstance(auto, SmtpTransport) and len(built) == 1


def test_tls_off_still_reports_a_bad_ca_bundle(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="CA bundle"):
        mail_transport_from_url(
            f"smtp://127.0.0.1:25?tls=off&ca={tmp_path}/missing.pem", mail_from=SENDER
        )


@pytest.mark.parametrize(
    "data",
    [b"", b"a", b"a\r\n", b"a\n", b"a\r", b"\r\r\n\n\r", b"x\r\ny\nz\r.\r\n", b"\n.\n", b"\r\n"],
)
def test_declared_size_is_the_normalised_length(data: bytes) -> None:
    from aiosmtplib.protocol import normalize_message_line_endings

    from tidings.notifications.channels.mail import smtp_size

    assert smtp_size(data) == len(normalize_message_line_endings(data))
