"""Completion and emission: an attempt's outcome is judged, its element completed or
failed, and whatever can leave the queue is emitted.

Owns what happens once an attempt has an outcome: :meth:`_Completion._on_result`
and :meth:`~_Completion._on_error` judge it (retry it, through the timeout part's
``_schedule_retry``, or complete it, or fail it); :meth:`~_Completion._complete`
completes an element's queue entry (its adaptive-limit sample, its counters, its
timeout slot released) and emits; :meth:`~_Completion._fail_element` turns a failed
element into ``on_failure``'s results or fails the operator
(:meth:`~_Completion._fail`, which wakes the feeder and the workers);
:meth:`~_Completion._emit` pops every entry the queue lets leave and sends it, in
the queue's order, to ``output`` or the ``emit_results`` hook
(:meth:`~_Completion._send`). Emission runs on the loop that completes elements:
no emitter thread, no locks.

Call order: a worker (or a timeout) calls ``_on_result`` / ``_on_error`` /
``_fail_element`` once per attempt's outcome; ``_complete`` at most once per
element (a late second call is ignored), then ``_emit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._elements import Record, Watermark
from .._limit import SignalsOverload
from .._results import bad_results, describe_record, element_failure
from ._core import _Entry, _OperatorCore


class _Completion(_OperatorCore):
    """Outcomes, completion and emission (see the module docstring)."""

    # -- outcomes ----------------------------------------------------------------------
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

    # -- completion --------------------------------------------------------------------
    def _complete(self, entry: _Entry, results: Sequence[Any], failed: bool = False) -> None:
        """``failed``: the results stand for an error (``on_failure``'s), not goodput."""
        if not entry.complete(results):
            return
        limiter = self.limiter
        grew = False
        pause = 0.0
        if limiter is not None and not entry.timed_out:
            now = self._clock_now()
            latency = now - entry.started
            limiter.on_complete(latency, self._in_flight, now, failed)
            grew = limiter.limit > self._cap
            self._cap = limiter.limit
            if failed:
                pause = limiter.pause_after_error(latency)
        if pause > 0:  # the slot stays taken a while: an error answered at once
            self._scheduler.call_at(now + pause, self._free_slot)
        else:
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

    def _free_slot(self) -> None:
        """The end of a slot's pause after an error answered at once."""
        self._in_flight -= 1
        if (self._pending or self._ready) and not self._closed:
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
