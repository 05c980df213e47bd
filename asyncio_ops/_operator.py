"""The AsyncWaitOperator: Flink's Async I/O on one asyncio event loop.

One class with one job, as Flink's ``AsyncWaitOperator`` is: admitting
elements within capacity, running their attempts, completing and emitting
them in the queue's order, timing them out and retrying them, and
snapshotting what is not yet emitted. What it is built from lives in modules
of their own: the element queues (``_queues``), the timer service
(``_timers``) and its timeout slots (``_timeout_slots``), the adaptive limit
(``_limit``), retry strategies (``_retry``), result checks (``_results``),
the snapshot's types (``_snapshot``) and the statistics (``_statistics``). The
class stays whole on purpose: its responsibilities share one queue and one set
of counters, which a split into collaborating objects would reach through an
extra attribute per step of the worker loop, and a split into mixins would
declare again in each mixin for the type checker.

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
- Up to ``capacity`` long-lived worker tasks run the attempts (started as
  work arrives, never ahead of it): a worker takes the next input once the
  queue has room, steps its coroutine once, puts it in the queue if it did
  not complete at once (one that did, with results the queue would emit
  anyway, needs no entry), awaits it directly, then takes the next; no task,
  wrapper or timer is created per element. ``process_element`` (and ``process_elements``,
  ``process_watermark``) return once everything given is in the queue, its
  first attempt started (run to its first suspension), in input order. A
  coroutine that finishes without suspending completes within the same step.
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
  queue's order (with ``emit_results``, once per element with its results).
- Every task the operator starts (workers, awaited ``timeout()`` answers) is
  cancelled by :meth:`close` and awaited up to ``close_grace`` seconds; one
  that ignores its cancellation is abandoned and logged with its row. An
  error of the operator's own in any of them fails the operator. A worker
  cancelled from outside (the loop shutting down) ends; a ``CancelledError``
  raised inside an attempt is a failed attempt.
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
import collections
import logging
import random
import time
import types
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Protocol

from ._clock import Scheduler
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
from ._limit import DEFAULT_MAX_CAPACITY, AdaptiveLimit, SignalsOverload
from ._queues import OutputMode, ResultHandle, make_queue
from ._results import bad_results, bad_timeout_results, describe_record, element_failure
from ._retry import AsyncRetryStrategy
from ._snapshot import SNAPSHOT_VERSION, OperatorSnapshot, SnapshotEntry
from ._statistics import LatencyHistogram, OperatorStatistics
from ._timeout_slots import Slot, TimeoutSlots
from ._timers import InternalTimerService, Timer
from .options import capacity_or_auto, non_negative_int, positive_int, positive_seconds

CLOSE_GRACE: Final = 5.0
"""Seconds ``close()`` waits for cancelled tasks before abandoning them (logged)."""

log = logging.getLogger("asyncio_ops.operator")

OutputFn = Callable[[StreamElement], object]
FailureHandler = Callable[[Record[Any], BaseException, int], Sequence[Any]]


class RuntimeHooks(Protocol):
    """What a runtime that adapts values gives the operator in place of its defaults,
    as one object (``AsyncWaitOperator(..., hooks=...)``), read once when the operator
    is built. Each is None for the default:

    - ``invoke(value)``: the awaitable one attempt runs, instead of
      ``function.async_invoke(value)`` (the Spark runtime awaits the user's coroutine
      directly: one coroutine less per attempt);
    - ``map_results(value, results)``: applied to an attempt's results once the retry
      strategy accepted them, before emission; what it raises fails the element, not
      retried;
    - ``emit_results(results)``: called once per emitted element with its results,
      instead of ``output`` once per result wrapped in a :class:`Record` (watermarks
      still go to ``output``);
    - ``describe(value)``: names an input in error messages (default: its ``repr``,
      cut to 300 characters);
    - ``weight(value)``: how many input rows an element stands for (chunks): the
      counters of :meth:`AsyncWaitOperator.statistics` then count rows (default: 1).
    """

    @property
    def invoke(self) -> Callable[[Any], Any] | None: ...
    @property
    def map_results(self) -> Callable[[Any, Sequence[Any]], Sequence[Any]] | None: ...
    @property
    def emit_results(self) -> Callable[[Sequence[Any]], object] | None: ...
    @property
    def describe(self) -> Callable[[Any], str] | None: ...
    @property
    def weight(self) -> Callable[[Any], int] | None: ...


@dataclass(frozen=True)
class OperatorHooks:
    """A :class:`RuntimeHooks` of plain callables (any may be left out)."""

    invoke: Callable[[Any], Any] | None = None
    map_results: Callable[[Any, Sequence[Any]], Sequence[Any]] | None = None
    emit_results: Callable[[Sequence[Any]], object] | None = None
    describe: Callable[[Any], str] | None = None
    weight: Callable[[Any], int] | None = None


_NO_HOOKS: Final = OperatorHooks()


class _Entry(ResultHandle):
    """A queue entry with the operator's bookkeeping of its element (a timer namespace
    by identity): one object per element. The queue creates it; the operator sets
    these fields when it admits a record (:meth:`AsyncWaitOperator._track`); a
    watermark's entry never has them."""

    __slots__ = (
        "attempts",
        "bucket",
        "deadline",
        "last_error",
        "retry_at",
        "started",
        "timed_out",
        "worker",
    )

    attempts: int
    bucket: Slot | None  # its timeout slot while armed
    deadline: float
    last_error: BaseException | None
    retry_at: float | None
    started: float
    timed_out: bool
    worker: asyncio.Task[None] | None  # the worker running an attempt

    @property
    def record(self) -> Record[Any]:
        return self.element  # type: ignore[return-value]

    def __repr__(self) -> str:
        if type(self.element) is Watermark:
            return f"_Entry({self.element!r})"
        return f"_Entry({self.element!r}, attempts={self.attempts})"


def _record_of(element: Any) -> Record[Any]:
    """The record of a restored element or of a plain one."""
    return element.record if type(element) is _Restored else element


class _Restored:
    """Input restored from a snapshot: a completed element (``results``) or one in
    flight (its ``attempts`` and absolute ``deadline``)."""

    __slots__ = ("attempts", "deadline", "record", "results")

    def __init__(
        self,
        record: Record[Any],
        results: Sequence[Any] | None,
        attempts: int = 0,
        deadline: float | None = None,
    ) -> None:
        self.record = record
        self.results = results
        self.attempts = attempts
        self.deadline = deadline


@types.coroutine
def _resume(coro: Any, step: Any) -> Generator[Any, Any, Any]:
    """Await a coroutine that was already stepped once and yielded ``step``.

    The worker steps a first attempt itself (so that one completing at once
    needs no queue entry); when it suspends instead, the worker awaits this.
    An exception thrown in before the first resumption (the timeout's
    cancellation) is delivered to the user's coroutine, as an ``await`` would.
    """
    while True:
        try:
            yield step
        except BaseException as exc:
            try:
                step = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        return (yield from coro)


def _uncancel(task: asyncio.Task[Any]) -> None:
    """Drop the timeout's cancel request that the attempt did not let through."""
    if task.cancelling():
        task.uncancel()


class _RetryTrigger:
    __slots__ = ("op",)

    def __init__(self, op: AsyncWaitOperator) -> None:
        self.op = op

    def on_processing_time(self, timer: Timer) -> None:
        self.op._on_retry_timer(timer.namespace)  # type: ignore[arg-type]

    def on_event_time(self, timer: Timer) -> None:  # pragma: no cover - never registered
        raise AssertionError("async-retries has no event-time timers")


class AsyncWaitOperator:
    """Runs an :class:`AsyncFunction` over a stream with bounded concurrency.

    Args:
        function: an :class:`AsyncFunction`, or a bare ``async def f(value)``.
        output: called with each emitted :class:`Record` / :class:`Watermark`.
        timeout: seconds (or ``timedelta``) per element, retries included.
        capacity: maximum elements in flight (queue size, watermarks included), or
            ``"auto"``: an :class:`~asyncio_ops._limit.AdaptiveLimit` finds the
            number of elements in flight from the observed throughput and latency
            (errors are not throughput; cut on timeouts, on errors whose
            ``overload`` is true and on an error rate that rises with it), between 1
            and ``max_capacity``, which then sizes the queue; or an
            :class:`~asyncio_ops._limit.AdaptiveLimit` of the caller's (a runtime
            that carries a limit from one operator instance to the next).
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
        hooks: a :class:`RuntimeHooks`: what a runtime that adapts values
            gives in place of the defaults (the attempt's awaitable, a mapping
            of results, where results go, how an input is named, how many rows
            an element stands for).
        close_grace: seconds :meth:`close` waits for cancelled tasks (an attempt
            that swallows ``CancelledError``) before abandoning them, logged with
            their rows (default 5).
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
        capacity: int | str | AdaptiveLimit = 100,
        mode: OutputMode = OutputMode.ORDERED,
        retry: AsyncRetryStrategy | None = None,
        clock: Scheduler | None = None,
        runtime_context: RuntimeContext | None = None,
        on_failure: FailureHandler | None = None,
        key_selector: Callable[[Any], Any] | None = None,
        manage_function: bool = True,
        hooks: RuntimeHooks = _NO_HOOKS,
        output_buffer: int = 0,
        close_grace: float = CLOSE_GRACE,
        max_capacity: int = DEFAULT_MAX_CAPACITY,
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
        self._async_invoke: Callable[[Any], Any] = hooks.invoke or (
            fn.fn if type(fn) is CoroutineFunction else fn.async_invoke
        )
        self._map_results = hooks.map_results
        self._emit_results = hooks.emit_results
        self.close_grace = positive_seconds(close_grace, "close_grace")
        self._describe_value = hooks.describe
        self.mode = mode
        self.limiter: AdaptiveLimit | None = None
        if isinstance(capacity, AdaptiveLimit):  # a caller's own, e.g. carried over
            self.limiter = capacity
            self.capacity = capacity.maximum
        elif isinstance(fixed := capacity_or_auto(capacity), int):
            self.capacity = fixed
        else:
            self.limiter = AdaptiveLimit(maximum=positive_int(max_capacity, "max_capacity"))
            self.capacity = self.limiter.maximum
        self.output_buffer = non_negative_int(output_buffer, "output_buffer")
        # with an output buffer (or an adaptive limit), in-flight elements are bounded
        # apart from the queue, by _cap
        self._bound_in_flight = output_buffer > 0 or self.limiter is not None
        self._cap = self.capacity if self.limiter is None else self.limiter.limit
        self._in_flight = 0
        self._queued = 0  # len(self._queue), kept here: read once per element
        self.timeout = positive_seconds(timeout, "timeout")
        self._latency_tick = 3  # the 1-in-4 latency sample takes the first completion
        self._queue = make_queue(
            mode, self.capacity + output_buffer, key_selector is not None, _Entry
        )
        self._output = output
        self._retry = retry if retry is not None and retry.enabled else None
        self._rng = random.Random()
        self._runtime_context = runtime_context or RuntimeContext()
        self._on_failure = on_failure
        self._key_selector = key_selector
        self._timeouts = TimeoutSlots(self.timeout, self._on_timeout, clock=clock)
        self._retries = InternalTimerService("async-retries", _RetryTrigger(self), clock=clock)
        # the system clock's now() is time.time: called directly, one frame less per call
        self._clock_now: Callable[[], float] = time.time if clock is None else clock.now
        # input not yet in the queue: records (or bare values), watermarks, restored elements
        self._pending: collections.deque[Any] = collections.deque()
        # elements in the queue waiting for a worker: restored in flight, retries due
        self._ready: collections.deque[_Entry] = collections.deque()
        self._workers: list[asyncio.Task[None]] = []
        self._idle_workers: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tasks: set[asyncio.Task[Any]] = set()  # awaiting an async timeout() answer
        # workers whose attempt the timeout cancelled, until they let it go (see close)
        self._cancelled: dict[asyncio.Task[None], _Entry] = {}
        self._pending_retries: set[_Entry] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._opened = False
        self._manage_function = manage_function
        self._closed = False
        self._draining = False
        # statistics
        self._weight = hooks.weight
        self._received = 0
        self._elements = 0
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
        replay: list[Any] = []
        for entry in restored.entries:
            element = entry.element
            if type(element) is Watermark:
                if self.mode is OutputMode.UNORDERED:
                    self._queue.try_put(element)  # raises WatermarkNotSupportedError
                replay.append(element)
            elif entry.results is not None:
                replay.append(_Restored(element, tuple(entry.results)))  # type: ignore[arg-type]
            elif entry.deadline is None:
                replay.append(element)
            else:
                replay.append(_Restored(element, None, entry.attempts, entry.deadline))  # type: ignore[arg-type]
        self._restored += sum(
            1 if type(e) is Watermark else self._weigh(_record_of(e).value) for e in replay
        )
        await self._enqueue(replay)

    async def close(self) -> None:
        """Cancel and await everything in flight, stop timers, close the function."""
        if self._closed:
            return
        self._closed = True
        self._timeouts.close()
        self._retries.close()
        tasks = [*self._workers, *self._tasks]
        self._workers = []
        for t in tasks:
            t.cancel()
        if tasks:
            done, stuck = await asyncio.wait(tasks, timeout=self.close_grace)
            for t in done:
                if not t.cancelled():
                    t.exception()  # retrieved: the operator's failure already holds it
            if stuck:
                self._abandon(stuck)
        self._wake()
        if self._opened and self._manage_function:
            await maybe_await(self.function.close())

    def _abandon(self, stuck: set[asyncio.Task[Any]]) -> None:
        """Tasks that ignored their cancellation for ``close_grace`` seconds: left to
        the loop, logged with the rows they were running, never waited for."""
        running = [t for t in stuck if t in self._cancelled]
        rows = [self._describe(self._cancelled[t].record) for t in running]
        rows += [
            self._describe(entry.record)
            for entry in self._queue.entries()
            if isinstance(entry, _Entry)
            and type(entry.element) is Record
            and entry.worker in stuck
        ]
        log.warning(
            "%d task(s) of the async operator ignored cancellation for %.1f s and were "
            "abandoned (a lookup that swallows CancelledError); rows: %s",
            len(stuck), self.close_grace, rows or "unknown",
        )  # fmt: skip

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
        Returns once the element is in the queue and its first attempt has run
        up to its first suspension. Raises the operator's failure, if any.
        """
        await self._enqueue((record,))

    async def process_elements(self, records: Iterable[Record[Any] | Watermark | Any]) -> None:
        """``process_element`` for each of ``records`` in order, one await for all.

        Watermarks among them are processed as :meth:`process_watermark` would,
        in their place. Same semantics element by element (backpressure
        included); it avoids a coroutine and a wake-up per element, which
        matters when lookups are fast.
        """
        await self._enqueue(records)

    async def process_watermark(self, watermark: Watermark) -> None:
        """Put a watermark in the queue; it leaves by the mode's rule."""
        self._check()
        if type(watermark) is not Watermark:
            raise TypeError(f"process_watermark takes a Watermark, got {watermark!r}")
        if self.mode is OutputMode.UNORDERED:
            self._queue.try_put(watermark)  # raises WatermarkNotSupportedError
        await self._enqueue((watermark,))

    async def process_completed_element(self, record: Record[Any], results: Sequence[Any]) -> None:
        """Put an element whose results are already known (replayed from a log or snapshot).

        It takes a queue slot and leaves by the mode's rule like any other, but
        no request is made and no timer is set.
        """
        await self._enqueue((_Restored(record, tuple(results)),))

    async def _enqueue(self, elements: Iterable[Any]) -> None:
        """Hand ``elements`` to the workers; return once every one has entered the queue."""
        self._check()
        pending = self._pending
        pending.extend(elements)
        if not pending:
            return
        self._wake_workers()
        while pending:
            await self._wait()
            self._check()

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
            self._ready.append(entry)
        self._wake_workers()
        self._emit()
        while self._pending or not self._queue.is_empty():
            self._check()
            await self._wait()
        self._check()

    # -- workers -----------------------------------------------------------------------
    def _wake_workers(self) -> None:
        """Wake as many idle workers as there are elements they can take now, and start
        more while too few are idle: workers grow with the work in flight, up to
        ``capacity``, never ahead of it."""
        idle = self._idle_workers
        if self._failure is not None or self._closed:
            n = len(idle)
        else:
            n = len(self._ready)
            pending = len(self._pending)
            if pending:
                queue = self._queue
                room = queue.capacity - self._queued
                if self._bound_in_flight:
                    room = min(room, self._cap - self._in_flight)
                n += min(room, pending)
        while idle and n > 0:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                n -= 1
        if n > 0 and self._failure is None and not self._closed:
            workers = self._workers
            more = min(n, self._cap - len(workers))
            if more > 0:
                loop = asyncio.get_running_loop()
                workers.extend(loop.create_task(self._work()) for _ in range(more))

    async def _work(self) -> None:
        """One of ``capacity`` workers: take the next element, run its attempts, repeat.

        Any error of the operator's own (not of an element) fails the operator.
        """
        try:
            await self._work_loop()
        except Exception as exc:  # a bug: fail the operator with it, never hang
            self._fail(exc)
            raise

    async def _work_loop(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        pending = self._pending
        ready = self._ready
        queue = self._queue
        bounded = self._bound_in_flight
        invoke = self._async_invoke
        idle = self._idle_workers
        retry = self._retry
        map_results = self._map_results
        select = self._key_selector
        weight = self._weight
        clock_now = self._clock_now
        timeout = self.timeout
        room = queue.capacity
        while True:
            entry: _Entry | None = None
            resumed: Any = None  # a first attempt that suspended, to be awaited
            again = False
            if self._failure is not None or self._closed:
                pass
            elif ready:
                entry = ready.popleft()
                if entry.done or entry.timed_out:
                    continue
            elif (
                pending
                and self._queued < room
                and not (bounded and self._in_flight >= self._cap)
            ):
                element = pending.popleft()
                if not pending:
                    self._wake()  # the feeder: everything it gave is in the queue
                t = type(element)
                if t is Watermark or t is _Restored:
                    entry = self._admit_special(element)
                    if entry is None:
                        continue
                else:
                    # A record, or a bare value: its first attempt starts here, stepped
                    # once before it has a queue entry. One that completes without
                    # suspending (a cache hit), with results this queue would emit at
                    # once anyway, needs no entry, timer or bookkeeping at all.
                    value = element.value if t is Record else element
                    self._elements += 1
                    self._received += 1 if weight is None else weight(value)
                    key = select(value) if select is not None else None
                    started = clock_now()
                    try:
                        coro = invoke(value)
                        step = coro.send(None)
                    except StopIteration as stop:
                        results = stop.value
                        if (
                            retry is None
                            and (type(results) is list or type(results) is tuple)
                            and queue.emits_on_arrival(key)
                        ):
                            self._emit_at_once(element, value, key, results)
                            continue
                        entry = self._put(element, t, key, started, timeout)
                        again = self._on_result(entry, results)
                    except Exception as exc:
                        entry = self._put(element, t, key, started, timeout)
                        again = self._on_error(entry, exc)
                    except (KeyboardInterrupt, SystemExit) as exc:
                        entry = self._put(element, t, key, started, timeout)
                        self._fail_element(entry, exc, fatal=True)
                        continue
                    else:  # it suspended: from here on it runs under its timeout
                        entry = self._put(element, t, key, started, timeout)
                        resumed = _resume(coro, step)
                    if resumed is None and not again:
                        continue  # done (or waiting for a retry) after one step
            if entry is None:
                if self._closed:
                    return
                waiter = loop.create_future()
                idle.append(waiter)
                await waiter
                continue
            # run the element's attempts until it completes, fails or waits for a retry
            entry.worker = task
            if entry.bucket is None:
                self._timeouts.arm(entry)
            value = entry.element.value  # type: ignore[union-attr]
            while True:
                if resumed is None:
                    entry.attempts += 1
                    attempt = invoke(value)
                else:  # the first attempt, already stepped once
                    attempt, resumed = resumed, None
                try:
                    results = await attempt
                except asyncio.CancelledError:
                    if entry.timed_out and not self._closed:
                        task.uncancel()  # the timeout's cancellation: the element is done
                        self._cancelled.pop(task, None)
                        break
                    if self._closed or task.cancelling():
                        raise  # the worker itself is cancelled (close, or loop shutdown)
                    # raised inside the attempt (a cancelled future it awaited): it failed
                    cancelled = asyncio.CancelledError("the attempt was cancelled")
                    again = self._on_error(entry, cancelled)
                except Exception as exc:
                    if entry.timed_out:
                        _uncancel(task)  # the attempt swallowed the timeout's cancellation
                        self._cancelled.pop(task, None)
                        break
                    again = self._on_error(entry, exc)
                except (KeyboardInterrupt, SystemExit) as exc:
                    self._fail_element(entry, exc, fatal=True)  # naming the row
                    break
                else:
                    if entry.timed_out:
                        _uncancel(task)
                        self._cancelled.pop(task, None)
                        break  # late: the timeout answered first
                    if retry is None and (type(results) is list or type(results) is tuple):
                        # the common case, without a call per judgement
                        if map_results is not None:
                            try:
                                results = map_results(value, results)
                            except Exception as exc:
                                self._fail_element(entry, exc)
                                break
                        self._complete(entry, results)
                        break
                    again = self._on_result(entry, results)
                if not again:
                    break
            entry.worker = None

    def _put(self, element: Any, t: type, key: Any, started: float, timeout: float) -> _Entry:
        """Put a record (or a bare value) whose first attempt started in the queue."""
        record = element if t is Record else Record(element)
        entry: _Entry = self._queue.try_put(record, key)  # type: ignore[assignment]
        assert entry is not None, "room was checked"
        self._queued += 1
        self._track(entry, 1, started, started + timeout)
        return entry

    def _emit_at_once(self, element: Any, value: Any, key: Any, results: Sequence[Any]) -> None:
        """Emit the results of a record that completed on its first step (no queue entry)."""
        if self._map_results is not None:
            try:
                results = self._map_results(value, results)
            except Exception as exc:
                t = type(element)
                self._fail_element(self._put(element, t, key, self._clock_now(), 0.0), exc)
                return
        self._completed += 1 if self._weight is None else self._weight(value)
        self.latency.instant += 1
        if results:
            try:
                self._send(results, element.timestamp if type(element) is Record else None)
            except Exception as exc:
                self._fail(exc)

    def _track(self, entry: _Entry, attempts: int, started: float, deadline: float) -> None:
        """Start the operator's bookkeeping of a record just put in the queue."""
        entry.attempts = attempts
        entry.started = started
        entry.deadline = deadline
        entry.retry_at = entry.worker = entry.last_error = entry.bucket = None
        entry.timed_out = False
        self._in_flight += 1

    def _admit_special(self, element: Watermark | _Restored) -> _Entry | None:
        """Put a watermark or a restored element in the queue; the entry to run, if any."""
        if type(element) is Watermark:
            try:
                self._queue.try_put(element)
            except Exception as exc:
                self._fail(exc)
                return None
            self._queued += 1
            self._emit()
            return None
        assert type(element) is _Restored
        record = element.record
        self._elements += 1
        self._received += self._weigh(record.value)
        key = self._key_selector(record.value) if self._key_selector is not None else None
        entry: _Entry | None = self._queue.try_put(record, key)  # type: ignore[assignment]
        assert entry is not None, "room was checked"
        self._queued += 1
        if element.results is not None:
            entry.complete(element.results)  # no request, no timer
            self._emit()
            return None
        deadline = element.deadline
        assert deadline is not None
        self._track(entry, max(0, element.attempts), self._clock_now(), deadline)
        if deadline <= self._clock_now():
            self._on_timeout(entry)  # its budget ran out while it was stored
            return None
        return entry

    # -- outcomes ------------------------------------------------------------------------
    def _on_result(self, entry: _Entry, results: Any) -> bool:
        """Judge an attempt's results; True to try again at once."""
        if type(results) is not list and type(results) is not tuple:
            error = bad_results(results)
            if error is not None:
                self._fail_element(entry, error)
                return False
        retry = self._retry
        if (
            retry is not None
            and retry.should_retry_result(results)
            and retry.can_retry(entry.attempts)
        ):
            return self._schedule_retry(entry)
        if self._map_results is not None:
            try:
                results = self._map_results(entry.record.value, results)
            except Exception as exc:
                self._fail_element(entry, exc)
                return False
        self._complete(entry, results)
        return False

    def _on_error(self, entry: _Entry, exc: BaseException) -> bool:
        """Judge a failed attempt; True to try again at once."""
        limiter = self.limiter
        if limiter is not None and isinstance(exc, SignalsOverload) and exc.overload:
            self._overloaded(limiter)
        retry = self._retry
        if (
            retry is not None
            and retry.should_retry_exception(exc)
            and retry.can_retry(entry.attempts)
        ):
            entry.last_error = exc
            if limiter is not None:  # an attempt that failed: not goodput
                now = self._clock_now()
                limiter.on_complete(now - entry.started, self._in_flight, now, failed=True)
                self._cap = limiter.limit
            return self._schedule_retry(entry)
        self._fail_element(entry, exc)
        return False

    def _schedule_retry(self, entry: _Entry) -> bool:
        """True to retry at once; else a timer of ``async-retries`` hands it to a worker."""
        self._retried += self._weigh(entry.record.value)
        assert self._retry is not None
        delay = 0.0 if self._draining else self._retry.backoff_seconds(entry.attempts, self._rng)
        if delay <= 0.0:
            return True
        entry.retry_at = self._clock_now() + delay
        self._pending_retries.add(entry)
        self._retries.register_processing_time_timer(entry, entry.retry_at, entry.key)
        return False

    def _on_retry_timer(self, entry: _Entry) -> None:
        self._pending_retries.discard(entry)
        if entry.done or entry.timed_out or self._closed:
            return
        entry.retry_at = None
        self._ready.append(entry)
        self._wake_workers()

    def _overloaded(self, limiter: AdaptiveLimit) -> None:
        """A timeout or an overload error: the adaptive limit is cut."""
        limiter.on_overload(self._clock_now())
        self._cap = limiter.limit

    # -- timeouts ----------------------------------------------------------------------
    def _on_timeout(self, entry: _Entry) -> None:
        if entry.done or entry.timed_out or self._closed:
            return
        entry.timed_out = True
        self._timed_out += self._weigh(entry.record.value)
        if self.limiter is not None:
            self._overloaded(self.limiter)
        if entry.retry_at is not None:
            self._retries.delete_processing_time_timer(entry, entry.retry_at, entry.key)
            self._pending_retries.discard(entry)
            entry.retry_at = None
        worker = entry.worker
        if worker is not None:
            entry.worker = None
            self._cancelled[worker] = entry  # until the worker has let the attempt go
            worker.cancel()  # the attempt in flight; the worker moves on
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

    # -- completion --------------------------------------------------------------------
    def _complete(self, entry: _Entry, results: Sequence[Any], failed: bool = False) -> None:
        """``failed``: the results stand for an error (``on_failure``'s), not goodput."""
        if not entry.complete(results):
            return
        limiter = self.limiter
        grew = False
        if limiter is not None and not entry.timed_out:
            now = self._clock_now()
            limiter.on_complete(now - entry.started, self._in_flight, now, failed)
            grew = limiter.limit > self._cap
            self._cap = limiter.limit
        self._in_flight -= 1
        self._completed += 1 if self._weight is None else self._weight(entry.record.value)
        if entry.bucket is not None:
            self._timeouts.release(entry)
        self._latency_tick += 1
        if not self._latency_tick & 3:  # a 1-in-4 sample, weighted: quantiles hold, less work
            self.latency.add(self._clock_now() - entry.started, 4)
        popped = self._emit()
        if (self._pending or self._ready) and (popped > 1 or entry.worker is None or grew):
            # room for more requests than the worker that ran this element (if any)
            # takes by itself when it goes back for the next
            self._wake_workers()

    def _fail_element(self, entry: _Entry, exc: BaseException, fatal: bool = False) -> None:
        """The element failed: results from ``on_failure``, or the operator fails. A
        ``fatal`` failure (KeyboardInterrupt, SystemExit raised by the attempt) always
        fails the operator, naming the row, with the exception as cause."""
        record = entry.record
        self._failed += self._weigh(record.value)
        if self._on_failure is not None and not fatal:
            try:
                results = self._on_failure(record, exc, entry.attempts)
            except Exception as handler_exc:
                exc = handler_exc
            else:
                self._complete(entry, results, failed=True)
                return
        self._timeouts.release(entry)
        error = element_failure(
            exc, record.value, entry.attempts, entry.last_error, lambda: self._describe(record)
        )
        entry.complete_exceptionally(error)
        self._fail(error)

    def _weigh(self, value: Any) -> int:
        """How many rows ``value`` counts for in :meth:`statistics` (1 without ``weight``)."""
        return 1 if self._weight is None else self._weight(value)

    def _describe(self, record: Record[Any]) -> str:
        if self._describe_value is not None:
            return self._describe_value(record.value)
        return describe_record(record)

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._wake()
        self._wake_workers()  # idle workers see the failure and stop taking input

    # -- emission ----------------------------------------------------------------------
    def _emit(self) -> int:
        """Emit every entry that can leave now; how many left the queue."""
        if self._failure is not None:
            return 0
        handles = self._queue.pop_completed_entries()
        if not handles:
            return 0
        self._queued -= len(handles)
        send = self._send
        try:
            for handle in handles:
                element = handle.element
                if type(element) is Watermark:
                    self._output(element)
                    continue
                if handle.exception is not None:
                    raise handle.exception
                if handle.results:
                    send(handle.results, element.timestamp)
        except Exception as exc:
            self._fail(exc)
            return len(handles)
        if self._waiter is not None:
            self._wake()  # room in the queue, or the end of input
        return len(handles)

    def _send(self, results: Sequence[Any], ts: float | None) -> None:
        """One element's (non-empty) results out: to ``emit_results`` as they are, or to
        ``output`` one :class:`Record` each, with the input's timestamp."""
        self._emitted += len(results)
        if self._emit_results is not None:
            self._emit_results(results)
            return
        output = self._output
        for r in results:
            output(Record(r, ts))

    # -- snapshot ----------------------------------------------------------------------
    def snapshot_state(self) -> OperatorSnapshot:
        """Every element not yet emitted, in input order, with results where complete.

        An element that completed exceptionally is stored without results, so a
        restore tries it again; input not yet in the queue (given to a
        ``process_*`` call still waiting for room) follows the queue's elements.
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
            assert isinstance(handle, _Entry)
            if handle.exception is not None:  # failed: tried again, with a fresh budget
                entries.append(SnapshotEntry(element, None, key))
                continue
            entries.append(SnapshotEntry(element, None, key, handle.attempts, handle.deadline))
        select = self._key_selector
        for item in self._pending:
            t = type(item)
            if t is Watermark:
                entries.append(SnapshotEntry(item))
                continue
            if t is _Restored:
                record = item.record
                results = item.results
                attempts, deadline = item.attempts, item.deadline
            else:
                record = item if t is Record else Record(item)
                results, attempts, deadline = None, 0, None
            key = select(record.value) if select is not None else None
            entries.append(SnapshotEntry(record, results, key, attempts, deadline))
        return OperatorSnapshot(tuple(entries), self.mode)

    # -- introspection -----------------------------------------------------------------
    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def __len__(self) -> int:
        """Elements in the queue (in flight, or complete and not yet emitted)."""
        return len(self._queue)

    def statistics(self) -> OperatorStatistics:
        return OperatorStatistics(
            received=self._received,
            elements=self._elements,
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
            f"capacity={self.capacity if self.limiter is None else self.limiter}, "
            f"timeout={self.timeout}, in_flight={len(self._queue)})"
        )


__all__ = ["AsyncWaitOperator", "OutputMode", "make_queue"]
