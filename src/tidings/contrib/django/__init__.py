"""Django integration: add ``"tidings.contrib.django"`` to ``INSTALLED_APPS``.

::

    # settings.py
    INSTALLED_APPS = [..., "accounts", "tidings.contrib.django"]
    TIDINGS = {                      # keys are the App(...) keywords
        "redis_url": "redis://127.0.0.1:6379/0",
        "key": env("TIDINGS_KEY"),
        "mail_url": "smtp://127.0.0.1:1025?tls=off",
        "after_commit": True,        # every push waits for the surrounding transaction
    }

When Django is ready, the App is created from ``TIDINGS`` (over the ``TIDINGS_*``
environment variables), made current, and:

- the ``listeners`` module (or package) of every installed app is imported and its
  Listener classes registered (``app.discover``); a missing module is skipped;
- ``allowed_modules`` defaults to every installed app and the project package (the
  one holding ``DJANGO_SETTINGS_MODULE``), so ``accounts.events:UserRegistered`` loads
  in the worker without configuration;
- pushes with ``after_commit`` wait for ``transaction.on_commit`` inside
  ``atomic()`` blocks (and drop on rollback);
- Django models are stored by primary key and reloaded in the worker (see
  :mod:`tidings.contrib.models`);
- the worker runs ``close_old_connections()`` before and after each job in the thread
  that runs it (sync handlers and model loads in the worker's threads, async handlers
  in ``sync_to_async``'s thread), as Celery's Django fixup does, so a job never uses a
  connection the database closed.

``notify-worker`` with neither ``-A`` nor ``TIDINGS_APP`` but with
``DJANGO_SETTINGS_MODULE`` set runs ``django.setup()`` and uses this App.
"""

from __future__ import annotations

from tidings.contrib.django.setup import app_from_settings, get_app, worker_app

__all__ = ["app_from_settings", "get_app", "worker_app"]
