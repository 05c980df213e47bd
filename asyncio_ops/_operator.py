"""The AsyncWaitOperator: Flink's Async I/O on one asyncio event loop.

Call order::

    await op.open(restored=None)      function.open(); replay of a snapshot
    await op.process_element(record)  any number of times, interleaved with
    await op.process_watermark(wm)    watermarks (not in UNORDERED mode)
    op.snapshot_state()               at any point between the calls above
    await op.end_input()              drain: wait until every element is emitted
    await op.close()                  always, also after a failure

Semantics:

- At most ``capacity`` elements (watermarks included) are in the queue. When it
  is full, ``process_element`` awaits; completions, timers and emission go on
  meanwhile (backpressure).
- ``async_invoke`` is started synchronously inside ``process_element`` (as in
  Flink, where ``asyncInvoke`` runs in ``processElement``). A coroutine that
  finishes without suspending completes at once, with no task; one that
  suspends continues as a task on the loop.
- ``timeout`` is one budget per element from its first invoke, retries
  included: a processing-time timer of the ``"async-timeouts"`` timer service.
  When it fires for an element not yet complete, the attempt in flight is
  cancelled and ``function.timeout(value)`` is called; what it returns is the
  element's result, what it raises fails the operator.
- Retries (``AsyncRetryStrategy``) are timers of the ``"async-retries"``
  service; attempt counts are per element. After :meth:`end_input` pending
  retries fire at once and later retries are not delayed (the attempt budget
  and the timeout still apply; Flink instead stops retrying at end of input,
  which would fail a job on a transient error in its last elements).
- A result that arrives after its element was completed (by a timeout) is
  dropped. Output records carry the input record's timestamp.
- A failed element (exception not retried, retries exhausted, ``None`` or a
  non-sequence result) fails the operator: every later call raises
  :class:`AsyncOperatorError` naming the input, with the original exception as
  ``__cause__``, unless ``on_failure`` turns the failure into results.
- Emission runs on the loop that completes elements (no emitter thread, no
  locks); ``output`` is called once per emitted record or watermark, in the
  queue's order.
- :meth:`snapshot_state` holds every element not yet emitted, in queue order,
  with the results of those already complete and, for the others, the
  attempts made and the absolute deadline (the element's timeout timer);
  :meth:`open` with it emits those results without a new request and
  re-invokes the rest before any new input, each keeping its deadline and
  attempt count. An element whose deadline passed while it was stored times
  out at once (its ``timeout()``, an error result, or a failure): restoring
  never grants a fresh budget, so a slow element cannot be re-requested
  forever across restores.
"""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import math
import random
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Final

from ._clock import SYSTEM_CLOCK, Scheduler
from ._elements import Record, StreamElement, Watermark
from ._exceptions import (
    ConfigurationError,
)
from ._functions import (
    AsyncFunction,
    CoroutineFunction,
    RuntimeContext,
    as_async_function,
    maybe_await,
)
from ._queues import (
    ElementQueue,
    OrderedElementQueue,
    ResultHandle,
    UnorderedElementQueue,
    WatermarkBoundedElementQueue,
)
from ._results import bad_results, bad_timeout_results, describe_record, element_failure
from ._retry import AsyncRetryStrategy
from ._snapshot import SNAPSHOT_VERSION, OperatorSnapshot, SnapshotEntry
from ._statistics import LatencyHistogram, OperatorStatistics
from ._timers import InternalTimerService, Timer
from .options import non_negative_int, positive_seconds

TIMEOUT_GRANULARITY: Final = 0.01
"""Seconds: timeouts fire at most this late (or 1% of the timeout, if smaller)."""

OutputFn = Callable[[StreamElement], object]
FailureHandler = Callable[[Record[Any], BaseException, int], Sequence[Any]]


class OutputMode(enum.Enum):
    """Order in which results leave the operator."""

    ORDERED = "ordered"
    """Input order, watermarks included (Flink's orderedWait)."""
    UNORDERED = "unordered"
    """Completion order; processing time only, watermarks are an error."""
    WATERMARK_BOUNDED = "watermark_bounded"
    """Completion order between watermarks; nothing crosses a watermark."""


def make_queue(mode: OutputMode, capacity: int, key_ordered: bool = False) -> ElementQueue:
    if mode is OutputMode.ORDERED:
        return OrderedElementQueue(capacity)
    if mode is OutputMode.UNORDERED:
        return UnorderedElementQueue(capacity, key_ordered)
    if mode is OutputMode.WATERMARK_BOUNDED:
        return WatermarkBoundedElementQueue(capacity, key_ordered)
    raise ConfigurationError(f"mode must be an OutputMode, got {mode!r}")


class _Entry:
    """Operator-side state of one in-flight element (a timer namespace by identity)."""

    __slots__ = (
        "attempts",
        "bucket",
        "deadline",
        "handle",
        "key",
        "last_error",
        "record",
        "retry_at",
        "started",
        "task",
        "timed_out",
    )

    def __init__(
        self, record: Record[Any], handle: ResultHandle, key: Any, started: float, deadline: float
    ) -> None:
        self.record = record
        self.handle = handle
        self.key = key
        self.attempts = 0
        self.started = started
        self.deadline = deadline
        self.retry_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.timed_out = False
        self.last_error: BaseException | None = None
        self.bucket: _TimeoutBucket | None = None

    def __repr__(self) -> str:
        return f"_Entry({self.record!r}, attempts={self.attempts})"


class _TimeoutBucket:
    """Elements whose deadlines fall in one slot of the timeout granularity.

    One timer of the ``async-timeouts`` service per slot, not per element: an
    element joins the bucket of its deadline when it first suspends; the
    bucket's timer is deleted when its last live element completes, and when
    it fires, the elements still live in it time out. Memory stays bounded:
    every live bucket holds at least one element in flight.
    """

    __slots__ = ("entries", "live", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.entries: list[_Entry] = []
        self.live = 0


class _Attempt(collections.abc.Coroutine[Any, Any, None]):
    """One attempt of ``async_invoke``, continued as a task after an eager first step.

    ``process_element`` steps the user's coroutine once, synchronously; if it
    suspends, this object carries it on as the coroutine of an asyncio task.
    It forwards ``send`` and ``throw`` to the user's coroutine, so that a
    cancellation reaches the user's code even when it arrives before the task
    has run its first step (an ``async def`` wrapper would be closed unstarted
    instead), and it reports the outcome to the operator when the coroutine
    returns or raises. ``CancelledError`` is reported only if the operator did
    not cause it, and is always re-raised.
    """

    __slots__ = ("coro", "entry", "first", "op")

    def __init__(self, op: AsyncWaitOperator, entry: _Entry, coro: Any, first: Any) -> None:
        self.op = op
        self.entry = entry
        self.coro = coro
        self.first = first

    def send(self, value: Any) -> Any:
        first = self.first
        if first is not None:
            self.first = None
            return first  # what the user's coroutine is waiting on, for the task
        return self._step(self.coro.send, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None and isinstance(typ, BaseException) else val
        if exc is None:
            exc = typ()
        self.first = None
        return self._step(self.coro.throw, exc)

    def _step(self, method: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return method(arg)
        except StopIteration as stop:
            self._finished()
            self.op._on_result(self.entry, stop.value)
            raise StopIteration from None
        except asyncio.CancelledError:
            self._finished()
            entry = self.entry
            if not (entry.handle.done or entry.timed_out or self.op._closed):
                # cancelled by someone else than the operator: a failed attempt
                self.op._on_error(entry, asyncio.CancelledError("the attempt was cancelled"))
            raise
        except Exception as exc:
            self._finished()
            self.op._on_error(self.entry, exc)
            raise StopIteration from None

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Any:
        return self

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        # the task's step calls this (not send) for a non-native coroutine
        first = self.first
        if first is not None:
            self.first = None
            return first
        return self._step(self.coro.send, None)

    def _finished(self) -> None:
        entry = self.entry
        task = entry.task
        if task is not None:
            entry.task = None
            self.op._tasks.discard(task)

    def __repr__(self) -> str:
        return f"<attempt {self.entry.attempts} of {self.entry.record!r}>"


class _TimeoutTrigger:
    __slots__ = ("op",)

    def __init__(self, op: AsyncWaitOperator) -> None:
        self.op = op

    def on_processing_time(self, timer: Timer) -> None:
        self.op._on_timeout_slot(timer.namespace)  # type: ignore[arg-type]

    def on_event_time(self, timer: Timer) -> None:  # pragma: no cover - never registered
        raise AssertionError("async-timeouts has no event-time timers")


class _RetryTrigger(_TimeoutTrigger):
    __slots__ = ()

    def on_processing_time(self, timer: Timer) -> None:
        self.op._on_retry_timer(timer.namespace)  # type: ignore[arg-type]


class AsyncWaitOperator:
    """Runs an :class:`AsyncFunction` over a stream with bounded concurrency.

    Args:
        function: an :class:`AsyncFunction`, or a bare ``async def f(value)``.
        output: called with each emitted :class:`Record` / :class:`Watermark`.
        timeout: seconds (or ``timedelta``) per element, retries included.
        capacity: maximum elements in flight (queue size, watermarks included).
        mode: :class:`OutputMode`.
        retry: an :class:`AsyncRetryStrategy`; ``None`` never retries.
        clock: where processing time comes from (a :class:`Scheduler`);
            defaults to the system clock on the running loop.
        runtime_context: given to ``function.open``.
        on_failure: ``(record, exc, attempts) -> results``: turns a failed
            element into results instead of failing the operator (the Spark
            layer's error rows). Exceptions it raises fail the operator.
        key_selector: ``value -> key`` in keyed mode: timers are scoped to the
            key, snapshot entries carry it, and in the unordered modes results
            of one key leave in input order (completion order across keys).
        manage_function: when False, ``open``/``close`` leave the function's
            own ``open``/``close`` to the caller (a runtime that keeps one
            opened function per worker across many operators).
        invoke: called per attempt instead of ``function.async_invoke(value)``,
            returning the awaitable to run (a runtime that adapts values calls
            the user's coroutine directly: one coroutine less per attempt).
        map_results: ``(value, results) -> results``, applied to an attempt's
            results once the retry strategy accepted them and before they are
            emitted; what it raises fails the element, not retried.
        describe: ``value -> str`` naming an input in error messages (default:
            its ``repr``, cut to 300 characters).
        output_buffer: completed elements that may wait, beyond ``capacity``,
            behind an earlier element still in flight (default 0: Flink's
            meaning, ``capacity`` bounds the whole queue). With ``N > 0`` the
            queue holds up to ``capacity + N`` elements of which at most
            ``capacity`` are in flight: in ordered mode a slow element no
            longer stops new requests while finished ones wait behind it.
    """

    def __init__(
        self,
        function: AsyncFunction[Any, Any] | Callable[[Any], Any],
        *,
        output: OutputFn,
        timeout: float | timedelta,
        capacity: int = 100,
        mode: OutputMode = OutputMode.ORDERED,
        retry: AsyncRetryStrategy | None = None,
        clock: Scheduler | None = None,
        runtime_context: RuntimeContext | None = None,
        on_failure: FailureHandler | None = None,
        key_selector: Callable[[Any], Any] | None = None,
        manage_function: bool = True,
        invoke: Callable[[Any], Any] | None = None,
        map_results: Callable[[Any, Sequence[Any]], Sequence[Any]] | None = None,
        describe: Callable[[Any], str] | None = None,
        output_buffer: int = 0,
    ) -> None:
        if not callable(output):
            raise ConfigurationError(f"output must be callable, got {output!r}")
        if not isinstance(mode, OutputMode):
            raise ConfigurationError(f"mode must be an OutputMode, got {mode!r}")
        if retry is not None and not isinstance(retry, AsyncRetryStrategy):
            raise ConfigurationError(f"retry must be an AsyncRetryStrategy, got {retry!r}")
        self.function = as_async_function(function)
        # a bare ``async def`` is called directly: one coroutine less per attempt
        fn = self.function
        self._async_invoke: Callable[[Any], Any] = invoke or (
            fn.fn if type(fn) is CoroutineFunction else fn.async_invoke
        )
        self._map_results = map_results
        self._describe_value = describe
        self.mode = mode
        self.capacity = capacity
        self.output_buffer = non_negative_int(output_buffer, "output_buffer")
        # with an output buffer, in-flight elements are bounded apart from the queue
        self._bound_in_flight = output_buffer > 0
        self._in_flight = 0
        self.timeout = positive_seconds(timeout, "timeout")
        self._granularity = min(TIMEOUT_GRANULARITY, self.timeout / 100)
        self._buckets: dict[int, _TimeoutBucket] = {}
        self._latency_tick = 0
        self._queue = make_queue(
            mode, capacity + output_buffer, key_ordered=key_selector is not None
        )
        self._output = output
        self._retry = retry if retry is not None and retry.enabled else None
        self._rng = random.Random()
        self._runtime_context = runtime_context or RuntimeContext()
        self._on_failure = on_failure
        self._key_selector = key_selector
        self._timeouts = InternalTimerService("async-timeouts", _TimeoutTrigger(self), clock=clock)
        self._retries = InternalTimerService("async-retries", _RetryTrigger(self), clock=clock)
        self._clock_now = (clock or SYSTEM_CLOCK).now
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending_retries: set[_Entry] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._opened = False
        self._manage_function = manage_function
        self._closed = False
        self._draining = False
        # statistics
        self._received = 0
        self._emitted = 0
        self._completed = 0
        self._timed_out = 0
        self._retried = 0
        self._failed = 0
        self._restored = 0
        self.latency = LatencyHistogram()

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self, restored: OperatorSnapshot | None = None) -> None:
        """Open the function, then replay ``restored`` (if any) before any new input."""
        if self._opened:
            raise RuntimeError("AsyncWaitOperator.open() called twice")
        self._opened = True
        if self._manage_function:
            await maybe_await(self.function.open(self._runtime_context))
        if restored is None:
            return
        if not isinstance(restored, OperatorSnapshot):
            raise ConfigurationError(
                "restored must be an OperatorSnapshot from snapshot_state(), "
                f"got {type(restored)!r}"
            )
        if restored.version > SNAPSHOT_VERSION:
            raise ConfigurationError(
                f"snapshot format version {restored.version} is newer than this version of "
                f"asyncio_ops understands ({SNAPSHOT_VERSION})"
            )
        for entry in restored.entries:
            self._restored += 1
            element = entry.element
            if type(element) is Watermark:
                await self.process_watermark(element)
            elif entry.results is not None:
                await self.process_completed_element(element, entry.results)  # type: ignore[arg-type]
            elif entry.deadline is None:
                await self.process_element(element)
            else:
                await self._restore_in_flight(element, entry.attempts, entry.deadline)  # type: ignore[arg-type]

    async def _restore_in_flight(self, record: Record[Any], attempts: int, deadline: float) -> None:
        """Re-admit a stored element with its attempts and deadline (see the module docstring)."""
        self._check()
        queue = self._queue
        if len(queue) >= queue.capacity or self._bound_in_flight:
            await self._wait_for_request_slot()
        self._received += 1
        key = self._key_selector(record.value) if self._key_selector is not None else None
        entry = self._new_entry(record, key)
        entry.attempts = max(0, attempts)
        entry.deadline = deadline
        if deadline <= self._clock_now():
            self._on_timeout(entry)
        else:
            self._invoke(entry)
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        """Cancel and await everything in flight, stop timers, close the function."""
        if self._closed:
            return
        self._closed = True
        self._timeouts.close()
        self._retries.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._wake()
        if self._opened and self._manage_function:
            await maybe_await(self.function.close())

    async def __aenter__(self) -> AsyncWaitOperator:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- input -------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeError("AsyncWaitOperator is closed")

    async def _wait_for_space(self) -> None:
        queue = self._queue
        while len(queue) >= queue.capacity:
            await self._wait()
            self._check()

    async def _wait_for_request_slot(self) -> None:
        """Queue space and, with an output buffer, fewer than ``capacity`` in flight."""
        await self._wait_for_space()
        while self._in_flight >= self.capacity:
            await self._wait()
            self._check()
            await self._wait_for_space()

    async def _wait(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def process_element(self, record: Record[Any] | Any) -> None:
        """Put ``record`` in the queue (awaiting space) and start its first attempt.

        A value that is not a :class:`Record` is wrapped as ``Record(value)``.
        Raises the operator's failure, if it has failed.
        """
        if self._failure is not None or self._closed:
            self._check()
        if type(record) is not Record:
            record = Record(record)
        queue = self._queue
        if len(queue) >= queue.capacity or self._bound_in_flight:
            await self._wait_for_request_slot()
        self._admit(record)
        if self._failure is not None:
            raise self._failure

    async def process_elements(self, records: Iterable[Record[Any] | Any]) -> None:
        """``process_element`` for each of ``records``, in order, with less overhead.

        Same semantics element by element (backpressure included); it avoids a
        coroutine per element, which matters when lookups are fast.
        """
        self._check()
        queue = self._queue
        admit = self._admit
        bounded = self._bound_in_flight
        capacity = self.capacity
        for record in records:
            if type(record) is not Record:
                record = Record(record)
            if len(queue) >= queue.capacity or (bounded and self._in_flight >= capacity):
                await self._wait_for_request_slot()
            admit(record)
            if self._failure is not None:
                raise self._failure

    def _admit(self, record: Record[Any]) -> None:
        """Start the first attempt of ``record``; the queue has room for it."""
        self._received += 1
        key = self._key_selector(record.value) if self._key_selector is not None else None
        try:
            coro = self._async_invoke(record.value)
            first = coro.send(None)
        except StopIteration as stop:
            results = stop.value
            # Fast path: a result ready on arrival, that this mode would emit at
            # once anyway, needs no queue entry, no timer and no task.
            if (
                (type(results) is list or type(results) is tuple)
                and self._queue.emits_on_arrival(key)
                and (self._retry is None or not self._retry.should_retry_result(results))
            ):
                if self._map_results is not None:
                    try:
                        results = self._map_results(record.value, results)
                    except Exception as exc:
                        entry = self._new_entry(record, key)
                        self._on_error(entry, exc, retryable=False)
                        return
                self._completed += 1
                self.latency.instant += 1
                ts = record.timestamp
                output = self._output
                try:
                    for r in results:
                        output(Record(r, ts))
                except Exception as exc:
                    self._fail(exc)
                self._emitted += len(results)
                return
            entry = self._new_entry(record, key)
            self._on_result(entry, results)
            return
        except Exception as exc:
            entry = self._new_entry(record, key)
            self._on_error(entry, exc)
            return
        self._suspended(self._new_entry(record, key), coro, first)

    def _new_entry(self, record: Record[Any], key: Any) -> _Entry:
        handle = self._queue.try_put(record, key)
        assert handle is not None, "_admit is only called with room in the queue"
        started = self._clock_now()
        entry = _Entry(record, handle, key, started, started + self.timeout)
        entry.attempts = 1
        handle.attachment = entry
        self._in_flight += 1
        return entry

    async def process_watermark(self, watermark: Watermark) -> None:
        """Put a watermark in the queue; it leaves by the mode's rule."""
        self._check()
        if type(watermark) is not Watermark:
            raise TypeError(f"process_watermark takes a Watermark, got {watermark!r}")
        if self.mode is OutputMode.UNORDERED:
            self._queue.try_put(watermark)  # raises WatermarkNotSupportedError
        await self._wait_for_space()
        self._queue.try_put(watermark)
        self._emit()

    async def process_completed_element(self, record: Record[Any], results: Sequence[Any]) -> None:
        """Put an element whose results are already known (replayed from a log or snapshot).

        It takes a queue slot and leaves by the mode's rule like any other, but
        no request is made and no timer is set.
        """
        self._check()
        self._received += 1
        await self._wait_for_space()
        key = self._key_selector(record.value) if self._key_selector is not None else None
        handle = self._queue.try_put(record, key)
        assert handle is not None
        handle.complete(tuple(results))
        self._emit()

    async def end_input(self) -> None:
        """Fire pending retries at once, then wait until every element is emitted.

        Timeouts still apply. Raises the operator's failure, if any.
        """
        self._check()
        self._draining = True
        for entry in list(self._pending_retries):
            self._retries.delete_processing_time_timer(entry, entry.retry_at, entry.key)  # type: ignore[arg-type]
            self._pending_retries.discard(entry)
            entry.retry_at = None
            self._invoke(entry)
        self._emit()
        while not self._queue.is_empty():
            self._check()
            await self._wait()
        self._check()

    # -- invocation --------------------------------------------------------------------
    def _invoke(self, entry: _Entry) -> None:
        """Start another attempt of an element already in the queue (a retry)."""
        entry.attempts += 1
        try:
            coro = self._async_invoke(entry.record.value)
            first = coro.send(None)
        except StopIteration as stop:
            self._on_result(entry, stop.value)
            return
        except Exception as exc:
            self._on_error(entry, exc)
            return
        self._suspended(entry, coro, first)

    def _suspended(self, entry: _Entry, coro: Any, first: Any) -> None:
        # The coroutine suspended: from here it runs as a task, under the timeout.
        self._ensure_timeout_timer(entry)
        task = asyncio.get_running_loop().create_task(_Attempt(self, entry, coro, first))
        entry.task = task
        self._tasks.add(task)

    def _on_result(self, entry: _Entry, results: Any) -> None:
        if entry.handle.done or entry.timed_out:
            return  # late: the element was completed by its timeout
        if type(results) is not list and type(results) is not tuple:
            error = bad_results(results)
            if error is not None:
                self._on_error(entry, error, retryable=False)
                return
        retry = self._retry
        if (
            retry is not None
            and retry.should_retry_result(results)
            and retry.can_retry(entry.attempts)
        ):
            self._schedule_retry(entry)
            return
        if self._map_results is not None:
            try:
                results = self._map_results(entry.record.value, results)
            except Exception as exc:
                self._on_error(entry, exc, retryable=False)
                return
        self._complete(entry, results)

    def _on_error(self, entry: _Entry, exc: BaseException, retryable: bool = True) -> None:
        if entry.handle.done or entry.timed_out:
            return
        retry = self._retry
        if (
            retryable
            and retry is not None
            and retry.should_retry_exception(exc)
            and retry.can_retry(entry.attempts)
        ):
            entry.last_error = exc
            self._schedule_retry(entry)
            return
        self._fail_element(entry, exc)

    def _schedule_retry(self, entry: _Entry) -> None:
        self._retried += 1
        assert self._retry is not None
        delay = 0.0 if self._draining else self._retry.backoff_seconds(entry.attempts, self._rng)
        if delay <= 0.0:
            self._ensure_timeout_timer(entry)
            self._invoke(entry)
            return
        self._ensure_timeout_timer(entry)
        entry.retry_at = self._clock_now() + delay
        self._pending_retries.add(entry)
        self._retries.register_processing_time_timer(entry, entry.retry_at, entry.key)

    def _ensure_timeout_timer(self, entry: _Entry) -> None:
        # Registered lazily: an element that completes without suspending never
        # pays for a timer. Deadlines are rounded up to the granularity, so a
        # timeout fires at most one granule late and never early.
        if entry.bucket is not None:
            return
        granularity = self._granularity
        slot = math.ceil(entry.deadline / granularity - 1e-9)
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = _TimeoutBucket(slot)
            self._timeouts.register_processing_time_timer(slot, slot * granularity, None)
        bucket.entries.append(entry)
        bucket.live += 1
        entry.bucket = bucket

    def _release_timeout(self, entry: _Entry) -> None:
        bucket = entry.bucket
        if bucket is None:
            return
        entry.bucket = None
        bucket.live -= 1
        if not bucket.live:
            del self._buckets[bucket.slot]
            self._timeouts.delete_processing_time_timer(
                bucket.slot, bucket.slot * self._granularity, None
            )

    def _on_timeout_slot(self, slot: int) -> None:
        bucket = self._buckets.pop(slot, None)
        if bucket is None:
            return
        for entry in bucket.entries:
            if entry.bucket is bucket:
                entry.bucket = None
                self._on_timeout(entry)

    def _on_retry_timer(self, entry: _Entry) -> None:
        self._pending_retries.discard(entry)
        if entry.handle.done or entry.timed_out or self._closed:
            return
        entry.retry_at = None
        self._invoke(entry)

    def _on_timeout(self, entry: _Entry) -> None:
        if entry.handle.done or entry.timed_out or self._closed:
            return
        entry.timed_out = True
        self._timed_out += 1
        if entry.retry_at is not None:
            self._retries.delete_processing_time_timer(entry, entry.retry_at, entry.key)
            self._pending_retries.discard(entry)
            entry.retry_at = None
        if entry.task is not None:
            entry.task.cancel()
            entry.task = None
        try:
            results = self.function.timeout(entry.record.value)
        except Exception as exc:
            self._fail_element(entry, exc)
            return
        if asyncio.iscoroutine(results) or asyncio.isfuture(results):
            task = asyncio.get_running_loop().create_task(self._await_timeout(entry, results))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._complete_after_timeout(entry, results)

    async def _await_timeout(self, entry: _Entry, awaitable: Any) -> None:
        try:
            results = await awaitable
        except Exception as exc:
            self._fail_element(entry, exc)
        else:
            self._complete_after_timeout(entry, results)

    def _complete_after_timeout(self, entry: _Entry, results: Any) -> None:
        error = bad_timeout_results(results)
        if error is not None:
            self._fail_element(entry, error)
            return
        self._complete(entry, results)

    def _complete(self, entry: _Entry, results: Sequence[Any]) -> None:
        handle = entry.handle
        if not handle.complete(results):
            return
        handle.attachment = None  # no cycle handle <-> entry left for the collector
        self._in_flight -= 1
        if self._bound_in_flight:
            self._wake()  # a request slot is free even if nothing can be emitted yet
        self._completed += 1
        self._release_timeout(entry)
        self._latency_tick += 1
        if not self._latency_tick & 3:  # a 1-in-4 sample, weighted: quantiles hold, less work
            self.latency.add(self._clock_now() - entry.started, 4)
        self._emit()

    def _fail_element(self, entry: _Entry, exc: BaseException) -> None:
        self._failed += 1
        if self._on_failure is not None:
            try:
                results = self._on_failure(entry.record, exc, entry.attempts)
            except Exception as handler_exc:
                exc = handler_exc
            else:
                self._complete(entry, results)
                return
        self._release_timeout(entry)
        error = element_failure(
            exc, entry.record.value, entry.attempts, entry.last_error,
            lambda: self._describe(entry.record),
        )  # fmt: skip
        entry.handle.complete_exceptionally(error)
        entry.handle.attachment = None
        self._fail(error)

    def _describe(self, record: Record[Any]) -> str:
        if self._describe_value is not None:
            return self._describe_value(record.value)
        return describe_record(record)

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._wake()

    # -- emission ----------------------------------------------------------------------
    def _emit(self) -> None:
        queue = self._queue
        if self._failure is not None:
            return
        output = self._output
        popped = False
        try:
            while queue.has_completed():
                popped = True
                for element in queue.pop_completed():
                    if type(element) is Record:
                        self._emitted += 1
                    output(element)
        except Exception as exc:
            self._fail(exc)
            return
        if popped:
            self._wake()

    # -- snapshot ----------------------------------------------------------------------
    def snapshot_state(self) -> OperatorSnapshot:
        """Every element not yet emitted, in queue order, with results where complete.

        An element that completed exceptionally is stored without results, so a
        restore tries it again.
        """
        entries = []
        for handle in self._queue.entries():
            element = handle.element
            if type(element) is Watermark:
                entries.append(SnapshotEntry(element))
                continue
            key = handle.key
            if handle.done and handle.exception is None:
                entries.append(SnapshotEntry(element, tuple(handle.results), key))
                continue
            entry: _Entry | None = handle.attachment
            if entry is None:
                entries.append(SnapshotEntry(element, None, key))
            else:
                entries.append(SnapshotEntry(element, None, key, entry.attempts, entry.deadline))
        return OperatorSnapshot(tuple(entries), self.mode)

    # -- introspection -----------------------------------------------------------------
    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def __len__(self) -> int:
        return len(self._queue)

    def statistics(self) -> OperatorStatistics:
        return OperatorStatistics(
            received=self._received,
            emitted=self._emitted,
            in_flight=len(self._queue),
            completed=self._completed,
            timed_out=self._timed_out,
            retried=self._retried,
            failed=self._failed,
            restored=self._restored,
            latency_p50=self.latency.quantile(0.5),
            latency_p99=self.latency.quantile(0.99),
            latency_max=self.latency.max if self.latency.count + self.latency.instant else None,
        )

    def __repr__(self) -> str:
        return (
            f"AsyncWaitOperator({self.function!r}, mode={self.mode.value}, "
            f"capacity={self.capacity}, timeout={self.timeout}, in_flight={len(self._queue)})"
        )


__all__ = ["AsyncWaitOperator", "OutputMode", "make_queue"]
