"""Timer service on a manual clock: dedup, delete, firing order, one armed callback."""

from __future__ import annotations

from typing import Any

import pytest

from asyncio_ops import InternalTimerService, Timer, TimerHeap
from asyncio_ops._keygroups import (
    KeyGroupRange,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from asyncio_ops.testing import ManualClock


class Recorder:
    def __init__(self, max_parallelism: int = 128) -> None:
        self.max_parallelism = max_parallelism
        self.fired: list[tuple[str, Any, Any, float]] = []
        self.current_key: Any = None
        self.keys_seen: list[Any] = []
        self.pinned: dict[Any, int] = {}

    def on_processing_time(self, timer: Timer) -> None:
        self.fired.append(("p", timer.key, timer.namespace, timer.timestamp))
        self.keys_seen.append(self.current_key)

    def on_event_time(self, timer: Timer) -> None:
        self.fired.append(("e", timer.key, timer.namespace, timer.timestamp))
        self.keys_seen.append(self.current_key)

    # KeyContext
    def set_current_key(self, key: Any) -> None:
        self.current_key = key

    def get_current_key(self) -> Any:
        return self.current_key

    def key_group_of(self, key: Any) -> int:
        return self.pinned.get(key, assign_to_key_group(key, self.max_parallelism))

    def assign_key_group(self, key: Any, key_group: int) -> None:
        self.pinned[key] = key_group

    requires_assigned_groups = False


def make(clock: ManualClock | None = None, **kw: Any) -> tuple[InternalTimerService, Recorder]:
    rec = Recorder(kw.get("max_parallelism", 128))
    svc = InternalTimerService("t", rec, clock=clock or ManualClock(), key_context=rec, **kw)
    return svc, rec


def test_heap_dedups_deletes_and_orders() -> None:
    h = TimerHeap()
    assert h.add("k", "ns", 5)
    assert not h.add("k", "ns", 5)
    assert h.add("k", "ns", 3)
    assert h.add("j", "ns", 5)
    assert len(h) == 3
    assert h.remove("k", "ns", 3)
    assert not h.remove("k", "ns", 3)
    assert h.peek_timestamp() == 5
    assert [(t.key, t.timestamp) for t in h] == [("k", 5), ("j", 5)]  # ties: registration order
    assert h.poll_due(4) is None
    first = h.poll_due(5)
    assert first == (Timer("k", "ns", 5), 0)  # with its group (0: none given)
    assert len(h) == 1


def test_heap_compacts_dead_entries() -> None:
    h = TimerHeap()
    for i in range(1000):
        h.add(None, i, float(i))
    for i in range(990):
        h.remove(None, i, float(i))
    assert len(h) == 10
    assert len(h._heap) < 1000  # rebuilt: memory follows live timers
    assert [t.namespace for t in h] == list(range(990, 1000))


def test_processing_timers_fire_in_order_with_their_key_current() -> None:
    clock = ManualClock()
    svc, rec = make(clock)
    svc.register_processing_time_timer("a", 3.0, key="k3")
    svc.register_processing_time_timer("a", 1.0, key="k1")
    svc.register_processing_time_timer("a", 2.0, key="k2")
    svc.register_processing_time_timer("a", 2.0, key="k2")  # duplicate
    assert svc.num_processing_time_timers() == 3
    clock.advance(1.5)
    assert rec.fired == [("p", "k1", "a", 1.0)]
    clock.advance(10)
    assert [f[3] for f in rec.fired] == [1.0, 2.0, 3.0]
    assert rec.keys_seen == ["k1", "k2", "k3"]
    assert svc.num_processing_time_timers() == 0


def test_only_one_callback_is_armed_for_the_earliest_timer() -> None:
    clock = ManualClock()
    svc, rec = make(clock)
    for i in range(100, 0, -1):
        svc.register_processing_time_timer(i, float(i), key=None)
    # each earlier timer re-arms; the old callback is cancelled, so one stays live
    assert clock.pending == 1
    for i in range(101, 200):
        svc.register_processing_time_timer(i, float(i), key=None)
    assert clock.pending == 1
    clock.advance(250)
    assert len(rec.fired) == 199
    assert clock.pending == 0


def test_deleted_timer_does_not_fire_and_default_key_is_current() -> None:
    clock = ManualClock()
    svc, rec = make(clock)
    rec.set_current_key("user-7")
    svc.register_processing_time_timer("ns", 5.0)
    svc.register_processing_time_timer("ns", 6.0)
    svc.delete_processing_time_timer("ns", 5.0)
    clock.advance(10)
    assert rec.fired == [("p", "user-7", "ns", 6.0)]


def test_timer_registered_while_firing_fires_when_due() -> None:
    clock = ManualClock()
    rec = Recorder()

    class Chain(Recorder):
        def on_processing_time(self, timer: Timer) -> None:
            rec.on_processing_time(timer)
            if timer.timestamp < 3:
                svc.register_processing_time_timer("n", timer.timestamp + 1, key=None)

    svc = InternalTimerService("chain", Chain(), clock=clock)
    svc.register_processing_time_timer("n", 1.0, key=None)
    clock.advance(2.5)
    assert [f[3] for f in rec.fired] == [1.0, 2.0]
    clock.advance(1)
    assert [f[3] for f in rec.fired] == [1.0, 2.0, 3.0]


def test_event_timers_fire_on_watermark_in_order() -> None:
    svc, rec = make()
    for ts in (30, 10, 20):
        svc.register_event_time_timer("w", ts, key=f"k{ts}")
    svc.delete_event_time_timer("w", 20, key="k20")
    assert svc.advance_watermark(15) == 1
    assert svc.current_watermark() == 15
    assert svc.advance_watermark(100) == 1
    assert rec.fired == [("e", "k10", "w", 10), ("e", "k30", "w", 30)]
    assert rec.keys_seen == ["k10", "k30"]


def test_closed_service_fires_nothing() -> None:
    clock = ManualClock()
    svc, rec = make(clock)
    svc.register_processing_time_timer("x", 1.0, key=None)
    svc.close()
    clock.advance(5)
    assert rec.fired == []


@pytest.mark.parametrize(("old_p", "new_p"), [(1, 3), (2, 3), (3, 2), (4, 1)])
def test_snapshot_and_restore_redistributes_by_key_group(old_p: int, new_p: int) -> None:
    maxp = 16
    keys = [f"user-{i}" for i in range(200)] + list(range(100))
    olds = []
    for i in range(old_p):
        kgr = compute_key_group_range_for_operator_index(maxp, old_p, i)
        svc, _ = make(max_parallelism=maxp, key_group_range=kgr)
        olds.append(svc)
    from asyncio_ops._keygroups import assign_to_key_group, compute_operator_index_for_key_group

    for k in keys:
        owner = compute_operator_index_for_key_group(maxp, old_p, assign_to_key_group(k, maxp))
        olds[owner].register_event_time_timer("ns", 7, key=k)
        olds[owner].register_processing_time_timer("ns", 9, key=k)
    snapshots = [s.snapshot() for s in olds]

    restored: list[set[tuple[str, Any]]] = []
    for i in range(new_p):
        kgr = compute_key_group_range_for_operator_index(maxp, new_p, i)
        svc, _ = make(max_parallelism=maxp, key_group_range=kgr)
        for snap in snapshots:
            svc.restore(snap)
        got = {("e", t.key) for t in svc.event_time_timers()} | {
            ("p", t.key) for t in svc.processing_time_timers()
        }
        for _, k in got:
            assert assign_to_key_group(k, maxp) in kgr
        restored.append(got)
    union = set().union(*restored)
    assert sum(len(r) for r in restored) == len(union)  # nothing duplicated
    assert union == {("e", k) for k in keys} | {("p", k) for k in keys}  # nothing lost


def test_restore_rejects_an_unknown_domain() -> None:
    svc, _ = make(max_parallelism=4, key_group_range=KeyGroupRange(0, 3))
    with pytest.raises(ValueError, match="unknown time domain"):
        svc.restore({0: [("sideways", None, "n", 1.0)]})


def test_timers_snapshot_under_the_key_group_their_key_is_filed_under() -> None:
    """A key the engine filed under its own key group (Spark's hash) keeps that group in
    the snapshot, and a restored timer's key is filed under it again."""
    svc, rec = make()
    core = assign_to_key_group(2)
    spark = (core + 5) % 128
    rec.pinned[2] = spark
    svc.register_processing_time_timer("ns", 10.0, key=2)
    snap = svc.snapshot()
    assert list(snap) == [spark]
    other, rec2 = make(key_group_range=KeyGroupRange(spark, spark))
    assert other.restore(snap) == 1
    assert rec2.pinned == {2: spark}
    assert [(t.key, t.timestamp) for t in other.processing_time_timers()] == [(2, 10.0)]


def test_an_unarmed_service_schedules_nothing_and_fires_when_asked() -> None:
    clock = ManualClock()
    svc, rec = make(clock, armed=False)
    svc.register_processing_time_timer("ns", 5.0, key="k")
    clock.advance(10)
    assert rec.fired == []
    assert svc.fire_processing_time(clock.now()) == 1
    assert rec.fired == [("p", "k", "ns", 5.0)]
