"""The states a function declares, and whether a checkpoint's states restore into them.

Contract:

- :func:`declared_states` runs ``fn.open(ctx)`` once on a throwaway heap
  backend (one key group, no key ever set) and returns what its
  ``ctx.get_state`` calls declared: ``{state: (kind, value type, map key
  type)}`` (types None: untyped). It is how a driver learns a
  :class:`KeyedProcessFunction`'s states before any task runs (Spark runs a
  ``StatefulProcessor``'s ``init`` on the driver for the same purpose); states
  obtained later than ``open`` are not seen. ``fn`` is then closed; pass a copy
  (``open`` usually stores its state handles on ``fn``).
- :func:`check_restore` compares what a checkpoint recorded with what is
  declared: for every state in both, the one rule of ``_types.evolution``
  (IncompatibleStateError naming the state, both types, why, and what to do);
  a state only in the checkpoint is kept unclaimed, one only declared starts
  empty. :func:`types_json` / :func:`types_of_json` are the record's form in
  a manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._functions import RuntimeContext
from .._keygroups import KeyGroupRange
from ._heap import HeapKeyedStateBackend
from ._keyed_operator import KeyedProcessFunction, KeyedProcessOperator
from ._types import StateType, evolution, types_json, types_of_json

__all__ = ["StateTypes", "check_restore", "declared_states", "types_json", "types_of_json"]

StateTypes = dict[str, tuple[str, StateType | None, StateType | None]]


def declared_states(fn: KeyedProcessFunction[Any, Any, Any]) -> StateTypes:
    """The states ``fn.open`` declares (see the module docstring)."""
    backend = HeapKeyedStateBackend(max_parallelism=1, key_group_range=KeyGroupRange(0, 0))
    try:
        op = KeyedProcessOperator(
            fn, _no_key, backend=backend, output=_discard, schedule_timers=False,
            runtime_context=RuntimeContext(task_name="keyed_process (declaring state)"),
        )  # fmt: skip
        op.open()
        op.close()
        return backend.state_types()
    finally:
        backend.close()


def check_restore(recorded: Mapping[str, tuple[str, Any, Any]], declared: StateTypes) -> None:
    """IncompatibleStateError for the first state (by name) of both that cannot restore."""
    for name in sorted(recorded.keys() & declared.keys()):
        old_kind, old, old_key = recorded[name]
        new_kind, new, new_key = declared[name]
        evolution(name, old, new, old_kind=old_kind, new_kind=new_kind,
                  old_key=old_key, new_key=new_key)  # fmt: skip


def _no_key(value: Any) -> Any:
    return value


def _discard(element: Any) -> None:
    return None
