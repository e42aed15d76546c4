"""Messages a notification's ``to_<channel>`` returns, and how mail is rendered and built.

:class:`MailMessage` is Laravel's fluent builder; :meth:`MailMessage.render` turns it
into a :class:`RenderedMail` (subject, HTML, text) with jinja2, and
:func:`build_email` wraps that into a MIME ``EmailMessage`` ready for a transport.

Rendering rules (they are what keeps user data inert):

* Everything a message carries (subject, lines, action, ``view`` context) is passed
  to templates as *context*; nothing a user supplies is ever compiled as a template,
  so ``{{ 7*7 }}`` in a line stays literal.
* :func:`make_environment` turns autoescaping on for HTML templates (``<script>`` is
  escaped in the HTML part, literal in the text part) and uses ``StrictUndefined``.
* Any jinja2 failure (syntax error, undefined variable, missing template, exception
  in a filter) becomes :class:`TemplateRenderError`, naming the template and line.
* The default layout is ``mail.html.j2`` / ``mail.txt.j2``; an app overrides it by
  putting same-named files in its ``templates_dir`` (searched first), and may extend
  the original as ``tidings/mail.html.j2``.
"""

from __future__ import annotations

import functools
import mimetypes
import os
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Literal, Self

import jinja2

from tidings import _clock
from tidings.errors import TemplateError, ValidationError
from tidings.notifications.validation import (
    validate_delivery_id,
    validate_email,
    validate_header,
    validate_sender,
)

__all__ = [
    "HTML_LAYOUT",
    "TEXT_LAYOUT",
    "Attachment",
    "MailMessage",
    "RenderedMail",
    "SmsMessage",
    "TemplateRenderError",
    "WebhookMessage",
    "build_email",
    "make_environment",
    "message_id_for",
]

HTML_LAYOUT = "mail.html.j2"
TEXT_LAYOUT = "mail.txt.j2"
Level = Literal["info", "success", "error"]

_PACKAGE_TEMPLATES = Path(__file__).parent / "templates"
_LEVEL_COLORS = {"info": "#2563eb", "success": "#16a34a", "error": "#dc2626"}
_MIME_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*")
_URL_SCHEMES = ("http://", "https://", "mailto:")
MAX_ATTACHMENT_BYTES = 25 * 1024 * 1024


class TemplateRenderError(TemplateError):
    """A mail template failed; ``template`` and ``lineno`` say where (when known)."""

    def __init__(self, message: str, *, template: str, lineno: int | None = None) -> None:
        self.template = template
        self.lineno = lineno
        where = f"{template}, line {lineno}" if lineno else template
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class RenderedMail:
    """A rendered mail: the subject and both bodies."""

    subject: str
    html: str
    text: str


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file to attach: bytes in memory or a path read when the email is built."""

    content: bytes | Path
    name: str
    mime: str

    def data(self) -> bytes:
        """Return the attachment's bytes.

        Raises:
            ValidationError: the file is gone or too large.
        """
        if isinstance(self.content, bytes):
            return self.content
        try:
            if self.content.stat().st_size > MAX_ATTACHMENT_BYTES:
                raise ValidationError("attachment is larger than 25 MiB", field="attachment")
            return self.content.read_bytes()
        except OSError as exc:
            msg = f"cannot read {self.name}: {exc.strerror}"
            raise ValidationError(msg, field="attachment") from None


@dataclass(frozen=True, slots=True)
class SmsMessage:
    """A text message; ``sender`` overrides the transport's configured ``from``."""

    content: str
    sender: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class WebhookMessage:
    """A webhook payload; ``type`` names the event, ``url`` overrides the route."""

    data: dict[str, Any]
    type: str | None = field(default=None, kw_only=True)
    url: str | None = field(default=None, kw_only=True)


def make_environment(
    templates_dir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
) -> jinja2.Environment:
    """Build the jinja2 environment mail is rendered with.

    Args:
        templates_dir: the app's template folder(s), searched before the package's
            own templates so an app can override ``mail.html.j2``/``mail.txt.j2``.

    Returns:
        An environment with autoescaping on except for ``.txt``/``.text`` templates
        and ``StrictUndefined``.
    """
    package = jinja2.FileSystemLoader(str(_PACKAGE_TEMPLATES))
    loaders: list[jinja2.BaseLoader] = []
    if templates_dir is not None:
        loaders.append(jinja2.FileSystemLoader(templates_dir))
    loaders += [package, jinja2.PrefixLoader({"tidings": package})]
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=jinja2.select_autoescape(
            enabled_extensions=("html", "htm", "xml", "html.j2", "htm.j2", "xml.j2"),
            disabled_extensions=("txt", "text", "txt.j2", "text.j2"),
            default_for_string=True,
            default=True,  # escaping what should not be is visible; the reverse is XSS
        ),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


@functools.cache
def _default_environment() -> jinja2.Environment:
    return make_environment()


def _locate(exc: BaseException) -> tuple[str | None, int | None]:
    """Find the innermost template frame in a traceback jinja2 rewrote."""
    where: tuple[str | None, int | None] = (None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        if not frame.filename.endswith(".py") and not frame.filename.startswith("<"):
            where = (frame.filename, frame.lineno)
    return where


def _render(env: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    try:
        return env.get_template(name).render(context)
    except jinja2.TemplateNotFound as exc:
        missing = exc.name if isinstance(exc.name, str) else name
        detail = "" if missing == name else f" (included from {name})"
        raise TemplateRenderError(f"template not found: {missing}{detail}", template=name) from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateRenderError(
            f"syntax error: {exc.message}", template=exc.name or name, lineno=exc.lineno
        ) from exc
    except Exception as exc:
        filename, lineno = _locate(exc)
        template = name
        if filename is not None and not filename.endswith(name):
            template = filename
        reason = f"{type(exc).__name__}: {exc}"
        raise TemplateRenderError(reason, template=template, lineno=lineno) from exc


def _template_exists(env: jinja2.Environment, name: str) -> bool:
    try:
        env.get_template(name)
    except jinja2.TemplateNotFound:
        return False
    except jinja2.TemplateError:
        return True  # it exists; rendering will report the problem with its line
    return True


class _TextExtractor(HTMLParser):
    """Plain text from HTML, for custom views that ship no text template."""

    _BLOCKS = frozenset({"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "table"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "head"):
            self._skip += 1
        elif tag == "a":
            self._href = dict(attrs).get("href")
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head"):
            self._skip = max(0, self._skip - 1)
        elif tag == "a" and self._href:
            self.parts.append(f" ({self._href})")
            self._href = None
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Reduce an HTML body to readable plain text."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _addresses(value: str | Iterable[str], field_name: str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    return [validate_email(item, field_name) for item in items]


class MailMessage:
    """Fluent builder for a notification email; every method returns the message.

    Lines added before :meth:`action` are intro lines, lines after it outro lines,
    as in Laravel. Attributes are public so fakes and tests can inspect them.
    """

    def __init__(self) -> None:
        """Start an empty message at level ``info``."""
        self.subject_text: str | None = None
        self.greeting_text: str | None = None
        self.salutation_text: str | None = None
        self.level_name: Level = "info"
        self.intro_lines: list[str] = []
        self.outro_lines: list[str] = []
        self.action_text: str | None = None
        self.action_url: str | None = None
        self.template: str | None = None
        self.text_template: str | None = None
        self.context: dict[str, Any] = {}
        self.attachments: list[Attachment] = []
        self.cc_addresses: list[str] = []
        self.bcc_addresses: list[str] = []
        self.reply_to_addresses: list[str] = []
        self.tags: list[str] = []
        self.from_address: str | None = None

    def subject(self, subject: str) -> Self:
        """Set the subject line."""
        self.subject_text = validate_header(subject, "subject")
        return self

    def greeting(self, greeting: str) -> Self:
        """Set the greeting (default ``Hello!``, or ``Whoops!`` at level error)."""
        self.greeting_text = str(greeting)
        return self

    def line(self, text: str) -> Self:
        """Add a paragraph, before the action button if none was set yet, else after."""
        (self.outro_lines if self.action_text is not None else self.intro_lines).append(str(text))
        return self

    def action(self, text: str, url: str) -> Self:
        """Add the call-to-action button.

        Raises:
            ValidationError: the URL is not http(s) or mailto, or has control chars.
        """
        validate_header(url, "action.url")
        if not url.lower().startswith(_URL_SCHEMES) or any(c.isspace() for c in url):
            raise ValidationError("action URL must be http(s) or mailto", field="action.url")
        self.action_text, self.action_url = str(text), url
        return self

    def salutation(self, salutation: str) -> Self:
        """Set the closing (default ``Regards`` and the app name)."""
        self.salutation_text = str(salutation)
        return self

    def level(self, level: Level) -> Self:
        """Set ``info``, ``success`` or ``error``; it colours the button."""
        if level not in _LEVEL_COLORS:
            raise ValidationError("level must be info, success or error", field="level")
        self.level_name = level
        return self

    def view(self, template: str, /, text_template: str | None = None, **context: Any) -> Self:
        """Render a template of the app's instead of the default layout.

        Args:
            template: the HTML template's name.
            text_template: the text part's template; defaults to the HTML name with
                ``.html`` replaced by ``.txt`` when that exists, else text derived
                from the HTML.
            **context: variables for the template.
        """
        self.template, self.text_template, self.context = template, text_template, context
        return self

    def attach(
        self, file: str | os.PathLike[str] | bytes, name: str | None = None, mime: str | None = None
    ) -> Self:
        """Attach a file by path or raw bytes.

        Raises:
            ValidationError: the path is not a file, or the name or type is invalid.
        """
        content: bytes | Path
        if isinstance(file, bytes | bytearray):
            content, default_name = bytes(file), "attachment"
        else:
            content = Path(file)
            if not content.is_file():
                raise ValidationError(f"no such file: {content.name}", field="attachment")
            default_name = content.name
        name = validate_header(name or default_name, "attachment.name")
        mime = mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
        if not _MIME_TYPE.fullmatch(mime):
            raise ValidationError("MIME type must look like type/subtype", field="attachment.mime")
        self.attachments.append(Attachment(content, name, mime))
        return self

    def cc(self, address: str | Iterable[str]) -> Self:
        """Add carbon-copy recipients."""
        self.cc_addresses += _addresses(address, "cc")
        return self

    def bcc(self, address: str | Iterable[str]) -> Self:
        """Add blind carbon-copy recipients (never shown in the sent headers)."""
        self.bcc_addresses += _addresses(address, "bcc")
        return self

    def reply_to(self, address: str | Iterable[str]) -> Self:
        """Add Reply-To addresses."""
        self.reply_to_addresses += _addresses(address, "reply_to")
        return self

    def tag(self, tag: str) -> Self:
        """Add a tag, sent as an ``X-Tag`` header (providers use it for analytics)."""
        self.tags.append(validate_header(tag, "tag"))
        return self

    def from_(self, address: str) -> Self:
        """Override the configured sender (``Name <addr>`` allowed)."""
        validate_sender(address)
        self.from_address = address
        return self

    def render(
        self, env: jinja2.Environment | None = None, *, app_name: str | None = None
    ) -> RenderedMail:
        """Render the subject, HTML and text parts.

        Args:
            env: from :func:`make_environment`; defaults to the package templates only.
            app_name: shown in the default salutation.

        Raises:
            TemplateRenderError: a template is missing or failed to render.
        """
        env = env or _default_environment()
        subject = self.subject_text or "Notification"
        action = None
        if self.action_text is not None:
            color = _LEVEL_COLORS[self.level_name]
            action = {"text": self.action_text, "url": self.action_url, "color": color}
        default_greeting = "Whoops!" if self.level_name == "error" else "Hello!"
        default_salutation = f"Regards,\n{app_name}" if app_name else "Regards"
        context: dict[str, Any] = {
            "subject": subject,
            "level": self.level_name,
            "greeting": self.greeting_text if self.greeting_text is not None else default_greeting,
            "intro_lines": list(self.intro_lines),
            "outro_lines": list(self.outro_lines),
            "action": action,
            "salutation": self.salutation_text
            if self.salutation_text is not None
            else default_salutation,
            "app_name": app_name,
        }
        if self.template is None:
            html = _render(env, HTML_LAYOUT, context)
            text = _render(env, TEXT_LAYOUT, context)
            return RenderedMail(subject, html, text)
        context.update(self.context)
        html = _render(env, self.template, context)
        text_name = self.text_template
        if text_name is None and ".html" in self.template:
            sibling = self.template.replace(".html", ".txt")
            text_name = sibling if _template_exists(env, sibling) else None
        text = _render(env, text_name, context) if text_name else html_to_text(html)
        return RenderedMail(subject, html, text)

    def to_email(
        self,
        *,
        to: str | Iterable[str],
        mail_from: str,
        delivery_id: str,
        env: jinja2.Environment | None = None,
        app_name: str | None = None,
    ) -> EmailMessage:
        """Render and build the MIME message in one step (``from_`` beats ``mail_from``)."""
        return build_email(
            self.render(env, app_name=app_name),
            to=to,
            mail_from=self.from_address or mail_from,
            message_id=delivery_id,
            cc=self.cc_addresses,
            bcc=self.bcc_addresses,
            reply_to=self.reply_to_addresses,
            tags=self.tags,
            attachments=self.attachments,
        )


def message_id_for(delivery_id: str) -> str:
    """The ``Message-ID`` for a delivery: ``<{delivery_id}@tidings>``, same on every retry.

    Raises:
        ValidationError: the id has characters other than letters, digits, ``._-``.
    """
    return f"<{validate_delivery_id(delivery_id, 'message_id')}@tidings>"


def build_email(
    rendered: RenderedMail,
    *,
    to: str | Iterable[str],
    mail_from: str,
    message_id: str,
    cc: Iterable[str] = (),
    bcc: Iterable[str] = (),
    reply_to: Iterable[str] = (),
    tags: Iterable[str] = (),
    attachments: Iterable[Attachment] = (),
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
    recipients = _addresses(to, "to")
    if not recipients:
        raise ValidationError("at least one recipient is required", field="to")
    name, sender = validate_sender(mail_from)
    msg = EmailMessage()
    msg["Subject"] = validate_header(rendered.subject, "subject")
    msg["From"] = Address(display_name=validate_header(name, "from"), addr_spec=sender)
    msg["To"] = [Address(addr_spec=addr) for addr in recipients]
    for header, values, field_name in (("Cc", cc, "cc"), ("Bcc", bcc, "bcc")):
        checked = _addresses(values, field_name)
        if checked:
            msg[header] = [Address(addr_spec=addr) for addr in checked]
    replies = _addresses(reply_to, "reply_to")
    if replies:
        msg["Reply-To"] = [Address(addr_spec=addr) for addr in replies]
    msg["Date"] = format_datetime(datetime.fromtimestamp(_clock.now(), UTC))
    msg["Message-ID"] = message_id_for(message_id)
    for tag in tags:
        msg["X-Tag"] = validate_header(tag, "tag")
    msg.set_content(rendered.text)
    msg.add_alternative(rendered.html, subtype="html")
    for attachment in attachments:
        maintype, subtype = attachment.mime.split("/", 1)
        msg.add_attachment(
            attachment.data(),
            maintype=maintype,
            subtype=subtype,
            filename=validate_header(attachment.name, "attachment.name"),
        )
    return msg
