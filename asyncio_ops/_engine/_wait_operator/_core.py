"""What every part of the operator shares: its fields, its entries, its runtime hooks.

Owns the declarations the parts agree on, and nothing that runs per element:

- :class:`RuntimeHooks` (the one Protocol by which a runtime that adapts values
  replaces the operator's defaults) and :class:`OperatorHooks`, its plain form;
- :class:`_Entry`, the queue entry with the operator's bookkeeping of one
  element, and :class:`_Restored`, input restored from a snapshot;
- :class:`_OperatorCore`, the base class of every part: the operator's fields,
  declared once with their types (``AsyncWaitOperator.__init__`` assigns them),
  and, for the type checker only, the methods one part calls on another. At run
  time it adds nothing: the parts are mixins of one object, so a field is one
  attribute of ``self`` and a call to another part one method lookup (cached by
  the interpreter, whatever the depth of the bases).

Every other module of the package imports this one and no other of its siblings,
except ``_async_wait``, which composes them.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..._clock import Scheduler
from ..._elements import Record, StreamElement, Watermark
from ..._functions import AsyncFunction, RuntimeContext
from ..._timers import InternalTimerService
from ...options import OutputMode
from .._limit import AdaptiveLimit
from .._operator_snapshot import OperatorSnapshot
from .._queues import ElementQueue, ResultHandle
from .._retry import AsyncRetryStrategy
from .._statistics import LatencyHistogram
from .._timeout_slots import Slot, TimeoutSlots

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

    Example: a runtime's hooks as a class of its own (:class:`OperatorHooks` is the
    ready-made one).

    >>> import asyncio
    >>> from asyncio_ops import AsyncWaitOperator, Record, RuntimeHooks
    >>> class Chunks:  # an element is a list of rows: counted, and named, as rows
    ...     invoke = map_results = emit_results = None
    ...     def describe(self, chunk):
    ...         return f"a chunk of {len(chunk)} rows"
    ...     def weight(self, chunk):
    ...         return len(chunk)
    >>> async def lookup(chunk):
    ...     return [[row * 2 for row in chunk]]
    >>> async def main(hooks: RuntimeHooks):
    ...     out = []
    ...     async with AsyncWaitOperator(lookup, output=out.append, timeout=5.0,
    ...                                  hooks=hooks) as op:
    ...         await op.process_elements([Record([1, 2, 3]), Record([4])])
    ...         await op.end_input()
    ...         return [r.value for r in out], op.statistics().completed
    >>> asyncio.run(main(Chunks()))
    ([[2, 4, 6], [8]], 4)
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
    """A :class:`RuntimeHooks` of plain callables (any may be left out).

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncWaitOperator, OperatorHooks
    >>> async def lookup(value):
    ...     return [value * 10]
    >>> async def main():
    ...     batches = []  # emit_results: each element's results at once, no Record
    ...     hooks = OperatorHooks(map_results=lambda value, results: [r + 1 for r in results],
    ...                           emit_results=batches.append)
    ...     async with AsyncWaitOperator(lookup, output=print, timeout=5.0, hooks=hooks) as op:
    ...         await op.process_elements([1, 2])
    ...         await op.end_input()
    ...     return batches
    >>> asyncio.run(main())
    [[11], [21]]
    """

    invoke: Callable[[Any], Any] | None = None
    map_results: Callable[[Any, Sequence[Any]], Sequence[Any]] | None = None
    emit_results: Callable[[Sequence[Any]], object] | None = None
    describe: Callable[[Any], str] | None = None
    weight: Callable[[Any], int] | None = None


_NO_HOOKS: Final = OperatorHooks()


class _Entry(ResultHandle):
    """A queue entry with the operator's bookkeeping of its element (a timer namespace
    by identity): one object per element. The queue creates it; the operator sets
    these fields when it admits a record (:meth:`_Admission._track`); a
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


class _OperatorCore:
    """The fields of :class:`AsyncWaitOperator`, declared once for every part of it.

    ``AsyncWaitOperator.__init__`` assigns each (grouped here by what they
    serve); the parts read and update them on ``self``.
    """

    # configuration (set once)
    function: AsyncFunction[Any, Any]
    mode: OutputMode
    capacity: int
    output_buffer: int
    timeout: float
    close_grace: float
    limiter: AdaptiveLimit | None
    _async_invoke: Callable[[Any], Any]
    _map_results: Callable[[Any, Sequence[Any]], Sequence[Any]] | None
    _emit_results: Callable[[Sequence[Any]], object] | None
    _describe_value: Callable[[Any], str] | None
    _weight: Callable[[Any], int] | None
    _output: OutputFn
    _retry: AsyncRetryStrategy | None
    _rng: random.Random
    _runtime_context: RuntimeContext
    _on_failure: FailureHandler | None
    _key_selector: Callable[[Any], Any] | None
    _manage_function: bool
    _clock_now: Callable[[], float]
    _bound_in_flight: bool  # in-flight elements are bounded apart from the queue, by _cap
    # the queue and its accounting (admission puts, completion pops)
    _queue: ElementQueue
    _queued: int  # len(self._queue), kept here: read once per element
    _in_flight: int
    _cap: int  # the adaptive limit's, or capacity
    _scheduler: Scheduler  # the clock's timers (the adaptive limit's pauses after errors)
    # input not yet in the queue: records (or bare values), watermarks, restored elements
    _pending: collections.deque[Any]
    # elements in the queue waiting for a worker: restored in flight, retries due
    _ready: collections.deque[_Entry]
    _workers: list[asyncio.Task[None]]
    _idle_workers: collections.deque[asyncio.Future[None]]
    _waiter: asyncio.Future[None] | None  # the feeder (process_*, end_input) waits on it
    # timeouts and retries
    _timeouts: TimeoutSlots
    _retries: InternalTimerService
    _pending_retries: set[_Entry]
    _tasks: set[asyncio.Task[Any]]  # awaiting an async timeout() answer
    # workers whose attempt the timeout cancelled, until they let it go (see close)
    _cancelled: dict[asyncio.Task[None], _Entry]
    # lifecycle
    _failure: BaseException | None
    _opened: bool
    _closed: bool
    _draining: bool  # end_input was called: retries are not delayed
    # statistics
    _received: int
    _elements: int
    _emitted: int
    _completed: int
    _timed_out: int
    _retried: int
    _failed: int
    _restored: int
    _latency_tick: int
    latency: LatencyHistogram

    if TYPE_CHECKING:  # what one part calls on another (each defined in one part)
        # _admission
        def _check(self) -> None: ...
        def _wake(self) -> None: ...
        def _wake_workers(self) -> None: ...
        async def _enqueue(self, elements: Iterable[Any]) -> None: ...
        def _put(
            self, element: Any, t: type, key: Any, started: float, timeout: float
        ) -> _Entry: ...
        def _track(self, entry: _Entry, attempts: int, started: float, deadline: float) -> None: ...
        def _overloaded(self, limiter: AdaptiveLimit) -> None: ...
        # _completion
        def _on_result(self, entry: _Entry, results: Any) -> bool: ...
        def _on_error(self, entry: _Entry, exc: BaseException) -> bool: ...
        def _complete(
            self, entry: _Entry, results: Sequence[Any], failed: bool = False
        ) -> None: ...
        def _fail_element(self, entry: _Entry, exc: BaseException, fatal: bool = False) -> None: ...
        def _emit_at_once(
            self, element: Any, value: Any, key: Any, results: Sequence[Any]
        ) -> None: ...
        def _fail(self, error: BaseException) -> None: ...
        def _emit(self) -> int: ...
        def _weigh(self, value: Any) -> int: ...
        def _describe(self, record: Record[Any]) -> str: ...
        # _timeouts
        def _schedule_retry(self, entry: _Entry) -> bool: ...
        def _on_timeout(self, entry: _Entry) -> None: ...
        def _retry_pending_now(self) -> None: ...
        # _snapshots
        def _admit_restored(self, element: _Restored) -> _Entry | None: ...
        async def _restore(self, restored: OperatorSnapshot) -> None: ...
