"""MkDocs hook: fills generated sections from the code at build time.

``<!-- tidings:config-reference -->`` in a page becomes the settings table of
:func:`tidings.config_reference.markdown_table` (read from ``tidings.config.Settings``).
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- tidings:config-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from tidings.config_reference import BEGIN, markdown_table, render_page

    if BEGIN in markdown:  # docs/configuration.md: the committed table, regenerated
        return render_page(markdown)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, markdown_table())
