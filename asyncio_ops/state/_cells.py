"""State kinds that keep one cell per key, written once for both backends.

TTL value state, reducing state and aggregating state differ between the heap
and RocksDB backends only in how one cell is read and written; each backend
provides ``_read(for_write=...)``, ``_write(value)`` and ``clear()`` (its
``_HeapCell`` / ``_RocksCell``) and these mixins add the state's semantics.
"""

from __future__ import annotations

from typing import Any

from .._exceptions import StateError
from ._api import AggregatingState, ReducingState, ValueState
from ._descriptors import AggregatingStateDescriptor, ReducingStateDescriptor


class _Cell:
    """What a backend's cell class provides (declared for the type checker)."""

    __slots__ = ()
    _t: Any

    def _read(self, *, for_write: bool = False) -> Any:
        raise NotImplementedError

    def _write(self, value: Any) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError


class TtlValueCell(_Cell, ValueState[Any]):
    """Value state with TTL: ``update(None)`` clears."""

    __slots__ = ()

    def value(self) -> Any:
        return self._read()

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._write(value)


class ReducingCell(_Cell, ReducingState[Any]):
    """Reducing state: ``add`` folds with the descriptor's ``reduce_fn``."""

    __slots__ = ()

    def get(self) -> Any:
        return self._read()

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"state {self._t.name!r}: cannot add None to reducing state")
        descriptor = self._t.descriptor
        assert isinstance(descriptor, ReducingStateDescriptor)
        current = self._read(for_write=True)
        result = value if current is None else descriptor.reduce_fn(current, value)
        fit = self._t.fit
        self._write(result if fit is None else fit(result))


class AggregatingCell(_Cell, AggregatingState[Any, Any]):
    """Aggregating state: an accumulator per key, read through ``get_result``."""

    __slots__ = ()

    def _aggregate(self) -> Any:
        descriptor = self._t.descriptor
        assert isinstance(descriptor, AggregatingStateDescriptor)
        return descriptor.aggregate_fn

    def get(self) -> Any:
        acc = self._read()
        return None if acc is None else self._aggregate().get_result(acc)

    def add(self, value: Any) -> None:
        aggregate = self._aggregate()
        acc = self._read(for_write=True)
        if acc is None:
            acc = aggregate.create_accumulator()
        result = aggregate.add(value, acc)
        fit = self._t.fit
        self._write(result if fit is None else fit(result))
