"""Run as its own process by test_connect.py: the Spark API through Spark Connect."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError, OutputSchemaError
from asyncio_ops.spark import AsyncMetrics, library_errors, ordered_wait, register, unordered_wait


async def double(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{"d": row["id"] * 2}]


async def double_or_fail(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Doubles; fails for multiples of 7; nothing for multiples of 5; two results for 999."""
    await asyncio.sleep(0.001)
    if row["id"] % 7 == 0:
        raise ValueError(f"no double for {row['id']}")
    if row["id"] == 999:
        return [{"d": 1}, {"d": 2}]
    return [] if row["id"] % 5 == 0 else [{"d": row["id"] * 2}]


def sql_functions(spark: SparkSession) -> dict[str, Any]:
    """The SQL function registered and called over Spark Connect: values, NULLs, error
    structs, and a failure raised as the library's exception (library_errors)."""
    register(spark, "connect_double", double_or_fail, timeout=5, input_schema="id long",
             output_schema="d long", on_error="error_column", capacity=16)  # fmt: skip
    rows = spark.sql(
        "SELECT id, connect_double(id) AS r FROM range(0, 998, 1, 2) ORDER BY id"
    ).collect()
    values_ok = all(
        (r.r.error is not None and r.r.result is None and r.r.error.exception == "ValueError")
        if r.id % 7 == 0 else
        (r.r.error is None and (r.r.result is None if r.id % 5 == 0 else r.r.result.d == 2 * r.id))
        for r in rows
    )  # fmt: skip
    register(spark, "connect_strict", double_or_fail, timeout=5, input_schema="id long",
             output_schema="d long")  # fmt: skip
    try:
        with library_errors():
            spark.sql("SELECT connect_strict(id) FROM range(995, 1000) WHERE id <> 997").collect()
        raised = None
    except OutputSchemaError as exc:
        raised = str(exc)
    return {"sql_rows": len(rows), "sql_values": values_ok, "sql_error": raised}


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
        **sql_functions(spark),
    }), flush=True)  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
