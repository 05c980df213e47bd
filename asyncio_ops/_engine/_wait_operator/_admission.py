"""Admission and capacity: input enters the queue within capacity; workers run attempts.

Owns the feeder's side (``process_element``, ``process_elements``,
``process_watermark``, ``process_completed_element``, ``end_input``), which puts
input in ``_pending`` and waits on ``_waiter`` until every element given is in
the queue, and the workers: up to ``capacity`` long-lived tasks, started by
:meth:`_Admission._wake_workers` as work arrives, each of which takes the next
element while the queue has room (and, with an output buffer or an adaptive
limit, while fewer than ``_cap`` are in flight), steps its first attempt once,
puts it in the queue (:meth:`~_Admission._put`, :meth:`~_Admission._track`) unless
it completed at once with results the queue would emit anyway, then awaits its
attempts until it completes, fails or waits for a retry. A worker hands each
outcome to the completion part (``_on_result``, ``_on_error``, ``_complete``,
``_fail_element``), arms the element's timeout (``_timeouts``) and lets the
timeout part's cancellation of an attempt go; restored elements are admitted by
the snapshot part (``_admit_restored``).

Call order: ``process_*`` any number of times, then ``end_input``; a worker's
loop runs from its start to :meth:`close` (or the loop's shutdown).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Generator, Iterable, Sequence
from typing import Any

from ..._elements import Record, Watermark
from ...options import OutputMode
from .._limit import AdaptiveLimit
from ._core import _Entry, _OperatorCore, _Restored


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


class _Admission(_OperatorCore):
    """The feeder's calls and the workers (see the module docstring)."""

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
        self._retry_pending_now()
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

    def _overloaded(self, limiter: AdaptiveLimit) -> None:
        """A timeout or an overload error: the adaptive limit is cut."""
        limiter.on_overload(self._clock_now())
        self._cap = limiter.limit

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
        """The worker's loop, in two steps per element: take the next (a retry or a
        restored element due, else input while there is room, its first attempt
        stepped once), then run its attempts until it completes, fails or waits for
        a retry; with nothing to take, wait idle.

        One function on purpose, both measured: the attempts as a coroutine of their
        own cost one coroutine per element that suspends (5 to 7% fewer elements per
        second with lookups that yield once), the first step as a method of its own
        a call per element (7 to 10% fewer with lookups that complete at once).
        """
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
            elif pending and self._queued < room and not (bounded and self._in_flight >= self._cap):
                element = pending.popleft()
                if not pending:
                    self._wake()  # the feeder: everything it gave is in the queue
                t = type(element)
                if t is Watermark:
                    self._admit_watermark(element)
                    continue
                if t is _Restored:
                    entry = self._admit_restored(element)
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

    def _track(self, entry: _Entry, attempts: int, started: float, deadline: float) -> None:
        """Start the operator's bookkeeping of a record just put in the queue."""
        entry.attempts = attempts
        entry.started = started
        entry.deadline = deadline
        entry.retry_at = entry.worker = entry.last_error = entry.bucket = None
        entry.timed_out = False
        self._in_flight += 1

    def _admit_watermark(self, element: Watermark) -> None:
        """Put a watermark in the queue (it may let entries before it leave)."""
        try:
            self._queue.try_put(element)
        except Exception as exc:
            self._fail(exc)
            return
        self._queued += 1
        self._emit()
