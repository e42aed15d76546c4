"""The one registry of Lua scripts: every atomic move, each loaded once from ``lua/*.lua``.

Every module takes its scripts from here (``scripts.POP``, ``scripts.LOCK``): a script
is declared once, so its file is read and hashed once per process, and the list below is
the state machine at a glance. Each ``.lua`` file opens with its KEYS/ARGV and reply.

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

    def __init__(self, name: str, uses: tuple[str, ...] = ()) -> None:
        self.name = name
        lua = resources.files("tidings.redis").joinpath("lua")
        # ``uses``: shared parts (lua/lib/<part>.lua) prepended, so a piece of bookkeeping
        # several scripts need is written once.
        parts = [lua.joinpath(f"lib/{part}.lua").read_text() for part in uses]
        self.source = "".join([*parts, lua.joinpath(f"{name}.lua").read_text()])
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


_REGISTRY: dict[str, LuaScript] = {}


def _declare(name: str, uses: tuple[str, ...] = ()) -> LuaScript:
    if name in _REGISTRY:
        raise RuntimeError(f"Lua script {name!r} declared twice")
    script = _REGISTRY[name] = LuaScript(name, uses)
    return script


def registered() -> dict[str, LuaScript]:
    """Every declared script by name (tests check it against ``lua/``)."""
    return dict(_REGISTRY)


# -- a job's life on its queue (tidings.moves) --------------------------------------------
PUSH = _declare("push")
PUSH_PRIORITY = _declare("push_priority")
PUSH_GROUP = _declare("push_group")
LATER = _declare("later")
PUSH_ONCE = _declare("push_once")
POP = _declare("pop", uses=("attempts_hashtable", "reserved_skiplist"))
ACK = _declare("ack", uses=("group_settled", "attempts_hashtable", "reserved_skiplist"))
RELEASE = _declare("release", uses=("reserved_skiplist",))
FAIL = _declare("fail", uses=("group_settled", "attempts_hashtable", "reserved_skiplist"))
EXTEND = _declare("extend")
PROGRESS = _declare("progress")
CANCEL_SETTLE = _declare(
    "cancel_settle", uses=("group_settled", "attempts_hashtable", "reserved_skiplist")
)
# -- the operator's commands on a queue and its failed store (tidings.moves.queues) ------
RETRY = _declare("retry", uses=("attempts_hashtable",))
FORGET = _declare("forget")
CLEAR = _declare("clear", uses=("attempts_hashtable",))
CANCEL = _declare("cancel")
GROUP_ADMIN = _declare("group_admin")
GROUP_CLEAR = _declare("group_clear", uses=("attempts_hashtable",))
# -- limits: rate limits, overlap locks and exception throttling (tidings.jobs.limits);
#    LOCK/UNLOCK also hold a schedule's lease and a unique job's lock ---------------------
RATE_LIMIT = _declare("rate_limit")
LOCK = _declare("lock")
UNLOCK = _declare("unlock")
THROTTLE = _declare("throttle")
# -- unique and debounced jobs (tidings.workflows.unique) ---------------------------------
UNIQUE_PUSH = _declare("unique_push")
DEBOUNCE_PUSH = _declare("debounce_push", uses=("attempts_hashtable",))
# -- batches (tidings.workflows.batch, batch_admin) ---------------------------------------
BATCH_CREATE = _declare("batch_create")
BATCH_ADD = _declare("batch_add")
BATCH_RECORD = _declare("batch_record")
BATCH_CANCEL = _declare("batch_cancel")
BATCH_RETRY = _declare("batch_retry")
# -- broadcasting to browsers (tidings.broadcasting.publish) ------------------------------
BROADCAST_PUBLISH = _declare("broadcast_publish")
# -- notification delivery rules (tidings.notifications.rules): once_per and digests -------
NOTIFY_ONCE_PER = _declare("notify_once_per")
DIGEST_ADD = _declare("digest_add")
DIGEST_CLAIM = _declare("digest_claim")
# -- Django's Tasks API (tidings.contrib.django.tasks): a task's record of failures -------
DJTASK_RECORD = _declare("djtask_record")
# -- worker pools across hosts: reports, the leader lease, the plan (tidings.pools) -----
POOLS_REPORT = _declare("pools_report")
POOLS_LEAD = _declare("pools_lead")
POOLS_PLAN = _declare("pools_plan")
