"""What a ``KeyedProcessFunction`` declares: the states its ``open`` obtains.

Contract: :func:`declared_states` runs ``fn.open`` once, on a throwaway heap
backend of one key group, with no timers scheduled and no element processed,
then ``fn.close``; it returns every state the function asked for, with its kind
and declared types (``state._schema``). The function keeps the state handles its
``open`` stored: pass a copy. The driver's check of a restart (the Spark layer)
compares them with what a checkpoint holds.
"""

from __future__ import annotations

from typing import Any

from .._engine._keyed_operator import KeyedProcessOperator
from .._functions import RuntimeContext
from .._keygroups import KeyGroupRange
from ..state import HeapKeyedStateBackend, KeyedProcessFunction
from ..state._schema import StateTypes

__all__ = ["declared_states"]


def declared_states(fn: KeyedProcessFunction[Any, Any, Any]) -> StateTypes:
    """The states ``fn.open`` declares (module docstring); ``fn`` is opened and closed."""
    backend = HeapKeyedStateBackend(max_parallelism=1, key_group_range=KeyGroupRange(0, 0))
    try:
        op = KeyedProcessOperator(
            fn, _same, backend=backend, output=_discard, schedule_timers=False,
            runtime_context=RuntimeContext(task_name="keyed_process (declaring state)"),
        )  # fmt: skip
        op.open()
        op.close()
        return backend.state_types()
    finally:
        backend.close()


def _same(value: Any) -> Any:
    return value


def _discard(element: Any) -> None:
    return None
