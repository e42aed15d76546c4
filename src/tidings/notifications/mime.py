"""Building the MIME email a mail transport sends, from a rendered mail.

:func:`build_email` wraps a :class:`~tidings.notifications.messages.RenderedMail` (and
its attachments) into a multipart/alternative ``EmailMessage``; every address and
header is validated here, before any I/O. :func:`message_id_for` gives the
``Message-ID`` of a delivery, the same on every retry so a receiver can drop a
duplicate. :mod:`tidings.notifications.messages` re-exports both.

:func:`prepare_envelope` checks a finished message (ours or any ``EmailMessage``)
before a transport sends it, and works out the SMTP envelope.

Speed (a worker does this for every mail): the stdlib's ``policy.default`` parses every
header it is given, builds a new header class for each, and the generator parses the
MIME headers again on every read, which made a mail ~3 ms of CPU. So the common case
is assembled by hand. A header whose value we validated and that is short plain ASCII
is stored verbatim (``set_raw``) and written as is; the MIME headers are parsed once
per process and shared (a multipart boundary is the process's unless a body contains
it); text bodies are encoded here (7bit/8bit when every line fits in 78 octets, else
quoted-printable or base64, whichever is shorter, by the C codecs). Non-ASCII or long
header values and attachments go through the stdlib as before. The result is a plain
``EmailMessage``: reading a stored header parses it then, as for a parsed mail.
:func:`prepare_envelope` skips the parser for text it cannot change (printable ASCII
without encoded words) and for plain ``a@b.org, Name <c@d.org>`` address lists.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime
from email.headerregistry import Address, BaseHeader, HeaderRegistry
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from email.policy import default as default_policy
from email.utils import format_datetime, formataddr
from typing import Protocol

from tidings import _clock
from tidings.errors import ValidationError
from tidings.notifications.validation import (
    validate_delivery_id,
    validate_email,
    validate_header,
    validate_header_name,
    validate_sender,
)

#: Most bytes of content (bodies and attachments, before base64) in one mail.
MAX_MESSAGE_BYTES = 30 * 1024 * 1024


class MailParts(Protocol):
    """What :func:`build_email` reads of a rendered mail
    (:class:`~tidings.notifications.messages.RenderedMail`)."""

    @property
    def subject(self) -> str: ...
    @property
    def html(self) -> str: ...
    @property
    def text(self) -> str: ...


class MailAttachment(Protocol):
    """What :func:`build_email` reads of an attachment
    (:class:`~tidings.notifications.messages.Attachment`)."""

    @property
    def name(self) -> str: ...
    @property
    def mime(self) -> str: ...
    def data(self) -> bytes: ...


__all__ = [
    "POLICY",
    "addresses",
    "build_email",
    "flatten_for_smtp",
    "message_id_for",
    "prepare_envelope",
]

_MAX_LINE = 78  # RFC 5322's "SHOULD" line length; the stdlib folds and encodes at it
_ADDRESS_HEADERS = {
    name.lower(): name for name in ("From", "Sender", "Reply-To", "To", "Cc", "Bcc")
}
# ``local@domain`` as dot-atoms, bare or after a display name of plain words: the
# mailboxes the stdlib parser reads the same way, so it need not run for them.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_SPEC = rf"{_ATOM}(?:\.{_ATOM})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
_SIMPLE_MAILBOX = re.compile(
    rf"[A-Za-z0-9]+(?: [A-Za-z0-9]+)* <(?P<named>{_SPEC})>|(?P<bare>{_SPEC})"
)


class _Registry(HeaderRegistry):
    """The stdlib header registry, creating each header class once instead of per header."""

    def __init__(self) -> None:
        super().__init__()
        self._classes: dict[str, type[BaseHeader]] = {}

    def map_to_type(self, name: str, cls: type[BaseHeader]) -> None:
        super().map_to_type(name, cls)
        self._classes.clear()

    def __getitem__(self, name: str) -> type[BaseHeader]:
        key = name.lower()
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = super().__getitem__(name)
        return cls


#: ``email.policy.default`` with a header registry that does not rebuild classes.
POLICY = default_policy.clone(header_factory=_Registry())
# The MIME headers, parsed once: the generator reads a parsed header for free and
# folds it back in ~10 us, where it would parse a raw one (~60 us) at every read.
_TEXT_TYPES = {
    subtype: POLICY.header_factory("Content-Type", f'text/{subtype}; charset="utf-8"')
    for subtype in ("plain", "html")
}
_BOUNDARY = secrets.token_hex(12)
_MULTIPART_TYPES = {  # subtype: (boundary, header)
    subtype: (
        f"=_{_BOUNDARY}_{subtype}",
        POLICY.header_factory(
            "Content-Type", f'multipart/{subtype}; boundary="=_{_BOUNDARY}_{subtype}"'
        ),
    )
    for subtype in ("alternative", "mixed")
}
_ENCODINGS = {
    cte: POLICY.header_factory("Content-Transfer-Encoding", cte)
    for cte in ("7bit", "8bit", "quoted-printable", "base64")
}
# What the SMTP generator writes for each shared header, folded once: id -> (header,
# folded bytes), the header kept so its id cannot be reused. And the Content-Type of
# each part kind: id -> (header, maintype, boundary or None).
_FOLDED: dict[int, tuple[BaseHeader, bytes]] = {}
_KNOWN_TYPES: dict[int, tuple[BaseHeader, str, str | None]] = {}
for _header in (*_TEXT_TYPES.values(), *_ENCODINGS.values()):
    _FOLDED[id(_header)] = (_header, SMTP_POLICY.fold_binary(_header.name, _header))
for _header in _TEXT_TYPES.values():
    _KNOWN_TYPES[id(_header)] = (_header, "text", None)
for _boundary, _header in _MULTIPART_TYPES.values():
    _FOLDED[id(_header)] = (_header, SMTP_POLICY.fold_binary(_header.name, _header))
    _KNOWN_TYPES[id(_header)] = (_header, "multipart", _boundary)
_NLCRE = re.compile(r"\r\n|\r|\n")  # the generator's line-ending pattern
_BCC = frozenset({"bcc", "resent-bcc"})


def addresses(value: str | Iterable[str], field_name: str) -> list[str]:
    """Validate one address or several; errors name ``field_name``."""
    items = [value] if isinstance(value, str) else list(value)
    return [validate_email(item, field_name) for item in items]


def message_id_for(delivery_id: str) -> str:
    """The ``Message-ID`` for a delivery: ``<{delivery_id}@tidings>``, same on every retry.

    Raises:
        ValidationError: the id has characters other than letters, digits, ``._-``.
    """
    return f"<{validate_delivery_id(delivery_id, 'message_id')}@tidings>"


_last_date: tuple[int, str] = (-1, "")


def _date_header(timestamp: float) -> str:
    """RFC 5322 date of ``timestamp`` in UTC, to the second (the last one is remembered)."""
    global _last_date
    second = math.floor(timestamp)
    if _last_date[0] != second:
        _last_date = (second, format_datetime(datetime.fromtimestamp(second, UTC)))
    return _last_date[1]


def _set_header(msg: EmailMessage, name: str, value: str) -> None:
    """Store a validated header verbatim when it is short ASCII, else parse it (stdlib)."""
    if value.isascii() and len(name) + len(value) + 2 <= _MAX_LINE:
        msg.set_raw(name, value)
    else:
        msg[name] = value


def _encode_text(text: str) -> tuple[str, str]:
    """``(Content-Transfer-Encoding, payload)`` for a text body, as ``set_content`` chooses.

    Lines end in LF here; the generator writes the policy's line separator.
    """
    lines = text.encode("utf-8").splitlines()
    data = b"\n".join(lines) + b"\n"
    if max(map(len, lines), default=0) <= _MAX_LINE:
        if data.isascii():
            return "7bit", data.decode("ascii")
        # Held as surrogate escapes, as the stdlib does: a 7-bit-only server gets it
        # re-encoded by the generator from the part's charset.
        return "8bit", data.decode("ascii", "surrogateescape")
    quoted = binascii.b2a_qp(data, istext=True)  # soft line breaks at 76
    encoded = b"" if data.isascii() else base64.encodebytes(data)
    if not encoded or len(quoted) <= len(encoded):
        return "quoted-printable", quoted.decode("ascii")
    return "base64", encoded.decode("ascii")


def _text_part(text: str, subtype: str) -> EmailMessage:
    part = EmailMessage(POLICY)
    cte, payload = _encode_text(text)
    part.set_raw("Content-Type", _TEXT_TYPES[subtype])
    part.set_raw("Content-Transfer-Encoding", _ENCODINGS[cte])
    part.set_payload(payload)
    return part


def _multipart(
    msg: EmailMessage, subtype: str, parts: list[EmailMessage], texts: list[str]
) -> EmailMessage:
    """Make ``msg`` multipart/``subtype`` holding ``parts``, under a boundary no text has.

    The boundary is this process's, parsed once; a body that happens to contain it
    gets a fresh one (RFC 2046 asks only that the delimiter occur in no part).
    """
    boundary, content_type = _MULTIPART_TYPES[subtype]
    if any(boundary in text for text in texts):
        boundary = f"=_{secrets.token_hex(12)}"
        while any(boundary in text for text in texts):  # a 96-bit token: practically never
            boundary = f"=_{secrets.token_hex(12)}"
        content_type = POLICY.header_factory(
            "Content-Type", f'multipart/{subtype}; boundary="{boundary}"'
        )
    msg.set_raw("Content-Type", content_type)
    for part in parts:
        msg.attach(part)
    return msg


def build_email(
    rendered: MailParts,
    *,
    to: str | Iterable[str],
    mail_from: str,
    message_id: str,
    cc: Iterable[str] = (),
    bcc: Iterable[str] = (),
    reply_to: Iterable[str] = (),
    tags: Iterable[str] = (),
    attachments: Iterable[MailAttachment] = (),
) -> EmailMessage:
    """Assemble a multipart/alternative (text + HTML) email, with attachments if any.

    Args:
        rendered: the rendered subject and bodies.
        to: one address or several.
        mail_from: the sender, ``addr`` or ``Name <addr>``.
        message_id: the delivery id; the header becomes ``<{message_id}@tidings>``.
        cc: carbon-copy addresses.
        bcc: blind-copy addresses (a transport strips the header when sending).
        reply_to: Reply-To addresses.
        tags: each becomes an ``X-Tag`` header.
        attachments: files to attach.

    Raises:
        ValidationError: an address, header, id or attachment is invalid.
    """
    recipients = addresses(to, "to")
    if not recipients:
        raise ValidationError("at least one recipient is required", field="to")
    name, sender = validate_sender(mail_from)
    msg = EmailMessage(POLICY)
    _set_header(msg, "Subject", validate_header(rendered.subject, "subject"))
    validate_header(name, "from")
    if sender.isascii():
        _set_header(msg, "From", formataddr((name, sender)))
    else:  # an SMTPUTF8 mailbox, which formataddr refuses
        msg["From"] = Address(display_name=name, addr_spec=sender)
    _set_header(msg, "To", ", ".join(recipients))
    for header, values, field_name in (("Cc", cc, "cc"), ("Bcc", bcc, "bcc")):
        checked = addresses(values, field_name)
        if checked:
            _set_header(msg, header, ", ".join(checked))
    replies = addresses(reply_to, "reply_to")
    if replies:
        _set_header(msg, "Reply-To", ", ".join(replies))
    _set_header(msg, "Date", _date_header(_clock.now()))
    _set_header(msg, "Message-ID", message_id_for(message_id))
    for tag in tags:
        _set_header(msg, "X-Tag", validate_header(tag, "tag"))
    msg.set_raw("MIME-Version", "1.0")
    texts = [rendered.text, rendered.html]
    body = [_text_part(rendered.text, "plain"), _text_part(rendered.html, "html")]
    files = list(attachments)
    if not files:
        return _multipart(msg, "alternative", body, texts)
    parts = [_multipart(EmailMessage(POLICY), "alternative", body, texts)]
    total = len(rendered.text) + len(rendered.html)
    for attachment in files:
        maintype, subtype = attachment.mime.split("/", 1)
        data = attachment.data()
        total += len(data)
        if total > MAX_MESSAGE_BYTES:
            raise ValidationError(
                f"message is larger than {MAX_MESSAGE_BYTES // (1024 * 1024)} MiB "
                "with its attachments",
                field="attachment",
            )
        part = EmailMessage(POLICY)
        part.set_content(
            data,
            maintype=maintype,
            subtype=subtype,
            disposition="attachment",
            filename=validate_header(attachment.name, "attachment.name"),
        )
        parts.append(part)
    return _multipart(msg, "mixed", parts, texts)


def _is_plain(value: object) -> bool:
    """True for text that parsing cannot turn into anything else (no encoded words).

    Printable ASCII without ``=?`` (RFC 2047) or ``*=`` (RFC 2231) decodes to itself,
    so it cannot hide a control character: checking it needs no header parser.
    """
    return (
        isinstance(value, str)
        and value.isascii()
        and value.isprintable()
        and "=?" not in value
        and "*=" not in value
    )


def _plain_addresses(text: str) -> list[str] | None:
    """The addr-specs of ``a@x.org, Name <b@y.org>``, or ``None`` if the parser is needed."""
    specs = []
    for item in text.split(","):
        match = _SIMPLE_MAILBOX.fullmatch(item.strip())
        if match is None:
            return None
        specs.append(match["named"] or match["bare"])
    return specs


def _header_addresses(name: str, text: str, field: str) -> list[str]:
    specs = _plain_addresses(text) if _is_plain(text) else None
    if specs is None:
        try:
            header = POLICY.header_factory(name, text)
        except ValueError:  # e.g. CR/LF decoded from an encoded word into a name
            header = None
        if header is None or header.defects or not hasattr(header, "addresses"):
            raise ValidationError("malformed address header", field=field)
        specs = [address.addr_spec for address in header.addresses]
    return specs


def prepare_envelope(
    email: EmailMessage, delivery_id: str, mail_from: str
) -> tuple[str, list[str]]:
    """Validate a message completely and work out its SMTP envelope.

    Sets ``Message-ID: <{delivery_id}@tidings>`` when the message has none. Every
    header of every part is checked as the message's policy reads it (a compat32
    message's raw text included); address headers are parsed by the default policy's
    rules whatever the message's policy, so a compat32 message is held to them too.

    Args:
        email: the message.
        delivery_id: the stable delivery id.
        mail_from: sender to use when the message has no From header.

    Returns:
        ``(envelope_sender, recipients)``: the addr-specs of From and of To, Cc and
        Bcc, de-duplicated in order.

    Raises:
        ValidationError: a header or address is invalid, or there is no recipient.
    """
    message_id = message_id_for(delivery_id)
    found: list[tuple[str, str]] = []  # (canonical name, text) of top-level address headers
    for part in email.walk():
        for name, raw in part.raw_items():
            validate_header_name(name)
            if _is_plain(raw):
                text = str(raw)
            else:
                text = str(part.policy.header_fetch_parse(name, raw))
                validate_header(text, name.lower())
            canonical = _ADDRESS_HEADERS.get(name.lower())
            if canonical is not None and part is email:
                found.append((canonical, text))
    addresses: dict[str, list[str]] = {}
    for name in _ADDRESS_HEADERS.values():
        field = name.lower().replace("-", "_")
        for text in (text for found_name, text in found if found_name == name):
            for spec in _header_addresses(name, text, field):
                if name in ("From", "Sender"):
                    validate_sender(spec, field)
                    addresses.setdefault(name, []).append(spec)
                else:
                    addresses.setdefault(name, []).append(validate_email(spec, field))
    senders = addresses.get("From", [])
    if len(senders) > 1:
        raise ValidationError("exactly one From address is allowed", field="from")
    sender = senders[0] if senders else validate_sender(mail_from)[1]
    if not senders:
        email["From"] = mail_from
    recipients = list(
        dict.fromkeys(a for name in ("To", "Cc", "Bcc") for a in addresses.get(name, []))
    )
    if not recipients:
        raise ValidationError("at least one recipient is required", field="to")
    if "Message-ID" not in email:
        email["Message-ID"] = message_id
    return sender, recipients


def _fold_smtp(name: str, value: str) -> bytes:
    """One header as ``email.policy.SMTP``'s generator writes it (``fold_binary``)."""
    if type(value) is str:
        # Stored verbatim (set_raw): the policy writes short plain ASCII unchanged.
        if (
            value.isascii()
            and value.isprintable()
            and name.isascii()
            and len(name) + len(value) + 2 <= _MAX_LINE
        ):
            return f"{name}: {value}\r\n".encode("ascii")
    else:
        known = _FOLDED.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
    return SMTP_POLICY.fold_binary(name, value)


def _flatten_part(part: EmailMessage, out: list[bytes], *, top: bool) -> bool:
    """Append ``part`` as the SMTP generator writes it; False if it is not a known shape."""
    content_type: object = None
    headers: list[bytes] = []
    for name, value in part.raw_items():
        lowered = name.lower()
        if top and lowered in _BCC:
            continue
        if content_type is None and lowered == "content-type":
            content_type = value
        headers.append(_fold_smtp(name, value))
    known = _KNOWN_TYPES.get(id(content_type))
    if known is None or known[0] is not content_type:
        return False  # an attachment, a fresh boundary, a type set by hand: the generator
    _, maintype, boundary = known
    payload = part.__dict__.get("_payload")
    if maintype == "text":
        if type(payload) is not str:
            return False
        body = _NLCRE.sub("\r\n", payload).encode("ascii", "surrogateescape")
        out += headers
        out += (b"\r\n", body)
        return True
    if (
        type(payload) is not list
        or boundary is None
        or part.preamble is not None
        or part.epilogue is not None
    ):
        return False
    out += headers
    out.append(b"\r\n")
    delimiter = f"--{boundary}\r\n".encode("ascii")
    out.append(delimiter)
    for index, child in enumerate(payload):
        if index:
            out += (b"\r\n", delimiter)
        if not isinstance(child, EmailMessage) or not _flatten_part(child, out, top=False):
            return False
    out.append(f"\r\n--{boundary}--\r\n".encode("ascii"))
    return True


def flatten_for_smtp(email: EmailMessage) -> bytes | None:
    """The bytes aiosmtplib's ``flatten_message(email)`` gives (8bit, no SMTPUTF8), faster.

    That is the stdlib ``BytesGenerator`` under ``email.policy.SMTP`` with Bcc and
    Resent-Bcc left out: CRLF line ends, headers folded at 78. This covers what
    :func:`build_email` makes without attachments: headers stored verbatim (short
    printable ASCII, written as is) or shared, pre-folded ones, text parts and
    multiparts under this process's boundary. For any other message it returns
    ``None`` and the caller uses the generator. The output is byte-for-byte the
    generator's (the tests compare them).
    """
    out: list[bytes] = []
    try:
        if not _flatten_part(email, out, top=True):
            return None
    except (UnicodeError, ValueError, TypeError):
        return None  # let the generator raise its own error
    return b"".join(out)
