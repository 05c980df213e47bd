"""The state interfaces users program against (Flink's ``State`` family).

Every keyed state object is bound to one state name and one namespace when it
is obtained (``backend.get_state(descriptor, namespace=...)``) and reads and
writes the entry of the backend's *current key*: call
``backend.set_current_key(key)`` first (an operator does this per record and
per timer). Without a current key every method raises :class:`StateError`.

``None`` means "absent": ``ValueState.value()`` returns None for a key with no
value, ``update(None)`` clears, ``ReducingState.get()`` is None before the
first ``add``. List and map states store no ``None`` elements or values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "ListState",
    "MapState",
    "ReducingState",
    "State",
    "ValueState",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class State(ABC):
    """Any state: it can be cleared for the current key.

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, State, ValueStateDescriptor)
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> seen = backend.get_state(ValueStateDescriptor("seen"))
    >>> backend.set_current_key("user-1")
    >>> seen.update(True)
    >>> seen.clear()
    >>> isinstance(seen, State), seen.value()
    (True, None)
    """

    __slots__ = ()

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's entry."""


class ValueState(State, Generic[T]):
    """One value per key.

    Example:

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> count = backend.get_state(ValueStateDescriptor("count", "long"))
    >>> backend.set_current_key("user-1")
    >>> count.value() is None  # absent
    True
    >>> count.update((count.value() or 0) + 1)
    >>> count.value()
    1
    >>> backend.set_current_key("user-2")  # another key, another value
    >>> count.value() is None
    True
    """

    __slots__ = ()

    @abstractmethod
    def value(self) -> T | None:
        """The current key's value, or None."""

    @abstractmethod
    def update(self, value: T | None) -> None:
        """Set the current key's value; None clears it."""


class ListState(State, Generic[T]):
    """A list of elements per key (also the shape of operator list state).

    Example:

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, ListStateDescriptor
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> events = backend.get_state(ListStateDescriptor("events"))
    >>> backend.set_current_key("user-1")
    >>> events.add("login")
    >>> events.add_all(["view", "buy"])
    >>> events.get()
    ['login', 'view', 'buy']
    >>> events.update(["logout"])
    >>> events.get()
    ['logout']
    """

    __slots__ = ()

    @abstractmethod
    def get(self) -> list[T]:
        """The elements, in insertion order (empty list when there are none)."""

    @abstractmethod
    def add(self, value: T) -> None:
        """Append one element (None is an error)."""

    @abstractmethod
    def add_all(self, values: Iterable[T]) -> None:
        """Append every element of ``values``."""

    @abstractmethod
    def update(self, values: Iterable[T]) -> None:
        """Replace the elements by ``values`` (empty clears)."""


class MapState(State, Generic[K, V]):
    """A map per key. Map keys must have a canonical encoding (like stream keys).

    Iteration order is unspecified (insertion order on the heap, encoded-key
    order in RocksDB).

    Example:

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, MapStateDescriptor
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> carts = backend.get_state(MapStateDescriptor("cart"))
    >>> backend.set_current_key("user-1")
    >>> carts.put("sku-1", 2)
    >>> carts.put_all({"sku-2": 1})
    >>> carts.remove("sku-1")
    >>> carts.get("sku-2"), carts.contains("sku-1"), sorted(carts.items())
    (1, False, [('sku-2', 1)])
    """

    __slots__ = ()

    @abstractmethod
    def get(self, key: K) -> V | None: ...

    @abstractmethod
    def put(self, key: K, value: V) -> None: ...

    @abstractmethod
    def put_all(self, mapping: Mapping[K, V] | Iterable[tuple[K, V]]) -> None: ...

    @abstractmethod
    def remove(self, key: K) -> None: ...

    @abstractmethod
    def contains(self, key: K) -> bool: ...

    @abstractmethod
    def items(self) -> Iterator[tuple[K, V]]: ...

    def keys(self) -> Iterator[K]:
        for k, _ in self.items():
            yield k

    def values(self) -> Iterator[V]:
        for _, v in self.items():
            yield v

    @abstractmethod
    def is_empty(self) -> bool: ...


class ReducingState(State, Generic[T]):
    """Values folded with a reduce function as they are added.

    Example:

    >>> import operator
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, ReducingStateDescriptor)
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> total = backend.get_state(ReducingStateDescriptor("total", operator.add))
    >>> backend.set_current_key("user-1")
    >>> total.get() is None  # before the first add
    True
    >>> total.add(5)
    >>> total.add(7)
    >>> total.get()
    12
    """

    __slots__ = ()

    @abstractmethod
    def get(self) -> T | None: ...

    @abstractmethod
    def add(self, value: T) -> None: ...


class AggregatingState(State, Generic[IN, OUT]):
    """Values folded into an accumulator by an :class:`AggregateFunction`.

    Example:

    >>> from asyncio_ops.state import (
    ...     AggregateFunction, AggregatingStateDescriptor, HeapKeyedStateBackend, KeyGroupRange)
    >>> class Longest(AggregateFunction):  # the longest string added
    ...     def create_accumulator(self):
    ...         return ""
    ...     def add(self, value, accumulator):
    ...         return max(accumulator, value, key=len)
    ...     def get_result(self, accumulator):
    ...         return accumulator
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> longest = backend.get_state(AggregatingStateDescriptor("longest", Longest()))
    >>> backend.set_current_key("user-1")
    >>> for word in ["a", "abc", "ab"]:
    ...     longest.add(word)
    >>> longest.get()
    'abc'
    """

    __slots__ = ()

    @abstractmethod
    def get(self) -> OUT | None: ...

    @abstractmethod
    def add(self, value: IN) -> None: ...


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """PyFlink's AggregateFunction: how an :class:`AggregatingState` folds values.

    ``add`` and ``merge`` may mutate and return the accumulator they are given.

    Example:

    >>> from asyncio_ops.state import (
    ...     AggregateFunction, AggregatingStateDescriptor, HeapKeyedStateBackend, KeyGroupRange)
    >>> class Average(AggregateFunction):
    ...     def create_accumulator(self):
    ...         return (0.0, 0)  # (sum, count)
    ...     def add(self, value, accumulator):
    ...         return (accumulator[0] + value, accumulator[1] + 1)
    ...     def get_result(self, accumulator):
    ...         return accumulator[0] / accumulator[1]
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> average = backend.get_state(AggregatingStateDescriptor("avg", Average()))
    >>> backend.set_current_key("sensor-1")
    >>> for reading in [1.0, 2.0, 6.0]:
    ...     average.add(reading)
    >>> average.get()
    3.0
    """

    @abstractmethod
    def create_accumulator(self) -> ACC: ...

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC: ...

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT: ...

    def merge(self, acc_a: ACC, acc_b: ACC) -> ACC:
        raise NotImplementedError(f"{type(self).__qualname__}.merge")
