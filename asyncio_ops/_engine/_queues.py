"""Element queues: where in-flight elements wait, and the order they leave in.

One contract for three kinds (Flink's StreamElementQueue):

- ``try_put(element)`` returns a :class:`ResultHandle`, or ``None`` when the
  queue already holds ``capacity`` elements. Watermarks take a slot too.
- The handle is the completion point: ``complete(results)`` or
  ``complete_exceptionally(exc)``. The first completion wins; later ones are
  ignored and return False (a late real result after a timeout result is
  dropped).
- ``has_completed()`` says whether ``pop_completed()`` has something to give.
  ``pop_completed()`` removes the next emittable entry and returns its output:
  one :class:`Record` per result, each with the input's timestamp, or
  ``[watermark]`` for a watermark entry. An entry completed exceptionally
  raises its exception from ``pop_completed()`` (after being removed).
  ``pop_completed_entries()`` removes every entry that can leave now, in
  order, and returns their handles (the operator emits results without a
  :class:`Record` per result).
- A queue makes handles of its ``handle_type``: :class:`ResultHandle` or a
  subclass whose extra slots carry the owner's bookkeeping of the element (the
  operator's attempts, deadline and timer), one object per entry.
- ``values()`` lists the inputs not yet emitted, in arrival order (what a
  snapshot stores); ``entries()`` the same as handles; ``len()``,
  ``is_empty()``.

Kinds:

- :class:`OutputMode` names the three, and :func:`make_queue` builds one.
- :class:`OrderedElementQueue`: FIFO; only the head leaves, and only once done.
  Watermarks are done on arrival and leave when they reach the head.
- :class:`UnorderedElementQueue`: processing time; records leave in completion
  order. A watermark is an error naming the mode to use instead.
- :class:`WatermarkBoundedElementQueue`: event time; records between two
  watermarks leave in completion order, and no record crosses a watermark in
  either direction. Internally a deque of segments: a record joins the last
  segment; a watermark gets a segment of its own (reusing the last one if it is
  empty) followed by a fresh empty one; only the first segment emits, and an
  emptied first segment is dropped while others follow.

Queues are single-threaded: they live on the operator's event loop and take no
locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from .._elements import Record, StreamElement, Watermark
from .._exceptions import ConfigurationError, WatermarkNotSupportedError
from ..options import OutputMode, positive_int

_EMPTY: tuple[()] = ()


class ResultHandle:
    """The promise of one queue entry; completed once, by whoever is first.

    Example:

    >>> from asyncio_ops import OrderedElementQueue, Record
    >>> queue = OrderedElementQueue(capacity=4)
    >>> handle = queue.try_put(Record("a"))  # the element's place in the queue
    >>> handle.complete(["A1", "A2"])  # two results: the element fans out
    True
    >>> queue.pop_completed()
    [Record(value='A1', timestamp=None), Record(value='A2', timestamp=None)]
    """

    __slots__ = ("_segment", "done", "element", "exception", "key", "results")

    def __init__(
        self, element: StreamElement, segment: _Segment | None = None, key: Any = None
    ) -> None:
        self.element = element
        self.key = key
        self.done = False
        # read-only outside this class: what complete() / complete_exceptionally() got
        self.results: Sequence[Any] = _EMPTY
        self.exception: BaseException | None = None
        self._segment = segment

    def complete(self, results: Sequence[Any]) -> bool:
        """Complete with ``results``; False (and nothing changes) if already complete."""
        if self.done:
            return False
        self.results = results
        self.done = True
        segment = self._segment
        if segment is not None:
            if segment.by_key is None:  # _Segment.on_complete without key order, inlined
                segment.pending -= 1
                segment.completed.append(self)
            else:
                segment.on_complete(self)
        return True

    def complete_exceptionally(self, exc: BaseException) -> bool:
        """Complete with a failure; False if already complete."""
        if self.done:
            return False
        self.exception = exc
        self.done = True
        if self._segment is not None:
            self._segment.on_complete(self)
        return True

    def output(self) -> list[StreamElement]:
        """What emitting this entry produces (raises the failure of a failed entry)."""
        if self.exception is not None:
            raise self.exception
        element = self.element
        if type(element) is Watermark:
            return [element]
        ts = element.timestamp
        return [Record(r, ts) for r in self.results]

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        return f"ResultHandle({self.element!r}, {state})"


class ElementQueue(Protocol):
    """The contract every queue kind implements (see the module docstring).

    Example:

    >>> from asyncio_ops import ElementQueue, OrderedElementQueue, Record
    >>> queue: ElementQueue = OrderedElementQueue(capacity=4)  # one of the three kinds
    >>> handle = queue.try_put(Record("a"))
    >>> len(queue), queue.has_completed()
    (1, False)
    """

    capacity: int

    def try_put(self, element: StreamElement, key: Any = None) -> ResultHandle | None: ...

    def has_completed(self) -> bool: ...

    def pop_completed(self) -> list[StreamElement]: ...

    def pop_completed_entries(self) -> list[ResultHandle]: ...

    def values(self) -> list[StreamElement]: ...

    def emits_on_arrival(self, key: Any = None) -> bool:
        """Would an entry (of ``key``) completed on arrival be emitted at once, first?"""
        ...

    def entries(self) -> list[ResultHandle]: ...

    def __len__(self) -> int: ...

    def is_empty(self) -> bool: ...


class OrderedElementQueue:
    """FIFO queue: entries leave in arrival order, each once it is done.

    Example:

    >>> from asyncio_ops import OrderedElementQueue, Record
    >>> queue = OrderedElementQueue(capacity=2)
    >>> a, b = queue.try_put(Record("a")), queue.try_put(Record("b"))
    >>> queue.try_put(Record("c")) is None  # full
    True
    >>> b.complete(["B"])
    True
    >>> queue.has_completed()  # "b" waits behind "a"
    False
    >>> a.complete(["A"])
    True
    >>> queue.pop_completed(), queue.pop_completed()
    ([Record(value='A', timestamp=None)], [Record(value='B', timestamp=None)])
    """

    __slots__ = ("_handle_type", "_queue", "capacity")

    def __init__(self, capacity: int, handle_type: type[ResultHandle] = ResultHandle) -> None:
        self.capacity = positive_int(capacity, "capacity")
        self._handle_type = handle_type
        self._queue: deque[ResultHandle] = deque()

    def try_put(self, element: StreamElement, key: Any = None) -> ResultHandle | None:
        if len(self._queue) >= self.capacity:
            return None
        handle = self._handle_type(element, None, key)
        if type(element) is Watermark:
            handle.done = True
        self._queue.append(handle)
        return handle

    def has_completed(self) -> bool:
        q = self._queue
        return bool(q) and q[0].done

    def emits_on_arrival(self, key: Any = None) -> bool:
        return not self._queue

    def pop_completed(self) -> list[StreamElement]:
        q = self._queue
        if not q or not q[0].done:
            raise LookupError("pop_completed: the head of the ordered queue is not complete")
        return q.popleft().output()

    def pop_completed_entries(self) -> list[ResultHandle]:
        q = self._queue
        out = []
        while q and q[0].done:
            out.append(q.popleft())
        return out

    def values(self) -> list[StreamElement]:
        return [h.element for h in self._queue]

    def entries(self) -> list[ResultHandle]:
        return list(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def is_empty(self) -> bool:
        return not self._queue

    def __repr__(self) -> str:
        return f"OrderedElementQueue(capacity={self.capacity}, len={len(self._queue)})"


class _Segment:
    """Entries between two watermarks: completed ones in completion order.

    Key-ordered, an entry becomes emittable only once every earlier entry of
    its key (in this segment) is: ``by_key`` holds each key's entries not yet
    moved to ``completed``, oldest first.
    """

    __slots__ = ("by_key", "completed", "pending")

    def __init__(self, key_ordered: bool = False) -> None:
        self.completed: deque[ResultHandle] = deque()
        self.pending = 0
        self.by_key: dict[Any, deque[ResultHandle]] | None = {} if key_ordered else None

    def add(self, handle: ResultHandle) -> None:
        self.pending += 1
        if self.by_key is not None and type(handle.element) is not Watermark:
            waiting = self.by_key.get(handle.key)
            if waiting is None:
                self.by_key[handle.key] = deque((handle,))
            else:
                waiting.append(handle)

    def on_complete(self, handle: ResultHandle) -> None:
        by_key = self.by_key
        if by_key is None or type(handle.element) is Watermark:
            self.pending -= 1
            self.completed.append(handle)
            return
        waiting = by_key[handle.key]
        if waiting[0] is not handle:
            return  # an earlier entry of this key is still in flight
        while waiting and waiting[0].done:
            self.pending -= 1
            self.completed.append(waiting.popleft())
        if not waiting:
            del by_key[handle.key]

    def is_empty(self) -> bool:
        return not self.pending and not self.completed


class WatermarkBoundedElementQueue:
    """Event-time unordered queue: completion order within watermark-delimited segments.

    With ``key_ordered=True`` entries of one key also leave in arrival order
    (keyed mode: per-key order, completion order across keys).

    Example:

    >>> from asyncio_ops import Record, Watermark, WatermarkBoundedElementQueue
    >>> queue = WatermarkBoundedElementQueue(capacity=4)
    >>> a = queue.try_put(Record("a", 1.0))
    >>> mark = queue.try_put(Watermark(1.0))
    >>> b = queue.try_put(Record("b", 2.0))
    >>> b.complete(["B"])
    True
    >>> queue.has_completed()  # "b" may not overtake the watermark before it
    False
    >>> a.complete(["A"])
    True
    >>> [queue.pop_completed() for _ in range(3)]  # doctest: +NORMALIZE_WHITESPACE
    [[Record(value='A', timestamp=1.0)], [Watermark(timestamp=1.0)],
     [Record(value='B', timestamp=2.0)]]
    """

    __slots__ = ("_all", "_handle_type", "_key_ordered", "_segments", "capacity")

    def __init__(
        self,
        capacity: int,
        key_ordered: bool = False,
        handle_type: type[ResultHandle] = ResultHandle,
    ) -> None:
        self.capacity = positive_int(capacity, "capacity")
        self._handle_type = handle_type
        self._key_ordered = key_ordered
        self._segments: deque[_Segment] = deque([_Segment(key_ordered)])
        # Every entry not yet emitted, in arrival order (dicts keep insertion order).
        self._all: dict[ResultHandle, None] = {}

    def try_put(self, element: StreamElement, key: Any = None) -> ResultHandle | None:
        if len(self._all) >= self.capacity:
            return None
        if type(element) is Watermark:
            return self._put_watermark(element)
        last = self._segments[-1]
        handle = self._handle_type(element, last, key)
        if last.by_key is None:
            last.pending += 1
        else:
            last.add(handle)
        self._all[handle] = None
        return handle

    def _put_watermark(self, element: Watermark) -> ResultHandle:
        segments = self._segments
        last = segments[-1]
        if not last.is_empty():
            last = _Segment(self._key_ordered)
            segments.append(last)
        handle = self._handle_type(element, last)
        last.add(handle)
        handle.complete(_EMPTY)
        segments.append(_Segment(self._key_ordered))
        self._all[handle] = None
        return handle

    def has_completed(self) -> bool:
        return bool(self._segments[0].completed)

    def emits_on_arrival(self, key: Any = None) -> bool:
        segments = self._segments
        if len(segments) != 1:
            return False
        first = segments[0]
        if first.completed:
            return False
        return first.by_key is None or key not in first.by_key

    def pop_completed(self) -> list[StreamElement]:
        segments = self._segments
        first = segments[0]
        if not first.completed:
            raise LookupError("pop_completed: no completed entry in the first segment")
        handle = first.completed.popleft()
        del self._all[handle]
        if len(segments) > 1 and first.is_empty():
            segments.popleft()
        return handle.output()

    def pop_completed_entries(self) -> list[ResultHandle]:
        segments = self._segments
        everything = self._all
        out: list[ResultHandle] = []
        while True:
            first = segments[0]
            completed = first.completed
            while completed:
                handle = completed.popleft()
                del everything[handle]
                out.append(handle)
            if len(segments) > 1 and first.is_empty():
                segments.popleft()  # the next segment may emit now
                continue
            return out

    def values(self) -> list[StreamElement]:
        return [h.element for h in self._all]

    def entries(self) -> list[ResultHandle]:
        return list(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def is_empty(self) -> bool:
        return not self._all

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, len={len(self._all)}, "
            f"segments={len(self._segments)})"
        )


class UnorderedElementQueue(WatermarkBoundedElementQueue):
    """Processing-time unordered queue: records leave in completion order.

    It has no notion of event time: a watermark is rejected with
    :class:`WatermarkNotSupportedError`.

    Example:

    >>> from asyncio_ops import Record, UnorderedElementQueue
    >>> queue = UnorderedElementQueue(capacity=4)
    >>> x, y = queue.try_put(Record("x")), queue.try_put(Record("y"))
    >>> y.complete(["Y"])  # completion order
    True
    >>> queue.pop_completed()
    [Record(value='Y', timestamp=None)]
    """

    __slots__ = ()

    def pop_completed_entries(self) -> list[ResultHandle]:
        # one segment, always: no watermark ever opens another
        completed = self._segments[0].completed
        everything = self._all
        out = []
        while completed:
            handle = completed.popleft()
            del everything[handle]
            out.append(handle)
        return out

    def _put_watermark(self, element: Watermark) -> ResultHandle:
        raise WatermarkNotSupportedError(
            f"{element!r} given to the processing-time unordered queue, which has no event "
            "time; use OutputMode.WATERMARK_BOUNDED (unordered between watermarks) or "
            "OutputMode.ORDERED"
        )


def make_queue(
    mode: OutputMode,
    capacity: int,
    key_ordered: bool = False,
    handle_type: type[ResultHandle] = ResultHandle,
) -> ElementQueue:
    if mode is OutputMode.ORDERED:
        return OrderedElementQueue(capacity, handle_type)
    if mode is OutputMode.UNORDERED:
        return UnorderedElementQueue(capacity, key_ordered, handle_type)
    if mode is OutputMode.WATERMARK_BOUNDED:
        return WatermarkBoundedElementQueue(capacity, key_ordered, handle_type)
    raise ConfigurationError(f"mode must be an OutputMode, got {mode!r}")
