"""Address, header, number and id validation (B11-B13), and the transports' shared helpers."""

from __future__ import annotations

import base64

import pytest

from tidings.errors import ValidationError
from tidings.notifications.channels.base import parse_query, parse_retry_after, redact, safe_cause
from tidings.notifications.validation import (
    validate_delivery_id,
    validate_e164,
    validate_email,
    validate_header,
    validate_header_name,
    validate_sender,
)


@pytest.mark.parametrize(
    "address",
    [
        "a@example.org",
        "first.last+tag@sub.example.com",
        "o'brien@example.co.uk",
        "ALICE@Example.ORG",
    ],
)
def test_valid_addresses_pass(address: str) -> None:
    assert validate_email(address, "to").lower() == address.lower()


def test_idn_domain_is_returned_in_ascii_form() -> None:
    assert validate_email("a@bücher.de", "to") == "a@xn--bcher-kva.de"


@pytest.mark.parametrize(
    "address",
    [
        "no-at-sign",
        "a b@x.org",
        "user@localhost",
        "a@b",
        "x" * 65 + "@example.org",
        "a@" + "b" * 63 + "." + "c" * 63 + "." + "d" * 63 + "." + "e" * 63 + ".org",
        "a\ud800@example.org",
        "a@ex\u0430mple.org",  # Cyrillic a (U+0430) inside a Latin label
        "a@\u0430\u0440\u0440\u04cf\u0435.com",  # all-Cyrillic look-alike of "apple"
        "Smith, John <a@example.org>",
        '"a,b"@example.org',
        "a@[127.0.0.1]",
        "",
    ],
)
def test_invalid_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_email(address, "to")
    assert info.value.field == "to"


@pytest.mark.parametrize(
    "address",
    [
        "a@b.test\r\nRCPT TO:<x@y.test>",
        "a@example.org\nBcc: victim@example.org",
        "a@example.org\x00",
        "a@b.test> AUTH=<x@y.test>",
        "alice@example.org)<bob@example.org>",
        "alice@example.org,bob@example.org",
        "alice@example.org;bob@example.org",
        "a@example.org\u2028",
    ],
)
def test_injection_shapes_are_refused(address: str) -> None:
    with pytest.raises(ValidationError, match=r"^cc: "):
        validate_email(address, "cc")


def test_test_domains_need_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDINGS_EMAIL_TEST_DOMAINS", raising=False)
    with pytest.raises(ValidationError):
        validate_email("a@b.test", "to")
    assert validate_email("a@b.test", "to", allow_test_domains=True) == "a@b.test"
    monkeypatch.setenv("TIDINGS_EMAIL_TEST_DOMAINS", "1")
    assert validate_email("a@b.test", "to") == "a@b.test"
    with pytest.raises(ValidationError):
        validate_email("a@b.test", "to", allow_test_domains=False)


def test_non_string_is_refused() -> None:
    with pytest.raises(ValidationError):
        validate_email(42, "to")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sender", "expected"),
    [
        ("tidings@localhost", ("", "tidings@localhost")),
        ("noreply@acme.io", ("", "noreply@acme.io")),
        ("Acme Billing <billing@acme.io>", ("Acme Billing", "billing@acme.io")),
        ('"Acme" <billing@acme.io>', ("Acme", "billing@acme.io")),
    ],
)
def test_sender_forms(sender: str, expected: tuple[str, str]) -> None:
    assert validate_sender(sender) == expected


@pytest.mark.parametrize(
    "sender",
    ["a@b.test\nX: y", "A <a@b.io>, B <b@b.io>", "<a@b.io> extra", "x<y> <a@b.io>", "no-at"],
)
def test_bad_senders(sender: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_sender(sender)
    assert info.value.field == "from"


@pytest.mark.parametrize(
    "value", ["Hi\r\nBcc: victim@x.test", "a\nb", "a\rb", "nul\x00", "\x1b[31m"]
)
def test_header_control_characters_refused(value: str) -> None:
    with pytest.raises(ValidationError, match=r"^subject: "):
        validate_header(value, "subject")


def test_header_allows_unicode_and_tab() -> None:
    assert validate_header("Grüße\tand 🎉", "subject") == "Grüße\tand 🎉"


@pytest.mark.parametrize("name", ["X-Tag", "Subject"])
def test_header_name_ok(name: str) -> None:
    assert validate_header_name(name) == name


@pytest.mark.parametrize("name", ["X:Tag", "", "X Tag", "X\r\nY", "É"])
def test_header_name_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        validate_header_name(name)


@pytest.mark.parametrize("number", ["+15551234567", "+442071838750", "+4930123456"])
def test_e164_ok(number: str) -> None:
    assert validate_e164(number) == number


@pytest.mark.parametrize(
    "number",
    [
        "15551234567",
        "+05551234567",
        "+1555",
        "+1234567890123456",
        "+1 555 123 4567",
        "+1555123456\n",
        "+\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668",
        "",
    ],
)
def test_e164_refused(number: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_e164(number)
    assert info.value.field == "to"


# -- helpers every transport shares (channels/base.py) ------------------------------------


@pytest.mark.parametrize("value", ["d-1", "01HZX8K2N3.retry_2", "a" * 128])
def test_delivery_id_ok(value: str) -> None:
    assert validate_delivery_id(value) == value


@pytest.mark.parametrize(
    "value", ["", ".hidden", "-x", "../x", "a/b", "a b", "a\r\nb", "é", "a" * 129]
)
def test_delivery_id_refused(value: str) -> None:
    with pytest.raises(ValidationError, match=r"^delivery_id: "):
        validate_delivery_id(value)


def test_redact_removes_secrets_in_every_encoding() -> None:
    password = "p@ss/w rd"
    basic = base64.b64encode(b"ada:" + password.encode()).decode()
    text = (
        f"pw={password} url=smtp://ada:p%40ss%2Fw%20rd@host hdr=Authorization: Basic {basic}\n"
        f"bearer=Bearer abc.def-ghi whsec=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    )
    clean = redact(text, [password, f"ada:{password}"])
    for leaked in (password, "p%40ss%2Fw%20rd", basic, "abc.def-ghi", "MfKQ9r8GKYqrTwjUPD8I"):
        assert leaked not in clean
    assert clean.startswith("pw=[REDACTED] url=smtp://")
    assert redact("nothing to hide", [None, ""]) == "nothing to hide"


def test_safe_cause_drops_chains_that_carry_secrets() -> None:
    inner = ValueError("token s3cr3t echoed")
    outer = RuntimeError("wrapper")
    outer.__cause__ = inner
    assert safe_cause(outer, ["s3cr3t"]) is None
    assert safe_cause(outer, ["other"]) is outer


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("864000", 3600.0),
        ("0", 0.0),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: no wait
        ("Thu, 01 Jan 1970 00:16:47 GMT", 7.0),  # 1007 s, with now = 1000 s
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    now = 1000.0 if header and header.startswith("Thu, 01 Jan 1970") else None
    assert parse_retry_after(header, now=now) == expected


def test_parse_query_keeps_plus_signs() -> None:
    assert parse_query("from=+15551234567&base_url=http%3A%2F%2F127.0.0.1%3A9&x") == {
        "from": "+15551234567",
        "base_url": "http://127.0.0.1:9",
        "x": "",
    }


def test_valid_addresses_are_remembered_and_refusals_are_not() -> None:
    from tidings.notifications import validation

    before = validation._validated_email.cache_info()
    for _ in range(3):
        assert validate_email("Remembered@Example.org", "to") == "Remembered@example.org"
    after = validation._validated_email.cache_info()
    assert after.hits - before.hits >= 2 and after.currsize <= after.maxsize == 4096
    for field in ("to", "cc"):  # each refusal is worked out afresh and names its field
        with pytest.raises(ValidationError) as info:
            validate_email("nobody@localhost", field)
        assert info.value.field == field


def test_sender_checks_are_remembered_but_refusals_are_not() -> None:
    assert validate_sender("tidings@localhost") == validate_sender("tidings@localhost")
    for _ in range(2):  # a refusal is raised every time, naming the field asked about
        with pytest.raises(ValidationError) as info:
            validate_sender("a@b.test\nX: y", "mail_from")
        assert info.value.field == "mail_from"
    with pytest.raises(ValidationError):
        validate_sender(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["plain ascii", "tab\there", "caf\u00e9", "x\u2028y", "\ufeff"])
def test_printable_ascii_shortcut_agrees_with_the_full_check(value: str) -> None:
    if value in ("plain ascii", "tab\there", "caf\u00e9"):
        assert validate_header(value, "subject") == value
    else:
        with pytest.raises(ValidationError):
            validate_header(value, "subject")
