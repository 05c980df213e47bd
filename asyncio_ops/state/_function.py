"""What a keyed function sees: :class:`KeyedProcessFunction`, its context, timers, output.

The user's side of ``keyed_process`` (Flink's ``KeyedProcessFunction`` and its
``Context``): ``open(runtime_context)`` once (state from
``runtime_context.get_state``), ``process_element(value, ctx, out)`` per record,
``on_timer(timestamp, ctx, out)`` per firing timer, ``close()``. ``ctx`` gives
the record's (or firing timer's) timestamp and time domain, the current key and
the :class:`TimerService` (timers of the current key, in seconds); ``out`` is a
:class:`Collector`. The operator that drives them is
``asyncio_ops._engine._keyed_operator.KeyedProcessOperator``, one floor up.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, TypeVar

from .._elements import Record, StreamElement
from .._functions import RuntimeContext
from .._timers import InternalTimerService
from ._backend import KeyedStateBackend
from ._descriptors import StateDescriptor

__all__ = [
    "Collector",
    "KeyedProcessContext",
    "KeyedProcessFunction",
    "KeyedRuntimeContext",
    "TimeDomain",
    "TimerService",
]

K = TypeVar("K")
IN = TypeVar("IN")
OUT = TypeVar("OUT")

_VOID_NAMESPACE: Final = None


class TimeDomain(enum.Enum):
    """Which clock a firing timer belongs to.

    Example:

    >>> from asyncio_ops import KeyedProcessOperator, Record
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction, TimeDomain)
    >>> from asyncio_ops.testing import ManualClock
    >>> class Remind(KeyedProcessFunction):
    ...     def process_element(self, value, ctx, out):
    ...         ctx.timer_service().register_processing_time_timer(10.0)
    ...     def on_timer(self, timestamp, ctx, out):
    ...         out.collect(ctx.time_domain() is TimeDomain.PROCESSING_TIME)
    >>> clock, out = ManualClock(), []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(Remind(), lambda v: v, backend=backend, output=out.append,
    ...                           clock=clock)
    >>> op.open()
    >>> op.process(Record("user-1"))
    >>> clock.advance(10)
    >>> [r.value for r in out]
    [True]
    """

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService:
    """What a function sees of the timer service: timers of the current key.

    Example: a session ends 30 seconds (event time) after a user's last event.

    >>> from asyncio_ops import KeyedProcessOperator, Record, Watermark
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction, ValueStateDescriptor)
    >>> class SessionEnd(KeyedProcessFunction):
    ...     def open(self, runtime_context):
    ...         self.last = runtime_context.get_state(ValueStateDescriptor("last"))
    ...     def process_element(self, value, ctx, out):
    ...         self.last.update(ctx.timestamp())
    ...         ctx.timer_service().register_event_time_timer(ctx.timestamp() + 30)
    ...     def on_timer(self, timestamp, ctx, out):
    ...         if self.last.value() + 30 == timestamp:  # no event since
    ...             out.collect((ctx.get_current_key(), timestamp))
    >>> out = []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(SessionEnd(), lambda v: v["user"], backend=backend,
    ...                           output=out.append)
    >>> op.open()
    >>> op.process(Record({"user": "a"}, 0.0))
    >>> op.process(Record({"user": "a"}, 10.0))
    >>> op.process(Watermark(100.0))
    >>> [r.value for r in out if isinstance(r, Record)]
    [('a', 40.0)]
    """

    __slots__ = ("_internal",)

    def __init__(self, internal: InternalTimerService) -> None:
        self._internal = internal

    def current_processing_time(self) -> float:
        return self._internal.current_processing_time()

    def current_watermark(self) -> float:
        return self._internal.current_watermark()

    def register_event_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer`` once a watermark ``>= timestamp`` arrives (once per key and time)."""
        self._internal.register_event_time_timer(_VOID_NAMESPACE, timestamp)

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer`` once the clock reaches ``timestamp`` (once per key and time)."""
        self._internal.register_processing_time_timer(_VOID_NAMESPACE, timestamp)

    def delete_event_time_timer(self, timestamp: float) -> None:
        self._internal.delete_event_time_timer(_VOID_NAMESPACE, timestamp)

    def delete_processing_time_timer(self, timestamp: float) -> None:
        self._internal.delete_processing_time_timer(_VOID_NAMESPACE, timestamp)


class Collector(Generic[OUT]):
    """``out`` of a function: ``collect(value)`` emits a record downstream.

    Example:

    >>> from asyncio_ops.state import Collector
    >>> sent = []
    >>> out = Collector(sent.append)
    >>> out.collect("hello")
    >>> sent
    [Record(value='hello', timestamp=None)]
    """

    __slots__ = ("_output", "timestamp")

    def __init__(self, output: Callable[[StreamElement], object]) -> None:
        self._output = output
        self.timestamp: float | None = None

    def collect(self, value: OUT) -> None:
        self._output(Record(value, self.timestamp))


class ValueCollector(Collector[OUT]):
    """A :class:`Collector` whose ``collect`` is ``sink`` itself (a C callable such as a
    list's ``append``): each value goes on as it is, without a Record (its timestamp is
    dropped) and without a Python frame, for an output that keeps values only."""

    __slots__ = ("collect",)  # the instance's own, not the method

    def __init__(self, sink: Callable[[OUT], object]) -> None:
        super().__init__(_unused)
        self.collect = sink  # type: ignore[method-assign,assignment]


def _unused(element: StreamElement) -> None:
    raise AssertionError("a ValueCollector's values go to its sink")  # pragma: no cover


class KeyedRuntimeContext(RuntimeContext):
    """The runtime context of a keyed function: also where state comes from.

    Example:

    >>> from asyncio_ops import KeyedProcessOperator, Record
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction, KeyedRuntimeContext,
    ...     ListStateDescriptor)
    >>> class Remember(KeyedProcessFunction):
    ...     def open(self, runtime_context):
    ...         assert isinstance(runtime_context, KeyedRuntimeContext)
    ...         self.seen = runtime_context.get_list_state(ListStateDescriptor("seen"))
    ...     def process_element(self, value, ctx, out):
    ...         self.seen.add(value["page"])
    ...         out.collect(self.seen.get())
    >>> out = []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(Remember(), lambda v: v["user"], backend=backend,
    ...                           output=out.append)
    >>> op.open()
    >>> for page in ["home", "cart"]:
    ...     op.process(Record({"user": "a", "page": page}))
    >>> out[-1].value
    ['home', 'cart']
    """

    _backend: KeyedStateBackend

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state of ``descriptor`` (any kind), scoped to the current key."""
        return self._backend.get_state(descriptor)

    get_list_state = get_state
    get_map_state = get_state
    get_reducing_state = get_state
    get_aggregating_state = get_state


class KeyedProcessContext:
    """``ctx`` of ``process_element`` and ``on_timer``.

    Example:

    >>> from asyncio_ops import KeyedProcessOperator, Record
    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction
    >>> class Describe(KeyedProcessFunction):
    ...     def process_element(self, value, ctx, out):
    ...         out.collect((ctx.current_key, ctx.timestamp(), ctx.time_domain()))
    >>> out = []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(Describe(), lambda v: v["user"], backend=backend,
    ...                           output=out.append)
    >>> op.open()
    >>> op.process(Record({"user": "a"}, 5.0))
    >>> out[0].value
    ('a', 5.0, None)
    """

    __slots__ = ("_backend", "_domain", "_timer_service", "_timestamp")

    def __init__(self, backend: KeyedStateBackend, timer_service: TimerService) -> None:
        self._backend = backend
        self._timer_service = timer_service
        self._timestamp: float | None = None
        self._domain: TimeDomain | None = None

    def timestamp(self) -> float | None:
        """The record's timestamp, or the firing timer's."""
        return self._timestamp

    def timer_service(self) -> TimerService:
        return self._timer_service

    @property
    def current_key(self) -> Any:
        return self._backend.get_current_key()

    def get_current_key(self) -> Any:
        return self._backend.get_current_key()

    def time_domain(self) -> TimeDomain | None:
        """In ``on_timer``: the firing timer's domain (None in ``process_element``)."""
        return self._domain


class KeyedProcessFunction(ABC, Generic[K, IN, OUT]):
    """Processes records of a keyed stream, with keyed state and timers.

    ``open(runtime_context)`` once (get state from ``runtime_context.get_state``),
    ``process_element`` per record, ``on_timer`` per firing timer, ``close``.

    Example: a running total per key, returned instead of collected.

    >>> from asyncio_ops import KeyedProcessOperator, Record
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction, ValueStateDescriptor)
    >>> class Total(KeyedProcessFunction):
    ...     def open(self, runtime_context):
    ...         self.total = runtime_context.get_state(ValueStateDescriptor("total", "double"))
    ...     def process_element(self, value, ctx, out):
    ...         self.total.update((self.total.value() or 0.0) + value["amount"])
    ...         return [(ctx.get_current_key(), self.total.value())]
    >>> out = []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(Total(), lambda v: v["user"], backend=backend,
    ...                           output=out.append)
    >>> op.open()
    >>> for user, amount in [("a", 2.5), ("b", 1.0), ("a", 4.0)]:
    ...     op.process(Record({"user": user, "amount": amount}))
    >>> op.close()
    >>> [r.value for r in out]
    [('a', 2.5), ('b', 1.0), ('a', 6.5)]
    """

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        """Called once before the first element."""

    @abstractmethod
    def process_element(
        self, value: IN, ctx: KeyedProcessContext, out: Collector[OUT]
    ) -> Iterable[OUT] | None:
        """Handle one record; its key is ``ctx.current_key``. Emit with ``out.collect``,
        or return or yield the outputs."""

    def on_timer(
        self, timestamp: float, ctx: KeyedProcessContext, out: Collector[OUT]
    ) -> Iterable[OUT] | None:
        """A timer of ``ctx.current_key`` fired at ``timestamp`` (emit as above)."""
        return None

    def close(self) -> None:
        """Called once at the end, also after a failure."""
