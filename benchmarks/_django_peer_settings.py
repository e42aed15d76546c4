"""Django settings of ``benchmarks/django_tasks_peers.py`` (one process per backend).

``PEER_BACKEND`` picks the backend under test (tidings, db, rq); ``PEER_REDIS_URL`` the
benchmark's Redis (tidings and RQ use the same one); ``PEER_DB`` the database: a SQLite
file path, or a ``postgresql://`` URL. Read from the environment so the enqueuing
process and the backend's own worker command share them.
"""

from __future__ import annotations

import os
import urllib.parse

_BACKENDS = {
    "tidings": "tidings.contrib.django.tasks.TidingsBackend",
    "db": "django_tasks_db.DatabaseBackend",
    "rq": "django_tasks_rq.RQBackend",
}
_APPS = {"tidings": "tidings.contrib.django", "db": "django_tasks_db", "rq": "django_tasks_rq"}

PEER = os.environ.get("PEER_BACKEND", "tidings")
REDIS_URL = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0")
_DB = os.environ.get("PEER_DB", ":memory:")

SECRET_KEY = "benchmark-only-not-a-secret"
USE_TZ = True
DEBUG = False
INSTALLED_APPS = ["django_tasks", _APPS[PEER]] + (["django_rq"] if PEER == "rq" else [])
if _DB.startswith("postgresql://"):
    _u = urllib.parse.urlsplit(_DB)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _u.path.lstrip("/"),
            "USER": _u.username or "postgres",
            "HOST": _u.hostname,
            "PORT": str(_u.port or 5432),
        }
    }
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _DB}}
TASKS = {"default": {"BACKEND": _BACKENDS[PEER], "QUEUES": ["default"]}}
TIDINGS = {
    "redis_url": REDIS_URL,
    "key": "bench-key-0123456789abcdef0123456789",
    "prefix": os.environ.get("PEER_PREFIX", "peers"),
    "allowed_modules": ["benchmarks"],
    "metrics": False,
}
RQ_QUEUES = {"default": {"URL": REDIS_URL}}
LOGGING_CONFIG = None
