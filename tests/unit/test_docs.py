"""The documentation site cannot rot: it builds with ``mkdocs build --strict`` (broken
links, missing pages and nav entries fail), the configuration reference covers every
``Settings`` field, and every exception class has its section in docs/errors.md."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tidings import config_reference, errors
from tidings.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_has_a_meaning_in_the_reference() -> None:
    assert config_reference.undocumented() == []
    names = [row[0] for row in config_reference.settings()]
    fields = [f.name for f in dataclasses.fields(Settings) if f.name not in {"embedded", "sources"}]
    assert names == fields
    table = config_reference.markdown_table()
    assert "`TIDINGS_MAIL_ALLOW_TEST_DOMAINS`" in table and "`'fail'`" in table


def test_the_configuration_page_holds_the_whole_generated_table() -> None:
    """docs/configuration.md is complete in the repository (not a placeholder filled at
    build time): every setting is in it, and it matches what the code generates."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert config_reference.render_page(page) == page, (
        "docs/configuration.md is stale: run python -m tidings.config_reference"
    )
    for name, variable, _, _ in config_reference.settings():
        assert f"| `{name}` | `{variable}` |" in page
    assert "notification_tries" in page and "TIDINGS_HOME" in page


def test_every_error_has_a_section_with_its_fix() -> None:
    text = (ROOT / "docs" / "errors.md").read_text()
    headings = set(re.findall(r"^#{2,3} (\w+)", text, flags=re.M))
    classes = {
        name
        for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.TidingsError) and obj is not errors.TidingsError
    }
    missing = sorted(classes - headings - {"TransientChannelError", "PermanentChannelError"})
    assert missing == [], f"docs/errors.md has no section for {missing}"
    assert "TransientChannelError" in text and "PermanentChannelError" in text


def test_the_readme_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "mkdocs serve" in readme and "docs/tutorials/django.md" in readme


@pytest.mark.skipif(
    shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
    reason="mkdocs is not installed (pip install -e '.[docs]')",
)
def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "mkdocs"),
            "build",
            "--strict",
            "-q",
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pages = sorted(
        p.relative_to(tmp_path / "site") for p in (tmp_path / "site").rglob("index.html")
    )
    assert len(pages) >= 13, pages
    reference = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "TIDINGS_MISSING_MODELS" in reference  # generated from the code at build time
