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
    """Which clock a firing timer belongs to."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService:
    """What a function sees of the timer service: timers of the current key."""

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
    """``out`` of a function: ``collect(value)`` emits a record downstream."""

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
    """The runtime context of a keyed function: also where state comes from."""

    _backend: KeyedStateBackend

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state of ``descriptor`` (any kind), scoped to the current key."""
        return self._backend.get_state(descriptor)

    get_list_state = get_state
    get_map_state = get_state
    get_reducing_state = get_state
    get_aggregating_state = get_state


class KeyedProcessContext:
    """``ctx`` of ``process_element`` and ``on_timer``."""

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
