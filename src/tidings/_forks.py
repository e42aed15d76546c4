"""How many forks this process's memory went through: a producer's hot path compares
this counter (a module attribute) instead of asking ``os.getpid()``, a system call on
every push, whether it runs in a forked child of the process that set up its state."""

from __future__ import annotations

import os

generation = 0
"""Incremented in every forked child (``os.register_at_fork``)."""


def _forked() -> None:
    global generation
    generation += 1


os.register_at_fork(after_in_child=_forked)
