"""Incremental snapshots of keyed state and timers (``_keyed_snapshot.snapshot_changes``).

A backend that records the keys made current, snapshotted after each round of
random writes with some key groups in full and the rest as deltas, and a
second backend that applies each round: after every round both hold the same
state and timers, for every backend kind (the heap's C key context and its
Python fallback record keys alike) and across kinds.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops._keygroups import assign_to_key_group
from asyncio_ops._storage._container import (
    DELTA,
    SHARED,
    Kind,
    Section,
    decode,
    encode,
    split_shared,
)
from asyncio_ops._timers import InternalTimerService, Timer
from asyncio_ops.state import (
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
    canonical_bytes,
)
from asyncio_ops.state._keyed_snapshot import Changes, apply_change, snapshot_changes

from .conftest import BackendFactory

MAXP = 8
KEYS = 30


class Quiet:
    def on_event_time(self, timer: Timer) -> None: ...

    def on_processing_time(self, timer: Timer) -> None: ...


def timers_of(backend: KeyedStateBackend) -> InternalTimerService:
    return InternalTimerService(
        "user-timers", Quiet(), key_context=backend, max_parallelism=MAXP,
        key_group_range=backend.key_group_range, armed=False,
    )  # fmt: skip


def read_all(backend: KeyedStateBackend, timers: InternalTimerService) -> dict[str, Any]:
    v = backend.get_state(ValueStateDescriptor[float]("v"))
    lst = backend.get_state(ListStateDescriptor[int]("l"))
    m = backend.get_state(MapStateDescriptor[int, str]("m"))
    m_ns = backend.get_state(MapStateDescriptor[int, str]("m"), namespace="window-2")
    out: dict[str, Any] = {}
    for k in range(KEYS):
        backend.set_current_key(k)
        out[f"{k}"] = (v.value(), lst.get(), dict(m.items()), dict(m_ns.items()))
    out["timers"] = sorted(
        (t.key, t.namespace or "", float(t.timestamp)) for t in timers.event_time_timers()
    )
    return out


operations = st.lists(
    st.lists(
        st.tuples(st.integers(0, KEYS - 1), st.integers(0, 7), st.integers(0, 9)), max_size=40
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(rounds=operations, full_every=st.integers(1, 4), kind_b=st.sampled_from(["heap", "rocksdb"]))
def test_full_blobs_and_deltas_rebuild_state_and_timers(
    make_backend: BackendFactory,
    any_backend_factory: Any,
    rounds: list[list[tuple[int, int, int]]],
    full_every: int,
    kind_b: str,
) -> None:
    a = make_backend(max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1))
    b = any_backend_factory(kind_b)(
        max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1)
    )
    ta, tb = timers_of(a), timers_of(b)
    a.track_changes()
    v = a.get_state(ValueStateDescriptor[float]("v"))
    lst = a.get_state(ListStateDescriptor[int]("l"))
    m = a.get_state(MapStateDescriptor[int, str]("m"))
    m_ns = a.get_state(MapStateDescriptor[int, str]("m"), namespace="window-2")
    for step, ops in enumerate(rounds):
        for key, op, x in ops:
            a.set_current_key(key)
            if op == 0:
                v.update(x / 2)
            elif op == 1:
                lst.add(x)
            elif op == 2:
                m.put(x % 3, f"x{x}")
            elif op == 3:
                m_ns.put(x, "ns")
            elif op == 4:
                v.clear()
                lst.clear()
            elif op == 5:
                ta.register_event_time_timer(None, x)
            elif op == 6:
                ta.delete_event_time_timer(None, x)
            else:
                m.clear()
        full = {kg for kg in range(MAXP) if (step + kg) % full_every == 0}
        changes = snapshot_changes(a, ta, full)
        # through one container (a key-group file): every section verified and read back
        sections = written(changes)
        data, _ = encode(Kind.KEY_GROUPS, sections)
        for section in decode(data, Kind.KEY_GROUPS, "key-group file"):
            apply_change(b, tb, section, "key-group file")
        for kg in full - {s.tag for s in sections}:  # a full key group with nothing in it
            b.clear_key_group(kg)
            tb.clear_key_group(kg)
        expected = read_all(a, ta)
        a.take_touched()  # reading made every key current: not a change of state
        assert read_all(b, tb) == expected


def written(changes: Changes) -> list[Section]:
    """The sections of :func:`snapshot_changes`'s result as a key-group file holds them:
    the full ones as built, then the deltas' one SHARED section once."""
    return [*changes.full, *{id(s): s for _, s in sorted(changes.deltas.items())}.values()]


def counted(
    make_backend: BackendFactory, timers: bool = False
) -> tuple[KeyedStateBackend, InternalTimerService, Any]:
    """A backend of every key group whose ValueState "v" holds each key of ``KEYS`` (and
    an event-time timer per key at the key, with ``timers``), its timer service, the state."""
    a = make_backend(max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1))
    t = timers_of(a)
    v = a.get_state(ValueStateDescriptor[int]("v"))
    for k in range(KEYS):
        a.set_current_key(k)
        v.update(k)
        if timers:
            t.register_event_time_timer(None, float(k))
    return a, t, v


def test_a_delta_holds_only_the_keys_made_current(make_backend: BackendFactory) -> None:
    a, t, v = counted(make_backend)
    a.track_changes()
    a.set_current_key(7)
    v.update(70)
    a.set_current_key(8)
    v.clear()
    changes = snapshot_changes(a, t, full=())
    # the deltas of every key group: one section, the same for each
    (section,) = written(changes)
    assert section.tag == SHARED and section.part == DELTA
    assert set(changes.deltas) == {assign_to_key_group(k, MAXP) for k in (7, 8)}
    assert [s.tag for s in split_shared(section, "delta")] == sorted(changes.deltas)
    rows = sorted(
        (row, k) for s in [section] for k, row in zip(
            s.table.column("key").to_pylist(), s.table.column("row").to_pylist(), strict=True
        )
    )  # fmt: skip
    # key 7 is named by its entry alone, key 8 (deleted) by a row of its own
    assert rows == [(0, canonical_bytes(7)), (2, canonical_bytes(8))]
    again = snapshot_changes(a, t, full=())  # nothing made current since
    assert again.deltas == {} and list(again.full) == []


def test_take_touched_needs_tracking(make_backend: BackendFactory) -> None:
    from asyncio_ops.state import StateError

    with pytest.raises(StateError, match="track_changes"):
        make_backend().take_touched()


def test_tracking_without_keys_records_none_and_a_full_snapshot_still_holds_all(
    make_backend: BackendFactory,
) -> None:
    """``track_changes(keys=False)`` (a micro-batch whose snapshot writes every key group
    in full, as a bulk load's first): no key is recorded, and the full sections hold
    every key; the next ``track_changes()`` records keys again."""
    a = make_backend(max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1))
    t = timers_of(a)
    a.track_changes(keys=False)
    v = a.get_state(ValueStateDescriptor[int]("v"))
    for k in range(KEYS):
        a.set_current_key(k)
        v.update(k)
    assert a.take_touched() == set() and a.take_touched() == set()
    changes = snapshot_changes(a, t, full=range(MAXP))
    assert changes.deltas == {}
    b = make_backend(max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1))
    for section in changes.full:
        apply_change(b, timers_of(b), section, "full")
    vb = b.get_state(ValueStateDescriptor[int]("v"))
    for k in range(KEYS):
        b.set_current_key(k)
        assert vb.value() == k
    a.track_changes()
    a.set_current_key(3)
    assert a.take_touched() == {3}


def test_a_delta_naming_every_key_in_rows_of_their_own_applies_the_same(
    make_backend: BackendFactory,
) -> None:
    """Format version 4 wrote a delta's every key as a row of its own, beside its entries:
    such a delta rebuilds the same state as the version 5 delta that names a key with
    entries or timers by those alone."""
    import pyarrow as pa

    full = KeyGroupRange(0, MAXP - 1)
    a = make_backend(max_parallelism=MAXP, key_group_range=full)
    ta = timers_of(a)
    v = a.get_state(ValueStateDescriptor[float]("v"))
    for k in range(KEYS):
        a.set_current_key(k)
        v.update(float(k))
    a.track_changes()
    base = list(snapshot_changes(a, ta, full=range(MAXP)).full)
    a.set_current_key(3)
    v.update(30.0)
    a.set_current_key(4)
    v.clear()
    a.set_current_key(5)
    ta.register_event_time_timer(None, 9.0)
    changes = snapshot_changes(a, ta, full=())
    for rebuilt in ("v5", "v4"):
        b = make_backend(max_parallelism=MAXP, key_group_range=full)
        tb = timers_of(b)
        for section in base:
            apply_change(b, tb, section, "full")
        for section in split_shared(written(changes)[0], "delta"):
            t = section.table
            if rebuilt == "v4":  # add the rows a version 4 writer added for every key
                rows = t.to_pylist()
                listed = {r["key"] for r in rows if r["row"] == 2}
                for enc in dict.fromkeys(r["key"] for r in rows if r["row"] in (0, 1)):
                    if enc not in listed:
                        rows.append(dict.fromkeys(t.schema.names) | {"row": 2, "key": enc})
                t = pa.Table.from_pylist(rows, schema=t.schema)
            apply_change(b, tb, section.__class__(section.tag, t, section.part), rebuilt)
        assert read_all(b, tb) == read_all(a, ta), rebuilt


def test_full_sections_are_built_one_key_group_at_a_time_as_the_writer_takes_them(
    make_backend: BackendFactory,
) -> None:
    """A snapshot's full sections are never all in memory: each key group's entries are
    dumped when its section is asked for, and the encoder keeps no table it has
    written but the last (so a state larger than memory is written)."""
    a, t, _ = counted(make_backend, timers=True)
    a.track_changes()
    dumped: list[tuple[int, ...]] = []
    dump = a.dump

    def spy(key_groups: Any = None) -> Any:
        dumped.append(tuple(key_groups))
        return dump(key_groups)

    a.dump = spy  # type: ignore[method-assign]
    changes = snapshot_changes(a, t, full=range(MAXP))
    assert dumped == [] and changes.deltas == {}  # nothing built yet
    released: list[weakref.ref[pa.Table]] = []

    def taken() -> Iterator[Section]:
        for section in changes.full:
            assert all(r() is None for r in released[:-1]), "the encoder kept a table"
            assert dumped[-1] == (section.tag,)  # this key group's entries alone
            released.append(weakref.ref(section.table))
            yield section
            gc.collect()

    data, extents = encode(Kind.KEY_GROUPS, taken())
    groups = sorted({assign_to_key_group(k, MAXP) for k in range(KEYS)})
    assert [d for (d,) in dumped] == list(range(MAXP)) and len(extents) == len(groups)
    b = make_backend(max_parallelism=MAXP, key_group_range=KeyGroupRange(0, MAXP - 1))
    tb = timers_of(b)
    for section in decode(data, Kind.KEY_GROUPS, "key-group file"):
        apply_change(b, tb, section, "key-group file")
    a.dump = dump  # type: ignore[method-assign]
    assert read_all(b, tb) == read_all(a, t)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    order=st.permutations(range(KEYS)),
    touched=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=12),
)
def test_a_section_lists_its_keys_in_canonical_order_whatever_order_they_came_in(
    any_backend_factory: Any, order: list[int], touched: list[int]
) -> None:
    """A key group's keys are written in the order of their canonical bytes (RocksDB's),
    whatever order they came in and after a restore re-put some of them (a heap dict
    keeps the order keys came in, a re-put key moved to its end): both backends write
    the same sections for the same state, full and delta."""
    every = KeyGroupRange(0, MAXP - 1)
    out: dict[str, tuple[list[Section], list[Section]]] = {}
    for kind in ("heap", "rocksdb"):
        a = any_backend_factory(kind)(max_parallelism=MAXP, key_group_range=every)
        ta = timers_of(a)
        v = a.get_state(ValueStateDescriptor[int]("v"))
        for k in order:
            a.set_current_key(k)
            v.update(k)
        a.track_changes()
        base = list(snapshot_changes(a, ta, full=range(MAXP)).full)
        for k in touched:
            a.set_current_key(k)
            v.update(k + 100)
        delta = written(snapshot_changes(a, ta, full=()))
        b = any_backend_factory(kind)(max_parallelism=MAXP, key_group_range=every)
        tb = timers_of(b)
        for section in [*base, *delta]:  # a restore: the full sections, then the delta
            apply_change(b, tb, section, "restore")
        b.get_state(ValueStateDescriptor[int]("v"))
        b.track_changes()
        again = list(snapshot_changes(b, tb, full=range(MAXP)).full)
        for section in [*base, *delta, *again]:
            pairs = list(
                zip(
                    section.table.column("key_group").to_pylist()
                    if section.tag == SHARED else [section.tag] * section.table.num_rows,
                    section.table.column("key").to_pylist(),
                    strict=True,
                )
            )  # fmt: skip
            assert pairs == sorted(pairs), (kind, section.tag)
        now = list(snapshot_changes(a, ta, full=range(MAXP)).full)
        assert [s.tag for s in again] == [s.tag for s in now]
        for x, y in zip(again, now, strict=True):  # restored: the same bytes as kept
            assert x.table.equals(y.table), (kind, x.tag)
        out[kind] = (delta, again)
    (d_heap, a_heap), (d_rocks, a_rocks) = out["heap"], out["rocksdb"]
    assert [s.tag for s in a_heap] == [s.tag for s in a_rocks]
    for x, y in zip([*d_heap, *a_heap], [*d_rocks, *a_rocks], strict=True):
        assert x.table.equals(y.table), x.tag
