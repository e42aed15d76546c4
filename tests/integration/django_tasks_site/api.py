"""The Tasks API the conformance suite runs on: Django's own ``django.tasks`` (Django 6
and later) or the ``django-tasks`` backport (Django 4.2/5.2), and their few naming
differences (the backport's ``InvalidTaskError`` is Django's ``InvalidTask``)."""

from __future__ import annotations

try:  # Django >= 6.0
    from django.tasks import TaskContext, TaskResultStatus, task, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
    IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
    APPS: list[str] = []
except ImportError:
    from django_tasks import TaskContext, TaskResultStatus, task, task_backends  # type: ignore[no-redef]
    from django_tasks.exceptions import (
        InvalidTaskError,  # type: ignore[no-redef]
        TaskResultDoesNotExist,  # type: ignore[no-redef]
    )
    from django_tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )

    SOURCE = "django_tasks"
    IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"
    APPS = ["django_tasks"]


def available() -> bool:
    """Whether either API is installed."""
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        try:
            import django_tasks  # noqa: F401
        except ImportError:
            return False
    return True


__all__ = [
    "APPS",
    "IMMEDIATE",
    "SOURCE",
    "InvalidTaskError",
    "TaskContext",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "available",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
