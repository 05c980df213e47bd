"""Whether a checkpoint's states restore into the states a function declares.

Contract:

- A state's record is ``(kind, value type, map key type)`` (types None:
  untyped), as ``KeyedStateBackend.state_types`` gives it.
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

from ._types import StateType, evolution, types_json, types_of_json

__all__ = ["StateTypes", "check_restore", "types_json", "types_of_json"]

StateTypes = dict[str, tuple[str, StateType | None, StateType | None]]


def check_restore(recorded: Mapping[str, tuple[str, Any, Any]], declared: StateTypes) -> None:
    """IncompatibleStateError for the first state (by name) of both that cannot restore."""
    for name in sorted(recorded.keys() & declared.keys()):
        old_kind, old, old_key = recorded[name]
        new_kind, new, new_key = declared[name]
        evolution(name, old, new, old_kind=old_kind, new_kind=new_kind,
                  old_key=old_key, new_key=new_key)  # fmt: skip
