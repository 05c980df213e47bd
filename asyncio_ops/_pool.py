"""A pull-based twin of the async operator for the partition runtime's plain case.

:class:`PooledWaitOperator` keeps ``capacity`` long-lived worker tasks that
pull rows from a shared queue and await the user's coroutine directly: no
task, queue entry, record or timer is created per row. It implements the
operator's semantics for what the runtime needs without keys, watermarks or
checkpoints: ordered or unordered output, ``capacity`` (and
``output_buffer``), a timeout budget per element (retries included, in the
operator's 10 ms slots, a timed-out attempt is cancelled and
``function.timeout(value)`` answers), retries with their backoff, results
mapped by ``map_results``, failures turned into results by ``on_failure`` or
failing the run with the operator's messages. The runtime uses it for
``ordered_wait`` / ``unordered_wait`` without ``key``, ``event_time``,
``checkpoint_location`` or ``chunk_size``; :class:`AsyncWaitOperator`
remains the reference; ``tests/runtime/test_pooled.py`` runs the same
scenarios on both and compares them (``ASYNCIO_OPS_POOL=0`` on the driver
turns this path off).

Why: at 1 ms lookups the per-row cost decides, and most of the operator's
per-row cost was its bookkeeping for a row in flight (a task per suspended
lookup, its entry in the queue, the record objects). Workers that pull the
next row in the same step in which they finish the last pay none of it.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ._elements import Record
from ._operator import TIMEOUT_GRANULARITY, OutputMode
from ._results import bad_results, bad_timeout_results, describe_record, element_failure
from ._retry import AsyncRetryStrategy
from ._statistics import LatencyHistogram, OperatorStatistics

__all__ = ["PooledWaitOperator"]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _uncancel(task: asyncio.Task[Any]) -> None:
    """Drop the timeout's cancel request that the attempt did not let through."""
    if task.cancelling():
        task.uncancel()


class _Slot:
    """What one worker is running: the element's sequence number and value."""

    __slots__ = (
        "attempts",
        "bucket",
        "deadline",
        "last_error",
        "seq",
        "started",
        "timed_out",
        "value",
    )

    def __init__(self, seq: int, value: Any, started: float, deadline: float) -> None:
        self.seq = seq
        self.value = value
        self.started = started
        self.deadline = deadline
        self.attempts = 0
        self.bucket = -1  # its timeout slot while armed
        self.timed_out = False
        self.last_error: BaseException | None = None


class PooledWaitOperator:
    """``capacity`` workers over a shared queue of values (see the module docstring)."""

    def __init__(
        self,
        *,
        invoke: Callable[[Any], Any],
        map_results: Callable[[Any, Any], Sequence[Any]],
        timeout_handler: Callable[[Any], Any],
        emit: Callable[[Sequence[Any]], None],
        timeout: float,
        capacity: int,
        mode: OutputMode,
        retry: AsyncRetryStrategy | None = None,
        on_failure: Callable[[Record[Any], BaseException, int], Sequence[Any]] | None = None,
        output_buffer: int = 0,
        describe: Callable[[Any], str] | None = None,
    ) -> None:
        if mode not in (OutputMode.ORDERED, OutputMode.UNORDERED):
            raise ValueError(f"PooledWaitOperator runs ordered or unordered mode, not {mode}")
        self._invoke = invoke
        self._map_results = map_results
        self._timeout_handler = timeout_handler
        self._emit_results = emit
        self.timeout = timeout
        self.capacity = capacity
        self.ordered = mode is OutputMode.ORDERED
        self._window = capacity + output_buffer  # ordered: elements between input and emission
        self._retry = retry if retry is not None and retry.enabled else None
        self._on_failure = on_failure
        self._describe = describe or (lambda value: describe_record(Record(value)))
        self._granularity = min(TIMEOUT_GRANULARITY, timeout / 100)
        self._rng = random.Random()
        self._pending: deque[Any] = deque()
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[asyncio.Task[Any], _Slot] = {}
        self._buckets: dict[int, list[tuple[asyncio.Task[Any], _Slot]]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._live: dict[int, int] = {}  # timeout slot -> elements in it not yet finished
        self._idle: asyncio.Future[None] | None = None  # workers waiting for input or room
        self._waiter: asyncio.Future[None] | None = None  # the feeder or end_input
        self._done: dict[int, Sequence[Any]] = {}  # ordered: finished, not yet emitted
        self._next_seq = 0
        self._emit_seq = 0
        self._in_flight = 0
        self._failure: BaseException | None = None
        self._closed = False
        self._draining = False
        self._backoffs: set[asyncio.Future[None]] = set()
        self.latency = LatencyHistogram()
        self._latency_tick = 0
        self._received = 0
        self._emitted = 0
        self._completed = 0
        self._timed_out = 0
        self._retried = 0
        self._failed = 0

    # -- input ---------------------------------------------------------------------------
    async def open(self, restored: object = None) -> None:
        """Nothing to open (the runtime opens the function); nothing to restore."""
        if restored is not None:
            raise ValueError("PooledWaitOperator does not restore snapshots")

    async def process_elements(self, values: Sequence[Any]) -> None:
        """Queue ``values``; return once every one has been started (backpressure)."""
        self._check()
        if not self._workers:
            loop = asyncio.get_running_loop()
            self._now = loop.time
            self._loop = loop
            self._workers = [loop.create_task(self._work()) for _ in range(self.capacity)]
        self._pending.extend(values)
        self._received += len(values)
        self._wake_workers()
        while self._pending:
            await self._wait()
            self._check()

    async def end_input(self) -> None:
        """Retry what waits for a retry at once, then wait until everything is emitted."""
        self._check()
        self._draining = True
        for wake in list(self._backoffs):
            _resolve(wake)
        while self._pending or self._in_flight or self._done:
            await self._wait()
            self._check()

    async def close(self) -> None:
        self._closed = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._workers:
            task.cancel()
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        self._wake()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def __len__(self) -> int:
        return self._in_flight + len(self._done)

    def statistics(self) -> OperatorStatistics:
        return OperatorStatistics(
            received=self._received,
            emitted=self._emitted,
            in_flight=len(self),
            completed=self._completed,
            timed_out=self._timed_out,
            retried=self._retried,
            failed=self._failed,
            restored=0,
            latency_p50=self.latency.quantile(0.5),
            latency_p99=self.latency.quantile(0.99),
            latency_max=self.latency.max if self.latency.count + self.latency.instant else None,
        )

    # -- waiting ---------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeError("PooledWaitOperator is closed")

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

    def _wake_workers(self) -> None:
        idle = self._idle
        if idle is not None:
            self._idle = None
            if not idle.done():
                idle.set_result(None)

    # -- workers -----------------------------------------------------------------------------
    async def _work(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        pending = self._pending
        invoke = self._invoke
        while True:
            # take the next element, if there is one and (ordered) room to emit it
            if (
                not pending
                or self._failure is not None
                or (self.ordered and self._next_seq - self._emit_seq >= self._window)
            ):
                if self._closed:
                    return
                idle = self._idle
                if idle is None or idle.done():
                    idle = self._idle = self._loop.create_future()
                await idle
                continue
            value = pending.popleft()
            if not pending:
                self._wake()  # the feeder: everything is started
            seq = self._next_seq
            self._next_seq += 1
            self._in_flight += 1
            started = self._now()
            slot = _Slot(seq, value, started, started + self.timeout)
            self._running[task] = slot
            self._arm(task, slot)
            while True:  # attempts
                slot.attempts += 1
                try:
                    results = await invoke(value)
                except asyncio.CancelledError:
                    if self._closed:
                        raise
                    if slot.timed_out:
                        task.uncancel()
                        break  # the timeout completed the element
                    # cancelled by someone other than the timeout: a failed attempt
                    if self._attempt_failed(
                        slot, asyncio.CancelledError("the attempt was cancelled")
                    ) and await self._backoff(task, slot):
                        continue
                    break
                except Exception as exc:
                    if slot.timed_out:
                        _uncancel(task)  # the attempt swallowed the timeout's cancellation
                        break
                    if self._attempt_failed(slot, exc) and await self._backoff(task, slot):
                        continue
                    break
                if slot.timed_out:
                    _uncancel(task)
                    break  # late: the timeout answered first
                if type(results) is not list and type(results) is not tuple:
                    error = bad_results(results)
                    if error is not None:
                        self._fail_element(slot, error)
                        break
                retry = self._retry
                if (
                    retry is not None
                    and retry.should_retry_result(results)
                    and retry.can_retry(slot.attempts)
                ):
                    if await self._backoff(task, slot):
                        continue
                    break
                try:
                    mapped = self._map_results(value, results)
                except Exception as exc:
                    self._fail_element(slot, exc)
                    break
                self._complete(slot, mapped)
                break
            del self._running[task]
            self._disarm(slot)

    def _attempt_failed(self, slot: _Slot, exc: BaseException) -> bool:
        """True to try again (after :meth:`_backoff`); else the element failed."""
        retry = self._retry
        if (
            retry is not None
            and retry.should_retry_exception(exc)
            and retry.can_retry(slot.attempts)
        ):
            slot.last_error = exc
            return True
        self._fail_element(slot, exc)
        return False

    async def _backoff(self, task: asyncio.Task[Any], slot: _Slot) -> bool:
        """Wait the retry delay; False if the timeout answered meanwhile.

        As in the operator, ``end_input`` ends every pending delay at once and
        later retries do not wait (Flink fires delayed retries on end of input).
        """
        assert self._retry is not None
        self._retried += 1
        delay = 0.0 if self._draining else self._retry.backoff_seconds(slot.attempts, self._rng)
        if delay > 0:
            wake: asyncio.Future[None] = self._loop.create_future()
            handle = self._loop.call_later(delay, _resolve, wake)
            self._backoffs.add(wake)
            try:
                await wake
            except asyncio.CancelledError:
                if slot.timed_out and not self._closed:
                    task.uncancel()
                    return False
                raise
            finally:
                handle.cancel()
                self._backoffs.discard(wake)
        return not slot.timed_out

    # -- timeouts ------------------------------------------------------------------------------
    def _arm(self, task: asyncio.Task[Any], slot: _Slot) -> None:
        n = math.ceil(slot.deadline / self._granularity)
        bucket = self._buckets.get(n)
        if bucket is None:
            bucket = self._buckets[n] = []
            self._live[n] = 0
            self._timers[n] = self._loop.call_at(n * self._granularity, self._fire, n)
        bucket.append((task, slot))
        self._live[n] += 1
        slot.bucket = n

    def _disarm(self, slot: _Slot) -> None:
        """The element is finished: a slot whose elements all finished goes, with its timer
        (finished rows must not stay referenced until their deadline)."""
        n = slot.bucket
        slot.bucket = -1
        live = self._live.get(n)
        if live is None:
            return  # the slot fired already
        if live > 1:
            self._live[n] = live - 1
            return
        del self._live[n]
        del self._buckets[n]
        self._timers.pop(n).cancel()

    def _fire(self, n: int) -> None:
        self._timers.pop(n, None)
        self._live.pop(n, None)
        for task, slot in self._buckets.pop(n, ()):
            if self._running.get(task) is slot and not slot.timed_out:
                self._on_timeout(task, slot)

    def _on_timeout(self, task: asyncio.Task[Any], slot: _Slot) -> None:
        slot.timed_out = True
        self._timed_out += 1
        task.cancel()
        try:
            results = self._timeout_handler(slot.value)
        except Exception as exc:
            self._fail_element(slot, exc)
            return
        if asyncio.iscoroutine(results) or asyncio.isfuture(results):
            self._loop.create_task(self._await_timeout(slot, results))
            return
        self._complete_after_timeout(slot, results)

    async def _await_timeout(self, slot: _Slot, awaitable: Any) -> None:
        try:
            results = await awaitable
        except Exception as exc:
            self._fail_element(slot, exc)
        else:
            self._complete_after_timeout(slot, results)

    def _complete_after_timeout(self, slot: _Slot, results: Any) -> None:
        error = bad_timeout_results(results)
        if error is not None:
            self._fail_element(slot, error)
            return
        self._complete(slot, results)

    # -- completion -----------------------------------------------------------------------------
    def _complete(self, slot: _Slot, results: Sequence[Any]) -> None:
        self._in_flight -= 1
        self._completed += 1
        self._latency_tick += 1
        if not self._latency_tick & 3:  # a 1-in-4 sample, weighted, as the operator
            self.latency.add(self._now() - slot.started, 4)
        if not self.ordered:
            self._output(results)
            return
        seq = slot.seq
        if seq != self._emit_seq:
            self._done[seq] = results
            return
        self._output(results)
        self._emit_seq = seq = seq + 1
        done = self._done
        while seq in done:
            self._output(done.pop(seq))
            self._emit_seq = seq = seq + 1
        self._wake_workers()  # room in the window

    def _output(self, results: Sequence[Any]) -> None:
        if results:
            self._emitted += len(results)
            self._emit_results(results)
        if not self._in_flight and not self._done:
            self._wake()  # end_input

    def _fail_element(self, slot: _Slot, exc: BaseException) -> None:
        self._failed += 1
        if self._on_failure is not None:
            try:
                results = self._on_failure(Record(slot.value), exc, slot.attempts)
            except Exception as handler_exc:
                exc = handler_exc
            else:
                self._complete(slot, results)
                return
        error = element_failure(
            exc, slot.value, slot.attempts, slot.last_error, lambda: self._describe(slot.value)
        )
        if self._failure is None:
            self._failure = error
        self._wake()
        self._wake_workers()
