"""Keyed state and timers of one operator, snapshotted together per key group.

:func:`snapshot_key_groups` turns a :class:`KeyedStateBackend` and the
:class:`InternalTimerService` scoped to its keys into ``{key_group: blob}``:
one sealed keyed-operator blob per non-empty key group, holding the group's
keyed-state blob and its timers (``_blob``, ``_payloads``).
:func:`restore_key_groups` takes the groups of such a snapshot inside the
backend's range (so state and timers move together on rescale), verifying
every blob before applying any; a key keeps the key group it was filed under.

Both the keyed process operator and the async operator's checkpoints (its
in-flight elements and their timeout timers) are written this way.

Incremental: :func:`snapshot_changes` returns, per key group, either its
full blob (keys ``None``) or a delta: the canonical bytes of the keys made
current since the last snapshot (``KeyedStateBackend.track_changes``) and a
blob of the same shape holding exactly those keys' state and timers.
:func:`apply_change` applies one such item: a full blob replaces the key
group, a delta replaces its keys whole (a key without entries in the blob
is deleted), so applying a key group's last full blob and the deltas after
it, in order, rebuilds the key group as it was.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .._exceptions import CorruptStateError
from .._timers import InternalTimerService
from ._backend import KeyedStateBackend
from ._blob import KEYED_OPERATOR, seal, unseal
from ._keycodec import decode_canonical

__all__ = ["apply_change", "restore_key_groups", "snapshot_changes", "snapshot_key_groups"]

Change = tuple[list[bytes] | None, bytes]
"""One key group's item of an incremental snapshot: (None, full blob) or (keys, delta blob)."""


def snapshot_key_groups(
    backend: KeyedStateBackend, timers: InternalTimerService
) -> dict[int, bytes]:
    """``{key_group: blob}``: each blob holds the group's state blob and its timers."""
    state = backend.snapshot()
    groups = timers.snapshot()
    return {
        kg: seal(KEYED_OPERATOR, kg, (state.get(kg), groups.get(kg, [])))
        for kg in sorted(state.keys() | groups.keys())
    }


def restore_key_groups(
    backend: KeyedStateBackend, timers: InternalTimerService, snapshot: Mapping[int, bytes]
) -> int:
    """Take the key groups of ``snapshot`` inside the backend's range; returns how many.

    May be called once per old operator instance on rescale. Every blob taken
    is verified (CorruptStateError naming its key group) before any is applied.
    """
    kgr = backend.key_group_range
    states: dict[int, bytes] = {}
    groups: dict[int, list[tuple[str, Any, Any, float]]] = {}
    for kg, blob in snapshot.items():
        if not isinstance(kg, int) or kg not in kgr:
            continue
        state_blob, kg_timers = _unseal_operator(kg, blob)
        if state_blob is not None:
            states[kg] = state_blob
        groups[kg] = kg_timers
    backend.restore(states)
    timers.restore(groups)
    return len(groups)


def snapshot_changes(
    backend: KeyedStateBackend, timers: InternalTimerService, full: Collection[int]
) -> dict[int, Change]:
    """``{key_group: (keys, blob)}``: the full blob (keys None) of every non-empty key
    group in ``full``, and a delta of every other key group with keys made current
    since the last call (see the module docstring)."""
    touched = backend.take_touched()
    if set(full).issuperset(backend.key_group_range):
        touched = set()  # every key group in full: no delta to write
    out: dict[int, Change] = {}
    if full:
        state = backend.snapshot(full)
        groups = timers.snapshot(full)
        for kg in sorted(state.keys() | groups.keys()):
            out[kg] = (None, seal(KEYED_OPERATOR, kg, (state.get(kg), groups.get(kg, []))))
    delta = backend.encoded_keys(touched, skip=full)
    if delta:
        state = backend.snapshot_keys(delta)
        groups = timers.snapshot_keys({kg: [k for k, _ in pairs] for kg, pairs in delta.items()})
        for kg, pairs in sorted(delta.items()):
            blob = seal(KEYED_OPERATOR, kg, (state.get(kg), groups.get(kg, [])))
            out[kg] = ([enc for _, enc in pairs], blob)
    return out


def apply_change(
    backend: KeyedStateBackend,
    timers: InternalTimerService,
    kg: int,
    keys: Sequence[bytes] | None,
    blob: bytes,
) -> None:
    """Apply one key group's item of :func:`snapshot_changes` (see the module docstring).

    The blob is verified (CorruptStateError naming the key group) before anything
    changes.
    """
    if kg not in backend.key_group_range:
        return
    state_blob, kg_timers = _unseal_operator(kg, blob)
    if keys is None:
        backend.clear_key_group(kg)
        timers.clear_key_group(kg)
    else:
        pairs = [(decode_canonical(enc), enc) for enc in keys]
        backend.remove_keys(kg, pairs)
        timers.remove_keys(kg, [key for key, _ in pairs])
    if state_blob is not None:
        backend.restore({kg: state_blob})
    timers.restore({kg: kg_timers})


def _unseal_operator(kg: int, blob: bytes) -> tuple[bytes | None, list[Any]]:
    """A key group's keyed-operator blob, verified: its state blob (or None) and timers."""
    payload = unseal(KEYED_OPERATOR, kg, blob)
    try:
        state_blob, kg_timers = payload
    except (TypeError, ValueError) as exc:
        raise CorruptStateError(f"key group {kg}: malformed operator snapshot") from exc
    return state_blob, kg_timers
