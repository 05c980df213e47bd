"""Clocks: where processing time comes from, and how to be woken at a time.

A clock is anything with ``now() -> float`` (seconds). The timer service also
needs to be called back at a given time; a :class:`Scheduler` adds
``call_at(when, callback)``. :class:`SystemClock` reads wall-clock time and
schedules on the running asyncio loop; ``asyncio_ops.testing.ManualClock``
moves only when told to, so timer, timeout, retry and TTL tests take
milliseconds of wall time.

Wall-clock (``time.time``) rather than monotonic time is used because
timestamps outlive the process: TTL timestamps and timers are restored in
another worker from a snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Processing time in seconds."""

    def now(self) -> float: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@runtime_checkable
class Scheduler(Clock, Protocol):
    """A clock that can call back at a point of its own time."""

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class SystemClock:
    """Wall-clock time; callbacks scheduled on the running event loop."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.time()), callback)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
