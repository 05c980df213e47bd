"""Keyed state and timers of one operator, snapshotted together per key group.

:func:`snapshot_key_groups` turns a :class:`KeyedStateBackend` and the
:class:`InternalTimerService` scoped to its keys into ``{key_group: blob}``:
one sealed ``KEY_GROUPS`` blob per non-empty key group, holding the group's
keyed state and its timers in one typed table (``_blob``, ``_payloads``).
:func:`restore_key_groups` takes the groups of such a snapshot inside the
backend's range (so state and timers move together on rescale), verifying
every blob before applying any; a key keeps the key group it was filed under.

Incremental (what checkpoint files hold, sections of one container,
``asyncio_ops._storage._container``): :func:`snapshot_changes` returns, per key
group, a section of the same table: the key group's full state (part
``FULL``, a section of its own), or a delta (part ``DELTA``): the canonical
bytes of the keys made current since the last snapshot
(``KeyedStateBackend.track_changes``) with exactly those keys' state and
timers (a key with entries or timers is named by them alone; a row of its
own names a key that has neither). The deltas of all key groups are ONE
section (tag ``SHARED``, the same object for each of them): one table sorted
by key group with it as a column, so a micro-batch that touches a few keys
in each of many key groups builds, writes and reads one table, not one per
key group. :func:`apply_change` applies one such section (a SHARED one: each
key group in it): a full one replaces the key group, a delta replaces its
keys whole (a key without entries in it is deleted), so applying a key
group's last full section and the deltas after it, in order, rebuilds the
key group as it was. Full sections are built one key group at a time, as the
checkpoint writer takes them (:class:`Changes`), so the memory a snapshot
takes grows with one key group and the keys touched, not with the state: a
RocksDB state larger than memory is written out without being held in it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from .._exceptions import CorruptStateError
from .._keygroups import canonical_bytes
from .._storage._container import DELTA, SHARED, Kind, Section, split_shared
from .._timers import InternalTimerService
from ._backend import KeyedStateBackend
from ._blob import KEYED_OPERATOR, seal, unseal
from ._keycodec import decode_canonical
from ._payloads import KeyGroupPayload, key_groups_table, read, table, value_key_group_table

__all__ = [
    "Changes",
    "apply_change",
    "delta_keys",
    "key_group_sections",
    "restore_key_groups",
    "snapshot_changes",
    "snapshot_key_groups",
]


def snapshot_key_groups(
    backend: KeyedStateBackend, timers: InternalTimerService
) -> dict[int, bytes]:
    """``{key_group: blob}``: each blob holds the group's keyed state and its timers.

    Example:

    >>> from asyncio_ops import InternalTimerService
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor, restore_key_groups,
    ...     snapshot_key_groups)
    >>> class Fired:
    ...     def on_event_time(self, timer): print("fired", timer.key, timer.timestamp)
    ...     def on_processing_time(self, timer): pass
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> timers = InternalTimerService("user-timers", Fired(), key_context=backend)
    >>> backend.set_current_key("user-1")
    >>> backend.get_state(ValueStateDescriptor("count")).update(3)
    >>> timers.register_event_time_timer(None, 60.0)
    >>> blobs = snapshot_key_groups(backend, timers)
    >>> sorted(blobs)  # the key group of "user-1"
    [70]
    """
    state = backend.dump()
    groups = timers.snapshot()
    return {
        kg: seal(KEYED_OPERATOR, kg, (state.get(kg, []), groups.get(kg, []), None))
        for kg in sorted(state.keys() | groups.keys())
    }


def restore_key_groups(
    backend: KeyedStateBackend, timers: InternalTimerService, snapshot: Mapping[int, bytes]
) -> int:
    """Take the key groups of ``snapshot`` inside the backend's range; returns how many.

    May be called once per old operator instance on rescale. Every blob taken
    is verified (CorruptStateError naming its key group) before any is applied.

    Example: a snapshot restored into a new backend and timer service.

    >>> from asyncio_ops import InternalTimerService
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor, restore_key_groups,
    ...     snapshot_key_groups)
    >>> class Fired:
    ...     def on_event_time(self, timer): print("fired", timer.key, timer.timestamp)
    ...     def on_processing_time(self, timer): pass
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> timers = InternalTimerService("user-timers", Fired(), key_context=backend)
    >>> backend.set_current_key("user-1")
    >>> backend.get_state(ValueStateDescriptor("count")).update(3)
    >>> timers.register_event_time_timer(None, 60.0)
    >>> blobs = snapshot_key_groups(backend, timers)
    >>> sorted(blobs)  # the key group of "user-1"
    [70]
    >>> new = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(64, 127))
    >>> new_timers = InternalTimerService("user-timers", Fired(), key_context=new)
    >>> restore_key_groups(new, new_timers, blobs)
    1
    >>> new.set_current_key("user-1")
    >>> new.get_state(ValueStateDescriptor("count")).value()
    3
    >>> new_timers.advance_watermark(60.0)
    fired user-1 60.0
    1
    """
    kgr = backend.key_group_range
    states: dict[int, list[Any]] = {}
    groups: dict[int, list[tuple[str, Any, Any, float]]] = {}
    for kg, blob in snapshot.items():
        if not isinstance(kg, int) or kg not in kgr:
            continue
        dumps, kg_timers, replaced = unseal(KEYED_OPERATOR, kg, blob)
        if replaced:
            raise CorruptStateError(f"key group {kg}: a delta where a full snapshot was expected")
        states[kg] = dumps
        groups[kg] = kg_timers
    backend.load(states)
    timers.restore(groups)
    return len(groups)


def key_group_sections(
    backend: KeyedStateBackend,
    timers: InternalTimerService,
    key_groups: Iterable[int] | None = None,
) -> Iterator[Section]:
    """The full state and timers of every non-empty key group (of ``key_groups``, if
    given), a ``FULL`` section each, in key-group order, each built when asked for:
    one key group's entries at a time, never the whole state (a checkpoint writer
    encodes and drops each before the next). ``timers`` is scoped to the backend's
    keys (indexed by key group), as a :class:`KeyedProcessOperator`'s is."""
    groups = sorted(backend.key_group_range if key_groups is None else key_groups)
    for kg in groups:
        kg_timers = timers.snapshot((kg,)).get(kg, [])
        runs = None if kg_timers else backend.value_runs(kg)
        if runs is not None:  # the same table, column by column
            if runs:
                yield Section(kg, value_key_group_table(runs))
            continue
        state = backend.dump((kg,)).get(kg, [])
        if state or kg_timers:
            yield Section(kg, table(Kind.KEY_GROUPS, (state, kg_timers, None)))


class Changes(NamedTuple):
    """What :func:`snapshot_changes` returns: the deltas, ``{key_group: section}`` (the
    SHARED one), and the full sections, built one at a time as they are iterated
    (:func:`key_group_sections`)."""

    deltas: dict[int, Section]
    full: Iterator[Section]


def snapshot_changes(
    backend: KeyedStateBackend, timers: InternalTimerService, full: Collection[int]
) -> Changes:
    """The full state of every non-empty key group in ``full``, and a delta of every
    other key group with keys made current since the last call (see the module
    docstring). The deltas are built now; the full sections as they are iterated,
    which must happen before the state changes again."""
    touched = backend.take_touched()
    if set(full).issuperset(backend.key_group_range):
        touched = set()  # every key group in full: no delta to write
    out: dict[int, Section] = {}
    delta = backend.encoded_keys(touched, skip=full)
    if delta:
        state = backend.dump_keys(delta)
        groups = timers.snapshot_keys({kg: [k for k, _ in pairs] for kg, pairs in delta.items()})
        payloads = [
            (kg, (state.get(kg, []), groups.get(kg, []), [enc for _, enc in pairs]))
            for kg, pairs in sorted(delta.items())
        ]
        shared = Section(SHARED, key_groups_table(payloads), DELTA)
        out.update(dict.fromkeys(delta, shared))
    return Changes(out, key_group_sections(backend, timers, full) if full else iter(()))


def apply_change(
    backend: KeyedStateBackend, timers: InternalTimerService, section: Section, where: str
) -> None:
    """Apply one section of :func:`snapshot_changes` (see the module docstring): a key
    group's table is read whole (CorruptStateError naming ``where``) before anything of
    it changes; a SHARED section's key groups in turn."""
    if section.tag == SHARED:
        for one in split_shared(section, where, CorruptStateError):
            apply_change(backend, timers, one, where)
        return
    kg = section.tag
    if kg not in backend.key_group_range:
        return
    dumps, kg_timers, replaced = read(Kind.KEY_GROUPS, section.table, where)
    if section.part != DELTA:
        _apply(backend, timers, kg, (dumps, kg_timers, None))
        return
    _apply(backend, timers, kg, (dumps, kg_timers, delta_keys((dumps, kg_timers, replaced))))


def delta_keys(payload: KeyGroupPayload) -> list[bytes]:
    """The canonical bytes of every key a delta replaces whole: those named in a row of
    their own (deleted keys), and those with entries or timers in it."""
    dumps, kg_timers, replaced = payload
    named = dict.fromkeys(replaced or ())
    for dump in dumps:
        named.update(dict.fromkeys(key for key, _, _ in dump[3]))
    named.update(dict.fromkeys(canonical_bytes(key) for _, key, _, _ in kg_timers))
    return list(named)


def _apply(
    backend: KeyedStateBackend, timers: InternalTimerService, kg: int, payload: KeyGroupPayload
) -> None:
    dumps, kg_timers, replaced = payload
    if replaced is None:
        backend.clear_key_group(kg)
        timers.clear_key_group(kg)
    else:
        pairs = [(decode_canonical(enc), enc) for enc in replaced]
        backend.remove_keys(kg, pairs)
        timers.remove_keys(kg, [key for key, _ in pairs])
    backend.load({kg: dumps})
    timers.restore({kg: kg_timers})
