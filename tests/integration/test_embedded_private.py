"""The embedded default's data is readable by its owner only."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import redis

from tidings.ops.embedded import embedded_key, ensure_embedded


def test_embedded_directory_and_data_files_are_private(tmp_path: Path) -> None:
    home = tmp_path / ".tidings"
    url = ensure_embedded(home)
    pid_file = home / "redis.pid"
    try:
        embedded_key(home)
        client = redis.Redis.from_url(url)
        client.rpush("queued", "ada@example.org +15551234567")
        client.close()
        deadline = time.monotonic() + 5
        while not list(home.rglob("*.aof")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        files = [p for p in home.rglob("*") if p.is_file()]
        assert any(p.suffix == ".aof" for p in files), files
        for path in [*files, *(p for p in home.rglob("*") if p.is_dir())]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path.name} is {oct(mode)}"
    finally:
        deadline = time.monotonic() + 5
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_file.exists():
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            while time.monotonic() < deadline + 5:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
