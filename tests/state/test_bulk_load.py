"""A bulk load (every key new, every key group written in full) takes shortcuts that must
not show: a key group's full section built as columns is the very table the entries
make, and a key new to an empty backend reads None without a lookup until written."""

from __future__ import annotations

import random

import pytest

from asyncio_ops._container import Kind, _ipc
from asyncio_ops._keygroups import canonical_bytes
from asyncio_ops.state import (
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    StateTtlConfig,
    UnsupportedKeyError,
    ValueStateDescriptor,
)
from asyncio_ops.state._keycodec import int_key_column
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
