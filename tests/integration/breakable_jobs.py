"""Jobs that fail on demand or kill their process, and functions used as a chain's
``catch`` (imported by ``notify-worker`` through the workflows app, whose allowed
modules include ``tests``)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from tests.integration.workflows_app import _r, record
from tidings import Job, queued


@dataclass
class Mendable(Job):
    """Records its tag; raises while ``{prefix}:test:broken:<tag>`` is set."""

    tag: str
    tries = 1

    def handle(self) -> None:
        record(self.tag)
        r, p = _r()
        if r.get(f"{p}:test:broken:{self.tag}"):
            raise RuntimeError(f"{self.tag} is broken")


@dataclass
class KillsItself(Job):
    """SIGKILLs the process that runs it, every time (a poison job)."""

    tag: str
    tries = 2

    def handle(self) -> None:
        record(self.tag)
        os.kill(os.getpid(), signal.SIGKILL)


def chain_failed() -> None:
    """A plain module-level function used as a chain's ``catch``."""
    record("catch-fn")


@queued(queue="default")
def chain_failed_queued() -> None:
    """A ``@queued`` function used as a chain's ``catch``."""
    record("catch-queued")
