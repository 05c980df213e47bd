"""Timeout slots: the async operator's element timeouts, one timer per slot of time.

Call order::

    slots = TimeoutSlots(timeout, on_timeout, clock=clock)
    slots.arm(element)        when an element's first attempt starts (its deadline set)
    slots.release(element)    when it completes (or fails) before its deadline
    slots.close()             no timer fires afterwards

Semantics: deadlines are rounded up to the granularity (10 ms, or 1% of the
timeout if smaller), so a timeout fires at most one slot late and never
early. The elements whose deadlines fall in one slot share one timer of the
``"async-timeouts"`` :class:`InternalTimerService`, not one per element; when
it fires, ``on_timeout(element)`` is called for each element of the slot not
yet released. A slot whose last element is released forgets its elements (a
finished row is not referenced until its deadline) and deletes its timer,
except the newest slot, which stays registered while empty: elements that
complete at once would otherwise create and delete the timer of the same slot
for every element. Memory stays bounded: every slot but the newest holds an
element in flight. An element with an infinite deadline has no slot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, Protocol

from .._clock import Scheduler
from .._timers import InternalTimerService, Timer

__all__ = ["TIMEOUT_GRANULARITY", "Slot", "TimedElement", "TimeoutSlots"]

TIMEOUT_GRANULARITY: Final = 0.01
"""Seconds: timeouts fire at most this late (or 1% of the timeout, if smaller)."""


class Slot:
    """The elements whose deadlines fall in one slot, and how many are still live."""

    __slots__ = ("elements", "live", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.elements: list[Any] = []
        self.live = 0


class TimedElement(Protocol):
    """What a slot needs of an element: its absolute deadline and its slot (or None)."""

    deadline: float
    bucket: Slot | None


class TimeoutSlots:
    """The timeouts of one operator instance (see the module docstring)."""

    __slots__ = ("_newest", "_on_timeout", "_service", "granularity", "slots")

    def __init__(
        self,
        timeout: float,
        on_timeout: Callable[[Any], object],
        *,
        clock: Scheduler | None = None,
    ) -> None:
        self.granularity = min(TIMEOUT_GRANULARITY, timeout / 100)
        self.slots: dict[int, Slot] = {}
        self._newest: Slot | None = None  # kept while empty
        self._on_timeout = on_timeout
        self._service = InternalTimerService("async-timeouts", self, clock=clock)

    def arm(self, element: TimedElement) -> None:
        """Time ``element`` out at its deadline unless it is released first."""
        if element.deadline == math.inf:
            return  # timeout=inf: no deadline
        granularity = self.granularity
        number = math.ceil(element.deadline / granularity - 1e-9)
        slot = self.slots.get(number)
        if slot is None:
            slot = self.slots[number] = Slot(number)
            self._service.register_processing_time_timer(number, number * granularity, None)
            newest = self._newest
            if newest is None or number > newest.number:
                self._newest = slot
                if newest is not None and not newest.live:  # no longer kept while empty
                    self._drop(newest)
        slot.elements.append(element)
        slot.live += 1
        element.bucket = slot

    def release(self, element: TimedElement) -> None:
        """``element`` is done: it no longer times out."""
        slot = element.bucket
        if slot is None:
            return
        element.bucket = None
        slot.live -= 1
        if not slot.live:
            slot.elements.clear()
            if slot is not self._newest:
                self._drop(slot)

    def close(self) -> None:
        self._service.close()

    def _drop(self, slot: Slot) -> None:
        if self.slots.pop(slot.number, None) is not None:
            self._service.delete_processing_time_timer(
                slot.number, slot.number * self.granularity, None
            )

    # -- Triggerable of the timer service ----------------------------------------------
    def on_processing_time(self, timer: Timer) -> None:
        slot = self.slots.pop(timer.namespace, None)  # type: ignore[call-overload]
        if slot is None:
            return
        if slot is self._newest:
            self._newest = None
        for element in slot.elements:
            if element.bucket is slot:
                element.bucket = None
                self._on_timeout(element)

    def on_event_time(self, timer: Timer) -> None:  # pragma: no cover - never registered
        raise AssertionError("async-timeouts has no event-time timers")
