"""``notify-worker``: the worker and the operator's commands (``main`` holds the group)."""

from __future__ import annotations


def main() -> None:
    """The ``notify-worker`` entry point (``python -m tidings.cli`` too)."""
    from tidings.cli.main import main as run

    run()
