"""Soak run: many rows through ``unordered_wait`` against the local HTTP service.

    python -m bench.soak                      # 20M rows, bounded by --minutes (10)
    python -m bench.soak --rows 2000000 --minutes 3

Not part of CI. Starts ``examples/services/customers.py`` on 127.0.0.1 (5 ms
latency), then runs chunks of ``--chunk`` rows on ``local[2]`` through
``unordered_wait`` + ``HttpLookup`` with the service's batch endpoint, where
``--fail`` (5%) of lookups raise a transient error first and are retried by the
operator. After each chunk it checks, in Spark, that every row came out exactly
once with the right answer, and prints rows/s, retries and the peak RSS of the
Python workers, so a leak shows as RSS growing from chunk to chunk. It stops at
``--rows`` or when ``--minutes`` have passed, whichever is first, and exits
non-zero if any row was lost, duplicated or wrong.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from pyspark.sql import functions as F

from asyncio_ops import AsyncFunction, AsyncRetryStrategy, RuntimeContext
from asyncio_ops.async_retry_predicates import exception_type_predicate
from asyncio_ops.spark import AsyncMetrics, session, unordered_wait
from bench._service import start_service, stop_service


class InjectedTransientError(ConnectionError):
    """A fault the soak injects; retried by the operator."""


class Flaky(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Delegates to ``inner`` after failing a fraction of attempts (seeded per worker)."""

    def __init__(self, inner: HttpLookup, fail: float) -> None:
        self.inner = inner
        self.fail = fail

    async def open(self, runtime_context: RuntimeContext) -> None:  # type: ignore[override]
        self.rng = random.Random(runtime_context.get_index_of_this_subtask())
        await self.inner.open(runtime_context)  # type: ignore[misc]

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if self.rng.random() < self.fail:
            raise InjectedTransientError(f"injected failure for row {row['row_id']}")
        return list(await self.inner.async_invoke(row))

    async def close(self) -> None:  # type: ignore[override]
        await self.inner.close()  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fail", type=float, default=0.05)
    parser.add_argument("--capacity", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--customers", type=int, default=100_000)
    args = parser.parse_args()

    service, base = start_service(latency_ms=args.latency_ms, customers=args.customers)
    spark = session("local[2]", app_name="asyncio_ops-soak")
    spark.sparkContext.setLogLevel("ERROR")
    lookup = HttpLookup(
        f"{base}/customers",
        batch=HttpBatch(key="customer_id", result_key="id", param="ids", max_size=500),
        result_path="items",
        max_connections=32, timeout=10.0,
    )  # fmt: skip
    retry = AsyncRetryStrategy.exponential_backoff(
        10, 1, 200, 2.0, exception_predicate=exception_type_predicate(ConnectionError)
    )
    print(f"service {base}, {args.rows:,} rows in chunks of {args.chunk:,}, "
          f"{args.fail:.0%} injected failures, capacity {args.capacity}")  # fmt: skip
    print(f"{'chunk':>5} {'rows':>12} {'rows/s':>10} {'retried':>9} {'worker RSS MB':>14} check")
    deadline = time.monotonic() + args.minutes * 60
    done, chunk, bad = 0, 0, 0
    started = time.monotonic()
    try:
        while done < args.rows and time.monotonic() < deadline:
            n = min(args.chunk, args.rows - done)
            df = spark.range(done, done + n, numPartitions=2).select(
                F.col("id").alias("row_id"),
                (F.col("id") % args.customers + 1).alias("customer_id"),
            )
            metrics = AsyncMetrics(spark)
            out = unordered_wait(
                df, Flaky(lookup, args.fail), timeout=60, capacity=args.capacity,
                output_schema="id long, name string, tier string, country string",
                retry=retry, metrics=metrics,
            )  # fmt: skip
            t0 = time.monotonic()
            check = out.agg(
                F.count("*").alias("rows"),
                F.countDistinct("row_id").alias("distinct"),
                F.sum(
                    (
                        (F.col("name") != F.concat(F.lit("customer-"), F.col("customer_id")))
                        | (F.col("id") != F.col("customer_id"))
                    ).cast("int")
                ).alias("wrong"),
            ).collect()[0]  # fmt: skip
            elapsed = time.monotonic() - t0
            ok = check.rows == n and check.distinct == n and not check.wrong
            bad += 0 if ok else 1
            s = metrics.summary()
            print(f"{chunk:>5} {done + n:>12,} {n / elapsed:>10,.0f} {s['retried']:>9,} "
                  f"{s['max_worker_rss_mb']:>14,.0f} "
                  f"{'ok' if ok else f'LOST/DUP/WRONG {check}'}", flush=True)  # fmt: skip
            done += n
            chunk += 1
    finally:
        stop_service(service)
        spark.stop()
    total = time.monotonic() - started
    print(
        f"\n{done:,} rows in {total:,.0f} s ({done / total:,.0f} rows/s overall); "
        f"{'no row lost, duplicated or wrong' if not bad else f'{bad} chunk(s) FAILED'}"
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
