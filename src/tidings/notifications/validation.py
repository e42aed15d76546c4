"""Checks every address, header and number before it can reach the network.

Our own character checks run *before* ``email-validator`` and the stdlib parsers,
because those are where the known injection bugs live: Python 3.11.7's
``email.utils.getaddresses`` splits ``alice@example.org)<bob@example.org>`` into two
recipients (CVE-2023-27043), its generator lacks the CVE-2024-6923 header fix, and
aiosmtplib before 5.1.3 forwarded ``a@b.test> AUTH=<x@y.test>`` verbatim into RCPT.
So a value that carries a control character, a bracket, a comma or a lone surrogate
is refused here, with a :class:`~tidings.errors.ValidationError` naming the field,
and nothing downstream ever parses it.

Addresses are plain ``local@domain`` (no display name, no quoting, no domain
literals). Domains must be globally deliverable: ``user@localhost`` and ``a@b`` are
refused. Special-use test domains (``*.test``) are refused too unless
``allow_test_domains`` is on, or the environment variable
``TIDINGS_EMAIL_TEST_DOMAINS=1`` is set (for test suites and local development).
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata

import email_validator

from tidings.errors import ValidationError

__all__ = [
    "validate_delivery_id",
    "validate_e164",
    "validate_email",
    "validate_header",
    "validate_header_name",
    "validate_sender",
]

_TEST_DOMAINS_ENV = "TIDINGS_EMAIL_TEST_DOMAINS"
_DELIVERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_E164 = re.compile(r"\+[1-9][0-9]{6,14}")
# RFC 5322 field-name: printable ASCII except colon.
_HEADER_NAME = re.compile(r"[!-9;-~]{1,76}")
# Characters that delimit or comment inside address lists; none belongs in a bare
# addr-spec we accept, and each has been used to smuggle a second recipient.
_ADDRESS_SPECIALS = frozenset('<>()[],;:"\\')
# Fallback for configured senders such as ``tidings@localhost`` (trusted config,
# never user input): a dot-atom local part at a plain ASCII host name.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PLAIN_ADDRESS = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*")
_SENDER_WITH_NAME = re.compile(r"(?P<name>[^<>]*?)\s*<(?P<addr>[^<>]+)>")

# Letters from other scripts that render like Latin ones. A domain label made only
# of these (``xn--80ak6aa92e``, a Cyrillic "apple") or mixing scripts is a lure.
_LATIN_LOOKALIKES = frozenset(
    "аеорсхуікјѕһԁԛԝӏвмнтьАВЕКМНОРСТХУІЈЅ"  # Cyrillic
    "αοριτυνκεχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"  # Greek
)


_ALLOWED_BY_APP = False
_TRUE = {"1", "true", "yes", "on"}
TEST_DOMAINS_HINT = (
    "for test addresses (dev@myapp.test, root@localhost) set "
    "TIDINGS_MAIL_ALLOW_TEST_DOMAINS=1 or App(mail_allow_test_domains=True)"
)


def allow_test_domains(on: bool = True) -> None:
    """Accept ``*.test`` and ``localhost`` recipients in this process (the App setting
    ``mail_allow_test_domains`` / ``TIDINGS_MAIL_ALLOW_TEST_DOMAINS`` calls this)."""
    global _ALLOWED_BY_APP
    _ALLOWED_BY_APP = on
    _validated_email.cache_clear()


def _test_domains_default() -> bool:
    if _ALLOWED_BY_APP:
        return True
    return any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in (_TEST_DOMAINS_ENV, "TIDINGS_MAIL_ALLOW_TEST_DOMAINS")
    )


def _forbidden_char(value: str) -> str | None:
    """Return a description of the first control, separator or surrogate char, if any."""
    if value.isascii() and value.isprintable():  # U+0020..U+007E: nothing to find
        return None
    for ch in value:
        category = unicodedata.category(ch)
        if ch == "\t":
            continue
        if category in ("Cc", "Cs", "Zl", "Zp") or ch in "\u2028\u2029\ufeff":
            if category == "Cs":
                return "an unpaired surrogate"
            return f"control character U+{ord(ch):04X}"
    return None


def validate_header(value: str, field: str) -> str:
    """Check a header value carries no CR, LF, NUL, other control chars or surrogates.

    Args:
        value: the header value (subject, tag, attachment name ...).
        field: name reported in the error.

    Returns:
        The value, unchanged.

    Raises:
        ValidationError: the value is not a string or contains a forbidden character.
    """
    if not isinstance(value, str):
        raise ValidationError(f"expected a string, got {type(value).__name__}", field=field)
    problem = _forbidden_char(value)
    if problem is not None:
        raise ValidationError(f"header value contains {problem}", field=field)
    return value


def validate_header_name(name: str, field: str = "header") -> str:
    """Check a header field name is 1-76 printable ASCII characters without a colon.

    Raises:
        ValidationError: the name is empty, too long or has a forbidden character.
    """
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ValidationError("invalid header name", field=field)
    return name


def _is_homoglyph_label(label: str) -> bool:
    if label.isascii():
        return False
    scripts = set()
    for ch in label:
        if ch.isascii():
            if ch.isalpha():
                scripts.add("LATIN")
            continue
        scripts.add(unicodedata.name(ch, "UNKNOWN").split(" ", 1)[0])
    if len(scripts) > 1:
        return True
    letters = [ch for ch in label if ch.isalpha()]
    return bool(letters) and all(ch in _LATIN_LOOKALIKES for ch in letters)


def _precheck_address(addr: object, field: str) -> str:
    if not isinstance(addr, str):
        raise ValidationError(f"expected a string, got {type(addr).__name__}", field=field)
    problem = _forbidden_char(addr)
    if problem is not None:
        raise ValidationError(f"address contains {problem}", field=field)
    if len(addr) > 254:
        raise ValidationError("address is longer than 254 characters", field=field)
    return addr


def validate_email(addr: str, field: str, *, allow_test_domains: bool | None = None) -> str:
    """Validate one bare recipient address (``local@domain.tld``).

    Args:
        addr: the address; display names and lists are not accepted.
        field: name reported in the error (``to``, ``cc``, ``reply_to`` ...).
        allow_test_domains: accept special-use ``*.test`` domains; ``None`` reads
            ``TIDINGS_EMAIL_TEST_DOMAINS``.

    Returns:
        The normalized address, with an IDN domain in its ASCII (punycode) form so
        the SMTP envelope needs no SMTPUTF8 when the local part is ASCII.

    Raises:
        ValidationError: the address is malformed, undeliverable or looks like an
            injection attempt.
    """
    if not isinstance(addr, str):
        raise ValidationError(f"expected a string, got {type(addr).__name__}", field=field)
    test_env = _test_domains_default() if allow_test_domains is None else allow_test_domains
    return _validated_email(addr, field, test_env)


# A worker validates the same addresses over and over (the sender on every mail, each
# recipient when the mail is built and again when it is sent), and email-validator
# takes ~100 us per call: remember the addresses that passed. Refusals are not cached.
@functools.lru_cache(maxsize=4096)
def _validated_email(addr: str, field: str, test_env: bool) -> str:
    _precheck_address(addr, field)
    bad = sorted({ch for ch in addr if ch in _ADDRESS_SPECIALS or ch.isspace()})
    if bad:
        shown = " ".join(repr(ch) for ch in bad)
        raise ValidationError(f"address contains forbidden characters: {shown}", field=field)
    local, _, domain = addr.rpartition("@")
    if test_env and domain.lower() == "localhost" and local:
        # email-validator refuses a single-label domain outright; check the local part
        # against a stand-in domain and keep the address as written.
        _validated_email(f"{local}@localhost.test", field, True)
        return addr
    try:
        result = email_validator.validate_email(
            addr,
            check_deliverability=False,
            allow_display_name=False,
            allow_quoted_local=False,
            allow_domain_literal=False,
            test_environment=test_env,
            strict=True,  # also enforces the 64-octet local-part limit
        )
    except email_validator.EmailNotValidError as exc:
        text = str(exc)
        if not test_env and ("special-use" in text or "should have a period" in text):
            text = f"{text} ({TEST_DOMAINS_HINT})"
        raise ValidationError(text, field=field) from None
    for label in result.domain.split("."):
        if _is_homoglyph_label(label):
            raise ValidationError(
                "domain uses look-alike characters of another script", field=field
            )
    return result.ascii_email or result.normalized


def validate_sender(addr: str, field: str = "from") -> tuple[str, str]:
    """Validate a sender, which may carry a display name (``Acme <noreply@acme.io>``).

    Senders come from configuration, so a local host name (``tidings@localhost``,
    the default) is accepted as long as it is plain ASCII.

    Returns:
        ``(display_name, addr_spec)``; the display name may be empty.

    Raises:
        ValidationError: the sender is malformed or carries forbidden characters.
    """
    if not isinstance(addr, str):
        raise ValidationError(f"expected a string, got {type(addr).__name__}", field=field)
    return _validated_sender(addr, field)


# The configured sender is checked on every mail (when it is built and again when it
# is sent), and the default ``tidings@localhost`` fails email-validator (~70 us with
# the exception) before the plain-address fallback accepts it: remember the senders
# that passed. The check depends on nothing but its arguments; refusals are not cached.
@functools.lru_cache(maxsize=256)
def _validated_sender(addr: str, field: str) -> tuple[str, str]:
    _precheck_address(addr, field)
    name, spec = "", addr.strip()
    match = _SENDER_WITH_NAME.fullmatch(spec)
    if match is not None:
        name, spec = match["name"].strip().strip('"').strip(), match["addr"].strip()
        if any(ch in '<>"\\' for ch in name):
            raise ValidationError("display name contains forbidden characters", field=field)
    try:
        return name, validate_email(spec, field, allow_test_domains=True)
    except ValidationError:
        if _PLAIN_ADDRESS.fullmatch(spec) and len(spec.split("@", 1)[0]) <= 64:
            return name, spec
        raise


def validate_e164(number: str, field: str = "to") -> str:
    """Check a phone number is E.164: ``+``, a non-zero digit, 7-15 digits in all.

    Raises:
        ValidationError: the number is not in E.164 form.
    """
    if not isinstance(number, str) or not _E164.fullmatch(number):
        raise ValidationError("phone number must be E.164, like +15551234567", field=field)
    return number


def validate_delivery_id(delivery_id: str, field: str = "delivery_id") -> str:
    """Check a delivery id is 1-128 of ``[A-Za-z0-9._-]``, not starting with a dot or dash.

    The id becomes a Message-ID, a file name, an HTTP header and a provider's
    idempotency key, so it must be safe in all four.

    Raises:
        ValidationError: the id has any other character.
    """
    if not isinstance(delivery_id, str) or not _DELIVERY_ID.fullmatch(delivery_id):
        raise ValidationError("delivery id must be 1-128 of [A-Za-z0-9._-]", field=field)
    return delivery_id
