"""Keys filed under the key group an engine computed (Spark's hash in the JVM), not the
core's: state, snapshots, restores and timers keep that group, never re-hash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncio_ops import InternalTimerService, Timer
from asyncio_ops.state import (
    KeyedStateBackend,
    KeyGroupError,
    KeyGroupRange,
    ListStateDescriptor,
    UnsupportedKeyError,
    ValueStateDescriptor,
    assign_to_key_group,
    restore_key_groups,
    snapshot_key_groups,
)
from asyncio_ops.testing import ManualClock

from .conftest import BACKEND_KINDS, BackendFactory

SPARK_KG = 22  # pmod(hash(2), 128) in Spark; the core's Murmur3 files the int 2 elsewhere
VALUE = ValueStateDescriptor[str]("v")


def test_the_example_key_groups_differ() -> None:
    assert assign_to_key_group(2, 128) != SPARK_KG


def test_a_pinned_key_reads_and_writes_under_its_group(make_backend: BackendFactory) -> None:
    b = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    b.assign_key_group(2, SPARK_KG)
    b.set_current_key(2)
    st = b.get_state(VALUE)
    st.update("x")
    assert b.current_key_group == SPARK_KG and b.key_group_of(2) == SPARK_KG
    assert st.value() == "x"
    assert list(b.snapshot()) == [SPARK_KG]


def test_pinning_refuses_a_group_outside_the_range_or_a_second_group(
    make_backend: BackendFactory,
) -> None:
    b = make_backend(key_group_range=KeyGroupRange(20, 29))
    with pytest.raises(KeyGroupError, match=r"key 2: key group 40 is outside .* 20\.\.29"):
        b.assign_key_group(2, 40)
    b.assign_key_group(2, SPARK_KG)
    b.assign_key_group(2, SPARK_KG)  # the same group again: fine
    with pytest.raises(KeyGroupError, match=r"key 2 is filed under key group 22; .* 23"):
        b.assign_key_group(2, 23)


def test_pinning_the_current_key_moves_it(make_backend: BackendFactory) -> None:
    core = assign_to_key_group(2, 128)
    b = make_backend()
    b.set_current_key(2)
    assert b.current_key_group == core
    b.assign_key_group(2, SPARK_KG)
    assert b.current_key_group == SPARK_KG


@pytest.mark.parametrize("target", BACKEND_KINDS)
def test_a_restored_key_keeps_its_group_across_backends(
    make_backend: BackendFactory,
    any_backend_factory: Callable[[str], BackendFactory],
    target: str,
) -> None:
    """Written under Spark's group by one backend kind, restored by another that owns
    only that group: the key reads back without being pinned again."""
    src = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    src.assign_key_group(2, SPARK_KG)
    src.set_current_key(2)
    src.get_state(ListStateDescriptor[int]("l")).add_all([1, 2])
    dst = any_backend_factory(target)(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    assert dst.restore(src.snapshot()) == 1
    assert list(dst.keys("l")) == [2]
    dst.set_current_key(2)  # no KeyGroupError: the restore filed 2 under 22
    assert dst.get_state(ListStateDescriptor[int]("l")).get() == [1, 2]


class _Fired:
    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def on_processing_time(self, timer: Timer) -> None:
        self.timers.append(timer)

    def on_event_time(self, timer: Timer) -> None:
        self.timers.append(timer)


def _service(backend: KeyedStateBackend, fired: Any, clock: ManualClock) -> InternalTimerService:
    return InternalTimerService(
        "t", fired, clock=clock, key_context=backend,
        max_parallelism=backend.max_parallelism, key_group_range=backend.key_group_range,
    )  # fmt: skip


def test_state_and_timers_move_together_under_the_assigned_group(
    make_backend: BackendFactory,
) -> None:
    clock = ManualClock()
    src = make_backend(key_group_range=KeyGroupRange(0, 127))
    timers = _service(src, _Fired(), clock)
    src.assign_key_group(2, SPARK_KG)
    src.set_current_key(2)
    src.get_state(VALUE).update("pending")
    timers.register_processing_time_timer("ns", 5.0)
    snap = snapshot_key_groups(src, timers)
    assert list(snap) == [SPARK_KG]
    timers.close()

    dst = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    fired = _Fired()
    restored = _service(dst, fired, clock)
    assert restore_key_groups(dst, restored, snap) == 1
    clock.advance(6)
    assert [(t.key, t.timestamp) for t in fired.timers] == [(2, 5.0)]
    assert dst.get_current_key() == 2 and dst.get_state(VALUE).value() == "pending"
    restored.close()


# -- a backend that takes every key's group from the engine (keyed_process on Spark) ------
def test_a_backend_requiring_assigned_groups_refuses_a_key_with_none(
    make_backend: BackendFactory,
) -> None:
    b = make_backend()
    b.require_assigned_groups()
    assert b.requires_assigned_groups
    with pytest.raises(KeyGroupError, match=r"key 2: no key group was assigned to it"):
        b.set_current_key(2)  # never the core hash's group: that would read another's state
    b.assign_key_group(2, SPARK_KG)
    b.set_current_key(2)
    assert b.current_key_group == SPARK_KG
    with pytest.raises(KeyGroupError, match=r"key 2 is filed under key group 22; .* 23"):
        b.assign_key_group(2, 23)
    with pytest.raises(UnsupportedKeyError):
        b.assign_key_group([1], SPARK_KG)
    with pytest.raises(KeyGroupError, match=r"key 3: key group 200 is outside"):
        b.assign_key_group(3, 200)


def test_required_groups_are_remembered_per_task_not_per_key_stored(
    make_backend: BackendFactory,
) -> None:
    """A restore pins none of the keys it loads, and track_changes forgets the groups
    named before it: the map of groups holds one task's keys, not the state's."""
    src = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    for k in range(200):
        src.assign_key_group(("k", k), SPARK_KG)
        src.set_current_key(("k", k))
        src.get_state(VALUE).update(f"v{k}")
    dst = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    dst.require_assigned_groups()
    assert dst.restore(src.snapshot()) == 1
    assert len(dst._assigned) == 0  # nothing pinned by the restore
    dst.track_changes()
    for k in (3, 150):
        dst.assign_key_group(("k", k), SPARK_KG)
        dst.set_current_key(("k", k))
        assert dst.get_state(VALUE).value() == f"v{k}"
    assert len(dst._assigned) == 2
    assert dst.take_touched() == {("k", 3), ("k", 150)}
    dst.track_changes()  # the next task
    assert len(dst._assigned) == 0
    with pytest.raises(KeyGroupError, match="no key group was assigned"):
        dst.set_current_key(("k", 7))


def test_a_timer_fires_under_its_group_after_the_groups_were_forgotten(
    make_backend: BackendFactory,
) -> None:
    clock = ManualClock()
    b = make_backend(key_group_range=KeyGroupRange(SPARK_KG, SPARK_KG))
    b.require_assigned_groups()
    fired = _Fired()
    timers = _service(b, fired, clock)
    b.track_changes()
    b.assign_key_group(2, SPARK_KG)
    b.set_current_key(2)
    b.get_state(VALUE).update("pending")
    timers.register_processing_time_timer("ns", 5.0)
    timers.register_event_time_timer("ns", 7.0)
    b.track_changes()  # a later task: the group of key 2 is no longer remembered
    b._key_cache.clear()  # nor cached (a long task evicts the cache)
    clock.advance(6)
    timers.advance_watermark(8.0)
    assert [(t.key, t.timestamp) for t in fired.timers] == [(2, 5.0), (2, 7.0)]
    assert b.current_key_group == SPARK_KG and b.get_state(VALUE).value() == "pending"
    timers.close()
