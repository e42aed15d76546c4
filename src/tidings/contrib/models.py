"""Models as arguments, without hooks: Django models, SQLAlchemy mapped objects, Pydantic.

A Django model or a SQLAlchemy mapped object is stored by class and primary key and
loaded again in the worker, fresh from its database, in a worker thread (Django refuses
ORM calls on an event loop). A row deleted since dispatch raises
:class:`~tidings.errors.ModelNotFound`: the worker fails the job with that reason, or
drops it under ``missing_models = "skip"`` / ``delete_when_missing_models = True`` (as
Laravel's ``deleteWhenMissingModels``).

A Pydantic (v2) model is stored as ``model_dump(mode="json")`` and validated again by
``model_validate`` on load, so a payload that no longer fits the model fails the job
with pydantic's message instead of reaching the handler.

Each extension asks ``sys.modules`` before touching its framework, so none is imported
here; an app that never imports Django pays nothing.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from tidings.errors import ModelNotFound, PayloadRejected, SerializationError
from tidings.hosts import AppHost
from tidings.wire.serializer import class_path, register_extension


class DjangoModels:
    """Django ``Model`` instances by primary key (and database alias when not default)."""

    name = "django"
    blocking = True

    def claims(self, cls: type[Any]) -> bool:
        """Concrete Django models."""
        models = sys.modules.get("django.db.models")
        if models is None or not issubclass(cls, models.Model):
            return False
        return not cls._meta.abstract

    def dump(self, value: Any) -> Any:
        """``{"pk": ..., "db": alias}``."""
        if value.pk is None:
            raise SerializationError(
                f"cannot queue an unsaved {type(value).__qualname__}: save() it first"
            )
        data: dict[str, Any] = {"pk": value.pk}
        db = value._state.db
        if db not in (None, "default"):
            data["db"] = db
        return data

    def load(self, cls: type[Any], data: Any) -> Any:
        """The row, fresh from the database."""
        manager = cls._default_manager.using(data.get("db") or "default")
        obj = manager.filter(pk=data["pk"]).first()
        if obj is None:
            raise ModelNotFound(class_path(cls), data["pk"])
        return obj


_session_factory: Any = None


def use_sqlalchemy_sessions(factory: Any) -> None:
    """The callable (a ``sessionmaker``) whose sessions load mapped objects in a worker."""
    global _session_factory
    _session_factory = factory


class SQLAlchemyModels:
    """SQLAlchemy mapped objects by identity (their primary key)."""

    name = "sqlalchemy"
    blocking = True

    def claims(self, cls: type[Any]) -> bool:
        """Mapped classes."""
        if "sqlalchemy.orm" not in sys.modules:
            return False
        import sqlalchemy

        return sqlalchemy.inspect(cls, raiseerr=False) is not None

    def dump(self, value: Any) -> Any:
        """``{"pk": [...]}`` (the identity key; composite keys keep their order)."""
        import sqlalchemy

        identity = sqlalchemy.inspect(value).identity
        if identity is None:
            raise SerializationError(
                f"cannot queue a {type(value).__qualname__} that has no primary key yet: "
                "flush() or commit the session first"
            )
        return {"pk": list(identity)}

    def load(self, cls: type[Any], data: Any) -> Any:
        """The row, fresh from the database, detached from a closed session."""
        if _session_factory is None:
            from tidings.errors import ConfigurationError

            raise ConfigurationError(
                "a SQLAlchemy model argument needs a session to load it: call "
                "tidings.contrib.sqlalchemy.use_sessions(sessionmaker) where the App is made"
            )
        pk = data["pk"]
        key = pk[0] if len(pk) == 1 else tuple(pk)
        with _session_factory() as session:
            obj = session.get(cls, key)
            if obj is None:
                raise ModelNotFound(class_path(cls), key)
            session.expunge(obj)
        return obj


class PydanticModels:
    """Pydantic v2 models: ``model_dump(mode="json")``, validated on load."""

    name = "pydantic"
    blocking = False

    def claims(self, cls: type[Any]) -> bool:
        """Subclasses of ``pydantic.BaseModel``."""
        pydantic = sys.modules.get("pydantic")
        return pydantic is not None and issubclass(cls, pydantic.BaseModel)

    def dump(self, value: Any) -> Any:
        """The model's JSON form."""
        return value.model_dump(mode="json")

    def load(self, cls: type[Any], data: Any) -> Any:
        """``cls.model_validate(data)`` (a ValidationError fails the job, named)."""
        return cls.model_validate(data)


def skips_missing_model(app: AppHost, job_cls: type[Any], data: Any) -> bool:
    """Whether a job whose model argument is gone is dropped (True) or failed.

    ``delete_when_missing_models`` on the notification, the queued listener or the job
    class wins (in that order); else the App's ``missing_models`` (``fail`` / ``skip``).
    """
    sources: list[Any] = [job_cls]
    fields = data.get("f") if isinstance(data, dict) else None
    if isinstance(fields, dict):
        note = fields.get("notification")
        for path in (fields.get("listener"), note.get("c") if isinstance(note, dict) else None):
            if isinstance(path, str):
                with contextlib.suppress(PayloadRejected):
                    sources.append(app.resolve_class(path))
    for source in reversed(sources):
        value = getattr(source, "delete_when_missing_models", None)
        if value is not None:
            return bool(value)
    return bool(app.settings.missing_models == "skip")


for _ext in (PydanticModels(), SQLAlchemyModels(), DjangoModels()):
    register_extension(_ext)
