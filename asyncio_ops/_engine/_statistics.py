"""Counters and latencies of an operator instance."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class OperatorStatistics:
    """Counters of one operator instance (latencies in seconds, first invoke to completion).

    With the operator's ``weight`` (the Spark runtime's chunks) the counters
    count rows, ``elements`` the elements received (chunks); without, one
    element is one row and ``elements == received``.

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncWaitOperator, Record
    >>> async def main():
    ...     async def lookup(value):
    ...         return [value]
    ...     op = AsyncWaitOperator(lookup, output=lambda element: None, timeout=1.0)
    ...     await op.open()
    ...     await op.process_elements([Record(1), Record(2)])
    ...     await op.end_input()
    ...     await op.close()
    ...     return op.statistics()
    >>> stats = asyncio.run(main())
    >>> stats.received, stats.emitted, stats.timed_out
    (2, 2, 0)
    """

    received: int
    emitted: int
    in_flight: int
    completed: int
    timed_out: int
    retried: int
    failed: int
    restored: int
    latency_p50: float | None
    latency_p99: float | None
    latency_max: float | None
    elements: int = 0


class LatencyHistogram:
    """Log-bucketed latencies (5% wide buckets): cheap to add, quantiles within 5%."""

    __slots__ = ("_buckets", "count", "instant", "max")
    _BASE: Final = math.log(1.05)
    _FLOOR: Final = 1e-6

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.max = 0.0
        self.instant = 0  # completed without suspending: latency 0, counted apart (hot path)

    def add(self, seconds: float, weight: int = 1) -> None:
        b = int(math.log(max(seconds, self._FLOOR) / self._FLOOR) / self._BASE)
        self._buckets[b] = self._buckets.get(b, 0) + weight
        self.count += weight
        if seconds > self.max:
            self.max = seconds

    def merge(self, other: LatencyHistogram) -> None:
        for b, n in other._buckets.items():
            self._buckets[b] = self._buckets.get(b, 0) + n
        self.count += other.count
        self.instant += other.instant
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        total_count = self.count + self.instant
        if not total_count:
            return None
        rank = q * total_count
        if rank <= self.instant:
            return 0.0
        keys = sorted(self._buckets)
        cumulative = []
        total = self.instant
        for k in keys:
            total += self._buckets[k]
            cumulative.append(total)
        i = bisect.bisect_left(cumulative, rank)
        bucket = keys[min(i, len(keys) - 1)]
        return min(self._FLOOR * math.exp((bucket + 0.5) * self._BASE), self.max)
