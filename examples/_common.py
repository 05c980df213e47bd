"""What the example scripts share: the Spark session, the orders they enrich, the report.

Runs on the driver only (workers never import this module): functions that
travel to executors live in the scripts' ``__main__`` or in ``connectors``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import session

# The marker of the one machine-readable line a script prints with --json.
JSON_MARKER = "RESULT "


def add_batch_options(
    p: argparse.ArgumentParser, *, orders: int, capacity: int, capacity_help: str
) -> None:
    """The options every batch example shares: sizes, Spark master, capacity, output."""
    p.add_argument("--orders", type=int, default=orders, help="orders to generate")
    p.add_argument("--customers", type=int, default=100_000, help="customer ids 1..N")
    p.add_argument(
        "--master", default=None,
        help="Spark master (default: spark-submit's, SPARK_MASTER/MASTER, else local[*])",
    )  # fmt: skip
    p.add_argument("--partitions", type=int, default=None, help="default: Spark's parallelism")
    p.add_argument("--capacity", type=int, default=capacity, help=capacity_help)
    p.add_argument("--sample", type=int, default=5, help="rows to print")
    p.add_argument("--json", action="store_true", help="print one RESULT {...} line")


# The sessions spark_session() started (not found running); stop_session() stops only these.
_STARTED: list[SparkSession] = []


def spark_session(master: str | None, app_name: str, partitions: int | None = None) -> SparkSession:
    """A local (or given) SparkSession with quiet logs and UTC time.

    A script run where a SparkSession is already active (a notebook's, a test's) gets
    that session, as ``asyncio_ops.spark.session()`` gives it: its master and other
    static settings stay as they are, and only the runtime SQL settings asked here
    (time zone, shuffle partitions) are set on it. :func:`stop_session` then leaves it
    running: a script stops only a session it started itself.
    """
    running = SparkSession.getActiveSession()
    conf = {"spark.sql.session.timeZone": "UTC"}
    if partitions:
        conf["spark.default.parallelism"] = str(partitions)
        conf["spark.sql.shuffle.partitions"] = str(partitions)
    spark = session(master, app_name=app_name, conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    if running is None:
        _STARTED.append(spark)
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop ``spark`` if :func:`spark_session` started it; leave one that was running."""
    if any(started is spark for started in _STARTED):
        _STARTED[:] = [started for started in _STARTED if started is not spark]
        spark.stop()


def orders(spark: SparkSession, n: int, customers: int, partitions: int) -> DataFrame:
    """``n`` deterministic orders: ``order_id``, ``customer_id`` in ``1..customers``, ``amount``.

    Customer ids are spread by a multiplicative step (every id is used when
    ``n >= customers`` and 7919 does not divide ``customers``).
    """
    if n < 0 or customers < 1 or partitions < 1:
        raise ValueError("orders >= 0, customers >= 1 and partitions >= 1 are required")
    return spark.range(0, n, numPartitions=partitions).select(
        F.col("id").alias("order_id"),
        ((F.col("id") * 7919) % customers + 1).alias("customer_id"),
        ((F.col("id") * 31 % 10_000) / 100).cast("double").alias("amount"),
    )


@contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def report(result: dict[str, Any], *, as_json: bool) -> None:
    """Print the human summary; with ``as_json`` also one ``RESULT {...}`` line."""
    sample = result.get("sample", [])
    if sample:
        print(f"\nsample ({len(sample)} rows):")
        for row in sample:
            print("  ", row)
    print()
    for name in ("input_rows", "rows", "missing", "mismatches", "seconds", "rows_per_s"):
        if name in result:
            print(f"{name:>12}: {result[name]}")
    if "metrics" in result:
        print("     metrics:", json.dumps(result["metrics"]))
    if as_json:
        print(JSON_MARKER + json.dumps(result, default=str), flush=True)
