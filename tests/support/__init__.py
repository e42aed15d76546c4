"""Test harness: real redis-server processes, a TCP fault proxy, subprocess helpers.

Import from here in tests (``from tests.support import RedisServer, FaultProxy, wait_for``).
Nothing in this package imports tidings, so it works while the library is half-written.
"""

from .procs import Proc, free_port, kill_pid, live_procs, python_cmd, spawn, wait_for
from .proxy import FaultProxy, ProxyMode
from .redis_server import RedisServer, RedisServerError, TlsFiles, find_redis_server

__all__ = [
    "FaultProxy",
    "Proc",
    "ProxyMode",
    "RedisServer",
    "RedisServerError",
    "TlsFiles",
    "find_redis_server",
    "free_port",
    "kill_pid",
    "live_procs",
    "python_cmd",
    "spawn",
    "wait_for",
]
