"""Operator list state: even-split and union redistribution across parallelism changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncio_ops.state import (
    ConfigurationError,
    CorruptStateError,
    OperatorStateBackend,
    StateError,
)


def snapshots(contents: list[list[int]], union: list[list[str]] | None = None) -> list[bytes]:
    out = []
    for i, items in enumerate(contents):
        b = OperatorStateBackend(index=i, parallelism=len(contents))
        b.get_list_state("offsets").add_all(items)
        if union is not None:
            b.get_union_list_state("partitions").add_all(union[i])
        out.append(b.snapshot())
    return out


def restore_all(snaps: list[bytes], q: int) -> list[OperatorStateBackend]:
    news = [OperatorStateBackend(index=i, parallelism=q) for i in range(q)]
    for b in news:
        b.restore(snaps)
    return news


def test_list_state_api() -> None:
    b = OperatorStateBackend()
    s = b.get_list_state("s")
    assert s.get() == []
    s.add(1)
    s.add_all([2, 3])
    assert s.get() == [1, 2, 3]
    s.update(["x"])
    assert s.get() == ["x"]
    s.clear()
    assert s.get() == []
    with pytest.raises(StateError):
        s.add(None)
    assert b.get_list_state("s") is s
    with pytest.raises(StateError, match="even-split"):
        b.get_union_list_state("s")


def test_even_split_2_to_3() -> None:
    news = restore_all(snapshots([[1, 2, 3, 4], [5, 6, 7]]), 3)
    assert [b.get_list_state("offsets").get() for b in news] == [[1, 2, 3], [4, 5], [6, 7]]


def test_even_split_3_to_2() -> None:
    news = restore_all(snapshots([[1], [2, 3], [4, 5, 6]]), 2)
    assert [b.get_list_state("offsets").get() for b in news] == [[1, 2, 3], [4, 5, 6]]


def test_same_parallelism_keeps_each_instance_its_own() -> None:
    news = restore_all(snapshots([[1, 2, 3], [], [4]]), 3)
    assert [b.get_list_state("offsets").get() for b in news] == [[1, 2, 3], [], [4]]


def test_union_gives_everything_to_everyone() -> None:
    snaps = snapshots([[1], [2]], union=[["p0", "p1"], ["p2"]])
    for b in restore_all(snaps, 3):
        assert b.get_union_list_state("partitions").get() == ["p0", "p1", "p2"]
        with pytest.raises(StateError, match="union"):
            b.get_list_state("partitions")


@given(st.lists(st.lists(st.integers(), max_size=8), min_size=1, max_size=6), st.integers(1, 6))
def test_even_split_loses_and_duplicates_nothing(contents: list[list[int]], q: int) -> None:
    tagged = [[(i, j) for j, _ in enumerate(items)] for i, items in enumerate(contents)]
    snaps = []
    for i, items in enumerate(tagged):
        b = OperatorStateBackend(index=i, parallelism=len(tagged))
        b.get_list_state("s").add_all(items)
        snaps.append(b.snapshot())
    parts = [b.get_list_state("s").get() for b in restore_all(snaps, q)]
    assert [x for p in parts for x in p] == [x for items in tagged for x in items]
    if len(tagged) != q:
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_snapshot_carries_unregistered_restored_state() -> None:
    (b,) = restore_all(snapshots([[1, 2]]), 1)
    again = restore_all([b.snapshot()], 1)[0]
    assert again.get_list_state("offsets").get() == [1, 2]


def test_corrupt_operator_blob_names_the_subtask() -> None:
    snaps = snapshots([[1], [2], [3]])
    snaps[1] = snaps[1][:-3]
    with pytest.raises(CorruptStateError, match="operator state of subtask 1"):
        OperatorStateBackend(index=0, parallelism=2).restore(snaps)
    with pytest.raises(ConfigurationError, match="list of every"):
        OperatorStateBackend().restore(snaps[0])
    with pytest.raises(ConfigurationError, match="index"):
        OperatorStateBackend(index=2, parallelism=2)
