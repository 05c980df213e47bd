"""The AsyncWaitOperator: Flink's Async I/O on one asyncio event loop.

The operator admits elements within capacity, runs their attempts, completes
and emits them in the queue's order, times them out and retries them, and
snapshots what is not yet emitted. One object does all of it, built from one
part per responsibility, each a module of this package:

- ``_core``: the fields every part shares (declared once, on one base class),
  the queue entry ``_Entry`` and the runtime hooks (:class:`RuntimeHooks`, one
  Protocol; :class:`OperatorHooks`);
- ``_admission``: admission and capacity: the ``process_*`` calls and
  ``end_input``, and the workers that take input into the queue and run its
  attempts;
- ``_completion``: completion and emission: an attempt's outcome judged, the
  element completed or failed, the queue's head emitted;
- ``_timeouts``: timeouts and retries, as timers;
- ``_snapshots``: ``snapshot_state`` and the replay of a snapshot by ``open``;
- ``_async_wait``: the class :class:`AsyncWaitOperator`, which composes them
  (construction, ``open``, ``close``, statistics).

The parts are mixins of that one class, sharing ``self``, as CPython's asyncio
composes its transports: a field is one attribute of ``self`` and a call from
one part to another one method of ``self``, no object between them (an
attribute hop per step of the worker loop). Each part imports ``_core`` and no
other part; ``_async_wait`` imports them all.

What it is built from lives in modules of their own: the element queues
(``_queues``), the timer service (``_timers``) and its timeout slots
(``_timeout_slots``), the adaptive limit (``_limit``), retry strategies
(``_retry``), result checks (``_results``), the snapshot's types
(``_snapshot``) and the statistics (``_statistics``).

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

from ...options import OutputMode
from .._queues import make_queue
from ._async_wait import CLOSE_GRACE, AsyncWaitOperator
from ._core import FailureHandler, OperatorHooks, OutputFn, RuntimeHooks

__all__ = [
    "CLOSE_GRACE",
    "AsyncWaitOperator",
    "FailureHandler",
    "OperatorHooks",
    "OutputFn",
    "OutputMode",
    "RuntimeHooks",
    "make_queue",
]
