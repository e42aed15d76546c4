"""MailMessage building and rendering, build_email, Sms/WebhookMessage (RELIABILITY B9, B10)."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path
from typing import Any

import jinja2
import pytest

from tidings.errors import TemplateError, ValidationError
from tidings.notifications.messages import (
    MailMessage,
    RenderedMail,
    SmsMessage,
    TemplateRenderError,
    WebhookMessage,
    build_email,
    make_environment,
    message_id_for,
)

INJECTION = ["{{ 7*7 }}", "{{ ''.__class__.__mro__ }}", "<script>alert(1)</script>", "{% raw %}"]


def invoice() -> MailMessage:
    return (
        MailMessage()
        .subject("Invoice paid")
        .greeting("Hi Ada,")
        .line("Your invoice was paid.")
        .action("View invoice", "https://example.org/invoices/1?a=1&b=2")
        .line("Thanks for your business.")
        .salutation("Cheers,\nAcme")
    )


def test_fluent_methods_return_the_message() -> None:
    message = MailMessage()
    assert message.subject("s") is message
    assert message.line("x").greeting("g").salutation("s").level("success") is message
    assert message.cc("c@example.org").bcc("b@example.org").reply_to("r@example.org") is message
    assert message.tag("t").from_("Acme <a@example.org>").attach(b"x", name="x.txt") is message
    assert message.action("Go", "https://example.org").view("v.html.j2", a=1) is message


def test_lines_before_and_after_action() -> None:
    message = invoice()
    assert message.intro_lines == ["Your invoice was paid."]
    assert message.outro_lines == ["Thanks for your business."]


def test_default_layout_renders_both_parts() -> None:
    rendered = invoice().render(app_name="Acme")
    assert rendered.subject == "Invoice paid"
    assert "<h1>Hi Ada,</h1>" in rendered.html
    assert 'href="https://example.org/invoices/1?a=1&amp;b=2"' in rendered.html
    assert "View invoice: https://example.org/invoices/1?a=1&b=2" in rendered.text
    assert rendered.text.index("Your invoice") < rendered.text.index("Thanks for")
    assert "Cheers,\nAcme" in rendered.text


def test_defaults_follow_laravel() -> None:
    rendered = MailMessage().line("x").render(app_name="Acme")
    assert rendered.subject == "Notification"
    assert "Hello!" in rendered.text and "Regards,\nAcme" in rendered.text
    assert "Whoops!" in MailMessage().level("error").render().text


def test_level_colours_the_button() -> None:
    html = MailMessage().level("error").action("Fix", "https://example.org").render().html
    assert "#dc2626" in html
    with pytest.raises(ValidationError):
        MailMessage().level("panic")  # type: ignore[arg-type]


@pytest.mark.parametrize("data", INJECTION)
def test_data_is_never_compiled_as_a_template(data: str) -> None:
    message = MailMessage().subject(data).greeting(data).line(data).action(data, "https://e.org")
    rendered = message.line(data).salutation(data).render()
    assert "49" not in rendered.html and "49" not in rendered.text
    assert "<class" not in rendered.html and "&lt;class" not in rendered.html
    assert data in rendered.text  # the text part shows data exactly as given
    if "<" in data:
        assert "<script>" not in rendered.html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered.html
    else:
        assert data.replace("'", "&#39;") in rendered.html


@pytest.mark.parametrize("url", ["javascript:alert(1)", "data:text/html,x", "https://e.org/\nx"])
def test_action_url_must_be_http_or_mailto(url: str) -> None:
    with pytest.raises(ValidationError) as info:
        MailMessage().action("Go", url)
    assert info.value.field == "action.url"


def test_subject_with_crlf_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"^subject: "):
        MailMessage().subject("Hi\r\nBcc: victim@example.org")


@pytest.mark.parametrize("method", ["cc", "bcc", "reply_to"])
def test_bad_addresses_are_refused_when_added(method: str) -> None:
    with pytest.raises(ValidationError) as info:
        getattr(MailMessage(), method)("alice@example.org)<bob@example.org>")
    assert info.value.field == method


def test_app_templates_override_the_layout(tmp_path: Path) -> None:
    (tmp_path / "mail.html.j2").write_text(
        "<b>{{ subject }}</b>{% for l in intro_lines %}{{ l }}{% endfor %}"
    )
    (tmp_path / "mail.txt.j2").write_text("TEXT {{ subject }}")
    env = make_environment(tmp_path)
    rendered = MailMessage().subject("S & co").line("<i>").render(env)
    assert rendered.html == "<b>S &amp; co</b>&lt;i&gt;"
    assert rendered.text == "TEXT S & co"


def test_override_can_extend_the_packaged_layout(tmp_path: Path) -> None:
    (tmp_path / "mail.html.j2").write_text(
        '{% extends "tidings/mail.html.j2" %}{% block greeting %}<h2>Custom</h2>{% endblock %}'
    )
    html = MailMessage().line("body").render(make_environment(tmp_path)).html
    assert "<h2>Custom</h2>" in html and "<p>body</p>" in html


def test_custom_view_with_sibling_text_template(tmp_path: Path) -> None:
    (tmp_path / "welcome.html.j2").write_text("<p>Hi {{ name }}</p>")
    (tmp_path / "welcome.txt.j2").write_text("Hi {{ name }}")
    message = MailMessage().subject("Welcome").view("welcome.html.j2", name="<Ada>")
    rendered = message.render(make_environment(tmp_path))
    assert rendered.html == "<p>Hi &lt;Ada&gt;</p>"
    assert rendered.text == "Hi <Ada>"


def test_custom_view_without_text_template_derives_text(tmp_path: Path) -> None:
    (tmp_path / "only.html.j2").write_text(
        "<style>p{}</style><p>Hi {{ name }}</p><p><a href='https://e.org'>Open</a></p>"
    )
    rendered = MailMessage().view("only.html.j2", name="Ada").render(make_environment(tmp_path))
    assert rendered.text == "Hi Ada\n\nOpen (https://e.org)\n"


def _error_for(tmp_path: Path, name: str, source: str, **context: Any) -> TemplateRenderError:
    (tmp_path / name).write_text(source)
    env = make_environment(tmp_path)
    env.filters["boom"] = lambda value: 1 / 0
    with pytest.raises(TemplateError) as info:
        MailMessage().view(name, **context).render(env)
    assert isinstance(info.value, TemplateRenderError)
    return info.value


def test_undefined_variable_names_template_and_line(tmp_path: Path) -> None:
    error = _error_for(tmp_path, "u.html.j2", "line one\n{{ missing }}\n")
    assert error.template == "u.html.j2" and error.lineno == 2
    assert "u.html.j2, line 2" in str(error) and "missing" in str(error)
    assert error.permanent


def test_syntax_error_names_template_and_line(tmp_path: Path) -> None:
    error = _error_for(tmp_path, "s.html.j2", "ok\nok\n{% if %}\n")
    assert error.template == "s.html.j2" and error.lineno == 3
    assert "syntax error" in str(error)


def test_missing_template(tmp_path: Path) -> None:
    with pytest.raises(TemplateRenderError, match=r"template not found: nope\.html\.j2"):
        MailMessage().view("nope.html.j2").render(make_environment(tmp_path))


def test_missing_included_template(tmp_path: Path) -> None:
    error = _error_for(tmp_path, "i.html.j2", '{% include "gone.html.j2" %}')
    assert "gone.html.j2" in str(error) and "i.html.j2" in str(error)


def test_exception_in_filter_names_template_and_line(tmp_path: Path) -> None:
    error = _error_for(tmp_path, "f.html.j2", "a\nb\n{{ x|boom }}\n", x=1)
    assert error.lineno == 3 and "ZeroDivisionError" in str(error)


def test_error_in_included_template_names_that_template(tmp_path: Path) -> None:
    (tmp_path / "inner.html.j2").write_text("\n\n{{ nothing_here }}")
    error = _error_for(tmp_path, "outer.html.j2", '{% include "inner.html.j2" %}')
    assert error.template.endswith("inner.html.j2") and error.lineno == 3


def test_environment_is_strict_and_autoescapes_by_name() -> None:
    env = make_environment()
    assert env.undefined is jinja2.StrictUndefined
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"


def rendered_mail() -> RenderedMail:
    return RenderedMail("Subject ü", "<p>html</p>", "text")


def test_build_email_structure() -> None:
    msg = build_email(
        rendered_mail(),
        to="a@example.org",
        mail_from="Acme <noreply@example.org>",
        message_id="01HZX-delivery.1",
        cc=["c@example.org"],
        bcc=["b@example.org"],
        reply_to=["r@example.org"],
        tags=["invoice", "paid"],
    )
    assert isinstance(msg, EmailMessage)
    assert msg.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in msg.iter_parts()] == ["text/plain", "text/html"]
    assert msg["Message-ID"] == "<01HZX-delivery.1@tidings>"
    assert msg.get_all("X-Tag") == ["invoice", "paid"]
    assert msg["From"] == "Acme <noreply@example.org>"
    assert (msg["Cc"], msg["Bcc"], msg["Reply-To"]) == (
        "c@example.org",
        "b@example.org",
        "r@example.org",
    )
    assert str(msg["Subject"]) == "Subject ü"
    assert msg["Date"]


def test_message_id_is_stable_per_delivery() -> None:
    first = build_email(
        rendered_mail(), to="a@example.org", mail_from="x@example.org", message_id="d1"
    )
    again = build_email(
        rendered_mail(), to="a@example.org", mail_from="x@example.org", message_id="d1"
    )
    assert first["Message-ID"] == again["Message-ID"] == message_id_for("d1")


@pytest.mark.parametrize("delivery_id", ["", "../etc/passwd", "a b", "a\r\nb", "x" * 129, "<x>"])
def test_bad_delivery_ids_are_refused(delivery_id: str) -> None:
    with pytest.raises(ValidationError):
        message_id_for(delivery_id)


def test_attachments(tmp_path: Path) -> None:
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.4 fake")
    message = invoice().attach(report).attach(b"a,b\n1,2\n", name="data.csv")
    message.attach(b"\x00\x01", name="blob", mime="application/x-custom")
    msg = message.to_email(to="a@example.org", mail_from="x@example.org", delivery_id="d2")
    assert msg.get_content_type() == "multipart/mixed"
    files = {p.get_filename(): p for p in msg.iter_attachments()}
    assert set(files) == {"report.pdf", "data.csv", "blob"}
    assert files["report.pdf"].get_content_type() == "application/pdf"
    assert files["report.pdf"].get_content() == b"%PDF-1.4 fake"
    assert files["data.csv"].get_content_type() == "text/csv"
    assert files["blob"].get_content_type() == "application/x-custom"
    body = msg.get_body(("html", "plain"))
    assert body is not None and body.get_content_type() == "text/html"


def test_attachment_errors(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        MailMessage().attach(tmp_path / "missing.pdf")
    with pytest.raises(ValidationError):
        MailMessage().attach(b"x", name="a\r\nb.txt")
    with pytest.raises(ValidationError):
        MailMessage().attach(b"x", name="a.txt", mime="not a mime")


def test_to_email_uses_message_fields() -> None:
    message = invoice().from_("Billing <billing@example.org>").cc("c@example.org").tag("t1")
    msg = message.to_email(
        to=["a@example.org", "b@example.org"], mail_from="x@example.org", delivery_id="d3"
    )
    assert msg["From"] == "Billing <billing@example.org>"
    assert msg["To"] == "a@example.org, b@example.org"
    assert msg["Cc"] == "c@example.org" and msg["X-Tag"] == "t1"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"to": "alice@example.org)<bob@example.org>"},
        {"to": []},
        {"to": "a@example.org", "mail_from": "x@example.org\nBcc: v@example.org"},
        {"to": "a@example.org", "tags": ["a\nb"]},
        {"to": "a@example.org", "bcc": ["user@localhost"]},
    ],
)
def test_build_email_validates_everything(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"mail_from": "x@example.org", "message_id": "d4", **kwargs}
    with pytest.raises(ValidationError):
        build_email(rendered_mail(), **args)  # type: ignore[arg-type]


def test_sms_and_webhook_messages() -> None:
    sms = SmsMessage("Your code is 123456", sender="Acme")
    assert (sms.content, sms.sender) == ("Your code is 123456", "Acme")
    assert SmsMessage("hi").sender is None
    hook = WebhookMessage({"invoice": 7}, type="invoice.paid", url="https://example.org/hook")
    assert (hook.data, hook.type, hook.url) == (
        {"invoice": 7},
        "invoice.paid",
        "https://example.org/hook",
    )
    assert WebhookMessage({}).type is None
    with pytest.raises(TypeError):
        SmsMessage("hi", "Acme")  # type: ignore[call-arg]
