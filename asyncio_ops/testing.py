"""Public helpers for testing code built on asyncio_ops.

:class:`ManualClock` is a clock and scheduler whose time moves only through
:meth:`ManualClock.advance`; callbacks due by then run inside ``advance``, in
time order (ties in registration order). Use it for timers, timeouts, retries
and TTL without sleeping.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

__all__ = ["ManualClock"]


class _Scheduled:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for tests: ``now()`` is what you set, ``advance()`` fires what is due."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._heap: list[tuple[float, int, _Scheduled]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _Scheduled:
        handle = _Scheduled(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), handle))
        return handle

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0), running every callback due.

        A callback that schedules another one due within the same advance has
        it run too, at its own time.
        """
        if seconds < 0:
            raise ValueError(f"ManualClock.advance: seconds must be >= 0, got {seconds!r}")
        target = self._now + seconds
        while self._heap and self._heap[0][0] <= target:
            when, _, handle = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            self._now = max(self._now, when)
            handle.callback()
        self._now = target

    def set(self, now: float) -> None:
        """Jump to ``now`` (never backwards), firing what is due."""
        self.advance(max(0.0, now - self._now))

    @property
    def pending(self) -> int:
        """Callbacks scheduled and not cancelled (for assertions)."""
        return sum(1 for _, _, h in self._heap if not h.cancelled)

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now!r})"
