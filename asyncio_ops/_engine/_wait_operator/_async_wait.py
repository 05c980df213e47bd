"""The class :class:`AsyncWaitOperator`: its parts composed, its construction and lifecycle.

Owns what is the operator's as a whole: ``__init__`` (checks the arguments and
assigns every field that ``_core._OperatorCore`` declares), ``open`` (the
function's ``open``, then the snapshot part's replay), ``close`` (timers stopped,
every task cancelled and awaited up to ``close_grace``, the function closed), the
async context manager, and introspection (``failure``, ``len``, ``statistics``).
The rest is inherited from the parts, one module each: admission and capacity
(``_admission``), completion and emission (``_completion``), timeouts and retries
(``_timeouts``), snapshot and restore (``_snapshots``).

Call order: see the package (``asyncio_ops._engine._wait_operator``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from ..._clock import Scheduler, SystemClock
from ..._elements import Record
from ..._exceptions import ConfigurationError
from ..._functions import (
    AsyncFunction,
    CoroutineFunction,
    RuntimeContext,
    as_async_function,
    maybe_await,
)
from ..._timers import InternalTimerService
from ...options import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_CAPACITY,
    OutputMode,
    capacity_or_auto,
    non_negative_int,
    positive_int,
    positive_seconds,
)
from .._limit import AdaptiveLimit
from .._operator_snapshot import OperatorSnapshot
from .._queues import make_queue
from .._retry import AsyncRetryStrategy
from .._statistics import LatencyHistogram, OperatorStatistics
from .._timeout_slots import TimeoutSlots
from ._admission import _Admission
from ._completion import _Completion
from ._core import _NO_HOOKS, FailureHandler, OutputFn, RuntimeHooks, _Entry
from ._snapshot_restore import _Snapshots
from ._timeouts import _RetryTrigger, _Timeouts

CLOSE_GRACE: Final = 5.0
"""Seconds ``close()`` waits for cancelled tasks before abandoning them (logged)."""

log = logging.getLogger("asyncio_ops.operator")


class AsyncWaitOperator(_Admission, _Completion, _Timeouts, _Snapshots):
    """Runs an :class:`AsyncFunction` over a stream with bounded concurrency.

    Args:
        function: an :class:`AsyncFunction`, or a bare ``async def f(value)``.
        output: called with each emitted :class:`Record` / :class:`Watermark`.
        timeout: seconds (or ``timedelta``) per element, retries included.
        capacity: maximum elements in flight (queue size, watermarks included), or
            ``"auto"``: an :class:`~asyncio_ops._engine._limit.AdaptiveLimit` finds the
            number of elements in flight from the observed throughput and latency
            (errors are not throughput; cut on timeouts, on errors whose
            ``overload`` is true and on an error rate that rises with it), between 1
            and ``max_capacity``, which then sizes the queue; or an
            :class:`~asyncio_ops._engine._limit.AdaptiveLimit` of the caller's (a runtime
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

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncWaitOperator, Record
    >>> async def lookup(value):
    ...     await asyncio.sleep(0.01)  # a call to a slow system
    ...     return [value * 10]
    >>> async def main():
    ...     out = []
    ...     async with AsyncWaitOperator(lookup, output=out.append, timeout=5.0,
    ...                                  capacity=2) as op:  # open() ... close()
    ...         for value in [1, 2, 3]:
    ...             await op.process_element(Record(value))
    ...         await op.end_input()  # every element emitted
    ...     return [r.value for r in out]
    >>> asyncio.run(main())
    [10, 20, 30]
    """

    def __init__(
        self,
        function: AsyncFunction[Any, Any] | Callable[[Any], Any],
        *,
        output: OutputFn,
        timeout: float | timedelta,
        capacity: int | str | AdaptiveLimit = DEFAULT_CAPACITY,
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
        self._async_invoke = hooks.invoke or (
            fn.fn if type(fn) is CoroutineFunction else fn.async_invoke
        )
        self._map_results = hooks.map_results
        self._emit_results = hooks.emit_results
        self.close_grace = positive_seconds(close_grace, "close_grace")
        self._describe_value = hooks.describe
        self.mode = mode
        self.limiter = None
        if isinstance(capacity, AdaptiveLimit):  # a caller's own, e.g. carried over
            self.limiter = capacity
            self.capacity = capacity.maximum
        elif isinstance(fixed := capacity_or_auto(capacity), int):
            self.capacity = fixed
        else:
            self.limiter = AdaptiveLimit(maximum=positive_int(max_capacity, "max_capacity"))
            self.capacity = self.limiter.maximum
        self.output_buffer = non_negative_int(output_buffer, "output_buffer")
        self._bound_in_flight = output_buffer > 0 or self.limiter is not None
        self._cap = self.capacity if self.limiter is None else self.limiter.limit
        self._in_flight = 0
        self._queued = 0
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
        self._clock_now = time.time if clock is None else clock.now
        self._scheduler = clock if clock is not None else SystemClock()
        self._pending = collections.deque()
        self._ready = collections.deque()
        self._workers = []
        self._idle_workers = collections.deque()
        self._tasks = set()
        self._cancelled = {}
        self._pending_retries = set()
        self._waiter = None
        self._failure = None
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
        if restored is not None:
            await self._restore(restored)

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
            if isinstance(entry, _Entry) and type(entry.element) is Record and entry.worker in stuck
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
