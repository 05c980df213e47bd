"""A bulk load (every key new, every key group written in full) takes shortcuts that must
not show: a key group's full section built as columns is the very table the entries
make, and a key new to an empty backend reads None without a lookup until written."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from asyncio_ops._keygroups import canonical_bytes
from asyncio_ops._storage._container import Kind, _ipc
from asyncio_ops.state import (
    HeapKeyedStateBackend,
    KeyedStateBackend,
    KeyGroupError,
    KeyGroupRange,
    ListStateDescriptor,
    RocksDBKeyedStateBackend,
    StateError,
    StateTtlConfig,
    UnsupportedKeyError,
    ValueStateDescriptor,
)
from asyncio_ops.state._keycodec import byte_rows, int_key_column, int_key_rows, key_prefix
from asyncio_ops.state._payloads import table, value_key_group_table

from .conftest import BackendFactory

GROUPS = KeyGroupRange(0, 7)
COUNT = ValueStateDescriptor[int]("count")


def _fill(b: KeyedStateBackend, keys: list[object], namespaces: bool) -> None:
    count = b.get_state(COUNT)
    raw = ValueStateDescriptor("raw")  # untyped: the serializer's bytes
    plain = b.get_state(raw)
    other = b.get_state(raw, namespace="w") if namespaces else None
    for i, k in enumerate(keys):
        b.set_current_key(k)
        count.update(i % 97)
        if i % 3 == 0:
            plain.update({"x": i})
        if other is not None and i % 5 == 0:
            other.update(i)


def test_integer_keys_canonical_bytes_sorted_as_arrays() -> None:
    rng = random.Random(3)
    keys: list[object] = [rng.randint(-(2**63), 2**63 - 1) for _ in range(500)]
    keys += [0, 1, -1, 255, 256, 2**63 - 1, -(2**63)]
    found = int_key_column(keys)
    assert found is not None
    order, column = found
    assert column.to_pylist() == sorted(canonical_bytes(k) for k in keys)
    assert [canonical_bytes(keys[i]) for i in order] == column.to_pylist()
    # not all plain int64 ints: the row-by-row path
    assert int_key_column([1, True]) is None
    assert int_key_column([1, 2**64]) is None
    assert int_key_column([1, "a"]) is None
    # RocksDB's row prefixes of them, as arrays
    groups = [rng.randrange(0, 2**15) for _ in keys]
    rows = int_key_rows(keys, groups)
    assert rows is not None
    assert byte_rows(rows) == list(map(key_prefix, groups, map(canonical_bytes, keys)))
    assert int_key_rows([1, True], [0, 0]) is None
    assert int_key_rows([1, 2**64], [0, 0]) is None
    assert int_key_rows([], []) is None


def test_a_full_section_as_columns_is_the_table_of_its_entries(
    make_backend: BackendFactory, backend_kind: str
) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    # RocksDB cuts rows of one length: one namespace here (the heap takes any)
    _fill(b, random.Random(5).sample(range(-(10**12), 10**12), 2000), backend_kind != "rocksdb")
    for kg in GROUPS:
        runs = b.value_runs(kg)
        assert runs is not None
        fast = value_key_group_table(runs)
        slow = table(Kind.KEY_GROUPS, (b.dump((kg,))[kg], [], None))
        assert fast.equals(slow)
        assert _ipc(fast).to_pybytes() == _ipc(slow).to_pybytes()  # the bytes written


@pytest.mark.parametrize("what", ["string keys of two lengths", "list state", "ttl"])
def test_state_it_cannot_cut_into_columns_is_dumped(
    make_backend: BackendFactory, what: str
) -> None:
    b = make_backend(max_parallelism=1, key_group_range=KeyGroupRange(0, 0))
    if what == "list state":
        b.get_state(ListStateDescriptor[int]("l"))
    if what == "ttl":
        b.get_state(ValueStateDescriptor[int]("t", ttl=StateTtlConfig(60.0)))
    _fill(b, ["a", "bb"] if what.startswith("string") else [1, 2], False)
    assert b.value_runs(0) is None


def test_a_new_key_of_an_empty_backend_reads_none_until_written(
    make_backend: BackendFactory,
) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    b.require_assigned_groups()
    count = b.get_state(COUNT)
    b.track_changes(keys=False)
    for key in (5, 6, 5, 7, 5):  # 5 again: its written count, never a fresh None
        b.assign_key_group(key, key % 8)
        b.set_current_key(key)
        count.update((count.value() or 0) + 1)
    b.assign_key_group(8, 0)
    b.set_current_key(8)
    assert count.value() is None  # read, not written
    assert count.value() is None
    for key, n in ((5, 3), (6, 1), (7, 1)):
        b.set_current_key(key)
        assert count.value() == n
    b.set_current_key(8)
    count.update(4)
    assert count.value() == 4


def test_a_backend_holding_rows_looks_new_keys_up(make_backend: BackendFactory) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    b.require_assigned_groups()
    count = b.get_state(COUNT)
    b.track_changes()
    b.assign_key_group(3, 3)
    b.set_current_key(3)
    count.update(9)
    b.track_changes()  # the next micro-batch: 3 is named again, its row is read
    b.assign_key_group(3, 3)
    b.set_current_key(3)
    assert count.value() == 9
    restored = make_backend(max_parallelism=8, key_group_range=GROUPS)
    restored.require_assigned_groups()
    again = restored.get_state(COUNT)
    restored.load(b.dump())
    restored.track_changes()
    restored.assign_key_group(3, 3)
    restored.set_current_key(3)
    assert again.value() == 9


def test_an_unencodable_key_is_still_refused_when_made_current(
    make_backend: BackendFactory,
) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    b.require_assigned_groups()
    b.track_changes(keys=False)
    b.assign_key_group(frozenset({1}), 1)
    with pytest.raises(UnsupportedKeyError):
        b.set_current_key(frozenset({1}))


# -- a batch's keys filed at once ----------------------------------------------------------
def test_a_batch_of_keys_is_filed_as_one_by_one(make_backend: BackendFactory) -> None:
    one, batch = (make_backend(max_parallelism=8, key_group_range=GROUPS) for _ in range(2))
    keys: list[object] = [5, "a", b"b", 2.5, None, True, 5, 9]
    groups = [3, 1, 2, 7, 0, 4, 3, 6]
    for b in (one, batch):
        b.require_assigned_groups()
        b.track_changes(keys=False)
    for k, g in zip(keys, groups, strict=True):
        one.assign_key_group(k, g)
    assert batch.assign_key_groups(keys, groups)
    count = {b: b.get_state(COUNT) for b in (one, batch)}
    for b in (one, batch):
        for k in keys:
            b.set_current_key(k)
            count[b].update((count[b].value() or 0) + 1)
    assert [batch.key_group_of(k) for k in keys] == [one.key_group_of(k) for k in keys]
    assert batch.dump() == one.dump()


@pytest.mark.parametrize(
    "keys, groups",
    [
        ([1, 2], [1, 9]),  # a group outside the range
        ([1, 2], [1, True]),  # not an int
        ([(1, 2), 3], [1, 2]),  # a key type that does not always encode
        ([1, 1], [1, 2]),  # one key, two groups
        ([4], [5]),  # named before with another group
    ],
)
def test_a_batch_it_cannot_file_at_once_is_left_to_the_key_by_key_calls(
    make_backend: BackendFactory, keys: list[object], groups: list[object]
) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    b.require_assigned_groups()
    b.track_changes(keys=False)
    b.assign_key_group(4, 4)
    assert not b.assign_key_groups(keys, groups)  # type: ignore[arg-type]
    assert b.key_group_of(4) == 4  # nothing assigned
    for k in keys:
        if k != 4:
            with pytest.raises(KeyGroupError):
                b.key_group_of(k)


def test_without_required_groups_a_batch_is_filed_key_by_key(make_backend: BackendFactory) -> None:
    b = make_backend(max_parallelism=8, key_group_range=GROUPS)
    assert not b.assign_key_groups([1], [1])


# -- RocksDB: a bulk load's rows staged, then written in order ----------------------------------
def _bulk(b: KeyedStateBackend, keys: list[object], fresh: bool) -> None:
    """The same writes on a backend in a bulk load (``fresh``) or not: two value states,
    two namespaces of one, keys written twice, read back, deleted and cleared, beside a
    list state."""
    b.require_assigned_groups()
    if not fresh:  # a row the load does not touch: the backend holds something
        b.track_changes(keys=False)
        b.assign_key_group("other", 0)
        b.set_current_key("other")
        b.get_state(ValueStateDescriptor[int]("x")).update(1)
    count = b.get_state(COUNT)
    raw = b.get_state(ValueStateDescriptor("raw"))
    wide = b.get_state(ValueStateDescriptor("raw"), namespace="w")
    seen = b.get_state(ListStateDescriptor[int]("seen"))  # never staged: written as it goes
    b.track_changes(keys=False)
    for i, k in enumerate(keys + keys[:50]):
        b.assign_key_group(k, hash(k) % 8)
        b.set_current_key(k)
        count.update((count.value() or 0) + 1)
        if i % 3 == 0:
            raw.update({"i": i})
        if i % 5 == 0:
            wide.update([i])
        if i % 7 == 0:
            raw.update(None)
        if i % 11 == 0:
            wide.clear()
        if i % 13 == 0:
            seen.add(i)
    b.set_current_key(keys[0])
    assert count.value() == 2  # read back before anything is written


@pytest.mark.parametrize("keys", ["ints", "strings"])
def test_a_rocksdb_bulk_load_writes_the_rows_its_puts_would_have(
    any_backend_factory: Callable[[str], BackendFactory], keys: str
) -> None:
    make = any_backend_factory("rocksdb")
    loaded, put = (make(max_parallelism=8, key_group_range=GROUPS) for _ in range(2))
    ks: list[object] = list(random.Random(7).sample(range(-(10**12), 10**12), 400))
    if keys == "strings":
        ks = [f"k{k}" for k in ks]
    _bulk(loaded, ks, fresh=True)
    _bulk(put, ks, fresh=False)
    assert isinstance(loaded, RocksDBKeyedStateBackend)
    assert isinstance(put, RocksDBKeyedStateBackend)
    assert loaded._fresh and not put._fresh
    rows = {n: list(cf.items()) for n, cf in put._cfs.items() if n != "x"}
    loaded.track_changes()  # the next micro-batch: the staged rows are in the database
    assert {n: list(cf.items()) for n, cf in loaded._cfs.items()} == rows
    count = loaded.get_state(COUNT)
    for k in ks[:60]:
        loaded.assign_key_group(k, hash(k) % 8)
        loaded.set_current_key(k)
        assert count.value() == (2 if k in ks[:50] else 1)


def test_a_rocksdb_bulk_load_snapshots_what_it_wrote(
    any_backend_factory: Callable[[str], BackendFactory],
) -> None:
    """The full sections built from the rows a bulk load wrote (kept as arrays) are the
    tables of the rows read back, and the heap's; a write after them is never missed."""
    rocks = any_backend_factory("rocksdb")(max_parallelism=8, key_group_range=GROUPS)
    heap = any_backend_factory("heap")(max_parallelism=8, key_group_range=GROUPS)
    ks: list[object] = list(random.Random(9).sample(range(-(10**12), 10**12), 600))
    for b in (rocks, heap):
        b.require_assigned_groups()
        count, raw = b.get_state(COUNT), b.get_state(ValueStateDescriptor("raw"))
        typed = b.get_state(ValueStateDescriptor("typed", "array<string>"))
        b.track_changes(keys=False)
        assert b.assign_key_groups(ks, [hash(k) % 8 for k in ks])
        for i, k in enumerate(ks):
            b.set_current_key(k)
            count.update(i % 13)
            if i % 2:
                raw.update({"i": i})
            if i % 3:
                typed.update([str(i)] * (i % 4))
    assert isinstance(rocks, RocksDBKeyedStateBackend)
    kept = [rocks.value_runs(kg) for kg in GROUPS]  # the first seals: kept as arrays
    assert rocks._sealed is not None
    for kg, runs in zip(GROUPS, kept, strict=True):
        assert runs is not None
        fast = value_key_group_table(runs)
        assert fast.equals(value_key_group_table(heap.value_runs(kg) or []))
        assert fast.equals(table(Kind.KEY_GROUPS, (rocks.dump((kg,))[kg], [], None)))
        entries = table(Kind.KEY_GROUPS, (heap.dump((kg,))[kg], [], None))
        assert _ipc(fast).to_pybytes() == _ipc(entries).to_pybytes()
    rocks.set_current_key(ks[0])
    rocks.get_state(COUNT).update(99)  # the database changed: its rows are read again
    again = rocks.value_runs(hash(ks[0]) % 8)
    assert rocks._sealed is None and again is not None
    assert rocks._tables["count"].dumps(99) in again[0].values


def test_reading_the_database_ends_a_rocksdb_bulk_load(
    any_backend_factory: Callable[[str], BackendFactory],
) -> None:
    b = any_backend_factory("rocksdb")(max_parallelism=8, key_group_range=GROUPS)
    b.require_assigned_groups()
    count = b.get_state(COUNT)
    b.track_changes(keys=False)
    for k in (1, 2, 3):
        b.assign_key_group(k, k)
        b.set_current_key(k)
        count.update(k * 10)
    assert sorted(b.keys("count")) == [1, 2, 3]  # reads the database: the rows are there
    assert isinstance(b, RocksDBKeyedStateBackend) and not b._fresh
    b.set_current_key(2)
    assert count.value() == 20
    count.update(21)
    b.assign_key_group(4, 4)
    b.set_current_key(4)
    assert count.value() is None
    assert {k: v for k, v in _values(b, count, [1, 2, 3, 4]).items()} == {1: 10, 2: 21, 3: 30}


def _values(b: KeyedStateBackend, state: Any, keys: list[int]) -> dict[int, Any]:
    out = {}
    for k in keys:
        b.set_current_key(k)
        v = state.value()
        if v is not None:
            out[k] = v
    return out


def test_snapshot_values_are_the_serializers_bytes() -> None:
    """``dump_values`` (one C pass, each repeated int pickled once) gives what ``dumps``
    gives value by value, and names the state when a value fails."""
    b = HeapKeyedStateBackend(max_parallelism=8, key_group_range=GROUPS)
    b.get_state(ValueStateDescriptor("v"))
    t = b._tables["v"]
    for values in ([1, 1, 2, 1, 1, 2, 3, 1], [1, True, 1, 1], [2**70, 2**70, 1, 1], [1, 2, 3],
                   ["a", "a", 1.5]):  # fmt: skip
        assert t.dump_values(list(values)) == [t.dumps(v) for v in values]
    with pytest.raises(StateError, match="state 'v'"):
        t.dump_values([1, lambda: 1])
