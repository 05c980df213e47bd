"""One contract suite for keyed state, run over the heap and the RocksDB backend."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from asyncio_ops.state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ConfigurationError,
    HeapKeyedStateBackend,
    KeyedStateBackend,
    KeyGroupError,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RocksDBKeyedStateBackend,
    StateError,
    StateTtlConfig,
    UnsupportedKeyError,
    ValueState,
    ValueStateDescriptor,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from asyncio_ops.state import _backend as backend_module
from tests.helpers import unavailable

from .conftest import BackendFactory


class Average(AggregateFunction[float, tuple[float, int], float]):
    def create_accumulator(self) -> tuple[float, int]:
        return (0.0, 0)

    def add(self, value: float, accumulator: tuple[float, int]) -> tuple[float, int]:
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[float, int]) -> float:
        return accumulator[0] / accumulator[1]


KEYS: list[Any] = ["alice", 7, -1, 2**70, 1.5, None, b"\x00raw", (1, "a"), dt.date(2024, 1, 2)]


# -- value ----------------------------------------------------------------------------
def test_value_state_per_key(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ValueStateDescriptor[Any]("v"))
    for i, k in enumerate(KEYS):
        backend.set_current_key(k)
        assert s.value() is None
        s.update({"i": i})
    for i, k in enumerate(KEYS):
        backend.set_current_key(k)
        assert s.value() == {"i": i}
        assert backend.get_current_key() == k
    backend.set_current_key("alice")
    s.clear()
    assert s.value() is None
    backend.set_current_key(7)
    s.update(None)  # None clears
    assert s.value() is None
    backend.set_current_key(-1)
    assert s.value() == {"i": 2}


def test_equal_keys_share_state(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ValueStateDescriptor[str]("v"))
    backend.set_current_key(1)
    s.update("one")
    for same in (True, 1.0, Decimal(1), (1)):
        backend.set_current_key(same)
        assert s.value() == "one"


def test_get_state_returns_same_object_per_name_and_namespace(backend: KeyedStateBackend) -> None:
    d = ValueStateDescriptor[int]("v")
    assert backend.get_state(d) is backend.get_state(ValueStateDescriptor[int]("v"))
    assert backend.get_state(d, namespace="w1") is not backend.get_state(d)


def test_namespaces_are_separate(backend: KeyedStateBackend) -> None:
    d = ValueStateDescriptor[str]("v")
    a, b = backend.get_state(d, namespace="a"), backend.get_state(d, namespace=("w", 10))
    backend.set_current_key("k")
    a.update("in a")
    assert b.value() is None
    b.update("in b")
    assert a.value() == "in a"
    assert list(backend.keys("v", namespace="a")) == ["k"]
    assert list(backend.keys("v")) == []


# -- list -----------------------------------------------------------------------------
def test_list_state(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ListStateDescriptor[Any]("l"))
    backend.set_current_key("k1")
    assert s.get() == []
    s.add(1)
    s.add({"x": 2})
    s.add_all([3, 4])
    assert s.get() == [1, {"x": 2}, 3, 4]
    backend.set_current_key("k2")
    assert s.get() == []
    s.add_all([])
    assert s.get() == []
    s.update(["a", "b"])
    assert s.get() == ["a", "b"]
    s.update([])
    assert s.get() == []
    assert list(backend.keys("l")) == ["k1"]
    backend.set_current_key("k1")
    s.update(["z"])
    s.add("y")
    assert s.get() == ["z", "y"]
    s.clear()
    assert s.get() == []


def test_list_rejects_none(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ListStateDescriptor[Any]("l"))
    backend.set_current_key("k")
    with pytest.raises(StateError, match="None"):
        s.add(None)
    with pytest.raises(StateError, match="None"):
        s.add_all([1, None])
    assert s.get() == []  # add_all checks everything before adding anything


def test_list_returns_a_copy(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ListStateDescriptor[int]("l"))
    backend.set_current_key("k")
    s.add(1)
    got = s.get()
    got.append(2)
    assert s.get() == [1]


# -- map ------------------------------------------------------------------------------
def test_map_state(backend: KeyedStateBackend) -> None:
    s = backend.get_state(MapStateDescriptor[Any, Any]("m"))
    backend.set_current_key("k")
    assert s.is_empty()
    assert s.get("a") is None
    assert not s.contains("a")
    s.put("a", 1)
    s.put(("t", 2), [2])
    s.put_all({"c": 3, 4: "four"})
    s.put_all([("d", None)])
    assert s.get("a") == 1
    assert s.get(("t", 2)) == [2]
    assert s.contains("d") and s.get("d") is None  # None values are stored
    assert not s.is_empty()
    assert dict(s.items()) == {"a": 1, ("t", 2): [2], "c": 3, 4: "four", "d": None}
    assert set(s.keys()) == {"a", ("t", 2), "c", 4, "d"}
    assert sorted(map(repr, s.values())) == sorted(map(repr, [1, [2], 3, "four", None]))
    s.put("a", 10)
    assert s.get("a") == 10
    s.remove("a")
    s.remove("missing")
    assert not s.contains("a")
    backend.set_current_key("other")
    assert s.is_empty()
    assert list(s.items()) == []
    backend.set_current_key("k")
    s.clear()
    assert s.is_empty()
    assert list(backend.keys("m")) == []


def test_map_keys_need_canonical_encoding(backend: KeyedStateBackend) -> None:
    s = backend.get_state(MapStateDescriptor[Any, int]("m"))
    backend.set_current_key("k")
    with pytest.raises(UnsupportedKeyError, match="frozenset"):
        s.put(frozenset({1}), 1)


# -- reducing / aggregating -------------------------------------------------------------
def test_reducing_state(backend: KeyedStateBackend) -> None:
    s = backend.get_state(ReducingStateDescriptor[int]("sum", lambda a, b: a + b))
    backend.set_current_key("k")
    assert s.get() is None
    for i in range(1, 5):
        s.add(i)
    assert s.get() == 10
    backend.set_current_key("j")
    s.add(100)
    assert s.get() == 100
    backend.set_current_key("k")
    s.clear()
    assert s.get() is None
    with pytest.raises(StateError):
        s.add(None)  # type: ignore[arg-type]


def test_aggregating_state(backend: KeyedStateBackend) -> None:
    s = backend.get_state(AggregatingStateDescriptor("avg", Average()))
    backend.set_current_key("k")
    assert s.get() is None
    for v in (1.0, 2.0, 6.0):
        s.add(v)
    assert s.get() == 3.0
    s.clear()
    assert s.get() is None
    s.add(5.0)
    assert s.get() == 5.0


# -- keys, errors, lifecycle ---------------------------------------------------------------
def test_keys_lists_each_key_once(backend: KeyedStateBackend) -> None:
    lst = backend.get_state(ListStateDescriptor[int]("l"))
    m = backend.get_state(MapStateDescriptor[str, int]("m"))
    for k in KEYS:
        backend.set_current_key(k)
        lst.add_all([1, 2, 3])
        m.put_all({"a": 1, "b": 2})
    for name in ("l", "m"):
        got = list(backend.keys(name))
        assert len(got) == len(KEYS)
        assert set(map(repr, got)) == set(map(repr, KEYS))
    assert list(backend.keys("unknown")) == []


def test_state_without_current_key_is_an_error(backend: KeyedStateBackend) -> None:
    descs: list[Any] = [
        ValueStateDescriptor("v"),
        ListStateDescriptor("l"),
        MapStateDescriptor("m"),
        ReducingStateDescriptor("r", max),
        AggregatingStateDescriptor("a", Average()),
        ValueStateDescriptor("vt", ttl=StateTtlConfig(5)),
        ListStateDescriptor("lt", ttl=StateTtlConfig(5)),
    ]
    for d in descs:
        s: Any = backend.get_state(d)
        with pytest.raises(StateError, match="set_current_key"):
            s.clear()
    v: Any = backend.get_state(descs[0])
    with pytest.raises(StateError, match="set_current_key"):
        v.value()
    with pytest.raises(StateError, match="set_current_key"):
        v.update(1)
    lst: Any = backend.get_state(descs[1])
    with pytest.raises(StateError, match="set_current_key"):
        lst.add(1)
    assert backend.get_current_key() is None
    assert backend.current_key_group is None


def test_key_outside_range_is_an_error(make_backend: BackendFactory) -> None:
    kgr = compute_key_group_range_for_operator_index(128, 4, 1)
    b = make_backend(key_group_range=kgr)
    inside = next(k for k in range(1000) if assign_to_key_group(k, 128) in kgr)
    outside = next(k for k in range(1000) if assign_to_key_group(k, 128) not in kgr)
    b.set_current_key(inside)
    assert b.current_key_group == assign_to_key_group(inside, 128)
    with pytest.raises(KeyGroupError, match=rf"key group {assign_to_key_group(outside, 128)}"):
        b.set_current_key(outside)
    assert b.get_current_key() == inside  # unchanged by the failed call


def test_key_validation_survives_key_cache_eviction(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # set_current_key validates a key once and caches that (bounded): after the cache
    # is cleared, keys are validated again and their state is intact.
    monkeypatch.setattr(backend_module, "_KEY_CACHE_LIMIT", 4)
    kgr = compute_key_group_range_for_operator_index(128, 4, 1)
    b = make_backend(key_group_range=kgr)
    s = b.get_state(ValueStateDescriptor[int]("v"))
    inside = [k for k in range(2000) if assign_to_key_group(k, 128) in kgr][:20]
    outside = next(k for k in range(1000) if assign_to_key_group(k, 128) not in kgr)
    with pytest.raises(KeyGroupError):
        b.set_current_key(outside)
    with pytest.raises(StateError, match="set_current_key"):  # still no current key
        s.value()
    for _ in range(3):
        for k in inside:
            b.set_current_key(k)
            assert b.current_key_group == assign_to_key_group(k, 128)
            s.update((s.value() or 0) + k)
        with pytest.raises(KeyGroupError):
            b.set_current_key(outside)
        assert b.get_current_key() == inside[-1]
        assert b.current_key_group == assign_to_key_group(inside[-1], 128)
    for k in inside:
        b.set_current_key(k)
        assert s.value() == (3 * k or None)
    assert sorted(b.keys("v")) == sorted(k for k in inside if k)


def test_unsupported_key_is_an_error(backend: KeyedStateBackend) -> None:
    with pytest.raises(UnsupportedKeyError, match="list"):
        backend.set_current_key([1, 2])
    with pytest.raises(UnsupportedKeyError, match="object"):
        backend.set_current_key(object())
    with pytest.raises(UnsupportedKeyError):
        backend.get_state(ValueStateDescriptor[int]("v"), namespace=object())


def test_same_name_other_kind_is_an_error(backend: KeyedStateBackend) -> None:
    backend.get_state(ValueStateDescriptor[int]("x"))
    with pytest.raises(StateError, match="registered as value state"):
        backend.get_state(ListStateDescriptor[int]("x"))
    with pytest.raises(StateError, match="ttl"):
        backend.get_state(ValueStateDescriptor[int]("x", ttl=StateTtlConfig(1)))


def test_closed_backend_refuses_work(make_backend: BackendFactory) -> None:
    b = make_backend()
    b.close()
    b.close()  # idempotent
    assert b.closed
    with pytest.raises(StateError, match="closed"):
        b.get_state(ValueStateDescriptor[int]("v"))
    with pytest.raises(StateError, match="closed"):
        b.snapshot()


def test_custom_serializer_is_used(make_backend: BackendFactory) -> None:
    class Upper:
        def __init__(self) -> None:
            self.calls = 0

        def dumps(self, obj: Any) -> bytes:
            self.calls += 1
            return str(obj).upper().encode()

        def loads(self, data: bytes | memoryview) -> Any:
            return bytes(data).decode()

    ser = Upper()
    b = make_backend()
    s = b.get_state(ValueStateDescriptor[str]("v", serializer=ser))
    b.set_current_key("k")
    s.update("abc")
    snap = b.snapshot()
    assert ser.calls >= 1
    other = make_backend()
    other.restore(snap)
    s2 = other.get_state(ValueStateDescriptor[str]("v", serializer=ser))
    other.set_current_key("k")
    assert s2.value() == "ABC"


def test_bad_configuration() -> None:
    with pytest.raises(KeyGroupError):
        HeapKeyedStateBackend(max_parallelism=0, key_group_range=KeyGroupRange(0, 0))
    with pytest.raises(KeyGroupError, match="exceeds"):
        HeapKeyedStateBackend(max_parallelism=8, key_group_range=KeyGroupRange(0, 8))
    with pytest.raises(ConfigurationError, match="clock"):
        HeapKeyedStateBackend(
            max_parallelism=8, key_group_range=KeyGroupRange(0, 7), clock=object()
        )
    with pytest.raises(ConfigurationError, match="name"):
        ValueStateDescriptor[int]("")
    with pytest.raises(ConfigurationError, match="reduce_fn"):
        ReducingStateDescriptor[int]("r", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="aggregate_fn"):
        AggregatingStateDescriptor("a", object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="serializer"):
        ValueStateDescriptor[int]("v", serializer=object())  # type: ignore[arg-type]


def test_rocksdb_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("do not delete")
    with pytest.raises(ConfigurationError, match="not empty"):
        RocksDBKeyedStateBackend(
            path=tmp_path, max_parallelism=8, key_group_range=KeyGroupRange(0, 7)
        )
    assert (tmp_path / "precious.txt").exists()


def test_rocksdb_reuses_its_own_directory_and_deletes_it_on_close(tmp_path: Path) -> None:
    path = tmp_path / "db"
    # What a crashed worker leaves behind: a marked working directory with data.
    path.mkdir()
    (path / ".asyncio_ops_rocksdb").write_text("")
    (path / "leftover").write_text("stale")
    first = RocksDBKeyedStateBackend(
        path=path, max_parallelism=8, key_group_range=KeyGroupRange(0, 7)
    )
    assert not (path / "leftover").exists()
    s = first.get_state(ValueStateDescriptor[int]("v"))
    first.set_current_key("k")
    s.update(1)
    first.close()  # releases the lock although `s` is still referenced
    assert not path.exists()
    second = RocksDBKeyedStateBackend(
        path=path, max_parallelism=8, key_group_range=KeyGroupRange(0, 7)
    )
    s2 = second.get_state(ValueStateDescriptor[int]("v"))
    second.set_current_key("k")
    assert s2.value() is None
    second.close()


def test_the_heap_backend_uses_its_c_accelerator_when_built() -> None:
    from asyncio_ops.state import _heap

    if _heap._heapfast is None:  # no compiler at install: the Python classes serve
        unavailable("asyncio_ops.state._heapfast was not built (no C compiler?)")
    b = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    state = b.get_state(ValueStateDescriptor[int]("v"))
    assert isinstance(state, _heap._heapfast.ValueCell) and isinstance(state, ValueState)
    assert type(b.set_current_key).__name__ == "builtin_function_or_method"
    b.set_current_key("a")
    state.update(3)
    assert (state.value(), b.get_current_key(), list(b.keys("v"))) == (3, "a", ["a"])
