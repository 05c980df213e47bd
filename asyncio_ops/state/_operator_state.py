"""Operator (non-keyed) state: list state bound to one parallel operator instance.

Two redistribution modes decide what each new instance gets when a snapshot
taken at parallelism ``p`` is restored at parallelism ``q`` (Flink's
``OperatorStateStore``):

- **even split** (:meth:`OperatorStateBackend.get_list_state`): the elements
  of all old instances, concatenated in subtask order, are cut into ``q``
  contiguous parts whose sizes differ by at most one; instance ``i`` gets part
  ``i``. At unchanged parallelism every instance gets its own elements back.
- **union** (:meth:`OperatorStateBackend.get_union_list_state`): every new
  instance gets every element of every old instance (for state like "offsets
  of all partitions" where each instance picks what it needs).

A snapshot is one sealed blob per instance (``_blob``; its section's tag is
the subtask index, and a corrupt blob raises
:class:`CorruptStateError` naming the subtask).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from .._exceptions import ConfigurationError, StateError
from ._api import ListState
from ._blob import OPERATOR_STATE, seal, unseal
from ._serializers import PICKLE_SERIALIZER, Serializer

__all__ = ["EVEN_SPLIT", "UNION", "OperatorStateBackend"]

EVEN_SPLIT: Final = "even-split"
UNION: Final = "union"


class _OperatorListState(ListState[Any]):
    __slots__ = ("_items", "mode", "name", "serializer")

    def __init__(self, name: str, mode: str, serializer: Serializer) -> None:
        self.name = name
        self.mode = mode
        self.serializer = serializer
        self._items: list[Any] = []

    def get(self) -> list[Any]:
        return list(self._items)

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"operator state {self.name!r}: None cannot be stored")
        self._items.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        if any(v is None for v in items):
            raise StateError(f"operator state {self.name!r}: None cannot be stored")
        self._items.extend(items)

    def update(self, values: Iterable[Any]) -> None:
        self.clear()
        self.add_all(values)

    def clear(self) -> None:
        self._items = []


def _split(items: list[Any], parts: int, index: int) -> list[Any]:
    """Part ``index`` of ``items`` cut into ``parts`` contiguous, near-equal parts."""
    base, extra = divmod(len(items), parts)
    start = index * base + min(index, extra)
    return items[start : start + base + (1 if index < extra else 0)]


class OperatorStateBackend:
    """Operator list states of instance ``index`` of ``parallelism`` (see module docstring).

    Call order: ``restore(snapshots)`` (optional, with the blobs of *every* old
    instance in subtask order), ``get_list_state``/``get_union_list_state``,
    then ``snapshot()`` as often as needed.

    Example: one instance's state restored at parallelism 2.

    >>> from asyncio_ops.state import OperatorStateBackend
    >>> old = OperatorStateBackend(index=0, parallelism=1)
    >>> old.get_list_state("buffered").add_all(["a", "b", "c", "d"])
    >>> old.get_union_list_state("offsets").add_all([10, 20])
    >>> blobs = [old.snapshot()]  # one blob per old instance, in subtask order
    >>> second = OperatorStateBackend(index=1, parallelism=2)
    >>> second.restore(blobs)
    >>> second.get_list_state("buffered").get()  # even split: its part
    ['c', 'd']
    >>> second.get_union_list_state("offsets").get()  # union: everything
    [10, 20]
    """

    def __init__(self, *, index: int = 0, parallelism: int = 1) -> None:
        if not isinstance(parallelism, int) or parallelism <= 0:
            raise ConfigurationError(f"parallelism must be a positive int, got {parallelism!r}")
        if not isinstance(index, int) or not 0 <= index < parallelism:
            raise ConfigurationError(f"index must be in 0..{parallelism - 1}, got {index!r}")
        self.index = index
        self.parallelism = parallelism
        self._states: dict[str, _OperatorListState] = {}
        # Restored, not yet registered: name -> (mode, element bytes).
        self._pending: dict[str, tuple[str, list[bytes]]] = {}

    def get_list_state(
        self, name: str, *, serializer: Serializer = PICKLE_SERIALIZER
    ) -> ListState[Any]:
        """List state redistributed by even split on rescale."""
        return self._get(name, EVEN_SPLIT, serializer)

    def get_union_list_state(
        self, name: str, *, serializer: Serializer = PICKLE_SERIALIZER
    ) -> ListState[Any]:
        """List state that every instance receives whole on restore."""
        return self._get(name, UNION, serializer)

    def _get(self, name: str, mode: str, serializer: Serializer) -> _OperatorListState:
        st = self._states.get(name)
        if st is not None:
            if st.mode != mode:
                raise StateError(f"operator state {name!r} is registered as {st.mode} state")
            return st
        pending = self._pending.get(name)
        if pending is not None and pending[0] != mode:
            raise StateError(
                f"operator state {name!r} was restored as {pending[0]} state, not {mode}"
            )
        st = _OperatorListState(name, mode, serializer)
        if pending is not None:
            del self._pending[name]
            st._items = [serializer.loads(b) for b in pending[1]]
        self._states[name] = st
        return st

    def state_names(self) -> list[str]:
        return sorted(set(self._states) | set(self._pending))

    def snapshot(self) -> bytes:
        """One sealed blob with every state of this instance (:meth:`dump`, sealed)."""
        return seal(OPERATOR_STATE, self.index, self.dump())

    def dump(self) -> list[tuple[str, str, list[bytes]]]:
        """``[(state, mode, items), ...]``: every state of this instance, its items as
        their serializer's bytes (what a snapshot holds; :meth:`load` takes it back)."""
        payload = [
            (st.name, st.mode, [st.serializer.dumps(v) for v in st._items])
            for st in self._states.values()
        ]
        payload += [(name, mode, list(items)) for name, (mode, items) in self._pending.items()]
        return payload

    def restore(self, snapshots: Sequence[bytes]) -> None:
        """Take this instance's share of the snapshots of all old instances (subtask order)."""
        given: object = snapshots
        if isinstance(given, bytes | bytearray):
            raise ConfigurationError(
                "OperatorStateBackend.restore takes the list of every old instance's blob"
            )
        self.load(
            [
                unseal(OPERATOR_STATE, old_index, blob, what="operator state of subtask")
                for old_index, blob in enumerate(snapshots)
            ]
        )

    def load(self, decoded: Sequence[list[tuple[str, str, list[bytes]]]]) -> None:
        """:meth:`restore` from every old instance's :meth:`dump` (subtask order), read
        back from a verified snapshot."""
        same_parallelism = len(decoded) == self.parallelism
        by_name: dict[str, tuple[str, list[list[bytes]]]] = {}
        for payload in decoded:
            for name, mode, _items in payload:
                entry = by_name.setdefault(name, (mode, []))
                if entry[0] != mode:
                    raise StateError(
                        f"operator state {name!r} is {entry[0]} in one snapshot, {mode} in another"
                    )
        for old_index, payload in enumerate(decoded):
            for name, _mode, items in payload:
                parts = by_name[name][1]
                while len(parts) < old_index:
                    parts.append([])
                parts.append(items)
        for name, (mode, parts) in by_name.items():
            if mode == UNION:
                mine = [b for part in parts for b in part]
            elif same_parallelism:
                mine = parts[self.index] if self.index < len(parts) else []
            else:
                mine = _split([b for part in parts for b in part], self.parallelism, self.index)
            self._restore_items(name, mode, mine)

    def _restore_items(self, name: str, mode: str, items: list[bytes]) -> None:
        st = self._states.get(name)
        if st is not None:
            if st.mode != mode:
                raise StateError(f"operator state {name!r} is {st.mode} here, {mode} in snapshot")
            st._items.extend(st.serializer.loads(b) for b in items)
            return
        pending = self._pending.setdefault(name, (mode, []))
        if pending[0] != mode:
            raise StateError(f"operator state {name!r} restored as both {pending[0]} and {mode}")
        pending[1].extend(items)

    def __repr__(self) -> str:
        return (
            f"OperatorStateBackend(index={self.index}, parallelism={self.parallelism}, "
            f"states={self.state_names()})"
        )
