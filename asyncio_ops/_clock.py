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
    """Processing time in seconds.

    Example:

    >>> from asyncio_ops import Clock, SystemClock
    >>> from asyncio_ops.testing import ManualClock
    >>> isinstance(SystemClock(), Clock), isinstance(ManualClock(start=5.0), Clock)
    (True, True)
    """

    def now(self) -> float: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@runtime_checkable
class Scheduler(Clock, Protocol):
    """A clock that can call back at a point of its own time.

    Example:

    >>> from asyncio_ops.testing import ManualClock  # a Scheduler for tests
    >>> clock = ManualClock()
    >>> handle = clock.call_at(2.0, lambda: print("due at", clock.now()))
    >>> clock.advance(2.0)
    due at 2.0
    """

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable: ...


class SystemClock:
    """Wall-clock time; callbacks scheduled on the running event loop.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import SystemClock
    >>> async def main():
    ...     clock = SystemClock()
    ...     fired = asyncio.Event()
    ...     clock.call_at(clock.now() + 0.01, fired.set)  # on the running loop
    ...     await fired.wait()
    ...     return fired.is_set()
    >>> asyncio.run(main())
    True
    """

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> Cancellable:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.time()), callback)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
