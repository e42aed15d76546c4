"""Rendering mail templates with jinja2: the environment, safe rendering, error reports.

:meth:`~tidings.notifications.messages.MailMessage.render` renders through the
functions here; :mod:`tidings.notifications.messages` re-exports the public names.

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
* A custom view with no text template gets its text part from :func:`html_to_text`.
"""

from __future__ import annotations

import functools
import os
import re
import traceback
from collections.abc import Mapping, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jinja2

from tidings.errors import TemplateError

__all__ = [
    "HTML_LAYOUT",
    "TEXT_LAYOUT",
    "TemplateRenderError",
    "default_environment",
    "html_to_text",
    "make_environment",
    "render_template",
    "template_exists",
]

HTML_LAYOUT = "mail.html.j2"
TEXT_LAYOUT = "mail.txt.j2"

_PACKAGE_TEMPLATES = Path(__file__).parent / "templates"


class TemplateRenderError(TemplateError):
    """A mail template failed; ``template`` and ``lineno`` say where (when known)."""

    def __init__(self, message: str, *, template: str, lineno: int | None = None) -> None:
        self.template = template
        self.lineno = lineno
        where = f"{template}, line {lineno}" if lineno else template
        super().__init__(f"{where}: {message}")


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
def default_environment() -> jinja2.Environment:
    """The shared environment with the package templates only (built once)."""
    return make_environment()


def _locate(exc: BaseException) -> tuple[str | None, int | None]:
    """Find the innermost template frame in a traceback jinja2 rewrote."""
    where: tuple[str | None, int | None] = (None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        if not frame.filename.endswith(".py") and not frame.filename.startswith("<"):
            where = (frame.filename, frame.lineno)
    return where


def render_template(env: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    """Render template ``name`` with ``context``.

    Raises:
        TemplateRenderError: the template (or one it includes) is missing, has a
            syntax error, or failed while rendering.
    """
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


def template_exists(env: jinja2.Environment, name: str) -> bool:
    """Tell whether ``env`` can find template ``name`` (broken but present counts)."""
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
