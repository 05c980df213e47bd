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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import CorruptStateError
from .._timers import InternalTimerService
from ._backend import KeyedStateBackend
from ._blob import KEYED_OPERATOR, seal, unseal

__all__ = ["restore_key_groups", "snapshot_key_groups"]


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
        payload = unseal(KEYED_OPERATOR, kg, blob)
        try:
            state_blob, kg_timers = payload
        except (TypeError, ValueError) as exc:
            raise CorruptStateError(f"key group {kg}: malformed operator snapshot") from exc
        if state_blob is not None:
            states[kg] = state_blob
        groups[kg] = kg_timers
    backend.restore(states)
    timers.restore(groups)
    return len(groups)
