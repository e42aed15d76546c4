"""Type-tagged JSON for job, event and notification arguments. No pickle, ever.

JSON values pass through as they are; everything else becomes a small tagged object
``{"__t": tag, ...}``:

=========  =====================================================  ======================
tag        encodes                                                fields
=========  =====================================================  ======================
``dc``     dataclass instance (nested ones too)                   ``c`` class, ``f`` fields
``obj``    instance of a tidings base (Job, Listener ...) w/o     ``c`` class, ``f`` vars
           dataclass
``m``      model with ``__queue_dump__``/``__queue_load__``       ``c`` class, ``v`` dump
``x``      a value an :class:`Extension` claims (ORM rows,        ``x`` extension, ``c``
           Pydantic models: :mod:`tidings.contrib.models`)         class, ``v`` its dump
``enum``   Enum member                                            ``c`` class, ``v`` value
``dt``/``date``/``time``/``td``  datetime, date, time, timedelta  ``v`` ISO text / seconds
``dec``    Decimal                                                ``v`` text
``uuid``   UUID                                                   ``v`` hex
``b``      bytes                                                  ``v`` base64
``tuple``/``set``/``fset``  tuple, set, frozenset                 ``v`` list
``dict``   dict with non-str keys or a ``__t`` key                ``v`` [[k, v], ...]
``int``    int beyond ±2**53 (JSON readers lose those)            ``v`` decimal text
=========  =====================================================  ======================

Classes are named ``module:QualName``. Decoding imports them only through the
``resolve`` callable the worker passes in, which enforces the allowed module prefixes.
Anything else raises :class:`~tidings.errors.SerializationError` naming the field path.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import enum
import math
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

from tidings.errors import SerializationError

Resolver = Callable[[str], type[Any]]


class Extension(Protocol):
    """Encodes values of classes the built-in tags do not cover (the extension point for
    ORM models and Pydantic; see :mod:`tidings.contrib.models`).

    Attributes:
        name: stored in the payload (``"x"``); one name per extension, never reused.
        blocking: ``load`` does I/O (a database query): a worker decodes such payloads
            in a thread, never on its event loop.
    """

    name: str
    blocking: bool

    def claims(self, cls: type[Any]) -> bool:
        """Whether this extension encodes instances of ``cls``."""

    def dump(self, value: Any) -> Any:
        """JSON-ready data for ``value`` (it is encoded again, so tags may appear)."""

    def load(self, cls: type[Any], data: Any) -> Any:
        """The value again; raises on data that does not validate."""


class NeedsThread(Exception):
    """Raised by :func:`decode` on an event loop's thread when a blocking extension
    (a database load) would run there: decode again in a worker thread."""


_EXTENSIONS: dict[str, Extension] = {}
_CLAIMED: dict[type[Any], Extension | None] = {}


def register_extension(ext: Extension) -> None:
    """Add (or replace) an extension; later registrations are asked first."""
    global _EXTENSIONS
    _EXTENSIONS = {ext.name: ext, **{k: v for k, v in _EXTENSIONS.items() if k != ext.name}}
    _CLAIMED.clear()


def _extension_for(cls: type[Any]) -> Extension | None:
    try:
        return _CLAIMED[cls]
    except KeyError:
        found = next((e for e in _EXTENSIONS.values() if e.claims(cls)), None)
        _CLAIMED[cls] = found
        return found


_MAX_SAFE_INT = 2**53


def _int(value: int) -> Any:
    """An int as JSON keeps it exactly: beyond 2**53 (where doubles lose digits) as text."""
    if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        return value
    return {"__t": "int", "v": str(value)}


_CLASS_PATHS: dict[type[Any], str] = {}


def class_path(cls: type[Any]) -> str:
    """The importable name of ``cls`` as ``module:QualName`` (worked out once per class:
    every dispatch asks for its job's).

    Raises:
        SerializationError: the class cannot be imported by a worker (defined inside a
            function, or in a ``__main__`` script).
    """
    path = _CLASS_PATHS.get(cls)
    if path is None:
        path = _CLASS_PATHS[cls] = _importable_name(cls)
    return path


def _importable_name(cls: type[Any]) -> str:
    module = cls.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None or not spec.name:
            raise SerializationError(
                f"{cls.__qualname__} is defined in a __main__ script; a worker cannot "
                "import it. Move it into a module (or run with python -m)."
            )
        module = spec.name
    if "<locals>" in cls.__qualname__:
        raise SerializationError(
            f"{cls.__qualname__} is defined inside a function; a worker cannot import it"
        )
    return f"{module}:{cls.__qualname__}"


def _join(path: str, part: str) -> str:
    if part.startswith("["):
        return f"{path}{part}"
    return f"{path}.{part}" if path else part


class _Unencodable(Exception):
    """Raised deep in the encoder; the containers on the way out add their path parts
    (so a path is built only for a value that fails, never for every field)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.parts: list[str] = []


# Per dataclass: its field names (the encoder's hot path).
_DATACLASSES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _DATACLASSES.get(cls)
    if names is None:
        names = _DATACLASSES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_FAST: dict[type[Any], int] = {type(None): 1, bool: 1, str: 1, int: 2, float: 3}


class _Encoder:
    def __init__(self) -> None:
        self._active: set[int] = set()

    def encode(self, value: Any) -> Any:
        cls = type(value)
        # Exact types first (most values): one dict lookup instead of the isinstance chain.
        kind = _FAST.get(cls)
        if kind is not None:
            if kind == 1:  # None, bool, str
                return value
            if kind == 2:  # int
                return _int(value)
            if kind == 3 and math.isfinite(value):  # float
                return value
        elif cls in _DATACLASSES:  # a dataclass met before (so no other tag applies)
            return self._guarded(self._dataclass, value, cls)
        elif cls is list or cls is dict:  # exact built-in containers: no tag applies
            if not value:  # empty: nothing to walk, no cycle possible
                return [] if cls is list else {}
            return self._guarded(self._container, value, cls)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and not isinstance(value, enum.Enum):
            # A str-mixin Enum (StrEnum) is a str too: it must keep its type.
            return value
        if isinstance(value, int) and not isinstance(value, enum.Enum):
            return _int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _Unencodable(f"float {value!r} has no JSON form")
            return value
        if hasattr(cls, "__queue_dump__") and hasattr(cls, "__queue_load__"):
            return {"__t": "m", "c": class_path(cls), "v": self.encode(value.__queue_dump__())}
        if isinstance(value, enum.Enum):
            return {"__t": "enum", "c": class_path(cls), "v": self.encode(value.value)}
        if isinstance(value, dt.datetime):
            return {"__t": "dt", "v": value.isoformat()}
        if isinstance(value, dt.date):
            return {"__t": "date", "v": value.isoformat()}
        if isinstance(value, dt.time):
            return {"__t": "time", "v": value.isoformat()}
        if isinstance(value, dt.timedelta):
            return {"__t": "td", "v": value.total_seconds()}
        if isinstance(value, Decimal):
            return {"__t": "dec", "v": str(value)}
        if isinstance(value, uuid.UUID):
            return {"__t": "uuid", "v": value.hex}
        if isinstance(value, (bytes, bytearray)):
            return {"__t": "b", "v": base64.b64encode(bytes(value)).decode("ascii")}
        return self._guarded(self._container, value, cls)

    def _guarded(self, encode: Callable[[Any, type], Any], value: Any, cls: type) -> Any:
        """``encode(value, cls)`` for a container or dataclass, refusing cycles (JSON has
        no way to express one)."""
        key = id(value)
        if key in self._active:
            raise _Unencodable("circular reference")
        self._active.add(key)
        try:
            return encode(value, cls)
        finally:
            self._active.discard(key)

    def _items(self, value: Any) -> list[Any]:
        out: list[Any] = []
        try:
            for v in value:
                out.append(self.encode(v))
        except _Unencodable as exc:
            exc.parts.append(f"[{len(out)}]")
            raise
        return out

    def _fields(self, pairs: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        name = ""
        try:
            for name, v in pairs:
                out[name] = self.encode(v)
        except _Unencodable as exc:
            exc.parts.append(name)
            raise
        return out

    def _dataclass(self, value: Any, cls: type[Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        name = ""
        try:  # _fields, without a generator of pairs between
            for name in _field_names(cls):
                fields[name] = self.encode(getattr(value, name))
        except _Unencodable as exc:
            exc.parts.append(name)
            raise
        return {"__t": "dc", "c": class_path(cls), "f": fields}

    def _container(self, value: Any, cls: type[Any]) -> Any:
        if isinstance(value, list):
            return self._items(value)
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {"__t": "tuple", "v": self._items(value)}
        if isinstance(value, (set, frozenset)):
            tag = "set" if isinstance(value, set) else "fset"
            return {"__t": tag, "v": self._items(value)}
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value) and "__t" not in value:
                return self._fields(value.items())
            pairs: list[Any] = []
            for k, v in value.items():
                try:
                    pairs.append([self.encode(k), self.encode(v)])
                except _Unencodable as exc:
                    exc.parts.append(f"[{k!r}]")
                    raise
            return {"__t": "dict", "v": pairs}
        ext = _extension_for(cls) if _EXTENSIONS else None
        if ext is not None:
            dump = self.encode(ext.dump(value))
            return {"__t": "x", "x": ext.name, "c": class_path(cls), "v": dump}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._dataclass(value, cls)
        if getattr(cls, "__tidings_serializable__", False) and hasattr(value, "__dict__"):
            fields = self._fields(
                (k, v) for k, v in vars(value).items() if not k.startswith("_tidings")
            )
            return {"__t": "obj", "c": class_path(cls), "f": fields}
        raise _Unencodable(
            f"cannot queue a value of type {cls.__module__}.{cls.__qualname__}; use a "
            "dataclass, a JSON type, or give the class __queue_dump__/__queue_load__"
        )


def _flat_dataclass(value: Any) -> dict[str, Any] | None:
    """A dataclass met before whose fields are all str, None, bool, safe ints or finite
    floats (most jobs) encoded without the general walk; None for anything else.
    The same output as :class:`_Encoder` (every dispatch encodes its job: ~1 us less)."""
    cls = type(value)
    names = _DATACLASSES.get(cls)
    if names is None:
        return None
    fields: dict[str, Any] = {}
    for name in names:
        v = getattr(value, name)
        kind = _FAST.get(type(v))
        if (
            kind == 1
            or (kind == 2 and -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT)
            or (kind == 3 and math.isfinite(v))
        ):
            fields[name] = v
        else:
            return None
    return {"__t": "dc", "c": class_path(cls), "f": fields}


def encode(value: Any, *, path: str = "") -> Any:
    """Turn ``value`` into JSON-ready data with type tags.

    Raises:
        SerializationError: a value has no queued form; the message names its path.
    """
    flat = _flat_dataclass(value)
    if flat is not None:
        return flat
    try:
        return _Encoder().encode(value)
    except _Unencodable as exc:
        for part in reversed(exc.parts):
            path = _join(path, part)
        raise SerializationError(exc.message, path=path) from None


# Types decode returns as they are (exact types only: orjson gives no subclasses).
_SCALARS = frozenset((str, int, float, bool, type(None)))
_OBJECT_SETATTR = object.__setattr__


def _plain(value: Any, resolve: Resolver) -> Any:
    if isinstance(value, list):
        return [decode(v, resolve) for v in value]
    return value


def _fits(cls: Any, tag: str) -> bool:
    if not isinstance(cls, type):
        return False
    if tag == "dc":
        return dataclasses.is_dataclass(cls)
    if tag == "obj":
        return bool(getattr(cls, "__tidings_serializable__", False))
    if tag == "m":
        return hasattr(cls, "__queue_load__")
    return issubclass(cls, enum.Enum)


# Per tag, the classes found to fit it (a class does not stop being a dataclass, a
# tidings serializable, a model or an Enum): each job's decode asks once per object.
_FITTING: dict[str, set[type[Any]]] = {"dc": set(), "obj": set(), "m": set(), "enum": set()}


def _resolve_kind(resolve: Resolver, path: str, tag: str) -> type[Any]:
    """Resolve ``path`` and check it is the kind of class ``tag`` stands for.

    A name in a payload is never a licence to call or fill any object: an ``enum`` tag
    naming a function, or a ``dc`` tag naming a plain class, is refused. ``resolve`` is
    asked every time (it enforces the allowed modules of its App); only the kind check
    of a class already found to fit is remembered.
    """
    return _kind(resolve(path), path, tag)


def _kind(cls: type[Any], path: str, tag: str) -> type[Any]:
    """``cls`` (resolved from ``path``) if it is the kind of class ``tag`` stands for."""
    fitting = _FITTING[tag]
    try:
        if cls in fitting:
            return cls
        hashable = True
    except TypeError:  # unhashable: not a class (refused below) or a rare metaclass's
        hashable = False
    if not _fits(cls, tag):
        raise SerializationError(f"{path!r} is not a class a {tag!r} value can hold")
    if hashable and len(fitting) < 4096:
        fitting.add(cls)
    return cls


def _load_extension(data: dict[str, Any], resolve: Resolver) -> Any:
    ext = _EXTENSIONS.get(data["x"])
    if ext is None:
        raise SerializationError(
            f"no serializer extension {data['x']!r} in this process: import the module "
            "that registers it (tidings.contrib.models registers django, sqlalchemy, pydantic)"
        )
    cls = resolve(data["c"])
    if not isinstance(cls, type) or not ext.claims(cls):
        raise SerializationError(f"{data['c']!r} is not a class the {ext.name!r} extension loads")
    if ext.blocking and _on_event_loop():
        raise NeedsThread(data["c"])
    return ext.load(cls, decode(data["v"], resolve))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def decode(data: Any, resolve: Resolver) -> Any:
    """Rebuild the value :func:`encode` produced.

    Args:
        data: parsed JSON.
        resolve: turns ``module:QualName`` into a class, refusing names outside the
            allowed modules.

    Raises:
        SerializationError: unknown tag or malformed data.
    """
    if not isinstance(data, dict):
        return _plain(data, resolve)
    tag = data.get("__t")
    if tag is None:
        return {k: decode(v, resolve) for k, v in data.items()}
    try:
        if tag == "dc" or tag == "obj":
            cls: Any = resolve(data["c"])
            try:  # _resolve_kind, inlined for a class already found to fit
                fit = cls in _FITTING[tag]
            except TypeError:
                fit = False
            if not fit:  # checked once per class (resolve is not asked again)
                cls = _kind(cls, data["c"], tag)
            obj = object.__new__(cls)
            # Bypass __init__/__post_init__: the object is restored, not created anew.
            # Past any __setattr__ of the class (a frozen dataclass's refuses): where it
            # defines none, the setattr builtin does exactly what object.__setattr__
            # does, without the slot wrapper's argument tuple. A str, number, bool or
            # None field is itself (what decode would return): most fields are.
            setter = setattr if cls.__setattr__ is _OBJECT_SETATTR else _OBJECT_SETATTR
            for name, raw in data["f"].items():
                setter(obj, name, raw if type(raw) in _SCALARS else decode(raw, resolve))
            return obj
        if tag == "m":
            cls = _resolve_kind(resolve, data["c"], tag)
            ext = _extension_for(cls) if _EXTENSIONS else None
            if ext is not None and ext.blocking and _on_event_loop():
                # A hand-written hook on an ORM model queries the database too.
                raise NeedsThread(data["c"])
            return cls.__queue_load__(decode(data["v"], resolve))
        if tag == "x":
            return _load_extension(data, resolve)
        if tag == "enum":
            return _resolve_kind(resolve, data["c"], tag)(decode(data["v"], resolve))
        v = data["v"]
        if tag == "dt":
            return dt.datetime.fromisoformat(v)
        if tag == "date":
            return dt.date.fromisoformat(v)
        if tag == "time":
            return dt.time.fromisoformat(v)
        if tag == "td":
            return dt.timedelta(seconds=v)
        if tag == "dec":
            return Decimal(v)
        if tag == "uuid":
            return uuid.UUID(hex=v)
        if tag == "b":
            return base64.b64decode(v, validate=True)
        if tag == "int":
            return int(v)
        if tag == "tuple":
            return tuple(decode(x, resolve) for x in v)
        if tag == "set":
            return {decode(x, resolve) for x in v}
        if tag == "fset":
            return frozenset(decode(x, resolve) for x in v)
        if tag == "dict":
            return {decode(k, resolve): decode(x, resolve) for k, x in v}
    except (SerializationError, NeedsThread):
        raise
    except Exception as exc:
        raise SerializationError(f"malformed {tag!r} value: {exc}") from exc
    raise SerializationError(f"unknown type tag {tag!r}")
