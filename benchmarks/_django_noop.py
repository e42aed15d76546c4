"""The no-op task every backend of ``benchmarks/django_tasks_peers.py`` runs (a module
of its own: ``@task`` needs Django's settings at import)."""

from __future__ import annotations

from django_tasks import task


@task()
def noop(n: int) -> int:
    """The body: returns its argument."""
    return n
