"""Django settings of the Tasks API conformance suite (test process and worker alike).

The tidings App takes its Redis URL, key and prefix from the ``TIDINGS_*`` environment.
"""

from tests.integration.django_tasks_site.api import APPS, IMMEDIATE

SECRET_KEY = "conformance-only-not-a-secret"
USE_TZ = True
INSTALLED_APPS = [*APPS, "tidings.contrib.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TIDINGS: dict[str, object] = {}
QUEUES = ["default", "emails", "lanes"]
TASKS = {
    "default": {
        "BACKEND": IMMEDIATE,
        "QUEUES": QUEUES,
    },
    "immediate": {
        "BACKEND": IMMEDIATE,
        "QUEUES": QUEUES,
    },
    "tidings": {
        "BACKEND": "tidings.contrib.django.tasks.TidingsBackend",
        "QUEUES": QUEUES,
        "OPTIONS": {"tries": 2, "backoff": [0], "result_ttl_s": 600},
    },
}
TASKS["on_commit"] = {
    "BACKEND": "tidings.contrib.django.tasks.TidingsBackend",
    "QUEUES": QUEUES,
    "OPTIONS": {"after_commit": True},
}
TASKS["short"] = {
    "BACKEND": "tidings.contrib.django.tasks.TidingsBackend",
    "QUEUES": QUEUES,
    "OPTIONS": {"timeout": 0.5},
}
LOGGING_CONFIG = None
