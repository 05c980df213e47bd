"""Typed state: the check on write, around a backend's own state object.

Contract: :func:`typed_state` wraps the value, list or map state a backend
made for a typed descriptor. Every write (``update``, ``add``, ``add_all``,
``put``, ``put_all``) and every map key given to a read first goes through
the declared type's normaliser (``_types.StateType.fit``); the backend then
stores the normalised value, so a read gives the same value before and after
a checkpoint. A value that does not fit raises
:class:`~asyncio_ops.StateTypeError` naming the state, the current key, the
value and what does not fit, and nothing is written (``add_all`` / ``update``
/ ``put_all`` check every item first). Reads pass through. Untyped states are
never wrapped: their hot path is the backend's own. Reducing and aggregating
state are not wrapped either: what they keep is ``reduce_fn``'s result or
``add``'s accumulator, which their cell checks with :func:`checker` before
keeping it (``TableBase.fit``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .._exceptions import StateError, StateTypeError
from ._api import ListState, MapState, State, ValueState
from ._descriptors import AGGREGATING, LIST, MAP, REDUCING, VALUE, StateDescriptor
from ._types import StateType, _Misfit

__all__ = ["checker", "typed_state"]


def checker(
    name: str, t: StateType, what: str, current_key: Callable[[], Any]
) -> Callable[[Any], Any]:
    fit = t.fit

    def check(value: Any) -> Any:
        try:
            return fit(value)
        except _Misfit as exc:
            raise StateTypeError(
                f"state {name!r}, key {current_key()!r:.100}: {what} "
                f"{value!r:.200} does not fit the declared type {t.ddl}: {exc}"
            ) from None

    return check


class _TypedValue(ValueState[Any]):
    __slots__ = ("_check", "_s")

    def __init__(self, state: ValueState[Any], check: Callable[[Any], Any]) -> None:
        self._s = state
        self._check = check

    def value(self) -> Any:
        return self._s.value()

    def update(self, value: Any) -> None:
        self._s.update(None if value is None else self._check(value))

    def clear(self) -> None:
        self._s.clear()


class _TypedList(ListState[Any]):
    __slots__ = ("_check", "_s")

    def __init__(self, state: ListState[Any], check: Callable[[Any], Any]) -> None:
        self._s = state
        self._check = check

    def _all(self, values: Iterable[Any]) -> list[Any]:
        # None is left to the backend's state, whose error names it
        return [None if v is None else self._check(v) for v in values]

    def get(self) -> list[Any]:
        return self._s.get()

    def add(self, value: Any) -> None:
        self._s.add(None if value is None else self._check(value))

    def add_all(self, values: Iterable[Any]) -> None:
        self._s.add_all(self._all(values))

    def update(self, values: Iterable[Any]) -> None:
        self._s.update(self._all(values))

    def clear(self) -> None:
        self._s.clear()


class _TypedMap(MapState[Any, Any]):
    __slots__ = ("_key", "_s", "_value")

    def __init__(
        self, state: MapState[Any, Any], key: Callable[[Any], Any], value: Callable[[Any], Any]
    ) -> None:
        self._s = state
        self._key = key
        self._value = value

    def get(self, key: Any) -> Any:
        return self._s.get(self._key(key))

    def put(self, key: Any, value: Any) -> None:
        self._s.put(self._key(key), None if value is None else self._value(value))

    def put_all(self, mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        pairs = list(mapping.items() if isinstance(mapping, Mapping) else mapping)
        self._s.put_all([(self._key(k), None if v is None else self._value(v)) for k, v in pairs])

    def remove(self, key: Any) -> None:
        self._s.remove(self._key(key))

    def contains(self, key: Any) -> bool:
        return self._s.contains(self._key(key))

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self._s.items()

    def is_empty(self) -> bool:
        return self._s.is_empty()

    def clear(self) -> None:
        self._s.clear()


def typed_state(state: State, descriptor: StateDescriptor, current_key: Callable[[], Any]) -> State:
    """``state`` (a backend's state of the typed ``descriptor``) checked on write;
    ``current_key`` names the key in errors."""
    name, value_type = descriptor.name, descriptor.value_type
    assert value_type is not None
    if descriptor.kind == VALUE:
        assert isinstance(state, ValueState)
        return _TypedValue(state, checker(name, value_type, "value", current_key))
    if descriptor.kind == LIST:
        assert isinstance(state, ListState)
        return _TypedList(state, checker(name, value_type, "element", current_key))
    if descriptor.kind == MAP:
        assert isinstance(state, MapState) and descriptor.key_type is not None
        return _TypedMap(
            state, checker(name, descriptor.key_type, "map key", current_key),
            checker(name, value_type, "map value", current_key),
        )  # fmt: skip
    if descriptor.kind in (REDUCING, AGGREGATING):
        return state  # its cell checks what it keeps (TableBase.fit): a result, not an input
    raise StateError(f"state {name!r}: {descriptor.kind} state cannot be typed")
