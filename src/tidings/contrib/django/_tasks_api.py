"""Every difference between Django 6's ``django.tasks`` and the ``django-tasks`` backport.

The backend imports the Tasks API from here only: ``django.tasks`` when Django ships it
(6.0 and later), else ``django_tasks`` (the backport, on Django 4.2 and 5.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # checked against the backport (django-stubs has django.tasks stubs too)
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    SOURCE = "django_tasks"
else:
    try:  # Django >= 6.0
        from django.tasks import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
        )
        from django.tasks.backends.base import (
            BaseTaskBackend,
        )
        from django.tasks.base import (
            Task,
            TaskError,
        )
        from django.tasks.exceptions import (
            TaskResultDoesNotExist,
        )
        from django.tasks.signals import (
            task_enqueued,
            task_finished,
            task_started,
        )
        from django.utils.json import normalize_json

        SOURCE = "django.tasks"
    except ImportError:  # the backport
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        SOURCE = "django_tasks"

__all__ = [
    "SOURCE",
    "BaseTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_enqueued",
    "task_finished",
    "task_started",
]
