"""Run as its own process by test_connect.py: the Spark API through Spark Connect."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait


async def double(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{"d": row["id"] * 2}]


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    df = spark.range(0, 1000, numPartitions=2)
    ordered = [r.id for r in ordered_wait(df, double, timeout=5, output_schema="d long").collect()]
    keyed = unordered_wait(
        df.withColumn("k", df.id % 10), double, timeout=5, output_schema="d long", key="k",
        num_partitions=3,
    ).collect()  # fmt: skip
    try:
        AsyncMetrics(spark)
        metrics_error = None
    except ConfigurationError as exc:
        metrics_error = str(exc)
    print("RESULT " + json.dumps({
        "session": type(spark).__module__,
        "ordered_in_order": ordered == list(range(1000)),
        "keyed_ids": sorted(r.id for r in keyed) == list(range(1000)),
        "keyed_values": all(r.d == 2 * r.id for r in keyed),
        "metrics_error": metrics_error,
    }), flush=True)  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
