"""Structured Streaming: enrich an event-time stream with watermark-bounded unordered lookups.

    python examples/streaming_watermark.py

A ``rate-micro-batch`` source produces ``--rows-per-batch`` orders per
micro-batch (deterministic: the same offsets always give the same rows), each
with an event time up to 9 s out of order. ``unordered_wait(...,
event_time="event_time", watermark_delay=--watermark-delay)`` looks each
order's customer up over HTTP (the customer service is started here unless
``--url`` is given) and emits rows in completion order, but never across a
watermark; rows behind the watermark are kept and flagged in ``_late``.

The query writes Parquet with a Spark ``checkpointLocation``; it is stopped
after ``--batches`` micro-batches and started again from the same checkpoint
(``--restarts`` times), continuing where it stopped (a batch interrupted by
a stop would be re-run from its recorded offsets, and written once). At the end the output is
read back and checked: every order exactly once (no loss across the restart,
no duplicate from the re-run batch), each row enriched with its own customer.
Output and checkpoint go to ``--output`` (default: a temporary directory,
deleted at the end).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncio_ops.connectors import is_retryable
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from asyncio_ops import AsyncRetryStrategy
from asyncio_ops.spark import AsyncMetrics, unordered_wait
from examples._common import report, spark_session, stop_session


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="base URL of the customer service (default: start one here)")
    p.add_argument("--rows-per-batch", type=int, default=500)
    p.add_argument("--batches", type=int, default=3, help="micro-batches per run")
    p.add_argument("--restarts", type=int, default=1, help="restarts from the checkpoint")
    p.add_argument("--customers", type=int, default=100_000)
    p.add_argument("--latency-ms", type=float, default=5.0, help="latency of the local service")
    p.add_argument("--watermark-delay", type=float, default=5.0, help="seconds")
    p.add_argument("--trigger", default="1 second", help="processing-time trigger")
    p.add_argument("--max-seconds", type=float, default=120.0, help="bound on each run")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--output", help="output + checkpoint directory (default: temporary)")
    p.add_argument("--sample", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one RESULT {...} line")
    return p.parse_args(argv)


def source(spark: SparkSession, rows_per_batch: int, customers: int) -> DataFrame:
    """Orders with an event time 0-9 s behind the source's timestamp (out of order)."""
    rate = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .option("startTimestamp", 1_700_000_000_000)
        .option("advanceMillisPerBatch", 1000)
        .load()
    )
    return rate.select(
        F.col("value").alias("order_id"),
        ((F.col("value") * 7919) % customers + 1).alias("customer_id"),
        F.timestamp_seconds(F.unix_timestamp("timestamp") - (F.col("value") * 7919 % 10)).alias(
            "event_time"
        ),
    )


def run_once(
    df: DataFrame, data: Path, checkpoint: Path, args: argparse.Namespace, run: int
) -> list[int]:
    """Start the query, let it complete ``--batches`` non-empty micro-batches, stop it.

    Returns the ids of the batches that completed in this run.
    """
    query: StreamingQuery = (
        df.writeStream.format("parquet")
        .option("path", str(data))
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(processingTime=args.trigger)
        .queryName(f"enrich_stream_run{run}")
        .start()
    )
    deadline = time.monotonic() + args.max_seconds
    done: list[int] = []
    stop_by = None
    try:
        while True:
            if query.exception() is not None:
                raise SystemExit(f"the streaming query failed: {query.exception()}")
            done = [p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0]
            now = time.monotonic()
            if len(done) >= args.batches:
                # Stop between triggers if one comes within 10 s: stopping a
                # running batch is safe (it is re-run from its recorded offsets
                # after the restart and the file sink writes it once) but makes
                # Spark log the interruption.
                stop_by = stop_by or now + 10
                if not query.status["isTriggerActive"] or now > stop_by:
                    break
            elif now > deadline:
                raise SystemExit(
                    f"run {run}: only {len(done)} of {args.batches} batches within "
                    f"{args.max_seconds} s"
                )
            time.sleep(0.02)
    finally:
        query.stop()
    print(f"run {run}: completed micro-batches {done}, stopped")
    return done


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    keep = args.output is not None
    root = Path(args.output or tempfile.mkdtemp(prefix="asyncio_ops_stream_"))
    data, checkpoint = root / "data", root / "checkpoint"
    service = None
    base = (args.url or "").rstrip("/")
    if not base:
        service = ServiceThread(customers=args.customers, latency=args.latency_ms / 1000)
        base = service.start()
        print(f"customer service at {base} (latency {args.latency_ms} ms)")

    spark = spark_session(args.master, "streaming_watermark", 2)
    metrics = AsyncMetrics(spark)
    enriched = unordered_wait(
        source(spark, args.rows_per_batch, args.customers),
        HttpLookup(f"{base}/customers/{{customer_id}}", max_connections=100, timeout=10.0),
        timeout=30.0,
        capacity=100,
        output_schema="id bigint, name string, tier string, country string",
        event_time="event_time",
        watermark_delay=args.watermark_delay,
        watermark_interval=50,
        retry=AsyncRetryStrategy.exponential_backoff(
            3, 50, 2000, 2.0, exception_predicate=is_retryable
        ),
        metrics=metrics,
    )

    runs = [run_once(enriched, data, checkpoint, args, run) for run in range(args.restarts + 1)]

    out = spark.read.parquet(str(data))
    stats = out.agg(
        F.count("*").alias("rows"),
        F.countDistinct("order_id").alias("distinct"),
        F.min("order_id").alias("min_id"),
        F.max("order_id").alias("max_id"),
        F.sum(F.col("_late").cast("int")).alias("late"),
        F.sum(((F.col("id") != F.col("customer_id")) | F.col("name").isNull()).cast("int")).alias(
            "mismatches"
        ),
    ).first()
    assert stats is not None
    rows = int(stats["rows"])
    sample = [r.asDict() for r in out.orderBy("order_id").limit(args.sample).collect()]
    result: dict[str, object] = {
        "runs": runs,
        "rows": rows,
        "distinct_orders": int(stats["distinct"]),
        "duplicates": rows - int(stats["distinct"]),
        # Orders form the range 0..max: a gap would be a lost order.
        "lost": (int(stats["max_id"]) + 1 - int(stats["distinct"])) if rows else 0,
        "min_order_id": stats["min_id"],
        "late_rows": int(stats["late"] or 0),
        "mismatches": int(stats["mismatches"] or 0),
        "sample": sample,
        "metrics": metrics.summary(),
        "output": str(root) if keep else None,
    }
    report(result, as_json=args.json)
    print(
        f"\n{rows} orders written once each over {len(runs)} runs "
        f"(duplicates: {result['duplicates']}, lost: {result['lost']}, "
        f"late: {result['late_rows']})"
    )
    stop_session(spark)
    if service is not None:
        service.stop()
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
