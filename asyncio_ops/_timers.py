"""The timer service: processing-time and event-time timers of one operator.

Contract (Flink's InternalTimerService):

- A timer is the triple ``(key, namespace, timestamp)``. Registering the same
  triple twice keeps one timer; deleting a triple that is not registered does
  nothing.
- Each time domain keeps a min-heap ordered by timestamp (ties: registration
  order). Deletion marks the entry dead in O(1) and the heap is rebuilt when
  dead entries outnumber live ones, so memory stays proportional to live
  timers and every operation is amortised O(log n).
- Processing-time timers fire when the clock passes them. The service keeps
  exactly one scheduled callback on the clock, for the earliest timer; it is
  re-armed only when an earlier timer arrives or when it fires.
- Event-time timers fire from :meth:`InternalTimerService.advance_watermark`,
  in timestamp order, for every timer ``<= watermark``; the caller emits the
  watermark downstream only after that returns.
- The end of input (Flink's rule for bounded input): the watermark +inf fires
  the event-time timers registered when it arrives, and
  ``fire_processing_time(now, final=True)`` the processing-time timers due by
  ``now`` registered when it is called; a timer a callback registers during
  that final firing never fires (it is dropped when it comes due in it), so a
  timer that re-registers itself ends with the input instead of firing forever.
- Before a timer's callback runs, its key becomes the current key of the
  ``key_context`` (the keyed state backend), if one is given; a context that
  takes every key's group from the engine (``requires_assigned_groups``) is
  first told the group the timer is filed under.
- :meth:`InternalTimerService.snapshot` returns the live timers grouped by key
  group, and :meth:`InternalTimerService.restore` takes back the groups inside
  the service's key-group range, so timers move with their keys on rescale. A
  timer's key group is the one its key's state is filed under (the key
  context's :meth:`KeyContext.key_group_of`: the engine's group when the
  engine assigned one), and a restored timer's key keeps the group it was
  snapshotted under.
- ``armed=False`` holds timers without scheduling anything on the clock: they
  fire only from :meth:`InternalTimerService.fire_processing_time` and
  :meth:`InternalTimerService.advance_watermark`. A runtime that fires
  deadlines its own way keeps them there to snapshot and restore them.

Several named services can live in one operator (``"async-timeouts"``,
``"async-retries"``, ``"user-timers"``); each has its own heaps.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

from ._clock import SYSTEM_CLOCK, Cancellable, Scheduler
from ._keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange, assign_to_key_group

PROCESSING_TIME: Final = "processing"
EVENT_TIME: Final = "event"

_COMPACT_SLACK: Final = 64


class Timer:
    """A registered timer: ``(key, namespace, timestamp)``; read-only by convention.

    Example:

    >>> from asyncio_ops import Timer
    >>> Timer("user-1", None, 10.0) == Timer("user-1", None, 10.0)  # one per (key, ns, time)
    True
    """

    __slots__ = ("key", "namespace", "timestamp")

    def __init__(self, key: Any, namespace: Hashable, timestamp: float) -> None:
        self.key = key
        self.namespace = namespace
        self.timestamp = timestamp

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timer) and (
            (self.key, self.namespace, self.timestamp)
            == (other.key, other.namespace, other.timestamp)
        )

    def __hash__(self) -> int:
        return hash((self.key, self.namespace, self.timestamp))

    def __repr__(self) -> str:
        return (
            f"Timer(key={self.key!r}, namespace={self.namespace!r}, timestamp={self.timestamp!r})"
        )


class Triggerable(Protocol):
    """What the service calls when a timer fires."""

    def on_event_time(self, timer: Timer) -> None: ...

    def on_processing_time(self, timer: Timer) -> None: ...


class KeyContext(Protocol):
    """The keyed state backend, as far as timers are concerned."""

    def set_current_key(self, key: Any) -> None: ...

    def get_current_key(self) -> Any: ...

    def key_group_of(self, key: Any) -> int: ...

    def assign_key_group(self, key: Any, key_group: int) -> None: ...

    @property
    def requires_assigned_groups(self) -> bool: ...


class TimerHeap:
    """A min-heap of timers with de-duplication and O(1) (lazy) delete.

    Live timers are also indexed by group and key (``group``: an int the caller
    gives with each timer, the key group; 0 by default), so that the timers of
    some keys, or of one group, are found without walking the heap.

    Example:

    >>> from asyncio_ops import TimerHeap
    >>> heap = TimerHeap()
    >>> heap.add("k", None, 5.0), heap.add("k", None, 1.0), heap.add("k", None, 1.0)
    (True, True, False)
    >>> heap.peek_timestamp(), len(heap)
    (1.0, 2)
    >>> heap.poll_due(2.0)
    (Timer(key='k', namespace=None, timestamp=1.0), 0)
    """

    __slots__ = ("_dead", "_entries", "_groups", "_heap", "_seq")

    def __init__(self) -> None:
        # entry: [timestamp, seq, timer-or-None, group]; None marks a deleted timer.
        self._heap: list[list[Any]] = []
        self._entries: dict[tuple[Any, Hashable, float], list[Any]] = {}
        self._groups: dict[int, dict[Any, set[tuple[Hashable, float]]]] = {}
        self._seq = itertools.count()
        self._dead = 0

    def add(self, key: Any, namespace: Hashable, timestamp: float, group: int = 0) -> bool:
        """Add the timer; False if that triple is already present."""
        triple = (key, namespace, timestamp)
        if triple in self._entries:
            return False
        entry = [timestamp, next(self._seq), Timer(key, namespace, timestamp), group]
        self._entries[triple] = entry
        heapq.heappush(self._heap, entry)
        self._groups.setdefault(group, {}).setdefault(key, set()).add((namespace, timestamp))
        return True

    def _unindex(self, entry: list[Any], key: Any, namespace: Hashable, timestamp: float) -> None:
        keys = self._groups[entry[3]]
        held = keys[key]
        held.discard((namespace, timestamp))
        if not held:
            del keys[key]
            if not keys:
                del self._groups[entry[3]]

    def remove(self, key: Any, namespace: Hashable, timestamp: float) -> bool:
        """Remove the timer; False if it was not present."""
        entry = self._entries.pop((key, namespace, timestamp), None)
        if entry is None:
            return False
        self._unindex(entry, key, namespace, timestamp)
        entry[2] = None
        self._dead += 1
        if self._dead > len(self._entries) + _COMPACT_SLACK:
            self._heap = [e for e in self._heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._dead = 0
        return True

    def peek_timestamp(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][0] if heap else None

    def mark(self) -> int:
        """A registration mark: every timer added after this call has a sequence ``>=`` it."""
        return next(self._seq)

    def poll_due(self, up_to: float, added_before: int | None = None) -> tuple[Timer, int] | None:
        """Remove and return the earliest timer with ``timestamp <= up_to`` and its
        group, if any.

        With ``added_before`` (a :meth:`mark`), a due timer added after the mark
        is removed without being returned.
        """
        heap = self._heap
        while heap:
            entry = heap[0]
            timer = entry[2]
            if timer is None:
                heapq.heappop(heap)
                self._dead -= 1
                continue
            if entry[0] > up_to:
                return None
            heapq.heappop(heap)
            del self._entries[(timer.key, timer.namespace, timer.timestamp)]
            self._unindex(entry, timer.key, timer.namespace, timer.timestamp)
            if added_before is not None and entry[1] >= added_before:
                continue
            return timer, entry[3]
        return None

    def of_keys(self, group: int, keys: Iterable[Any]) -> list[Timer]:
        """The live timers of ``keys`` (all filed under ``group``)."""
        held = self._groups.get(group, {})
        return [
            Timer(key, ns, ts)
            for key in keys
            for ns, ts in sorted(held.get(key, ()), key=_by_timestamp)
        ]

    def of_group(self, group: int) -> list[Timer]:
        """The live timers filed under ``group``."""
        return self.of_keys(group, list(self._groups.get(group, {})))

    def groups(self) -> list[int]:
        """The groups holding live timers."""
        return list(self._groups)

    def remove_keys(self, group: int, keys: Iterable[Any]) -> None:
        """Remove every timer of ``keys`` (filed under ``group``)."""
        held = self._groups.get(group)
        if not held:
            return
        for key in keys:
            for ns, ts in list(held.get(key, ())):
                self.remove(key, ns, ts)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, triple: object) -> bool:
        return triple in self._entries

    def __iter__(self) -> Iterator[Timer]:
        """Live timers in timestamp order."""
        for entry in sorted((e for e in self._heap if e[2] is not None), key=_entry_order):
            yield entry[2]

    def clear(self) -> None:
        self._heap.clear()
        self._entries.clear()
        self._groups.clear()
        self._dead = 0


def _by_timestamp(item: tuple[Hashable, float]) -> float:
    return item[1]


def _entry_order(entry: list[Any]) -> tuple[float, int]:
    return entry[0], entry[1]


_UNSET: Final[Any] = object()

TimerSnapshot = dict[int, list[tuple[str, Any, Hashable, float]]]


class InternalTimerService:
    """Timers of one named service of one operator (see the module docstring).

    Example:

    >>> from asyncio_ops import InternalTimerService
    >>> from asyncio_ops.testing import ManualClock
    >>> class Fired:
    ...     def on_event_time(self, timer):
    ...         print("event time", timer.timestamp)
    ...     def on_processing_time(self, timer):
    ...         print("processing time", timer.timestamp)
    >>> clock = ManualClock()
    >>> timers = InternalTimerService("user-timers", Fired(), clock=clock)
    >>> timers.register_processing_time_timer(None, 5.0, key="k")
    >>> timers.register_event_time_timer(None, 10.0, key="k")
    >>> clock.advance(5.0)
    processing time 5.0
    >>> timers.advance_watermark(10.0)
    event time 10.0
    1
    """

    def __init__(
        self,
        name: str,
        triggerable: Triggerable,
        *,
        clock: Scheduler | None = None,
        key_context: KeyContext | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        key_group_range: KeyGroupRange | None = None,
        armed: bool = True,
    ) -> None:
        self.name = name
        self._armed_mode = armed
        self._triggerable = triggerable
        self._clock: Scheduler = clock if clock is not None else SYSTEM_CLOCK
        self._key_context = key_context
        self._max_parallelism = max_parallelism
        self._key_group_range = (
            key_group_range
            if key_group_range is not None
            else KeyGroupRange.of_all(max_parallelism)
        )
        self._processing = TimerHeap()
        self._event = TimerHeap()
        self._watermark = float("-inf")
        self._armed: Cancellable | None = None
        self._armed_at = float("inf")
        self._closed = False

    # -- time -------------------------------------------------------------------------
    def current_processing_time(self) -> float:
        return self._clock.now()

    def current_watermark(self) -> float:
        return self._watermark

    # -- registration ----------------------------------------------------------------
    def _key(self, key: Any) -> Any:
        if key is not _UNSET:
            return key
        return self._key_context.get_current_key() if self._key_context is not None else None

    def _group(self, key: Any) -> int:
        """The key group a timer of ``key`` is filed under (see the module docstring);
        0 without a key context (such a service's snapshot computes its groups)."""
        ctx = self._key_context
        return ctx.key_group_of(key) if ctx is not None else 0

    def register_processing_time_timer(
        self, namespace: Hashable, timestamp: float, key: Any = _UNSET
    ) -> None:
        """Fire ``on_processing_time`` once the clock reaches ``timestamp``.

        ``key`` defaults to the key context's current key (None when unkeyed).
        """
        key = self._key(key)
        if self._processing.add(key, namespace, timestamp, self._group(key)) and (
            timestamp < self._armed_at
        ):
            self._arm(timestamp)

    def delete_processing_time_timer(
        self, namespace: Hashable, timestamp: float, key: Any = _UNSET
    ) -> None:
        self._processing.remove(self._key(key), namespace, timestamp)

    def register_event_time_timer(
        self, namespace: Hashable, timestamp: float, key: Any = _UNSET
    ) -> None:
        """Fire ``on_event_time`` when a watermark ``>= timestamp`` arrives."""
        key = self._key(key)
        self._event.add(key, namespace, timestamp, self._group(key))

    def delete_event_time_timer(
        self, namespace: Hashable, timestamp: float, key: Any = _UNSET
    ) -> None:
        self._event.remove(self._key(key), namespace, timestamp)

    def num_processing_time_timers(self) -> int:
        return len(self._processing)

    def num_event_time_timers(self) -> int:
        return len(self._event)

    def processing_time_timers(self) -> list[Timer]:
        return list(self._processing)

    def event_time_timers(self) -> list[Timer]:
        return list(self._event)

    # -- firing ----------------------------------------------------------------------
    def _arm(self, when: float) -> None:
        if self._closed or not self._armed_mode:
            return
        if self._armed is not None:
            self._armed.cancel()
        self._armed_at = when
        self._armed = self._clock.call_at(when, self._on_armed)

    def _on_armed(self) -> None:
        self._armed = None
        self._armed_at = float("inf")
        self.fire_processing_time(self._clock.now())

    def fire_processing_time(self, now: float, *, final: bool = False) -> int:
        """Fire every processing-time timer ``<= now``; returns how many fired.

        Normally called by the armed clock callback; public so that a drain can
        fire timers at once. ``final``: the end of input, only the timers
        registered before this call fire (module docstring).
        """
        fired = 0
        heap = self._processing
        ctx = self._key_context
        name_group = ctx is not None and ctx.requires_assigned_groups
        trigger = self._triggerable.on_processing_time
        mark = heap.mark() if final else None
        while not self._closed:
            due = heap.poll_due(now, mark)
            if due is None:
                break
            timer, group = due
            if ctx is not None:
                if name_group:
                    ctx.assign_key_group(timer.key, group)
                ctx.set_current_key(timer.key)
            trigger(timer)
            fired += 1
        nxt = heap.peek_timestamp()
        if nxt is not None and nxt < self._armed_at:
            self._arm(nxt)
        return fired

    def advance_watermark(self, watermark: float) -> int:
        """Set the watermark and fire every event-time timer ``<= watermark``, in order.

        +inf is the end of input: only the timers registered before it fire.
        """
        if watermark > self._watermark:
            self._watermark = watermark
        fired = 0
        ctx = self._key_context
        name_group = ctx is not None and ctx.requires_assigned_groups
        trigger = self._triggerable.on_event_time
        mark = self._event.mark() if watermark == math.inf else None
        while not self._closed:
            due = self._event.poll_due(watermark, mark)
            if due is None:
                break
            timer, group = due
            if ctx is not None:
                if name_group:
                    ctx.assign_key_group(timer.key, group)
                ctx.set_current_key(timer.key)
            trigger(timer)
            fired += 1
        return fired

    def pop_processing_time_timers(
        self, predicate: Callable[[Timer], bool] | None = None
    ) -> list[Timer]:
        """Remove (without firing) and return the processing-time timers matching ``predicate``."""
        taken = [t for t in self._processing if predicate is None or predicate(t)]
        for t in taken:
            self._processing.remove(t.key, t.namespace, t.timestamp)
        return taken

    # -- snapshot --------------------------------------------------------------------
    def snapshot(self, key_groups: Iterable[int] | None = None) -> TimerSnapshot:
        """Live timers by key group: ``{kg: [(domain, key, namespace, timestamp), ...]}``
        (of every key group, or of ``key_groups``)."""
        heaps = ((PROCESSING_TIME, self._processing), (EVENT_TIME, self._event))
        out: TimerSnapshot = {}
        if self._key_context is None:  # no index by key group: hash each key
            maxp = self._max_parallelism
            for domain, heap in heaps:
                for t in heap:
                    kg = assign_to_key_group(t.key, maxp)
                    out.setdefault(kg, []).append((domain, t.key, t.namespace, t.timestamp))
            return out if key_groups is None else {g: out[g] for g in key_groups if g in out}
        if key_groups is None:
            key_groups = sorted({g for _, heap in heaps for g in heap.groups()})
        for kg in key_groups:
            timers = [
                (d, t.key, t.namespace, t.timestamp) for d, h in heaps for t in h.of_group(kg)
            ]
            if timers:
                out[kg] = timers
        return out

    def snapshot_keys(self, keys: Mapping[int, Iterable[Any]]) -> TimerSnapshot:
        """The live timers of some keys: ``keys`` is ``{kg: [key, ...]}``; the result is
        shaped as :meth:`snapshot`'s (key groups whose keys have no timer left out)."""
        heaps = ((PROCESSING_TIME, self._processing), (EVENT_TIME, self._event))
        out: TimerSnapshot = {}
        for kg, of in keys.items():
            of = list(of)
            timers = [
                (d, t.key, t.namespace, t.timestamp) for d, h in heaps for t in h.of_keys(kg, of)
            ]
            if timers:
                out[kg] = timers
        return out

    def remove_keys(self, key_group: int, keys: Iterable[Any]) -> None:
        """Drop every timer of ``keys`` (filed under ``key_group``), without firing them."""
        keys = list(keys)
        self._processing.remove_keys(key_group, keys)
        self._event.remove_keys(key_group, keys)

    def clear_key_group(self, key_group: int) -> None:
        """Drop every timer filed under ``key_group``, without firing them."""
        for heap in (self._processing, self._event):
            heap.remove_keys(key_group, [t.key for t in heap.of_group(key_group)])

    def take_timers(self, other: InternalTimerService) -> None:
        """Adopt the timers and watermark of ``other`` (same key-group range), which
        must not be used afterwards: a new operator takes over a warm one's timers."""
        self._processing, other._processing = other._processing, TimerHeap()
        self._event, other._event = other._event, TimerHeap()
        self._watermark = max(self._watermark, other._watermark)
        nxt = self._processing.peek_timestamp()
        if nxt is not None and nxt < self._armed_at:
            self._arm(nxt)

    def restore(self, snapshot: Mapping[int, Iterable[tuple[str, Any, Hashable, float]]]) -> int:
        """Take the timers of the key groups inside this service's range; returns how many.

        May be called several times (once per old operator instance on rescale).
        """
        n = 0
        ctx = self._key_context
        for kg, timers in snapshot.items():
            if kg not in self._key_group_range:
                continue
            for domain, key, namespace, ts in timers:
                if ctx is not None:
                    ctx.assign_key_group(key, kg)
                if domain == PROCESSING_TIME:
                    self.register_processing_time_timer(namespace, ts, key)
                elif domain == EVENT_TIME:
                    self.register_event_time_timer(namespace, ts, key)
                else:
                    raise ValueError(
                        f"timer snapshot of service {self.name!r}, key group {kg}: "
                        f"unknown time domain {domain!r}"
                    )
                n += 1
        return n

    def close(self) -> None:
        """Cancel the scheduled callback; no timer fires after this."""
        self._closed = True
        if self._armed is not None:
            self._armed.cancel()
            self._armed = None

    def __repr__(self) -> str:
        return (
            f"InternalTimerService({self.name!r}, processing={len(self._processing)}, "
            f"event={len(self._event)}, watermark={self._watermark!r})"
        )
