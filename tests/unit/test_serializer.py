"""The type-tagged JSON serializer: every tag round-trips, everything else is refused.

Round trips go through real JSON bytes (orjson, as the producer does) so a value that
only survives in memory does not pass. No sockets.
"""

from __future__ import annotations

import datetime as dt
import enum
import importlib
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
import pytest

from tidings import Job
from tidings.errors import SerializationError
from tidings.wire import serializer
from tidings.wire.serializer import class_path, decode, encode


def resolve(path: str) -> type[Any]:
    """A resolver with no module policy (the App's one is tested in integration)."""
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


def roundtrip(value: Any) -> Any:
    return decode(orjson.loads(orjson.dumps(encode(value))), resolve)


# -- fixtures: classes at module level, so a worker could import them ---------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mood(enum.StrEnum):
    HAPPY = "happy"
    SAD = "sad"


@dataclass
class Address:
    street: str
    zip: str


@dataclass
class User:
    id: int
    name: str
    created_at: dt.datetime
    address: Address
    tags: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class FrozenPoint:
    x: int
    y: int


@dataclass(slots=True)
class Slotted:
    a: int
    b: list[int]


@dataclass(frozen=True, slots=True)
class FrozenSlotted:
    when: dt.date
    amount: Decimal


@dataclass
class WithPostInit:
    n: int
    calls: int = 0

    def __post_init__(self) -> None:
        self.calls += 1


class Model:
    """An ORM-like model: only its id travels; it is reloaded at run time."""

    loaded: list[int] = []

    def __init__(self, pk: int, heavy: object = None) -> None:
        self.pk = pk
        self.heavy = heavy

    def __queue_dump__(self) -> dict[str, Any]:
        return {"pk": self.pk}

    @classmethod
    def __queue_load__(cls, data: dict[str, Any]) -> Model:
        cls.loaded.append(data["pk"])
        return cls(data["pk"], heavy="reloaded")


@dataclass
class Signup:
    user: User
    note: str = ""


class Opaque:
    pass


@dataclass
class HasOpaque:
    created_at: object


@dataclass
class Outer:
    @dataclass
    class Inner:
        v: int

    inner: Inner


class PlainJob(Job):
    """A Job that is not a dataclass: its vars travel under the ``obj`` tag."""

    def __init__(self, n: int, items: list[str]) -> None:
        self.n = n
        self.items = items

    def handle(self) -> None:  # pragma: no cover - never run here
        pass


# -- round trips ---------------------------------------------------------------------------

SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**53,
    -(2**53),
    1.5,
    -0.0,
    "",
    "text with / and \u00e9\u00e8 and \U0001f600",
    [],
    {},
    [1, "a", None, [2, [3]]],
    {"a": 1, "b": {"c": [1, 2]}},
]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_json_values_pass_through_unchanged(value: Any) -> None:
    assert encode(value) == value
    assert roundtrip(value) == value


TAGGED: list[tuple[str, Any]] = [
    ("dt", dt.datetime(2024, 2, 29, 13, 45, 6, 123456)),
    ("dt", dt.datetime(2024, 2, 29, 13, 45, 6, tzinfo=dt.timezone(dt.timedelta(hours=-5)))),
    ("dt", dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
    ("date", dt.date(1999, 12, 31)),
    ("time", dt.time(23, 59, 59, 999999)),
    ("time", dt.time(1, 2, tzinfo=dt.UTC)),
    ("td", dt.timedelta(days=2, seconds=3, microseconds=4)),
    ("dec", Decimal("12345678901234567890.000000000000000001")),
    ("dec", Decimal("-0.00")),
    ("uuid", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("b", b"\x00\xff binary \r\n"),
    ("b", b""),
    ("tuple", (1, "a", (2, 3))),
    ("tuple", ()),
    ("set", {1, 2, 3}),
    ("fset", frozenset({"x", "y"})),
    ("dict", {1: "one", (2, 3): "tuple key", None: 0}),
    ("dict", {"__t": "not a tag", "v": 1}),
    ("int", 2**53 + 1),
    ("int", -(2**53) - 1),
    ("int", 2**200),
    ("enum", Color.BLUE),
    ("enum", Level.HIGH),
]


@pytest.mark.parametrize(("tag", "value"), TAGGED, ids=lambda v: repr(v)[:40])
def test_every_tag_round_trips(tag: str, value: Any) -> None:
    encoded = encode(value)
    assert encoded["__t"] == tag
    back = roundtrip(value)
    assert back == value
    assert type(back) is type(value)


def test_datetime_keeps_its_timezone() -> None:
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    value = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=tz)
    back = roundtrip(value)
    assert back.utcoffset() == dt.timedelta(hours=5, minutes=30)
    naive = roundtrip(dt.datetime(2024, 5, 6, 7, 8, 9))
    assert naive.tzinfo is None


def test_big_ints_are_exact_in_the_json_text() -> None:
    big = 2**64 + 12345
    text = orjson.dumps(encode({"n": big, "nested": [big, -big]}))
    assert str(big).encode() in text
    assert roundtrip({"n": big, "nested": [big, -big]}) == {"n": big, "nested": [big, -big]}
    # The largest exact double is not tagged; one past it is.
    assert encode(2**53) == 2**53
    assert encode(2**53 + 1) == {"__t": "int", "v": str(2**53 + 1)}


def test_enum_with_mixin_keeps_its_type() -> None:
    back = roundtrip({"mood": Mood.SAD, "level": Level.LOW})
    assert back["mood"] is Mood.SAD
    assert back["level"] is Level.LOW


def test_nested_dataclasses_round_trip() -> None:
    user = User(
        7,
        "Ada",
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        Address("1 Loop", "12345"),
        {"admin", "beta"},
    )
    back = roundtrip(Signup(user, note="hi"))
    assert back == Signup(user, note="hi")
    assert type(back.user.address) is Address
    assert encode(Signup(user))["c"] == f"{__name__}:Signup"


@pytest.mark.parametrize(
    "value",
    [
        FrozenPoint(1, 2),
        Slotted(3, [4, 5]),
        FrozenSlotted(dt.date(2020, 1, 1), Decimal("9.99")),
        Outer(Outer.Inner(5)),
    ],
    ids=lambda v: type(v).__qualname__,
)
def test_frozen_slotted_and_nested_class_dataclasses(value: Any) -> None:
    back = roundtrip(value)
    assert back == value
    assert type(back) is type(value)


def test_decode_restores_without_running_init_or_post_init() -> None:
    back = roundtrip(WithPostInit(3))
    assert back.calls == 1  # a second __post_init__ would have made it 2


@dataclass
class Guarded:
    """A class whose own __setattr__ refuses: decode restores past it."""

    x: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("read-only")


def test_decode_restores_past_a_classes_own_setattr() -> None:
    back = decode({"__t": "dc", "c": f"{__name__}:Guarded", "f": {"x": [1]}}, resolve)
    assert type(back) is Guarded and back.x == [1]


def test_queue_dump_and_load_hook() -> None:
    Model.loaded.clear()
    encoded = encode({"owner": Model(42, heavy=object())})
    assert encoded["owner"] == {"__t": "m", "c": f"{__name__}:Model", "v": {"pk": 42}}
    back = roundtrip({"owner": Model(42, heavy=object())})
    assert isinstance(back["owner"], Model)
    assert back["owner"].pk == 42
    assert back["owner"].heavy == "reloaded"
    assert Model.loaded == [42]


def test_plain_job_subclass_uses_obj_tag() -> None:
    encoded = encode(PlainJob(3, ["a"]))
    assert encoded["__t"] == "obj"
    back = roundtrip(PlainJob(3, ["a"]))
    assert isinstance(back, PlainJob)
    assert (back.n, back.items) == (3, ["a"])


def test_shared_references_are_not_mistaken_for_cycles() -> None:
    shared = [1, 2]
    assert roundtrip({"a": shared, "b": shared, "c": (shared, shared)}) == {
        "a": [1, 2],
        "b": [1, 2],
        "c": ([1, 2], [1, 2]),
    }


# -- refusals name the path ----------------------------------------------------------------


def test_unsupported_object_names_the_field_path() -> None:
    user = User(1, "x", dt.datetime(2024, 1, 1), Address("s", "z"))
    user.created_at = Opaque()  # type: ignore[assignment]
    with pytest.raises(SerializationError) as info:
        encode(Signup(user))
    assert info.value.path == "user.created_at"
    assert "user.created_at" in str(info.value)
    assert "Opaque" in str(info.value)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"items": [1, {"bad": Opaque()}]}, "items[1].bad"),
        ({"t": (1, Opaque())}, "t[1]"),
        (HasOpaque(Opaque()), "created_at"),
        ({"f": lambda: None}, "f"),
        ({"gen": (i for i in range(3))}, "gen"),
        ({"cls": Opaque}, "cls"),
    ],
    ids=["list-in-dict", "tuple", "dataclass-field", "lambda", "generator", "class-object"],
)
def test_refusals_carry_paths(value: Any, path: str) -> None:
    with pytest.raises(SerializationError) as info:
        encode(value)
    assert info.value.path == path


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_refused(bad: float) -> None:
    with pytest.raises(SerializationError) as info:
        encode({"price": {"amount": bad}})
    assert info.value.path == "price.amount"


def test_circular_dict_is_refused() -> None:
    d: dict[str, Any] = {"a": 1}
    d["self"] = d
    with pytest.raises(SerializationError, match="circular") as info:
        encode({"root": d})
    assert info.value.path == "root.self"


def test_circular_list_and_dataclass_are_refused() -> None:
    items: list[Any] = [1]
    items.append(items)
    with pytest.raises(SerializationError, match="circular"):
        encode(items)
    s = Slotted(1, [])
    s.b.append(s)  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="circular") as info:
        encode(s)
    assert info.value.path == "b[0]"


def test_class_defined_in_a_function_is_refused() -> None:
    @dataclass
    class Local:
        x: int

    with pytest.raises(SerializationError, match="inside a function"):
        encode({"v": Local(1)})
    with pytest.raises(SerializationError, match="inside a function"):
        class_path(Local)


def test_namedtuple_is_refused_rather_than_silently_flattened() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    with pytest.raises(SerializationError):
        encode({"p": Pair(1, 2)})


# -- decoding bad data ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"__t": "nope", "v": 1},
        {"__t": "dt", "v": "not a date"},
        {"__t": "b", "v": "!!!not base64"},
        {"__t": "int", "v": "12x"},
        {"__t": "dec", "v": "abc"},
        {"__t": "uuid", "v": "zz"},
        {"__t": "tuple"},
        {"__t": "dc", "c": f"{__name__}:Address"},
    ],
    ids=repr,
)
def test_malformed_tags_raise_serialization_error(data: Any) -> None:
    with pytest.raises(SerializationError):
        decode(data, resolve)


def test_decode_resolves_classes_only_through_the_resolver() -> None:
    seen: list[str] = []

    def refusing(path: str) -> type[Any]:
        seen.append(path)
        raise SerializationError(f"not allowed: {path}")

    data = orjson.loads(orjson.dumps(encode({"a": Address("s", "z"), "c": Color.RED})))
    with pytest.raises(SerializationError, match="not allowed"):
        decode(data, refusing)
    assert seen == [f"{__name__}:Address"]


@pytest.mark.parametrize(
    ("data", "wrong"),
    [
        ({"__t": "enum", "c": "builtins:print", "v": "pwned"}, "enum"),
        ({"__t": "enum", "c": f"{__name__}:Address", "v": "x"}, "enum"),
        ({"__t": "m", "c": f"{__name__}:Address", "v": {}}, "m"),
        ({"__t": "dc", "c": f"{__name__}:Opaque", "f": {"x": 1}}, "dc"),
        ({"__t": "obj", "c": f"{__name__}:Opaque", "f": {"x": 1}}, "obj"),
    ],
    ids=["callable-as-enum", "class-as-enum", "class-as-model", "plain-as-dc", "plain-as-obj"],
)
def test_decode_checks_the_class_fits_the_tag(data: dict[str, Any], wrong: str) -> None:
    """A tag never calls or fills a class of the wrong kind (a signed payload is trusted,
    but a name is not a licence to call anything)."""
    with pytest.raises(SerializationError):
        decode(data, resolve)


class _Unhashable(type):
    """A metaclass whose classes cannot be hashed (the decoder's per-class cache must
    not refuse them)."""

    def __eq__(cls, other: object) -> bool:
        return cls is other

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Unhashable(metaclass=_Unhashable):
    a: Any = 0


def test_decode_of_a_class_that_cannot_be_hashed() -> None:
    for value in (1, "x", [2]):
        got = decode({"__t": "dc", "c": "m:Unhashable", "f": {"a": value}}, lambda p: Unhashable)
        assert type(got) is Unhashable and got.a == value


@pytest.mark.parametrize("named", [{"a": 1}, [1], int, print], ids=repr)
def test_decode_refuses_a_name_of_no_fitting_class_every_time(named: Any) -> None:
    """The kind check is remembered only for classes that fit: whatever the resolver
    gives that does not fit (not hashable either) is refused on every decode."""
    for _ in range(2):
        for tag in ("dc", "obj"):
            with pytest.raises(SerializationError, match="is not a class"):
                decode({"__t": tag, "c": "m:X", "f": {}}, lambda p: named)


def test_scalar_fields_decode_as_themselves() -> None:
    value = Address("s", "z")
    data = orjson.loads(orjson.dumps(encode({"a": [value, True, None, 1.5, 2**60]})))
    got = decode(data, resolve)
    assert got == {"a": [value, True, None, 1.5, 2**60]}
    row = decode(
        {"__t": "dc", "c": f"{__name__}:Address", "f": {"street": 1, "zip": None}}, resolve
    )
    assert (row.street, row.zip) == (1, None)


def test_module_docstring_lists_every_tag_the_encoder_emits() -> None:
    doc = serializer.__doc__ or ""
    for tag, _ in TAGGED:
        assert f"``{tag}``" in doc
    for tag in ("dc", "obj", "m"):
        assert f"``{tag}``" in doc
