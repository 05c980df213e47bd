"""Typed state: declared Spark types, checked on write, Arrow columns in snapshots, evolution."""

from __future__ import annotations

import datetime as dt
import re
from collections import namedtuple
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops import IncompatibleStateError, StateTypeError
from asyncio_ops._storage._container import Kind, Section, decode, encode
from asyncio_ops.state import (
    ConfigurationError,
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from asyncio_ops.state._blob import KEYED_STATE
from asyncio_ops.state._keyed_snapshot import apply_change, key_group_sections
from asyncio_ops.state._types import StateType, _Misfit
from asyncio_ops.testing import ManualClock

from .conftest import BackendFactory
from .test_incremental_snapshot import timers_of

UTC = dt.UTC
EVENT = "struct<t timestamp, v double>"
SEEN = "struct<n long, last timestamp>"


def _fill(backend: KeyedStateBackend) -> dict[str, Any]:
    count = backend.get_state(ValueStateDescriptor("count", "long"))
    events = backend.get_state(ListStateDescriptor("events", EVENT))
    seen = backend.get_state(MapStateDescriptor("seen", "string", SEEN))
    money = backend.get_state(ValueStateDescriptor("money", "decimal(10,2)"))
    tags = backend.get_state(ValueStateDescriptor("tags", "map<string,array<date>>"))
    untyped = backend.get_state(ValueStateDescriptor("any"))
    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    for key in range(40):
        backend.set_current_key(key)
        count.update(key * 10)
        events.add({"t": t0, "v": key / 2})
        events.add({"t": None, "v": 1})  # an int into a double: normalised to 1.0
        seen.put(f"a{key}", {"n": key, "last": t0})
        seen.put("b", {"n": None})  # a missing field is null
        money.update(Decimal("1.5") + key)
        tags.update({"x": [dt.date(2026, 1, key % 28 + 1)], "y": []})
        untyped.update({"anything": {1, 2}})
    return {"count": count, "events": events, "seen": seen, "money": money, "tags": tags,
            "any": untyped}  # fmt: skip


def _read(backend: KeyedStateBackend) -> dict[int, tuple[Any, ...]]:
    count = backend.get_state(ValueStateDescriptor("count", "long"))
    events = backend.get_state(ListStateDescriptor("events", EVENT))
    seen = backend.get_state(MapStateDescriptor("seen", "string", SEEN))
    money = backend.get_state(ValueStateDescriptor("money", "decimal(10,2)"))
    tags = backend.get_state(ValueStateDescriptor("tags", "map<string,array<date>>"))
    untyped = backend.get_state(ValueStateDescriptor("any"))
    out = {}
    for key in range(40):
        backend.set_current_key(key)
        out[key] = (count.value(), events.get(), dict(seen.items()), money.value(),
                    tags.value(), untyped.value())  # fmt: skip
    return out


def test_typed_values_come_back_normalised_before_and_after_a_snapshot(
    make_backend: BackendFactory, any_backend_factory: Callable[[str], BackendFactory]
) -> None:
    source = make_backend()
    _fill(source)
    before = _read(source)
    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert before[3] == (
        30,
        [{"t": t0, "v": 1.5}, {"t": None, "v": 1.0}],
        {"a3": {"n": 3, "last": t0}, "b": {"n": None, "last": None}},
        Decimal("4.50"),
        {"x": [dt.date(2026, 1, 4)], "y": []},
        {"anything": {1, 2}},
    )
    assert type(before[3][1][1]["v"]) is float
    blobs = source.snapshot()
    for kind in ("heap", "rocksdb"):  # each backend restores what either wrote
        target = any_backend_factory(kind)()
        target.restore(blobs)
        assert _read(target) == before


def test_a_typed_state_is_an_arrow_column_of_its_type_never_bytes(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend()
    _fill(backend)
    _, blob = next(iter(backend.snapshot().items()))
    (section,) = decode(blob, KEYED_STATE, "test")
    table = section.table
    assert table.schema.field("typed:count").type == pa.int64()
    assert table.schema.field("typed:events").type == pa.struct(
        [("t", pa.timestamp("us", tz="UTC")), ("v", pa.float64())]
    )
    seen = table.schema.field("typed:seen")
    assert seen.metadata == {b"aops.key_type": b"string"}
    rows = table.to_pylist()
    typed_rows = [r for r in rows if r["state"] != "any"]
    assert typed_rows and all(r["value"] is None for r in typed_rows)
    assert all(r[f"typed:{r['state']}"] is not None for r in typed_rows)
    untyped_rows = [r for r in rows if r["state"] == "any"]
    assert untyped_rows and all(r["value"].startswith(b"\x80") for r in untyped_rows)  # pickle


def test_the_incremental_sections_carry_typed_columns_too(make_backend: BackendFactory) -> None:
    backend = make_backend()
    timers = timers_of(backend)
    _fill(backend)
    before = _read(backend)
    sections = key_group_sections(backend, timers)  # built as encode takes them
    data, _ = encode(Kind.KEY_GROUPS, sections)
    target = make_backend()
    target_timers = timers_of(target)
    for section in decode(data, Kind.KEY_GROUPS, "test"):
        assert any(n.startswith("typed:") for n in section.table.schema.names)
        apply_change(target, target_timers, Section(section.tag, section.table), "test")
    assert _read(target) == before


def test_one_delta_section_of_many_key_groups_carries_typed_columns(
    make_backend: BackendFactory,
) -> None:
    """The deltas of every key group touched are one packed section through a container:
    typed states' columns travel in it, and each key group applies as written."""
    from asyncio_ops._storage._container import SHARED
    from asyncio_ops.state._keyed_snapshot import snapshot_changes

    backend = make_backend()
    timers = timers_of(backend)
    _fill(backend)
    backend.track_changes()
    base = list(key_group_sections(backend, timers))  # built now, before the changes
    _fill(backend)  # every key made current again, the same values but the counts
    count = backend.get_state(ValueStateDescriptor("count", "long"))
    for key in range(0, 40, 3):
        backend.set_current_key(key)
        count.update(-key)
    changes = snapshot_changes(backend, timers, full=())
    (shared,) = {id(s): s for s in changes.deltas.values()}.values()
    assert shared.tag == SHARED and any(n.startswith("typed:") for n in shared.table.schema.names)
    expected = _read(backend)
    data, _ = encode(Kind.KEY_GROUPS, [*base, shared])
    target = make_backend()
    target_timers = timers_of(target)
    for section in decode(data, Kind.KEY_GROUPS, "test"):
        apply_change(target, target_timers, section, "test")
    assert _read(target) == expected


def test_a_value_that_does_not_fit_names_the_state_the_key_and_the_value(
    backend: KeyedStateBackend,
) -> None:
    count = backend.get_state(ValueStateDescriptor("count", "long"))
    events = backend.get_state(ListStateDescriptor("events", EVENT))
    seen = backend.get_state(MapStateDescriptor("seen", "string", SEEN))
    backend.set_current_key("user-7")
    count.update(1)
    with pytest.raises(StateTypeError, match=r"state 'count', key 'user-7': value 'x'.*bigint"):
        count.update("x")
    assert count.value() == 1  # nothing written
    with pytest.raises(StateTypeError, match=r"out of the range of bigint"):
        count.update(1 << 70)
    with pytest.raises(StateTypeError, match=r"state 'events'.*element \{'v': 'slow'\}.*field 'v'"):
        events.add_all([{"v": 1.0}, {"v": "slow"}])
    assert events.get() == []  # all checked before any is added
    with pytest.raises(StateTypeError, match=r"field\(s\) \['w'\] are not in"):
        events.add({"v": 1.0, "w": 2})
    with pytest.raises(StateTypeError, match=r"state 'seen'.*map key 5"):
        seen.put(5, {"n": 1})
    with pytest.raises(StateTypeError, match=r"map value.*field 'last'.*not a datetime"):
        seen.put("a", {"last": "2026-01-01"})
    with pytest.raises(StateTypeError, match=r"bool is not a bigint"):
        count.update(True)
    assert isinstance(StateTypeError("x"), TypeError)


def test_struct_values_accept_dicts_rows_named_tuples_and_tuples(
    backend: KeyedStateBackend,
) -> None:
    seen = backend.get_state(ValueStateDescriptor("seen", SEEN))
    backend.set_current_key(1)
    t = dt.datetime(2026, 5, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    expected = {"n": 1, "last": dt.datetime(2026, 5, 1, 10, tzinfo=UTC)}
    Seen = namedtuple("Seen", "n last")

    class Row(tuple):  # what pyspark's Row offers: asDict()
        def asDict(self) -> dict[str, Any]:
            return {"last": self[1], "n": self[0]}

    for given_value in ({"n": 1, "last": t}, Seen(1, t), (1, t), Row((1, t))):
        seen.update(given_value)
        assert seen.value() == expected


def test_descriptors_parse_ddl_and_refuse_what_is_not_a_type() -> None:
    d = MapStateDescriptor("seen", "string", "n long, last timestamp")
    assert d.value_type is not None and d.value_type.ddl == "struct<n:bigint,last:timestamp>"
    assert d == MapStateDescriptor("seen", "string", "struct<n: bigint, last: timestamp>")
    assert ValueStateDescriptor("c", "long") != ValueStateDescriptor("c")
    with pytest.raises(ConfigurationError, match=r"state 'c': type 'lng': unknown type 'lng'"):
        ValueStateDescriptor("c", "lng")
    with pytest.raises(ConfigurationError, match=r"both key_type and value_type"):
        MapStateDescriptor("m", "string")
    with pytest.raises(ConfigurationError, match=r"not an atomic type"):
        MapStateDescriptor("m", "array<int>", "long")
    with pytest.raises(ConfigurationError, match=r"takes no serializer"):
        ValueStateDescriptor("c", "long", serializer=_Plain())


class _Plain:
    def dumps(self, v: Any) -> bytes:
        return repr(v).encode()

    def loads(self, b: bytes) -> Any:
        return b


def test_a_second_descriptor_of_another_type_is_refused(backend: KeyedStateBackend) -> None:
    backend.get_state(ValueStateDescriptor("c", "long"))
    with pytest.raises(Exception, match=r"registered as value state.*type=bigint"):
        backend.get_state(ValueStateDescriptor("c", "int"))


def test_typed_state_with_ttl_keeps_its_timestamps(make_backend: BackendFactory) -> None:
    clock = ManualClock(100.0)
    backend = make_backend(clock=clock)
    ttl = StateTtlConfig(10)
    events = backend.get_state(ListStateDescriptor("events", "long", ttl=ttl))
    backend.set_current_key(1)
    events.add(1)
    clock.advance(5)
    events.add(2)
    restored = make_backend(clock=clock)
    restored.restore(backend.snapshot())
    state = restored.get_state(ListStateDescriptor("events", "long", ttl=ttl))
    restored.set_current_key(1)
    clock.advance(6)  # the first element is 11 s old, the second 6 s
    assert state.get() == [2]


# -- evolution ---------------------------------------------------------------------------
def _evolve(make: BackendFactory, old: Any, new: Any, values: list[Any]) -> list[Any]:
    """Write ``values`` as list state of ``old`` type, restore as ``new``; read them back."""
    source = make()
    state = source.get_state(old)
    source.set_current_key("k")
    state.update(values)
    target = make()
    target.restore(source.snapshot())
    restored = target.get_state(new)
    target.set_current_key("k")
    return list(restored.get())


def test_compatible_changes_restore_old_values_in_the_new_shape(
    make_backend: BackendFactory,
) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
    old = ListStateDescriptor("e", "struct<t timestamp, v float, n int, gone string>")
    new = ListStateDescriptor("e", "struct<n bigint, v double, t timestamp, added string>")
    got = _evolve(make_backend, old, new, [{"t": t0, "v": 0.5, "n": 3, "gone": "x"}])
    assert got == [{"n": 3, "v": 0.5, "t": t0, "added": None}]
    for before, after, value, expected in [
        ("tinyint", "bigint", 7, 7),
        ("int", "double", 7, 7.0),
        ("float", "double", 0.25, 0.25),
        ("int", "decimal(12,2)", 7, Decimal("7.00")),
        ("decimal(5,2)", "decimal(10,3)", Decimal("1.25"), Decimal("1.250")),
        ("array<int>", "array<bigint>", [1, None], [1, None]),
        ("map<string,int>", "map<string,double>", {"a": 1}, {"a": 1.0}),
    ]:
        got = _evolve(make_backend, ListStateDescriptor("x", before),
                      ListStateDescriptor("x", after), [value])  # fmt: skip
        assert got == [expected], (before, after)
        assert type(got[0]) is type(expected)


@pytest.mark.parametrize(
    ("old", "new", "value", "why"),
    [
        (ValueStateDescriptor("s", "bigint"), ValueStateDescriptor("s", "int"), 1,
         r"bigint -> int narrows"),
        (ValueStateDescriptor("s", "bigint"), ValueStateDescriptor("s", "double"), 1,
         r"loses precision"),
        (ValueStateDescriptor("s", "string"), ValueStateDescriptor("s", "bigint"), "v",
         r"string -> bigint is not a widening"),
        (ValueStateDescriptor("s", "struct<a int>"), ValueStateDescriptor("s", "struct<a string>"),
         {"a": 1}, r"int -> string \(at a\)"),
        (ValueStateDescriptor("s", "bigint"), ValueStateDescriptor("s"), 1,
         r"typed state cannot become untyped"),
        (ValueStateDescriptor("s"), ValueStateDescriptor("s", "bigint"), 1,
         r"typed and untyped .* do not convert"),
        (ValueStateDescriptor("s", "bigint"), ListStateDescriptor("s", "bigint"), 1,
         r"the kind of state changed"),
        (MapStateDescriptor("s", "string", "int"), MapStateDescriptor("s", "bigint", "int"), 1,
         r"map key type changed"),
    ],
)  # fmt: skip
def test_incompatible_changes_are_refused_naming_both_types(
    make_backend: BackendFactory, old: Any, new: Any, value: Any, why: str
) -> None:
    source = make_backend()
    state = source.get_state(old)
    source.set_current_key("k")
    if old.kind == "map":
        state.put("a", value)
    else:
        state.update(value)
    target = make_backend()
    target.restore(source.snapshot())
    with pytest.raises(Exception, match=r"state 's'") as info:
        target.get_state(new)
    message = str(info.value)
    if old.kind != new.kind:  # the backend's own check of kinds
        assert "was restored as value state" in message
        return
    assert isinstance(info.value, IncompatibleStateError)
    assert re.search(why, message), message
    assert "the checkpoint holds" in message and "new state name" in message  # what to do


# -- the type round trip, as a property ---------------------------------------------------
_ATOMS: dict[str, Any] = {
    "bigint": st.integers(-(1 << 63), (1 << 63) - 1),
    "int": st.integers(-(1 << 31), (1 << 31) - 1),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=20),
    "binary": st.binary(max_size=20),
    "boolean": st.booleans(),
    "date": st.dates(),
    "timestamp": st.datetimes(timezones=st.just(UTC)),
    "timestamp_ntz": st.datetimes(),
    "decimal(12,3)": st.decimals(min_value=-(10**8), max_value=10**8, places=3,
                                 allow_nan=False, allow_infinity=False),
}  # fmt: skip


@st.composite
def _typed_values(draw: st.DrawFn, depth: int = 2) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["atom", "atom", "array", "map", "struct"] if depth else ["atom"]))
    if kind == "atom":
        ddl = draw(st.sampled_from(sorted(_ATOMS)))
        return ddl, _ATOMS[ddl]
    if kind == "array":
        ddl, inner = draw(_typed_values(depth - 1))
        return f"array<{ddl}>", st.lists(st.one_of(st.none(), inner), max_size=3)
    if kind == "map":
        ddl, inner = draw(_typed_values(depth - 1))
        return f"map<string,{ddl}>", st.dictionaries(st.text(max_size=5), inner, max_size=3)
    n = draw(st.integers(1, 3))
    parts = [draw(_typed_values(depth - 1)) for _ in range(n)]
    ddl = "struct<" + ", ".join(f"f{i} {d}" for i, (d, _) in enumerate(parts)) + ">"
    return ddl, st.fixed_dictionaries(
        {f"f{i}": st.one_of(st.none(), s) for i, (_, s) in enumerate(parts)}
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fit_column_values_and_bytes_round_trip(data: st.DataObject) -> None:
    ddl, values = data.draw(_typed_values())
    t = StateType.of(ddl)
    assert StateType.of(t.ddl) == t  # the DDL it shows parses back to it
    value = t.fit(data.draw(values))
    assert t.fit(value) == value  # normalised values are fixed points
    assert t.values(t.column([value])) == [value]  # an Arrow column and back
    assert t.decode(t.encode(value)) == value  # a RocksDB working copy's bytes


def test_misfits_say_where() -> None:
    t = StateType.of("struct<a array<map<string,int>>>")
    with pytest.raises(_Misfit, match=r"field 'a': element 0: map value of 'k': str is not a"):
        t.fit({"a": [{"k": "x"}]})
    with pytest.raises(_Misfit, match=r"more than 2 decimal places"):
        StateType.of("decimal(5,2)").fit(Decimal("1.234"))
    with pytest.raises(_Misfit, match=r"aware datetime is not a timestamp_ntz"):
        StateType.of("timestamp_ntz").fit(dt.datetime(2026, 1, 1, tzinfo=UTC))


def test_restore_of_one_key_group_keeps_typed_state_of_others_apart() -> None:
    # rescaling: each new backend takes only its key groups' typed rows
    from asyncio_ops.state import HeapKeyedStateBackend

    source = HeapKeyedStateBackend(max_parallelism=8, key_group_range=KeyGroupRange(0, 7))
    count = source.get_state(ValueStateDescriptor("count", "long"))
    for key in range(50):
        source.set_current_key(key)
        count.update(key)
    blobs = source.snapshot()
    seen: dict[int, int] = {}
    for r in (KeyGroupRange(0, 3), KeyGroupRange(4, 7)):
        part = HeapKeyedStateBackend(max_parallelism=8, key_group_range=r)
        part.restore(blobs)
        state = part.get_state(ValueStateDescriptor("count", "long"))
        for key in part.keys("count"):
            part.set_current_key(key)
            seen[key] = state.value()
    assert seen == {k: k for k in range(50)}


def test_key_groups_restored_in_an_older_and_a_newer_type_read_in_the_newer(
    make_backend: BackendFactory,
) -> None:
    # a chain written across a change of type: one key group's delta in the new type,
    # another key group still only in the old one (its keys untouched since)
    old = make_backend()
    count = old.get_state(ValueStateDescriptor("count", "int"))
    keys = {}
    for key in range(30):
        old.set_current_key(key)
        count.update(key)
        keys.setdefault(old.key_group_of(key), key)
    first, second = sorted(keys)[:2]
    old_blobs = old.snapshot()
    new = make_backend()
    wide = new.get_state(ValueStateDescriptor("count", "bigint"))
    new.set_current_key(keys[first])
    wide.update(1 << 40)
    target = make_backend()
    target.restore({first: old_blobs[first]})
    target.restore({first: new.snapshot()[first]})  # merges: the delta's key overwritten
    target.restore({second: old_blobs[second]})
    state = target.get_state(ValueStateDescriptor("count", "bigint"))
    target.set_current_key(keys[first])
    assert state.value() == 1 << 40
    target.set_current_key(keys[second])
    assert state.value() == keys[second]


class _Mean:
    """An AggregateFunction whose accumulator is a struct<sum double, n long>."""

    def create_accumulator(self) -> dict[str, Any]:
        return {"sum": 0.0, "n": 0}

    def add(self, value: Any, acc: dict[str, Any]) -> Any:
        if value == "break it":
            return {"sum": "not a number", "n": acc["n"]}
        return {"sum": acc["sum"] + value, "n": acc["n"] + 1}

    def get_result(self, acc: dict[str, Any]) -> float:
        return float(acc["sum"] / acc["n"])

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"sum": a["sum"] + b["sum"], "n": a["n"] + b["n"]}


def _reduce(a: Any, b: Any) -> Any:
    return "a string" if b == -1 else a + b


def test_reducing_and_aggregating_state_can_be_typed(
    make_backend: BackendFactory, any_backend_factory: Callable[[str], BackendFactory]
) -> None:
    """A typed reducing state checks what reduce_fn returns, a typed aggregating state
    the accumulator add returns, before keeping it (a misfit names the state, the key
    and the value; nothing kept); both are Arrow columns of their type in a snapshot
    and restore in either backend."""
    from asyncio_ops.state import AggregatingStateDescriptor, ReducingStateDescriptor

    backend = make_backend()
    total = backend.get_state(ReducingStateDescriptor("total", _reduce, "long"))
    acc = "struct<sum double, n long>"
    mean = backend.get_state(AggregatingStateDescriptor("mean", _Mean(), acc))
    for key in range(10):
        backend.set_current_key(key)
        for v in range(key + 1):
            total.add(v)
            mean.add(v)
    backend.set_current_key(4)
    with pytest.raises(StateTypeError, match=r"state 'total', key 4: reduced value 'a string'"):
        total.add(-1)
    with pytest.raises(StateTypeError, match=r"state 'mean', key 4: accumulator .*'sum'"):
        mean.add("break it")
    assert total.get() == 10 and mean.get() == 2.0  # nothing kept
    _, blob = next(iter(backend.snapshot().items()))
    (section,) = decode(blob, KEYED_STATE, "test")
    assert section.table.schema.field("typed:total").type == pa.int64()
    assert section.table.schema.field("typed:mean").type == pa.struct(
        [("sum", pa.float64()), ("n", pa.int64())]
    )
    blobs = backend.snapshot()
    for kind in ("heap", "rocksdb"):
        target = any_backend_factory(kind)()
        target.restore(blobs)
        t = target.get_state(ReducingStateDescriptor("total", _reduce, "long"))
        m = target.get_state(AggregatingStateDescriptor("mean", _Mean(), acc))
        for key in range(10):
            target.set_current_key(key)
            assert t.get() == key * (key + 1) // 2 and m.get() == key / 2
