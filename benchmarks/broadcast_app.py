"""The App of benchmarks/broadcast.py: its web processes and worker import it."""

from __future__ import annotations

from dataclasses import dataclass

from tidings import App
from tidings.broadcasting import ShouldBroadcast

app = App.from_env()
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
