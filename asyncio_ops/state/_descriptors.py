"""State descriptors: name, kind, serializer and TTL of one keyed state.

A descriptor is configuration: frozen, picklable (if its functions are) and
compared by value. Two ``get_state`` calls with descriptors of the same name
must agree on the kind; the first registration fixes serializer and TTL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, TypeVar

from .._exceptions import ConfigurationError
from ._api import AggregateFunction
from ._serializers import PICKLE_SERIALIZER, Serializer
from ._ttl import StateTtlConfig

__all__ = [
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
IN = TypeVar("IN")
OUT = TypeVar("OUT")

VALUE: Final = "value"
LIST: Final = "list"
MAP: Final = "map"
REDUCING: Final = "reducing"
AGGREGATING: Final = "aggregating"
KINDS: Final = (VALUE, LIST, MAP, REDUCING, AGGREGATING)


@dataclass(frozen=True, kw_only=True)
class StateDescriptor:
    """Base of the descriptors; ``kind`` names the state kind."""

    kind: ClassVar[str] = ""
    name: str
    serializer: Serializer = field(default=PICKLE_SERIALIZER)
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"state name must be a non-empty str, got {self.name!r}")
        if not (
            callable(getattr(self.serializer, "dumps", None))
            and callable(getattr(self.serializer, "loads", None))
        ):
            raise ConfigurationError(
                f"state {self.name!r}: serializer must have dumps() and loads(), "
                f"got {self.serializer!r}"
            )
        if self.ttl is not None and not isinstance(self.ttl, StateTtlConfig):
            raise ConfigurationError(
                f"state {self.name!r}: ttl must be a StateTtlConfig, got {self.ttl!r}"
            )


@dataclass(frozen=True, init=False)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """``ValueStateDescriptor("seen", ttl=StateTtlConfig(60))``."""

    kind: ClassVar[str] = VALUE

    def __init__(
        self,
        name: str,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        _init(self, name, serializer, ttl)


@dataclass(frozen=True, init=False)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """``ListStateDescriptor("events")``; the serializer is per element."""

    kind: ClassVar[str] = LIST

    def __init__(
        self,
        name: str,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        _init(self, name, serializer, ttl)


@dataclass(frozen=True, init=False)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """``MapStateDescriptor("by_id")``; the serializer is for map values.

    Map keys are encoded canonically (like stream keys), so they are limited
    to None, bool, int, float, str, bytes, date, datetime, Decimal and tuples.
    """

    kind: ClassVar[str] = MAP

    def __init__(
        self,
        name: str,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        _init(self, name, serializer, ttl)


@dataclass(frozen=True, init=False)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """``ReducingStateDescriptor("sum", lambda a, b: a + b)``."""

    kind: ClassVar[str] = REDUCING
    reduce_fn: Callable[[T, T], T]

    def __init__(
        self,
        name: str,
        reduce_fn: Callable[[T, T], T],
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        if not callable(reduce_fn):
            raise ConfigurationError(
                f"state {name!r}: reduce_fn must be callable, got {reduce_fn!r}"
            )
        object.__setattr__(self, "reduce_fn", reduce_fn)
        _init(self, name, serializer, ttl)


@dataclass(frozen=True, init=False)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, OUT]):
    """``AggregatingStateDescriptor("avg", MyAverage())``; the serializer is for accumulators."""

    kind: ClassVar[str] = AGGREGATING
    aggregate_fn: AggregateFunction[IN, Any, OUT]

    def __init__(
        self,
        name: str,
        aggregate_fn: AggregateFunction[IN, Any, OUT],
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        if not all(
            callable(getattr(aggregate_fn, m, None))
            for m in ("create_accumulator", "add", "get_result")
        ):
            raise ConfigurationError(
                f"state {name!r}: aggregate_fn must have create_accumulator(), add() and "
                f"get_result(), got {aggregate_fn!r}"
            )
        object.__setattr__(self, "aggregate_fn", aggregate_fn)
        _init(self, name, serializer, ttl)


def _init(
    desc: StateDescriptor, name: str, serializer: Serializer, ttl: StateTtlConfig | None
) -> None:
    object.__setattr__(desc, "name", name)
    object.__setattr__(desc, "serializer", serializer)
    object.__setattr__(desc, "ttl", ttl)
    desc.__post_init__()
