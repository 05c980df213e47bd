"""Benchmark: one streaming job, keyed state in `keyed_process` and in Spark's transformWithState.

Run: ``python -m bench.keyed_spark`` (``--events N --keys K --batches B``; the
defaults are 1,000,000 events over 100,000 keys in 10 micro-batches).

The job: a running count per key with a 10-minute processing-time TTL, one
output row per event (the key and its count so far). The events are written
once as ``--batches`` Parquet files; each side reads them as a stream, one
file per micro-batch (``maxFilesPerTrigger=1``, ``availableNow``), into
Spark's ``noop`` sink, on the same session (``local[2]``, 2 shuffle
partitions, the RocksDB state store that transformWithState requires).
Printed: each side's wall time from the start of the query to the end of the
micro-batch that brings the last event's row (transformWithState's
processing-time mode, which its TTL requires, keeps running empty batches for
its timers after the input, so the query is stopped there),
events per second, and the ratio; the output row counts are checked equal to
the events.

- ``keyed_process``: a :class:`KeyedProcessFunction` with a ValueState with
  TTL, heap backend, state under a temporary ``checkpoint_location``.
- transformWithState: a ``StatefulProcessor`` whose ``handleInputRows`` reads
  the key's ValueState (TTL 10 minutes) once per batch and yields a row per
  event.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StructField, StructType

from asyncio_ops.spark import keyed_process, session
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL_SECONDS = 600


class CountWithTtl(KeyedProcessFunction[int, dict[str, Any], dict[str, Any]]):
    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        descriptor = ValueStateDescriptor[int]("count", ttl=StateTtlConfig(TTL_SECONDS))
        self.count = runtime_context.get_state(descriptor)

    def process_element(
        self, value: dict[str, Any], ctx: KeyedProcessContext, out: Collector[dict[str, Any]]
    ) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        out.collect({"key": value["key"], "n": n})


class SparkCountWithTtl(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        schema = StructType([StructField("n", LongType(), True)])
        self.count = handle.getValueState("count", schema, TTL_SECONDS * 1000)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:
        n = self.count.get()[0] if self.count.exists() else 0
        (k,) = key
        for _ in rows:
            n += 1
            yield Row(key=k, n=n)
        self.count.update((n,))

    def close(self) -> None:
        pass


def write_events(spark: SparkSession, root: Path, events: int, keys: int, batches: int) -> Path:
    src = root / "events"
    per = events // batches
    for b in range(batches):
        df = spark.range(b * per, (b + 1) * per, numPartitions=1).select(
            ((F.col("id") * 7919) % keys).alias("key"), F.col("id").alias("event")
        )
        df.write.parquet(str(src / f"part-{b:04d}"))
    flat = root / "stream"
    flat.mkdir()
    for b in range(batches):
        (file,) = list((src / f"part-{b:04d}").glob("*.parquet"))
        target = flat / f"events-{b:04d}.parquet"
        shutil.move(str(file), target)
        stamp = 1_700_000_000 + b * 10  # Spark takes files in modification-time order
        os.utime(target, (stamp, stamp))
    return flat


def run(
    spark: SparkSession, side: str, src: Path, root: Path, events: int, timeout: float
) -> tuple[float, int]:
    stream = (
        spark.readStream.schema("key long, event long").option("maxFilesPerTrigger", 1)
        .parquet(str(src))
    )  # fmt: skip
    if side == "keyed_process":
        out = keyed_process(
            stream, CountWithTtl(), key="key", output_schema="key long, n long",
            checkpoint_location=str(root / "kp-state"), num_partitions=2,
        )  # fmt: skip
    else:
        out = stream.groupBy("key").transformWithState(
            SparkCountWithTtl(), "key long, n long", "Append", "ProcessingTime"
        )
    counted = [0]  # foreachBatch runs on the driver

    def count(batch: Any, batch_id: int) -> None:
        counted[0] += batch.count()

    started = time.perf_counter()
    query = (
        out.writeStream.foreachBatch(count)
        .option("checkpointLocation", str(root / f"{side}-spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    # Timed to the batch that brings the last event's row: in processing-time mode,
    # transformWithState keeps running empty batches (for its timers) after the input.
    deadline = started + timeout
    while counted[0] < events and query.exception() is None and query.isActive:
        if time.perf_counter() > deadline:
            query.stop()
            raise SystemExit(f"{side}: {counted[0]:,} of {events:,} rows after {timeout} s")
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    error = query.exception()
    query.stop()
    if error is not None:
        raise SystemExit(f"{side}: {error}")
    return elapsed, counted[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per side")
    args = p.parse_args()
    spark = session(
        args.master,
        app_name="bench.keyed_spark",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            ),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="bench_keyed_spark_"))
    try:
        src = write_events(spark, root, args.events, args.keys, args.batches)
        events = args.events // args.batches * args.batches
        print(
            f"{events:,} events over {args.keys:,} keys in {args.batches} micro-batches, "
            f"{args.master}, 2 partitions, python {sys.version.split()[0]}"
        )
        results = {}
        for side in ("keyed_process", "transformWithState"):
            elapsed, rows = run(spark, side, src, root, events, args.timeout)
            assert rows == events, (side, rows, events)
            results[side] = elapsed
            print(f"{side:<20} {elapsed:8.1f} s  {events / elapsed:12,.0f} events/s")
        ratio = results["transformWithState"] / results["keyed_process"]
        print(f"keyed_process / transformWithState throughput: {ratio:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
