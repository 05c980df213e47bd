"""Constructors of slotted objects (``asyncio_ops._construct``): in C and in Python, an
object built by one is the object its class builds, and anything else is refused."""

from __future__ import annotations

import gc
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops import _construct
from asyncio_ops._elements import Record, Watermark
from asyncio_ops._engine._operator_snapshot import SnapshotEntry
from asyncio_ops._native import in_use
from asyncio_ops._runtime._adapters import RowValue

from .helpers import unavailable

ENTRY = ("element", "results", "key", "attempts", "deadline")


@pytest.fixture(params=["c", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "c":
        if _construct._CConstructor is None:  # no compiler at install: the fallback serves
            unavailable("asyncio_ops._slotsfast was not built (no C compiler?)")
        monkeypatch.delenv("ASYNCIO_OPS_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("ASYNCIO_OPS_PURE_PYTHON", "1")
    assert in_use(_construct._CConstructor) == (request.param == "c")
    yield request.param


values = st.none() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
rows = st.dictionaries(st.text(max_size=3), values, max_size=3)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # set once, for all
@given(
    row=rows, late=st.none() | st.booleans(), position=st.integers(-10, 10),
    timestamp=st.none() | st.floats(allow_nan=False), results=st.none() | st.tuples(rows),
    key=values, attempts=st.integers(0, 5), deadline=st.none() | st.floats(allow_nan=False),
)  # fmt: skip
def test_an_object_built_by_a_constructor_is_the_object_its_class_builds(
    path: str, row: dict[str, Any], late: bool | None, position: int,
    timestamp: float | None, results: tuple[Any, ...] | None, key: Any, attempts: int,
    deadline: float | None,
) -> None:  # fmt: skip
    new_value = _construct.constructor(RowValue, ("row", "late", "position"))
    new_record = _construct.constructor(Record, ("value", "timestamp"))
    new_entry = _construct.constructor(SnapshotEntry, ENTRY)
    value = new_value(row, late, position)
    assert type(value) is RowValue
    assert (value.row, value.late, value.position) == (row, late, position)
    assert repr(value) == repr(RowValue(row, late, position))
    record = new_record(value, timestamp)
    entry = new_entry(record, results, key, attempts, deadline)
    expected = SnapshotEntry(Record(value, timestamp), results, key, attempts, deadline)
    assert type(entry) is SnapshotEntry and type(entry.element) is Record
    assert entry == expected and repr(entry) == repr(expected)
    # frozen, hashable and picklable as the class's own (a value without a dict row)
    plain = new_entry(new_record(key, timestamp), results, key, attempts, deadline)
    twin = SnapshotEntry(Record(key, timestamp), results, key, attempts, deadline)
    if results is None:  # (results of dicts are not hashable, either way)
        assert hash(plain) == hash(twin)
    assert pickle.loads(pickle.dumps(plain)) == twin
    with pytest.raises(AttributeError):
        entry.attempts = 9  # type: ignore[misc]
    assert gc.is_tracked(entry) and gc.is_tracked(value)


def test_a_constructor_holds_its_values_as_the_class_does(path: str) -> None:
    """References: each value is held once by the object built, and freed with it; a
    cycle through an object built is collected."""
    held = object()
    before = sys.getrefcount(held)
    new_value = _construct.constructor(RowValue, ("row", "late", "position"))
    built = [new_value(held, held, None) for _ in range(1000)]
    assert sys.getrefcount(held) == before + 2000
    del built
    assert sys.getrefcount(held) == before
    cycle: list[Any] = []
    value = new_value(cycle, None, None)
    cycle.append(value)
    del value, cycle
    assert gc.collect() >= 2  # the list and the object built, unreachable together


def test_a_constructor_refuses_what_it_cannot_build(path: str) -> None:
    with pytest.raises(TypeError, match=r"sets \['timestamp', 'value'\], not the parameters"):
        _construct.constructor(Record, ("timestamp", "value"))  # the fields out of order
    with pytest.raises(TypeError, match="not the parameters"):
        _construct.constructor(Record, ("value",))

    class Plain:  # instances with a __dict__
        def __init__(self, a: Any) -> None:
            self.a = a

    with pytest.raises(TypeError, match="Plain has a __dict__"):
        _construct.constructor(Plain, ("a",))

    class Derived(Watermark):  # a slot of the base class, not of its own
        __slots__ = ()

    with pytest.raises(TypeError, match="timestamp"):
        _construct.constructor(Derived, ("timestamp",))


def test_the_c_constructor_takes_every_field_positionally() -> None:
    if _construct._CConstructor is None:
        unavailable("asyncio_ops._slotsfast was not built (no C compiler?)")
    make = _construct._CConstructor(Record, ("value", "timestamp"))
    assert make(1, 2.0) == Record(1, 2.0)
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        make(1)
    with pytest.raises(TypeError, match="positional arguments only"):
        make(1, timestamp=2.0)
    assert repr(make) == "<constructor of Record>"
