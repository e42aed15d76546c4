"""The Lua scripts, one per atomic move, loaded from ``lua/*.lua``.

Each script is sent by SHA (``EVALSHA``) and falls back to ``EVAL`` when the server does
not know it (a fresh or restarted Redis), which also caches it again.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

Arg = str | bytes | int | float


class LuaScript:
    """One Lua script, callable on a sync or an asyncio redis-py client."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = resources.files("tidings.redis").joinpath(f"lua/{name}.lua").read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def call(self, client: redis.Redis, keys: list[str], args: list[Arg]) -> Any:
        """Run the script with a sync client."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)

    async def acall(self, client: redis.asyncio.Redis, keys: list[str], args: list[Arg]) -> Any:
        """Run the script with an asyncio client."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


PUSH = LuaScript("push")
LATER = LuaScript("later")
POP = LuaScript("pop")
ACK = LuaScript("ack")
RELEASE = LuaScript("release")
FAIL = LuaScript("fail")
RETRY = LuaScript("retry")
EXTEND = LuaScript("extend")
FORGET = LuaScript("forget")
CLEAR = LuaScript("clear")
