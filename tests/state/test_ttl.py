"""TTL on a manual clock: every update type and visibility, every state kind, both backends."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import pytest

from asyncio_ops.state import (
    AggregatingStateDescriptor,
    ConfigurationError,
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    RocksDBKeyedStateBackend,
    StateTtlConfig,
    StateVisibility,
    TtlTimeCharacteristic,
    UpdateType,
    ValueStateDescriptor,
    cleanup_full_snapshot,
    cleanup_in_rocksdb_compaction,
    cleanup_incrementally,
)
from asyncio_ops.testing import ManualClock

from .conftest import BackendFactory
from .test_backends import Average

NEVER = StateVisibility.NEVER_RETURN_EXPIRED
IF_NOT_CLEANED = StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
ON_WRITE = UpdateType.ON_CREATE_AND_WRITE
ON_READ = UpdateType.ON_READ_AND_WRITE

update_types = pytest.mark.parametrize("update_type", [ON_WRITE, ON_READ], ids=["write", "read"])
visibilities = pytest.mark.parametrize("visibility", [NEVER, IF_NOT_CLEANED], ids=["never", "ret"])


def ttl(update_type: UpdateType, visibility: StateVisibility, **kw: Any) -> StateTtlConfig:
    # No background cleanup: these tests pin the lazy, on-access semantics.
    return StateTtlConfig(10.0, update_type, visibility, cleanup=(), **kw)


def test_ttl_must_be_positive() -> None:
    for bad in (0, -1, float("nan"), float("inf"), "10", True):
        with pytest.raises(ConfigurationError, match="ttl"):
            StateTtlConfig(bad)  # type: ignore[arg-type]
    assert StateTtlConfig(dt.timedelta(minutes=1)).ttl == 60.0  # type: ignore[arg-type]
    # Spark's interval strings, as withWatermark takes them
    assert StateTtlConfig("10 minutes").ttl == 600.0  # type: ignore[arg-type]
    assert StateTtlConfig("500 milliseconds").ttl == 0.5  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"ttl '10 fortnights' is not a duration"):
        StateTtlConfig("10 fortnights")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cleanup_size"):
        cleanup_incrementally(0)
    with pytest.raises(ConfigurationError, match="cleanup strategy"):
        StateTtlConfig(1, cleanup=("full",))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="update_type"):
        StateTtlConfig(1, update_type="read")  # type: ignore[arg-type]


@update_types
@visibilities
def test_value_ttl(
    backend: KeyedStateBackend,
    clock: ManualClock,
    update_type: UpdateType,
    visibility: StateVisibility,
) -> None:
    s = backend.get_state(ValueStateDescriptor[str]("v", ttl=ttl(update_type, visibility)))
    backend.set_current_key("k")
    s.update("x")
    clock.advance(9.0)
    assert s.value() == "x"  # 9 s old: alive; with ON_READ this read refreshes it
    clock.advance(2.0)  # 11 s after the write, 2 s after the read
    if update_type is ON_READ:
        assert s.value() == "x"
        clock.advance(10.0)  # now exactly ttl after the last read: expired
    expected = "x" if visibility is IF_NOT_CLEANED else None
    assert s.value() == expected
    assert s.value() is None  # the read that met the expired value removed it
    s.update("y")  # a write always refreshes
    clock.advance(9.99)
    assert s.value() == "y"


@update_types
@visibilities
def test_list_ttl_per_element(
    backend: KeyedStateBackend,
    clock: ManualClock,
    update_type: UpdateType,
    visibility: StateVisibility,
) -> None:
    s = backend.get_state(ListStateDescriptor[int]("l", ttl=ttl(update_type, visibility)))
    backend.set_current_key("k")
    s.add(1)
    clock.advance(6.0)
    s.add_all([2, 3])
    clock.advance(5.0)  # element 1 is 11 s old, 2 and 3 are 5 s old
    if visibility is IF_NOT_CLEANED:
        assert s.get() == [1, 2, 3]
    else:
        assert s.get() == [2, 3]
    assert s.get() == [2, 3]  # 1 was cleaned by the first read
    clock.advance(6.0)  # 2 and 3: 11 s after the write, 6 s after the last reads
    if update_type is ON_READ:
        assert s.get() == [2, 3]
    else:
        assert s.get() == ([2, 3] if visibility is IF_NOT_CLEANED else [])
        assert s.get() == []
    s.update([7])
    clock.advance(10.0)
    assert s.get() == ([7] if visibility is IF_NOT_CLEANED else [])


@update_types
@visibilities
def test_map_ttl_per_entry(
    backend: KeyedStateBackend,
    clock: ManualClock,
    update_type: UpdateType,
    visibility: StateVisibility,
) -> None:
    s = backend.get_state(MapStateDescriptor[str, int]("m", ttl=ttl(update_type, visibility)))
    backend.set_current_key("k")
    s.put("old", 1)
    clock.advance(6.0)
    s.put("new", 2)
    clock.advance(5.0)  # old: 11 s, new: 5 s
    ret = visibility is IF_NOT_CLEANED
    assert s.contains("old") is ret
    if ret:  # contains() does not remove what it may still return
        assert s.get("old") == 1
    assert s.get("old") is None
    assert not s.contains("old")
    assert dict(s.items()) == {"new": 2}
    clock.advance(6.0)  # new: 11 s after write, 6 s after the items() read
    if update_type is ON_READ:
        assert s.get("new") == 2
        assert not s.is_empty()
    else:
        assert dict(s.items()) == ({"new": 2} if ret else {})
        assert s.is_empty()
    s.put_all({"a": 1, "b": 2})
    clock.advance(10.0)
    still_stored = ["a", "b"] + (["new"] if update_type is ON_READ else [])
    assert sorted(s.keys()) == (still_stored if ret else [])
    assert list(s.values()) == []


@update_types
@visibilities
def test_reducing_and_aggregating_ttl(
    backend: KeyedStateBackend,
    clock: ManualClock,
    update_type: UpdateType,
    visibility: StateVisibility,
) -> None:
    cfg = ttl(update_type, visibility)
    r = backend.get_state(ReducingStateDescriptor[int]("r", lambda a, b: a + b, ttl=cfg))
    a = backend.get_state(AggregatingStateDescriptor("a", Average(), ttl=cfg))
    backend.set_current_key("k")
    r.add(1)
    a.add(4.0)
    clock.advance(5.0)
    r.add(2)
    a.add(2.0)
    clock.advance(6.0)
    assert (r.get(), a.get()) == (3, 3.0)  # ON_READ: refreshed here
    clock.advance(5.0)  # 11 s after the last write, 5 s after the read
    ret = visibility is IF_NOT_CLEANED
    if update_type is ON_READ:
        assert (r.get(), a.get()) == (3, 3.0)
    else:
        assert (r.get(), a.get()) == ((3, 3.0) if ret else (None, None))
        assert (r.get(), a.get()) == (None, None)
    clock.advance(10.0)  # now expired (or gone) under every configuration
    r.add(10)
    a.add(1.0)
    # an add never folds into an expired value
    assert (r.get(), a.get()) == (10, 1.0)
    clock.advance(10.0)
    r.add(5)
    assert r.get() == 5


def test_ttl_and_non_ttl_states_live_side_by_side(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    plain = backend.get_state(ValueStateDescriptor[int]("plain"))
    timed = backend.get_state(ValueStateDescriptor[int]("timed", ttl=StateTtlConfig(1)))
    backend.set_current_key("k")
    plain.update(1)
    timed.update(2)
    clock.advance(3600)
    assert (plain.value(), timed.value()) == (1, None)


def test_event_time_ttl_uses_the_watermark(backend: KeyedStateBackend, clock: ManualClock) -> None:
    cfg = StateTtlConfig(10.0, time_characteristic=TtlTimeCharacteristic.EVENT_TIME, cleanup=())
    s = backend.get_state(ValueStateDescriptor[str]("v", ttl=cfg))
    backend.set_current_key("early")
    s.update("before any watermark")
    clock.advance(1e6)  # processing time is irrelevant
    assert s.value() == "before any watermark"
    backend.advance_watermark(100.0)  # the early write counts as written at 100
    backend.set_current_key("k")
    s.update("at 100")
    backend.advance_watermark(109.0)
    backend.advance_watermark(50.0)  # watermarks never go back
    assert backend.current_watermark() == 109.0
    assert s.value() == "at 100"
    backend.set_current_key("early")
    assert s.value() == "before any watermark"
    backend.advance_watermark(110.0)
    assert s.value() is None
    backend.set_current_key("k")
    assert s.value() is None


def test_event_time_ttl_of_early_writes_survives_a_restore(
    make_backend: BackendFactory,
) -> None:
    """Written before the first watermark, an entry's TTL runs from the first watermark;
    restored into a backend whose own first watermark comes much later, it keeps that."""
    cfg = StateTtlConfig(10.0, time_characteristic=TtlTimeCharacteristic.EVENT_TIME, cleanup=())
    src = make_backend()
    value = src.get_state(ValueStateDescriptor[str]("v", ttl=cfg))
    items = src.get_state(ListStateDescriptor[int]("l", ttl=cfg))
    src.set_current_key("early")
    value.update("before any watermark")
    items.add(1)
    src.advance_watermark(100.0)  # the early writes count as written at 100
    dst = make_backend()
    dst.restore(src.snapshot())
    dst.advance_watermark(120.0)  # dst's first watermark: 100 + 10 has passed
    dst.set_current_key("early")
    assert dst.get_state(ValueStateDescriptor[str]("v", ttl=cfg)).value() is None
    assert dst.get_state(ListStateDescriptor[int]("l", ttl=cfg)).get() == []


def heap_groups_size(backend: KeyedStateBackend, name: str) -> int:
    """Stored entries of a state, expired or not (what cleanup is about)."""
    return len(list(backend.keys(name)))


def test_incremental_cleanup_on_access(backend: KeyedStateBackend, clock: ManualClock) -> None:
    cfg = StateTtlConfig(10.0, cleanup=(cleanup_incrementally(5),))
    s = backend.get_state(ValueStateDescriptor[int]("v", ttl=cfg))
    for k in range(20):
        backend.set_current_key(k)
        s.update(k)
    clock.advance(20.0)
    assert heap_groups_size(backend, "v") == 20  # nothing touched yet
    backend.set_current_key(1000)
    for _ in range(3):
        s.value()  # each access checks 5 more entries
    assert heap_groups_size(backend, "v") == 20 - 15
    for _ in range(2):
        s.value()
    assert heap_groups_size(backend, "v") == 0


def test_incremental_cleanup_for_every_record(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    cfg = StateTtlConfig(10.0, cleanup=(cleanup_incrementally(4, run_for_every_record=True),))
    s = backend.get_state(ListStateDescriptor[int]("l", ttl=cfg))
    for k in range(8):
        backend.set_current_key(k)
        s.add(k)
    clock.advance(10.0)
    # The adds above moved the cleanup cursor too (they are accesses), so a call may
    # end a pass early; each call checks at most 4 entries and a few calls clear all.
    sizes = [heap_groups_size(backend, "l")]
    for _ in range(4):
        backend.on_record()
        sizes.append(heap_groups_size(backend, "l"))
    assert sizes[0] == 8 and sizes[-1] == 0
    assert all(0 <= a - b <= 4 for a, b in itertools.pairwise(sizes))


def test_on_record_leaves_states_without_per_record_cleanup_alone(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    cfg = StateTtlConfig(10.0, cleanup=(cleanup_incrementally(4),))
    s = backend.get_state(ListStateDescriptor[int]("l", ttl=cfg))
    for k in range(8):
        backend.set_current_key(k)
        s.add(k)
    clock.advance(10.0)
    for _ in range(4):
        backend.on_record()
    assert heap_groups_size(backend, "l") == 8


def test_full_snapshot_cleanup_drops_expired_entries(
    make_backend: BackendFactory, clock: ManualClock
) -> None:
    cfg = StateTtlConfig(10.0, cleanup=(cleanup_full_snapshot(),))
    b = make_backend(clock=clock)
    v = b.get_state(ValueStateDescriptor[int]("v", ttl=cfg))
    m = b.get_state(MapStateDescriptor[str, int]("m", ttl=cfg))
    b.set_current_key("old")
    v.update(1)
    m.put("x", 1)
    clock.advance(6.0)
    b.set_current_key("new")
    v.update(2)
    m.put("x", 2)
    b.set_current_key("old")
    m.put("y", 3)  # a fresh entry beside an expiring one
    clock.advance(5.0)
    snap = b.snapshot()
    assert heap_groups_size(b, "v") == 2  # the snapshot did not modify the live state
    restored = make_backend(clock=clock)
    restored.restore(snap)
    assert sorted(restored.keys("v")) == ["new"]
    m2 = restored.get_state(MapStateDescriptor[str, int]("m", ttl=cfg))
    restored.set_current_key("old")
    assert dict(m2.items()) == {"y": 3}


def test_without_full_snapshot_cleanup_timestamps_travel(
    make_backend: BackendFactory, clock: ManualClock
) -> None:
    cfg = StateTtlConfig(10.0, cleanup=())
    b = make_backend(clock=clock)
    v = b.get_state(ValueStateDescriptor[int]("v", ttl=cfg))
    b.set_current_key("k")
    v.update(1)
    clock.advance(8.0)
    restored = make_backend(clock=clock)
    restored.restore(b.snapshot())
    v2 = restored.get_state(ValueStateDescriptor[int]("v", ttl=cfg))
    restored.set_current_key("k")
    assert v2.value() == 1
    clock.advance(2.0)  # the restored entry keeps its original timestamp
    assert v2.value() is None


def test_rocksdb_compaction_sweep_every_n_writes(tmp_path: Path, clock: ManualClock) -> None:
    cfg = StateTtlConfig(10.0, cleanup=(cleanup_in_rocksdb_compaction(10),))
    b = RocksDBKeyedStateBackend(
        path=tmp_path / "db",
        max_parallelism=128,
        key_group_range=KeyGroupRange(0, 127),
        clock=clock,
    )
    try:
        s = b.get_state(ListStateDescriptor[int]("l", ttl=cfg))
        for k in range(30):
            b.set_current_key(k)
            s.add(k)  # 30 writes: three sweeps ran, but nothing had expired
        assert heap_groups_size(b, "l") == 30
        clock.advance(10.0)
        for k in range(100, 120):
            b.set_current_key(k)
            s.add(k)  # 20 more writes: two sweeps of at most 10 rows each
        swept = 50 - heap_groups_size(b, "l")
        assert 0 < swept <= 20
        assert b.sweep_expired() == 30 - swept  # the full sweep gets the rest
        assert heap_groups_size(b, "l") == 20
        clock.advance(10.0)
        assert b.compact() == 20
        assert heap_groups_size(b, "l") == 0
    finally:
        b.close()


def test_default_cleanup_per_backend() -> None:
    cfg = StateTtlConfig(1.0)
    assert cfg.incremental(rocksdb=False) is not None
    assert cfg.compaction(rocksdb=False) is None
    assert cfg.compaction(rocksdb=True) is not None
    assert cfg.incremental(rocksdb=True) is None
    assert StateTtlConfig(1.0, cleanup=()).strategies(rocksdb=True) == ()
