"""State descriptors: name, kind, serializer or type, and TTL of one keyed state.

A descriptor is configuration: frozen, picklable (if its functions are) and
compared by value. Two ``get_state`` calls with descriptors of the same name
must agree on the kind, the TTL and the type.

Every kind of state may declare a type (a Spark DDL string or a pyspark
``DataType``, parsed at construction into a :class:`StateType`; a bad one is a
``ConfigurationError`` naming the state): ``ValueStateDescriptor("count",
"long")``, ``ListStateDescriptor("events", "struct<t timestamp, v double>")``,
``MapStateDescriptor("seen", "string", "struct<n long, last timestamp>")``
(map keys and values both, or neither), ``ReducingStateDescriptor("sum",
operator.add, "long")`` (the reduced value), ``AggregatingStateDescriptor("avg",
Avg(), "struct<sum double, n long>")`` (the accumulator). Typed state is checked on write and
checkpointed as typed Arrow columns, never pickled (``_types``); without a
type (the default) values go through ``serializer`` (pickle by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, TypeVar

from .._exceptions import ConfigurationError
from ._api import AggregateFunction
from ._serializers import PICKLE_SERIALIZER, Serializer
from ._ttl import StateTtlConfig
from ._types import StateType

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
    """Base of the descriptors; ``kind`` names the state kind.

    Example:

    >>> from asyncio_ops.state import StateDescriptor, ValueStateDescriptor
    >>> d = ValueStateDescriptor("count", "long")
    >>> isinstance(d, StateDescriptor), d.name, d.kind, d.typed
    (True, 'count', 'value', True)
    >>> d == ValueStateDescriptor("count", "long")  # compared by value
    True
    """

    kind: ClassVar[str] = ""
    name: str
    serializer: Serializer = field(default=PICKLE_SERIALIZER)
    ttl: StateTtlConfig | None = None
    value_type: StateType | None = None
    """The declared type of values (list elements, map values); None: untyped."""
    key_type: StateType | None = None
    """Map state: the declared type of map keys (with ``value_type``)."""

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
        if self.value_type is not None and self.serializer != PICKLE_SERIALIZER:
            raise ConfigurationError(
                f"state {self.name!r}: a typed state is stored as Arrow columns; it takes no "
                "serializer="
            )

    @property
    def typed(self) -> bool:
        """True if the state declares a type (checked on write, Arrow in checkpoints)."""
        return self.value_type is not None


@dataclass(frozen=True, init=False)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """``ValueStateDescriptor("seen", ttl=StateTtlConfig(60))``; typed:
    ``ValueStateDescriptor("count", "long")``.

    Example:

    >>> from asyncio_ops.state import StateTtlConfig, ValueStateDescriptor
    >>> ValueStateDescriptor("seen", ttl=StateTtlConfig("1 hour")).ttl.ttl
    3600.0
    >>> ValueStateDescriptor("count", "long").value_type.ddl
    'bigint'
    """

    kind: ClassVar[str] = VALUE

    def __init__(
        self,
        name: str,
        value_type: object = None,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        _init(self, name, serializer, ttl, value_type)


@dataclass(frozen=True, init=False)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """``ListStateDescriptor("events")``; the serializer is per element; typed:
    ``ListStateDescriptor("events", "struct<t timestamp, v double>")`` (the element type).

    Example:

    >>> from asyncio_ops.state import ListStateDescriptor
    >>> ListStateDescriptor("events", "struct<t timestamp, v double>").value_type.ddl
    'struct<t:timestamp,v:double>'
    >>> ListStateDescriptor("events").typed  # untyped: elements are pickled
    False
    """

    kind: ClassVar[str] = LIST

    def __init__(
        self,
        name: str,
        element_type: object = None,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        _init(self, name, serializer, ttl, element_type)


@dataclass(frozen=True, init=False)
class MapStateDescriptor(StateDescriptor, Generic[K, V]):
    """``MapStateDescriptor("by_id")``; the serializer is for map values.

    Map keys are encoded canonically (like stream keys), so they are limited
    to None, bool, int, float, str, bytes, date, datetime, Decimal and tuples.
    Typed: ``MapStateDescriptor("seen", "string", "struct<n long, last timestamp>")``
    (key type, value type; the key type one of the atomic types above).

    Example:

    >>> from asyncio_ops.state import MapStateDescriptor
    >>> d = MapStateDescriptor("seen", "string", "struct<n long, last timestamp>")
    >>> d.key_type.ddl, d.value_type.ddl
    ('string', 'struct<n:bigint,last:timestamp>')
    >>> MapStateDescriptor("seen", "string")  # both types, or neither
    Traceback (most recent call last):
    ...
    asyncio_ops.ConfigurationError: state 'seen': a typed map state declares both ...
    """

    kind: ClassVar[str] = MAP

    def __init__(
        self,
        name: str,
        key_type: object = None,
        value_type: object = None,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        if (key_type is None) != (value_type is None):
            raise ConfigurationError(
                f"state {name!r}: a typed map state declares both key_type and value_type"
            )
        _init(self, name, serializer, ttl, value_type, key_type)


@dataclass(frozen=True, init=False)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """``ReducingStateDescriptor("sum", lambda a, b: a + b)``; typed:
    ``ReducingStateDescriptor("sum", operator.add, "long")`` (the type of the values
    added and of what ``reduce_fn`` returns: each result is checked before it is kept).

    Example:

    >>> import operator
    >>> from asyncio_ops.state import ReducingStateDescriptor
    >>> d = ReducingStateDescriptor("sum", operator.add, "long")
    >>> d.reduce_fn(2, 3), d.value_type.ddl
    (5, 'bigint')
    """

    kind: ClassVar[str] = REDUCING
    reduce_fn: Callable[[T, T], T]

    def __init__(
        self,
        name: str,
        reduce_fn: Callable[[T, T], T],
        value_type: object = None,
        *,
        serializer: Serializer = PICKLE_SERIALIZER,
        ttl: StateTtlConfig | None = None,
    ) -> None:
        if not callable(reduce_fn):
            raise ConfigurationError(
                f"state {name!r}: reduce_fn must be callable, got {reduce_fn!r}"
            )
        object.__setattr__(self, "reduce_fn", reduce_fn)
        _init(self, name, serializer, ttl, value_type)


@dataclass(frozen=True, init=False)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, OUT]):
    """``AggregatingStateDescriptor("avg", MyAverage())``; the serializer is for
    accumulators; typed: ``AggregatingStateDescriptor("avg", MyAverage(), "struct<sum
    double, n long>")`` (the accumulator's type: each accumulator ``add`` returns is
    checked before it is kept).

    Example:

    >>> from asyncio_ops.state import AggregateFunction, AggregatingStateDescriptor
    >>> class Average(AggregateFunction):
    ...     def create_accumulator(self):
    ...         return {"sum": 0.0, "n": 0}
    ...     def add(self, value, accumulator):
    ...         return {"sum": accumulator["sum"] + value, "n": accumulator["n"] + 1}
    ...     def get_result(self, accumulator):
    ...         return accumulator["sum"] / accumulator["n"]
    >>> d = AggregatingStateDescriptor("avg", Average(), "struct<sum double, n long>")
    >>> d.kind, d.value_type.ddl
    ('aggregating', 'struct<sum:double,n:bigint>')
    """

    kind: ClassVar[str] = AGGREGATING
    aggregate_fn: AggregateFunction[IN, Any, OUT]

    def __init__(
        self,
        name: str,
        aggregate_fn: AggregateFunction[IN, Any, OUT],
        accumulator_type: object = None,
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
        _init(self, name, serializer, ttl, accumulator_type)


def _init(
    desc: StateDescriptor,
    name: str,
    serializer: Serializer,
    ttl: StateTtlConfig | None,
    value_type: object = None,
    key_type: object = None,
) -> None:
    object.__setattr__(desc, "name", name)
    object.__setattr__(desc, "serializer", serializer)
    object.__setattr__(desc, "ttl", ttl)
    what = f"state {name!r}: "
    object.__setattr__(
        desc, "value_type", None if value_type is None else StateType.of(value_type, what + "type")
    )
    key = None if key_type is None else StateType.of(key_type, what + "key_type")
    if key is not None and not _atomic(key):
        raise ConfigurationError(
            f"state {name!r}: key_type {key.ddl} is not an atomic type (map keys are "
            "encoded like stream keys: a number, string, binary, boolean, date, timestamp "
            "or decimal)"
        )
    object.__setattr__(desc, "key_type", key)
    desc.__post_init__()


def _atomic(t: StateType) -> bool:
    return not t.ddl.startswith(("array<", "map<", "struct<"))
