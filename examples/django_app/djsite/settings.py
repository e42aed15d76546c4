"""Settings of the tidings Django example (only what the example needs).

The database is SQLite (``db.sqlite3`` here) unless ``DATABASE_URL`` names a
PostgreSQL one (``postgresql://user@127.0.0.1:5432/dbname``). tidings reads its
``TIDINGS_*`` variables from the environment under the ``TIDINGS`` dict below; with no
``TIDINGS_REDIS_URL`` it starts an embedded Redis under ``./.tidings/``.
"""

import os
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "djsite.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "accounts",
    "tidings.contrib.django",  # creates the App from TIDINGS, discovers accounts.listeners
]

TIDINGS = {
    # Keys are the App(...) keywords; the TIDINGS_* environment fills the rest
    # (TIDINGS_REDIS_URL, TIDINGS_KEY, TIDINGS_MAIL_URL ...).
    "after_commit": True,  # pushes wait for the transaction they were made in
    "mail_allow_test_domains": True,  # this example mails ada@myapp.test
}


def _database() -> dict[str, object]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 60,
    }


DATABASES = {"default": _database()}
