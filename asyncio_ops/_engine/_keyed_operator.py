"""The operator that runs a KeyedProcessFunction (Flink's KeyedProcessOperator).

The function's side (``KeyedProcessFunction``, its context, timer service and
collector) is ``asyncio_ops.state._function``, on the state layer below.

Call order, per operator instance::

    op = KeyedProcessOperator(fn, key_selector, backend=b, output=out, clock=c)
    op.open()                    fn.open(runtime_context): obtain state here
    op.restore(snapshot)         0..n times (once per old instance on rescale)
    op.apply_change(kg, keys, b) or so, replaying a key group's full blob and deltas
    op.take_timers(previous)     or so, taking over a warm operator's backend and timers
    op.track_changes()           incremental snapshots: record the keys made current
    op.process(element)          per Record / Watermark (also ``op(element)``)
    op.process_values(vs, keys)  or a batch of values without timestamps, keys given
    op.end_input()               bounded input only: the final firing (below)
    op.snapshot()                -> {key_group: blob}, state and timers together
    op.snapshot_changes(full)    or: deltas, and full sections of ``full`` as iterated
    op.close()                   fn.close(); timers stop

``restore``, ``apply_change``, ``take_timers`` and ``clear_key_group`` come before
the first record, watermark or timer, after ``open`` or before it: after it, a restored
key group's entries go straight into the states ``open`` obtained (a key group at a
time); a state not obtained yet holds what is restored for it aside, whole, until
it is (``KeyedStateBackend.load``), so restoring before ``open`` holds the state
once more in memory.

Semantics:

- For a record, ``key_selector(value)`` becomes the backend's current key, then
  ``fn.process_element(value, ctx, out)`` runs; ``out.collect(x)`` emits
  ``Record(x, record.timestamp)``.
- Timers live in the operator's ``"user-timers"`` :class:`InternalTimerService`
  (the same service class the async operator uses for timeouts), scoped to
  (key, namespace None, timestamp) and de-duplicated. When one fires, its key
  is the backend's current key, and ``fn.on_timer(timestamp, ctx, out)`` runs;
  outputs carry the timer's timestamp for event-time timers and no timestamp
  for processing-time timers (Flink's rule).
- A watermark first advances event-time TTL, then fires every event-time
  timer ``<= watermark`` in timestamp order, and only then goes downstream.
- End of input (Flink's rule for bounded input): :meth:`end_input` sends the
  watermark +inf, which fires the event-time timers registered at that moment,
  then fires the processing-time timers due by then; a timer that ``on_timer``
  registers during this final firing never fires (it is dropped), so a timer
  that re-registers itself (a heartbeat) ends with the input. A stream that
  does not end (a streaming micro-batch) never calls it: its timers stay
  registered and go into the snapshot.
- An exception from ``on_timer`` carries a note naming the key, the timer's
  timestamp and its time domain.
- ``process_element`` and ``on_timer`` emit with ``out.collect(x)``, or,
  PyFlink style, return or yield their outputs (an iterable; None emits
  nothing more).
- Processing-time timers fire from the clock (the timer service keeps one
  scheduled callback); with ``schedule_timers=False`` nothing is scheduled and
  they fire when the caller calls ``timer_service.fire_processing_time(now)``
  (a runtime without an event loop, such as a Spark task).
- ``collect``, if given, receives each emitted value as it is (no Record, so no
  timestamp) instead of ``output`` (an output that keeps values only, such as
  a list's ``append``); watermarks still go to ``output``.
- ``output`` is a plain callable receiving Record and Watermark, and
  :meth:`process` is one too, so the operator chains after an
  ``AsyncWaitOperator`` in the same partition: ``AsyncWaitOperator(...,
  output=keyed_op.process)``.
- A snapshot holds, per key group, one sealed blob with the key group's state
  and its timers in one table; restore takes the key groups inside the backend's
  range, so state and timers move together on rescale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final

from .._clock import Scheduler
from .._elements import Record, StreamElement, Watermark
from .._exceptions import ConfigurationError, StateError
from .._functions import RuntimeContext
from .._storage._container import Section
from .._timers import InternalTimerService, Timer
from ..state._backend import KeyedStateBackend
from ..state._function import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    TimeDomain,
    TimerService,
    ValueCollector,
)
from ..state._keyed_snapshot import (
    Changes,
    apply_change,
    restore_key_groups,
    snapshot_changes,
    snapshot_key_groups,
)

__all__ = ["USER_TIMERS", "KeyedProcessOperator"]

USER_TIMERS: Final = "user-timers"


class KeyedProcessOperator:
    """Runs a :class:`KeyedProcessFunction` (see the module docstring for the contract).

    Example:

    >>> from asyncio_ops import KeyedProcessOperator, Record
    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, KeyedProcessFunction, ValueStateDescriptor)
    >>> class Count(KeyedProcessFunction):
    ...     def open(self, ctx):
    ...         self.n = ctx.get_state(ValueStateDescriptor("n"))
    ...     def process_element(self, value, ctx, out):
    ...         self.n.update((self.n.value() or 0) + 1)
    ...         out.collect((ctx.get_current_key(), self.n.value()))
    >>> out = []
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> op = KeyedProcessOperator(Count(), lambda v: v["user"], backend=backend, output=out.append)
    >>> op.open()
    >>> for user in ["a", "b", "a"]:
    ...     op.process(Record({"user": user}))
    >>> [r.value for r in out]
    [('a', 1), ('b', 1), ('a', 2)]
    """

    def __init__(
        self,
        function: KeyedProcessFunction[Any, Any, Any],
        key_selector: Callable[[Any], Any],
        *,
        backend: KeyedStateBackend,
        output: Callable[[StreamElement], object],
        clock: Scheduler | None = None,
        runtime_context: RuntimeContext | None = None,
        schedule_timers: bool = True,
        collect: Callable[[Any], object] | None = None,
    ) -> None:
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigurationError(
                f"function must be a KeyedProcessFunction, got {type(function).__name__}"
            )
        if not callable(key_selector):
            raise ConfigurationError(f"key_selector must be callable, got {key_selector!r}")
        if not isinstance(backend, KeyedStateBackend):
            raise ConfigurationError(f"backend must be a KeyedStateBackend, got {backend!r}")
        if not callable(output):
            raise ConfigurationError(f"output must be callable, got {output!r}")
        self.function = function
        self.backend = backend
        self._key_selector = key_selector
        self._output = output
        self.timer_service = InternalTimerService(
            USER_TIMERS,
            self,
            clock=clock,
            key_context=backend,
            max_parallelism=backend.max_parallelism,
            key_group_range=backend.key_group_range,
            armed=schedule_timers,
        )
        base = runtime_context if runtime_context is not None else RuntimeContext()
        ctx = KeyedRuntimeContext(
            task_name=base.task_name,
            index_of_this_subtask=base.index_of_this_subtask,
            number_of_parallel_subtasks=base.number_of_parallel_subtasks,
            attempt_number=base.attempt_number,
            job_parameters=base.job_parameters,
        )
        object.__setattr__(ctx, "_backend", backend)
        self.runtime_context = ctx
        self._ctx = KeyedProcessContext(backend, TimerService(self.timer_service))
        if collect is not None and not callable(collect):
            raise ConfigurationError(f"collect must be callable, got {collect!r}")
        self._out: Collector[Any] = (
            Collector(output) if collect is None else ValueCollector(collect)
        )
        self._opened = False
        self._started = False  # a record, watermark or timer was handled: no restore after
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------
    def open(self) -> None:
        if self._opened:
            raise StateError("KeyedProcessOperator.open called twice")
        self._opened = True
        self.function.open(self.runtime_context)

    def close(self) -> None:
        """Stop timers and close the function (not the backend, which the caller owns)."""
        if self._closed:
            return
        self._closed = True
        self.timer_service.close()
        if self._opened:
            self.function.close()

    def _before_input(self, what: str) -> None:
        if self._started:
            raise StateError(
                f"KeyedProcessOperator.{what} must come before the first record, watermark or timer"
            )

    def _check(self) -> None:
        self._started = True
        if not self._opened or self._closed:
            state = "closed" if self._closed else "not open"
            raise StateError(f"KeyedProcessOperator is {state}")

    # -- input ------------------------------------------------------------------------
    def process(self, element: StreamElement) -> None:
        """Handle a Record or a Watermark (the ``output`` shape of the async operator)."""
        if isinstance(element, Record):
            self.process_element(element)
        elif isinstance(element, Watermark):
            self.process_watermark(element)
        else:
            raise TypeError(f"expected a Record or a Watermark, got {type(element).__name__}")

    __call__ = process

    def process_element(self, record: Record[Any]) -> None:
        self._check()
        value = record.value
        backend = self.backend
        backend.set_current_key(self._key_selector(value))
        ctx = self._ctx
        ctx._timestamp = record.timestamp
        ctx._domain = None
        out = self._out
        out.timestamp = record.timestamp
        emitted = self.function.process_element(value, ctx, out)
        if emitted is not None:
            self._emit(emitted)
        backend.on_record()

    def process_values(
        self,
        values: Sequence[Any],
        keys: Sequence[Any],
        note: Callable[[Exception, Any, Any], None] | None = None,
    ) -> None:
        """:meth:`process_element` of ``Record(value)`` (no timestamp) for each of ``values``
        in order, its key given (``keys[i]``, what the key selector gives for
        ``values[i]``): the same calls, without a Record or a key selection per value.
        ``note(exc, key, value)`` sees an exception from a value's key or function
        before it propagates (to name them)."""
        if not values:
            return
        self._check()
        backend = self.backend
        set_key = backend.set_current_key
        process = self.function.process_element
        ctx = self._ctx
        out = self._out
        ctx._timestamp = None
        ctx._domain = None
        out.timestamp = None
        cleaned = backend.cleaned_per_record  # live: a state registered on the way joins
        key = value = None
        try:
            for value, key in zip(values, keys, strict=True):
                set_key(key)
                emitted = process(value, ctx, out)
                if emitted is not None:
                    self._emit(emitted)
                if cleaned:
                    backend.on_record()
        except Exception as exc:
            if note is not None:
                note(exc, key, value)
            raise

    def process_watermark(self, watermark: Watermark) -> None:
        """Event-time TTL, then due event-time timers, then the watermark downstream."""
        self._check()
        self.backend.advance_watermark(watermark.timestamp)
        self.timer_service.advance_watermark(watermark.timestamp)
        self._output(watermark)

    def end_input(self, now: float | None = None) -> None:
        """The input ended: the final firing (module docstring); ``now`` defaults to the clock."""
        self._check()
        self.process_watermark(Watermark(math.inf))
        when = self.timer_service.current_processing_time() if now is None else now
        self.timer_service.fire_processing_time(when, final=True)

    # -- timers (Triggerable) -----------------------------------------------------------
    def on_event_time(self, timer: Timer) -> None:
        self._fire(timer, TimeDomain.EVENT_TIME, timer.timestamp)

    def on_processing_time(self, timer: Timer) -> None:
        self._fire(timer, TimeDomain.PROCESSING_TIME, None)

    def _fire(self, timer: Timer, domain: TimeDomain, out_ts: float | None) -> None:
        # The timer service has already made timer.key the backend's current key.
        self._started = True
        ctx = self._ctx
        ctx._timestamp = timer.timestamp
        ctx._domain = domain
        self._out.timestamp = out_ts
        try:
            emitted = self.function.on_timer(timer.timestamp, ctx, self._out)
            if emitted is not None:
                self._emit(emitted)
        except Exception as exc:
            exc.add_note(
                f"keyed_process: key {timer.key!r:.100}, on_timer of the {domain.value} timer "
                f"at {timer.timestamp!r}"
            )
            raise

    def _emit(self, values: Iterable[Any]) -> None:
        """What a function returned or yielded (PyFlink style), each value collected."""
        try:
            items = iter(values)
        except TypeError:
            raise TypeError(
                f"{type(self.function).__qualname__} returned {type(values).__name__}: return "
                "None (and use out.collect), or an iterable of outputs, or yield them"
            ) from None
        collect = self._out.collect
        for value in items:
            collect(value)

    # -- snapshot ---------------------------------------------------------------------
    def snapshot(self) -> dict[int, bytes]:
        """``{key_group: blob}``: each blob holds the group's state blob and its timers."""
        return snapshot_key_groups(self.backend, self.timer_service)

    def restore(self, snapshot: Mapping[int, bytes]) -> int:
        """Take the key groups of ``snapshot`` inside the backend's range; returns how many.

        Call before the first record, watermark or timer (after :meth:`open`, so that the
        entries go straight into the states it obtained), once per old instance on
        rescale. Every blob is verified before any is applied.
        """
        self._before_input("restore")
        return restore_key_groups(self.backend, self.timer_service, snapshot)

    # -- incremental snapshots (see ``_keyed_snapshot``) -----------------------------------
    def track_changes(self, keys: bool = True) -> None:
        """Record the keys made current from now on (state and timers): see
        :meth:`snapshot_changes` (``keys=False``: none, every key group will be
        snapshotted in full; ``KeyedStateBackend.track_changes``)."""
        self.backend.track_changes(keys)

    def snapshot_changes(self, full: Collection[int] = ()) -> Changes:
        """The full state of the non-empty key groups in ``full`` (built one key group
        at a time as they are iterated, before the state changes again), and deltas
        of the keys made current since the last call elsewhere (``Changes``)."""
        return snapshot_changes(self.backend, self.timer_service, full)

    def apply_change(self, section: Section, where: str) -> None:
        """Apply one key group's full or delta section, before the first record,
        watermark or timer; errors name ``where``."""
        self._before_input("apply_change")
        apply_change(self.backend, self.timer_service, section, where)

    def clear_key_group(self, kg: int) -> None:
        """Drop a key group's state and timers, before the first record, watermark or timer."""
        self._before_input("clear_key_group")
        self.backend.clear_key_group(kg)
        self.timer_service.clear_key_group(kg)

    def take_timers(self, previous: KeyedProcessOperator) -> None:
        """Take over the timers of ``previous`` (an operator of the same backend, closed),
        before the first record, watermark or timer."""
        self._before_input("take_timers")
        self.timer_service.take_timers(previous.timer_service)

    def __repr__(self) -> str:
        return (
            f"KeyedProcessOperator({type(self.function).__name__}, backend={self.backend!r}, "
            f"timers={self.timer_service!r})"
        )
