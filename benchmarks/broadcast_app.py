"""The App of benchmarks/broadcast.py: its web processes and worker import it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tidings import App
from tidings.broadcasting import ShouldBroadcast

# The driver imports this module for Ping only: with no TIDINGS_REDIS_URL it gets a
# placeholder that never connects (App.from_env() would start an embedded Redis).
app = (
    App.from_env()
    if os.environ.get("TIDINGS_REDIS_URL")
    else App(env=False, redis_url="redis://127.0.0.1:9/0", key="placeholder-key-0123456789abcdef")
)
app.broadcasting.max_len = 10_000


@dataclass
class Ping(ShouldBroadcast):
    k: int
    t: float
    channel: str

    def broadcast_on(self) -> str:
        return self.channel

    def broadcast_with(self) -> dict[str, float]:
        return {"k": self.k, "t": self.t}
