"""Run as its own process by test_connect.py: the Spark API through Spark Connect."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from typing import Any

from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError, OutputSchemaError
from asyncio_ops.spark import (
    AsyncMetrics,
    library_errors,
    ordered_wait,
    register,
    register_table,
    unordered_wait,
)


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


async def fan_out(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Fails for multiples of 7; nothing for multiples of 5; two results for multiples of 3."""
    await asyncio.sleep(0.001)
    i = row["id"]
    if i % 7 == 0:
        raise ValueError(f"no fan for {i}")
    if i % 5 == 0:
        return []
    return [{"d": 2 * i}, {"d": 2 * i + 1}] if i % 3 == 0 else [{"d": 2 * i}]


def table_functions(spark: SparkSession) -> dict[str, Any]:
    """The table function registered and called over Spark Connect: zero, one or two rows
    per input row, error rows, compared as a multiset with what fan_out answers."""
    register_table(spark, "connect_fan", fan_out, timeout=5, input_schema="id long",
                   output_schema="d long", on_error="error_column", on_empty="drop",
                   capacity=16)  # fmt: skip
    rows = spark.sql("SELECT * FROM connect_fan(TABLE(SELECT id FROM range(0, 300, 1, 2)))")
    got = Counter(
        (r.id, r.d, None if r._error is None else tuple(r._error)) for r in rows.collect()
    )
    want: Counter[tuple[Any, ...]] = Counter()
    for i in range(300):
        if i % 7 == 0:
            want[(i, None, ("ValueError", f"no fan for {i}", 1))] += 1
        elif i % 5 != 0:
            for d in [2 * i, 2 * i + 1] if i % 3 == 0 else [2 * i]:
                want[(i, d, None)] += 1
    return {"sql_table_rows": sum(got.values()), "sql_table_values": got == want}


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
        **table_functions(spark),
    }), flush=True)  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
