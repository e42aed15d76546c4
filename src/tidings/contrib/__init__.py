"""Framework integrations: Django, FastAPI/Starlette, Flask, SQLAlchemy, Pydantic.

Each module imports its framework only when used; none is needed by the core.

- :mod:`tidings.contrib.models`: Django models, SQLAlchemy mapped objects and Pydantic
  models as job, event and notification arguments (registered by every App).
- :mod:`tidings.contrib.django`: ``INSTALLED_APPS`` entry, ``TIDINGS = {...}`` setting.
- :mod:`tidings.contrib.sqlalchemy`: after-commit dispatch on SQLAlchemy sessions, the
  session factory that reloads mapped objects in the worker.
- :mod:`tidings.contrib.fastapi`: a lifespan that opens and closes the App.
- :mod:`tidings.contrib.flask`: the ``Tidings`` extension (``init_app``).
"""
