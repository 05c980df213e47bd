"""Counters of one partition run, merged across tasks on the driver.

Every count is of rows, on the per-row path and on the chunk and columnar
paths alike (a chunk that times out counts its rows as timed out); ``chunks``
is the number of chunks the rows travelled in (0 on the per-row path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .._engine._statistics import LatencyHistogram


@dataclass
class RunMetrics:
    """Counters of one or more partitions; merged across tasks on the driver."""

    partitions: int = 0
    received: int = 0
    chunks: int = 0
    emitted: int = 0
    completed: int = 0
    timed_out: int = 0
    retried: int = 0
    failed: int = 0
    error_rows: int = 0
    # rows answered with no result and left out of the output (on_empty="drop")
    dropped: int = 0
    late: int = 0
    dropped_late: int = 0
    restored: int = 0
    replayed: int = 0
    carried_over: int = 0
    max_in_flight: int = 0
    max_worker_rss_mb: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    cache_expirations: int = 0
    # a model's bill (asyncio_ops.SupportsTokenUsage)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    # a rate limit's toll (asyncio_ops.SupportsRateLimitUsage)
    rate_limit_permits: int = 0
    rate_limit_tokens: int = 0
    rate_limit_wait_seconds: float = 0.0
    # a connector's own retries inside an attempt, its 429/503 answers and the seconds
    # it waited before sending again (asyncio_ops.SupportsServiceRetries)
    connector_retried: int = 0
    throttled: int = 0
    throttle_wait_seconds: float = 0.0
    # rows a connector answered without a request: a request field was NULL
    # (asyncio_ops.SupportsNullKeyCount)
    skipped_null_keys: int = 0
    seconds: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    # capacity="auto": each partition's limit when it ended, the lowest and highest any
    # partition's limit had, and the cuts (timeouts, 429/503, a rising error share)
    capacity_limits: list[int] = field(default_factory=list)
    capacity_low: int | None = None
    capacity_high: int | None = None
    capacity_cuts: int = 0

    def merge(self, other: RunMetrics) -> RunMetrics:
        for name in (
            "partitions", "received", "chunks", "emitted", "completed", "timed_out", "retried",
            "failed", "error_rows", "dropped", "late", "dropped_late", "restored", "replayed",
            "carried_over", "seconds", "cache_hits", "cache_misses", "cache_evictions",
            "cache_expirations", "prompt_tokens", "completion_tokens", "cost",
            "rate_limit_permits", "rate_limit_tokens", "rate_limit_wait_seconds",
            "connector_retried", "throttled", "throttle_wait_seconds", "skipped_null_keys",
            "capacity_cuts",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_in_flight = max(self.max_in_flight, other.max_in_flight)
        self.max_worker_rss_mb = max(self.max_worker_rss_mb, other.max_worker_rss_mb)
        self.latency.merge(other.latency)
        self.capacity_limits = self.capacity_limits + other.capacity_limits
        lows = [v for v in (self.capacity_low, other.capacity_low) if v is not None]
        highs = [v for v in (self.capacity_high, other.capacity_high) if v is not None]
        self.capacity_low = min(lows, default=None)
        self.capacity_high = max(highs, default=None)
        return self

    def summary(self) -> dict[str, Any]:
        """Plain numbers, for logs and for users."""
        p50, p99 = self.latency.quantile(0.5), self.latency.quantile(0.99)
        return {
            "partitions": self.partitions,
            "received": self.received,
            "chunks": self.chunks,
            "emitted": self.emitted,
            "completed": self.completed,
            "timed_out": self.timed_out,
            "retried": self.retried,
            "failed": self.failed,
            "error_rows": self.error_rows,
            "dropped": self.dropped,
            "late": self.late,
            "dropped_late": self.dropped_late,
            "restored": self.restored,
            "replayed": self.replayed,
            "carried_over": self.carried_over,
            "max_in_flight": self.max_in_flight,
            "max_worker_rss_mb": round(self.max_worker_rss_mb, 1),
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_evictions": self.cache_evictions,
            "cache_expirations": self.cache_expirations,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": round(self.cost, 6),
            "rate_limit_permits": self.rate_limit_permits,
            "rate_limit_tokens": self.rate_limit_tokens,
            "rate_limit_wait_seconds": round(self.rate_limit_wait_seconds, 3),
            "connector_retried": self.connector_retried,
            "throttled": self.throttled,
            "throttle_wait_seconds": round(self.throttle_wait_seconds, 3),
            "skipped_null_keys": self.skipped_null_keys,
            "latency_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "latency_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "capacity_limits": sorted(self.capacity_limits),
            "capacity_range": None
            if self.capacity_low is None
            else [self.capacity_low, self.capacity_high],
            "capacity_cuts": self.capacity_cuts,
        }


class MetricsSink(Protocol):
    """Where the driver sums the runs' metrics (the Spark layer's ``AsyncMetrics``)."""

    def _add(self, metrics: RunMetrics) -> None: ...
