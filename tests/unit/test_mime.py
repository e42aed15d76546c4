"""build_email's hand-assembled MIME and prepare_envelope's fast paths, against the stdlib.

The reference is what build_email used to do: ``EmailMessage()`` with the default
policy, ``set_content`` + ``add_alternative``. Both are flattened as aiosmtplib does and
parsed back with the stdlib parser; headers, structure and decoded bodies must match.
"""

from __future__ import annotations

import email
import email.policy
import re
from email.message import EmailMessage
from email.utils import formataddr

import pytest
from aiosmtplib.email import flatten_message

from tidings.errors import ValidationError
from tidings.notifications import mime
from tidings.notifications.messages import Attachment, RenderedMail, build_email
from tidings.notifications.mime import POLICY, prepare_envelope

LONG_ASCII = "<p>" + "word " * 60 + "</p>"  # one 300-character line
LONG_CJK = "長い行" * 60  # 540 octets of UTF-8 on one line
TRICKY_TEXT = "From here on\n.\n. a dot\nprice = 10 =?utf-8?q?x?=\ntrailing space \n\tindented"

CASES = {
    "ascii": ("Order O-42 shipped", "Shop", "Hello,\nYour order shipped.", "<p>Hi</p>"),
    "non-ascii": ("Bestellung für Jürgen ✓", "Bücher Laden", "Grüße\nçà", "<p>Grüße ✓</p>"),
    "long-lines": ("word " * 30, "Long Name " * 10, LONG_ASCII, LONG_ASCII),
    "long-cjk": ("件名" * 30, "店", LONG_CJK, f"<p>{LONG_CJK}</p>"),
    "tricky": ("=?utf-8?q?not_encoded?= really", "Smith, John", TRICKY_TEXT, TRICKY_TEXT),
    "empty": ("", "", "", ""),
    "crlf-bodies": ("s", "n", "one\r\ntwo\rthree\n", "<p>a</p>\r\n<p>b</p>"),
}


def reference(subject: str, name: str, text: str, html: str) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = formataddr((name, "noreply@example.org"))
    msg["To"] = "a@example.org, b@example.org"
    msg["Cc"] = "c@example.org"
    msg["Reply-To"] = "r@example.org"
    msg["Message-ID"] = "<d-1@tidings>"
    msg["X-Tag"] = "invoice"
    msg.set_content(text)
    msg.add_alternative(html, subtype="html")
    return msg


def ours(subject: str, name: str, text: str, html: str) -> EmailMessage:
    return build_email(
        RenderedMail(subject, html, text),
        to=["a@example.org", "b@example.org"],
        mail_from=formataddr((name, "noreply@example.org")) if name else "noreply@example.org",
        message_id="d-1",
        cc=["c@example.org"],
        bcc=["hidden@example.org"],
        reply_to=["r@example.org"],
        tags=["invoice"],
    )


def parsed(data: bytes) -> EmailMessage:
    msg = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    return msg


def summary(msg: EmailMessage) -> dict[str, object]:
    parts = list(msg.iter_parts())
    return {
        "headers": {
            h: [str(v) for v in msg.get_all(h, [])]
            for h in ("Subject", "From", "To", "Cc", "Reply-To", "Message-ID", "X-Tag")
        },
        "type": msg.get_content_type(),
        "parts": [(p.get_content_type(), p.get_content_charset(), p.get_content()) for p in parts],
        "defects": [len(p.defects) for p in msg.walk()],
    }


@pytest.mark.parametrize("cte_type", ["8bit", "7bit"])
@pytest.mark.parametrize("case", list(CASES))
def test_bytes_parse_back_like_the_stdlib_built_message(case: str, cte_type: str) -> None:
    args = CASES[case]
    data = flatten_message(ours(*args), cte_type=cte_type)
    expected = flatten_message(reference(*args), cte_type=cte_type)
    assert summary(parsed(data)) == summary(parsed(expected))
    assert b"hidden@example.org" not in data  # Bcc is never written
    assert b"\n" not in data.replace(b"\r\n", b"")  # CRLF only
    if cte_type == "7bit":
        assert data.isascii()


@pytest.mark.parametrize("case", list(CASES))
def test_lines_stay_within_limits(case: str) -> None:
    data = flatten_message(ours(*CASES[case]))
    head, _, body = data.partition(b"\r\n\r\n")
    assert all(len(line) <= 78 for line in head.split(b"\r\n"))
    assert all(len(line) <= 998 for line in body.split(b"\r\n"))
    if case.startswith("long"):  # encoded, not sent as one long line
        assert all(len(line) <= 78 for line in body.split(b"\r\n"))


def test_non_ascii_header_text_is_an_encoded_word() -> None:
    data = flatten_message(ours(*CASES["non-ascii"]))
    head = data.partition(b"\r\n\r\n")[0]
    assert head.isascii() and b"=?utf-8?" in head
    assert str(parsed(data)["From"]) == "Bücher Laden <noreply@example.org>"


def test_built_message_reads_like_before() -> None:
    msg = ours(*CASES["non-ascii"])
    assert msg["Subject"] == "Bestellung für Jürgen ✓"
    assert msg["To"] == "a@example.org, b@example.org"
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(("plain",))
    assert text is not None and text.get_content() == "Grüße\nçà\n"


def test_boundary_never_occurs_in_a_body(monkeypatch: pytest.MonkeyPatch) -> None:
    usual = ours("s", "n", "t", "h").get_boundary()
    assert usual is not None and usual == ours("s", "n", "t", "h").get_boundary()
    tokens = iter(["clash", "fresh"])
    monkeypatch.setattr(mime.secrets, "token_hex", lambda n: next(tokens))
    msg = ours("s", "n", f"a body quoting {usual} and =_clash", "<p>x</p>")
    assert msg.get_boundary() == "=_fresh"
    back = parsed(flatten_message(msg))
    assert [p.get_content_type() for p in back.iter_parts()] == ["text/plain", "text/html"]
    plain = back.get_body(("plain",))
    assert plain is not None and usual in plain.get_content()


def small(to: str = "a@example.org", attachments: list[Attachment] | None = None) -> EmailMessage:
    rendered = RenderedMail("s", "<p>h</p>", "t")
    return build_email(
        rendered, to=to, mail_from="x@example.org", message_id="d", attachments=attachments or []
    )


def test_attachments_sit_beside_the_alternative_part() -> None:
    attachment = Attachment(b"\x00\x01" * 100, "blob.bin", "application/octet-stream")
    msg = small(attachments=[attachment])
    back = parsed(flatten_message(msg))
    assert back.get_content_type() == "multipart/mixed"
    first, blob = back.iter_parts()
    assert first.get_content_type() == "multipart/alternative"
    assert blob.get_filename() == "blob.bin" and blob.get_content() == b"\x00\x01" * 100


def test_header_classes_are_built_once_per_name() -> None:
    factory = POLICY.header_factory
    assert factory["Subject"] is factory["subject"]
    assert factory("To", "a@example.org").addresses[0].addr_spec == "a@example.org"


@pytest.mark.parametrize(
    "text",
    [
        "a@example.org",
        "a@example.org, b.c+d@sub.example.org",
        "Acme Shop <noreply@example.org>",
        "Acme <a@example.org>,b@example.org",
        "x!#$%&'*+/=?^_`{|}~-@example-1.org",
    ],
)
def test_plain_address_lists_read_as_the_parser_reads_them(text: str) -> None:
    header = POLICY.header_factory("To", text)
    assert not header.defects
    assert mime._plain_addresses(text) == [a.addr_spec for a in header.addresses]


@pytest.mark.parametrize(
    "text",
    [
        '"Smith, John" <a@example.org>',
        "a..b@example.org",
        "a@example.org,,b@example.org",
        "Jürgen <a@example.org>",
        "group: a@example.org;",
        "a@example.org (comment)",
        "<a@example.org>",
    ],
)
def test_anything_else_goes_to_the_parser(text: str) -> None:
    assert mime._plain_addresses(text) is None


def compat32(**headers: str) -> EmailMessage:
    msg = email.message.Message()
    for name, value in headers.items():
        msg[name] = value
    msg.set_payload("hello")
    return msg  # type: ignore[return-value]


def test_envelope_of_a_built_message() -> None:
    msg = ours(*CASES["ascii"])
    assert prepare_envelope(msg, "d-1", "fallback@example.org") == (
        "noreply@example.org",
        ["a@example.org", "b@example.org", "c@example.org", "hidden@example.org"],
    )


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"To": "=?utf-8?q?a=0Ab?= <a@example.org>"}, "to"),  # LF hidden in an encoded word
        ({"To": "a@example.org", "X-Note": "x\r\nBcc: v@example.org"}, "x-note"),
        ({"To": "Smith, John <a@example.org>"}, "to"),
    ],
)
def test_hidden_control_characters_are_still_found(headers: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        prepare_envelope(compat32(From="x@example.org", **headers), "d", "x@example.org")
    assert info.value.field == field


def test_control_characters_in_encoded_words_of_a_parsed_message_are_found() -> None:
    raw = b"From: x@example.org\r\nTo: a@example.org\r\nSubject: =?utf-8?q?hi=0D=0ABcc:_v?=\r\n\r\n"
    with pytest.raises(ValidationError) as info:
        prepare_envelope(parsed(raw), "d", "x@example.org")
    assert info.value.field == "subject"


def test_folded_raw_headers_of_a_parsed_message_are_accepted() -> None:
    raw = (
        b"From: x@example.org\r\nTo: a@example.org,\r\n b@example.org\r\n"
        b"Subject: a long\r\n folded subject\r\n\r\nhi\r\n"
    )
    msg = parsed(raw)
    assert prepare_envelope(msg, "d", "x@example.org") == (
        "x@example.org",
        ["a@example.org", "b@example.org"],
    )
    assert re.fullmatch(r"<d@tidings>", str(msg["Message-ID"]))


def test_a_non_ascii_local_part_is_a_validation_error() -> None:
    msg = small(to="jürgen@example.org")
    with pytest.raises(ValidationError) as info:
        prepare_envelope(msg, "d", "x@example.org")
    assert info.value.field == "to"


# flatten_for_smtp: the SMTP transport's fast flattening, byte for byte the generator's.


@pytest.mark.parametrize("case", list(CASES))
def test_fast_flattening_is_the_generators_output(case: str) -> None:
    msg = ours(*CASES[case])
    before = flatten_message(msg)
    fast = mime.flatten_for_smtp(msg)
    assert fast is not None and fast == before
    assert flatten_message(msg) == before  # and the message is left as it was


def test_fast_flattening_with_a_fresh_boundary_leaves_it_to_the_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usual = ours("s", "n", "t", "h").get_boundary()
    monkeypatch.setattr(mime.secrets, "token_hex", lambda n: "fresh")
    msg = ours("s", "n", f"quoting {usual}", "<p>x</p>")
    assert msg.get_boundary() == "=_fresh" and mime.flatten_for_smtp(msg) is None


@pytest.mark.parametrize(
    "change",
    ["long subject", "parsed header", "preamble", "payload", "attachment", "compat32 part"],
)
def test_fast_flattening_of_an_unusual_message_is_the_generators_or_none(change: str) -> None:
    msg = ours(*CASES["ascii"])
    if change == "long subject":
        msg.replace_header("Subject", "word " * 30)
    elif change == "parsed header":
        msg["Comments"] = "a parsed, not a raw, header"
    elif change == "preamble":
        msg.preamble = "This is a MIME message."
    elif change == "payload":
        msg.get_payload()[1].set_payload("<p>changed\nby hand</p>")  # type: ignore[index]
    elif change == "attachment":
        msg = small(attachments=[Attachment(b"x", "x.bin", "application/octet-stream")])
    else:
        part = email.message.Message()
        part.set_payload("old style")
        msg.attach(part)  # type: ignore[arg-type]
    fast = mime.flatten_for_smtp(msg)
    assert fast is None or fast == flatten_message(msg)
    if change in ("long subject", "parsed header", "payload"):
        assert fast is not None  # still the fast path: only the header/payload differs
    else:
        assert fast is None


def test_date_header_is_format_datetime_to_the_second() -> None:
    from datetime import UTC, datetime
    from email.utils import format_datetime

    for stamp in (0.0, 59.999, 1_700_000_000.25, 1_700_000_000.75, 1_700_000_001.0, 4e9):
        assert mime._date_header(stamp) == format_datetime(datetime.fromtimestamp(stamp, UTC))
