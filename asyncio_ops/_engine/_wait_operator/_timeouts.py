"""Timeouts and retries: one budget per element from its first invoke, and retries as
timers.

Owns the element's timeout and its retries. The timeout is a slot of the
operator's :class:`~asyncio_ops._engine._timeout_slots.TimeoutSlots` (timers of the
``"async-timeouts"`` service), armed by the worker that first runs the element and
released when it completes; when it fires for an element not yet complete,
:meth:`_Timeouts._on_timeout` cancels the attempt in flight (the worker lets it go)
and completes the element with ``function.timeout(value)`` (awaited in a task of its
own if it is a coroutine). A retry (:meth:`~_Timeouts._schedule_retry`, asked by the
completion part) is immediate, or a processing-time timer of the
``"async-retries"`` service whose firing hands the element back to a worker
(``_ready``); after ``end_input`` pending retries fire at once
(:meth:`~_Timeouts._retry_pending_now`) and later ones are not delayed.

Call order: ``_schedule_retry`` from an attempt's judgement; ``_on_timeout`` from
the timeout slots (or the snapshot part, for a restored element out of time);
``_on_retry_timer`` from the retry timer; each does nothing for an element already
complete, timed out, or after ``close``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..._timers import Timer
from .._results import bad_timeout_results
from ._core import _Entry, _OperatorCore


class _RetryTrigger:
    """The ``"async-retries"`` service's trigger: a due retry back to a worker."""

    __slots__ = ("op",)

    def __init__(self, op: _Timeouts) -> None:
        self.op = op

    def on_processing_time(self, timer: Timer) -> None:
        self.op._on_retry_timer(timer.namespace)  # type: ignore[arg-type]

    def on_event_time(self, timer: Timer) -> None:  # pragma: no cover - never registered
        raise AssertionError("async-retries has no event-time timers")


class _Timeouts(_OperatorCore):
    """Timeouts and retry timers (see the module docstring)."""

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

    def _retry_pending_now(self) -> None:
        """End of input: every retry waiting for its timer goes to a worker now."""
        for entry in list(self._pending_retries):
            self._retries.delete_processing_time_timer(entry, entry.retry_at, entry.key)  # type: ignore[arg-type]
            self._pending_retries.discard(entry)
            entry.retry_at = None
            self._ready.append(entry)

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
