"""The Lua scripts have one registry: every ``lua/*.lua`` file is declared there once."""

from __future__ import annotations

import pathlib
import re

import pytest

import tidings
from tidings.redis import scripts

SRC = pathlib.Path(tidings.__file__).parent


def test_every_lua_file_is_declared_once_in_the_registry() -> None:
    files = {p.stem for p in (SRC / "redis" / "lua").glob("*.lua")}
    assert set(scripts.registered()) == files


def test_no_module_declares_a_script_of_its_own() -> None:
    declaring = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "scripts.py" and re.search(r"\bLuaScript\(", p.read_text())
    ]
    assert declaring == []


def test_a_second_declaration_is_refused() -> None:
    with pytest.raises(RuntimeError, match="declared twice"):
        scripts._declare("lock")
