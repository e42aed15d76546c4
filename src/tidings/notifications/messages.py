"""The messages a notification's ``to_<channel>`` returns: one type per channel.

:class:`MailMessage` is Laravel's fluent builder; :meth:`MailMessage.render` turns it
into a :class:`RenderedMail` (subject, HTML, text) and :meth:`MailMessage.to_email`
goes on to the MIME ``EmailMessage`` a transport sends. :class:`SmsMessage` and
:class:`WebhookMessage` are plain values; :class:`Attachment` is a file a mail carries.

Rendering (the jinja2 environment and the rules that keep user data inert) lives in
:mod:`tidings.notifications.templating`, and MIME assembly in
:mod:`tidings.notifications.mime`; their public names are re-exported here, so
``from tidings.notifications.messages import build_email`` keeps working.

The dataclasses here may travel inside queued payloads, which name them
``tidings.notifications.messages:QualName``: they stay defined in this module.
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Literal, Self

import jinja2

from tidings.errors import ValidationError
from tidings.notifications.mime import addresses, build_email, message_id_for
from tidings.notifications.templating import (
    HTML_LAYOUT,
    TEXT_LAYOUT,
    TemplateRenderError,
    default_environment,
    make_environment,
    render_template,
    template_exists,
)
from tidings.notifications.templating import html_to_text as html_to_text
from tidings.notifications.validation import validate_header, validate_sender

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

Level = Literal["info", "success", "error"]

_LEVEL_COLORS = {"info": "#2563eb", "success": "#16a34a", "error": "#dc2626"}
_MIME_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*")
_URL_SCHEMES = ("http://", "https://", "mailto:")
MAX_ATTACHMENT_BYTES = 25 * 1024 * 1024


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
            _check_size(len(self.content))
            return self.content
        try:
            if self.content.stat().st_size > MAX_ATTACHMENT_BYTES:
                raise ValidationError("attachment is larger than 25 MiB", field="attachment")
            return self.content.read_bytes()
        except OSError as exc:
            msg = f"cannot read {self.name}: {exc.strerror}"
            raise ValidationError(msg, field="attachment") from None


def _check_size(size: int) -> None:
    if size > MAX_ATTACHMENT_BYTES:
        raise ValidationError(
            f"attachment is larger than 25 MiB ({size} bytes)", field="attachment"
        )


@dataclass(frozen=True, slots=True)
class SmsMessage:
    """A text message; ``sender`` overrides the transport's configured ``from``."""

    content: str
    sender: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class WebhookMessage:
    """A webhook payload; ``type`` names the event, ``url`` overrides the route.

    ``secret`` (a ``whsec_…`` key) signs this delivery instead of the route's or the
    app's ``TIDINGS_WEBHOOK_SECRET``: give each receiver its own secret, so
    one tenant's secret cannot forge deliveries another tenant's receiver accepts.
    """

    data: dict[str, Any]
    type: str | None = field(default=None, kw_only=True)
    url: str | None = field(default=None, kw_only=True)
    secret: str | None = field(default=None, kw_only=True, repr=False)


@dataclass(frozen=True, slots=True)
class WebhookEndpoint:
    """A webhook route with its own signing secret, as Stripe and Svix give each endpoint.

    Return it from ``route_notification_for_webhook`` (resolved in the worker, so the
    secret never enters Redis), or pass it to ``route("webhook", ...)`` (then it travels
    in the signed job payload, readable by whoever can read Redis)::

        def route_notification_for_webhook(self, notification):
            return WebhookEndpoint(self.webhook_url, secret=self.webhook_secret)
    """

    url: str
    secret: str | None = field(default=None, kw_only=True, repr=False)


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
            # The same limit as files, checked when attached: at dispatch.
            _check_size(len(file))
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
        self.cc_addresses += addresses(address, "cc")
        return self

    def bcc(self, address: str | Iterable[str]) -> Self:
        """Add blind carbon-copy recipients (never shown in the sent headers)."""
        self.bcc_addresses += addresses(address, "bcc")
        return self

    def reply_to(self, address: str | Iterable[str]) -> Self:
        """Add Reply-To addresses."""
        self.reply_to_addresses += addresses(address, "reply_to")
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
        env = env or default_environment()
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
            html = render_template(env, HTML_LAYOUT, context)
            text = render_template(env, TEXT_LAYOUT, context)
            return RenderedMail(subject, html, text)
        context.update(self.context)
        html = render_template(env, self.template, context)
        text_name = self.text_template
        if text_name is None and ".html" in self.template:
            sibling = self.template.replace(".html", ".txt")
            text_name = sibling if template_exists(env, sibling) else None
        text = render_template(env, text_name, context) if text_name else html_to_text(html)
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
