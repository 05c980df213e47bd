"""Enrich orders generated in Spark from an HTTP API, in completion order.

    python examples/enrich_http.py                       # starts the customer service itself
    python examples/enrich_http.py --url http://127.0.0.1:8080   # docker compose's service

Without ``--url`` the customer service (``examples/services/customers.py``) is
started in this process on a free 127.0.0.1 port, answering after
``--latency-ms``. Each partition keeps up to ``--capacity`` requests in flight
through ``HttpLookup``: one per row (``GET /customers/{customer_id}``), or with
``--batch`` one per chunk of 100 rows to the batch endpoint
(``GET /customers?ids=...``; the columnar path, the default for a lookup with a
batch endpoint). ``unordered_wait`` emits each row as soon as its answer arrives.

Prints a sample, the row count, the operator's metrics and rows/s; ``--json``
adds one ``RESULT {...}`` line for programs. Orders whose customer does not
exist (404) are kept with NULL customer columns, as a left join (counted as
``missing``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncio_ops.connectors import is_retryable
from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import functions as F

from asyncio_ops import AsyncRetryStrategy
from asyncio_ops.spark import AsyncMetrics, unordered_wait
from examples._common import add_batch_options, orders, report, spark_session, stop_session, timed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="base URL of the customer service (default: start one here)")
    add_batch_options(
        p, orders=20_000, capacity=200, capacity_help="requests in flight per partition"
    )
    p.add_argument("--latency-ms", type=float, default=20.0, help="latency of the local service")
    p.add_argument("--batch", action="store_true", help="use the batch endpoint (?ids=...)")
    return p.parse_args(argv)


def lookup(base: str, capacity: int, batch: bool) -> HttpLookup:
    if batch:
        return HttpLookup(
            f"{base}/customers",
            result_path="items",
            batch=HttpBatch(key="customer_id", result_key="id", param="ids", max_size=100),
            max_connections=capacity,
            timeout=10.0,
        )
    return HttpLookup(f"{base}/customers/{{customer_id}}", max_connections=capacity, timeout=10.0)


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    service = None
    base = (args.url or "").rstrip("/")
    if not base:
        service = ServiceThread(customers=args.customers, latency=args.latency_ms / 1000)
        base = service.start()
        print(f"customer service at {base} (latency {args.latency_ms} ms)")

    spark = spark_session(args.master, "enrich_http", args.partitions)
    partitions = args.partitions or spark.sparkContext.defaultParallelism
    metrics = AsyncMetrics(spark)
    enriched = unordered_wait(
        orders(spark, args.orders, args.customers, partitions),
        lookup(base, args.capacity, args.batch),
        timeout=30.0,
        capacity=args.capacity,
        # The service answers with the customer's own id too: kept, and checked below.
        output_schema="id bigint, name string, tier string, country string",
        retry=AsyncRetryStrategy.exponential_backoff(
            3, 50, 2000, 2.0, exception_predicate=is_retryable
        ),
        metrics=metrics,
    ).persist()

    with timed() as elapsed:
        rows = enriched.count()  # runs the requests once; the rest reads the cache
    mismatches = enriched.where(
        (F.col("id") != F.col("customer_id"))
        | (F.col("name") != F.concat(F.lit("customer-"), F.col("customer_id").cast("string")))
    ).count()
    sample = [r.asDict() for r in enriched.orderBy("order_id").limit(args.sample).collect()]
    seconds = elapsed[0]
    result: dict[str, object] = {
        "url": base,
        "local_service": service is not None,
        "batch": args.batch,
        "partitions": partitions,
        "input_rows": args.orders,
        "rows": rows,
        # a connector keeps the rows it cannot enrich (on_empty="drop" would drop them)
        "missing": enriched.where(F.col("name").isNull()).count(),
        "mismatches": mismatches,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds) if seconds > 0 else None,
        "sample": sample,
        "metrics": metrics.summary(),
    }
    report(result, as_json=args.json)
    enriched.unpersist()
    stop_session(spark)
    if service is not None:
        service.stop()
    return result


if __name__ == "__main__":
    main()
