"""The lookup cache through the Spark runtime: hits, misses and evictions in the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from asyncio_ops.connectors import LookupCache
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, ordered_wait
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.parametrize("chunk_size", [None, "auto"])
def test_cache_counters_reach_the_operator_metrics(
    spark: SparkSession, pg_tables: PgTables, chunk_size: str | None
) -> None:
    lookup = PostgresLookup(
        pg_tables.dsn,
        f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="customer_id", on="id", columns=("name",),
        cache=LookupCache(ttl=600, max_size=50),
    )  # fmt: skip
    # 2,000 orders in runs of 20 per customer, cycling over 100 customers: repeats hit,
    # and 100 keys do not fit a cache of 50
    orders = spark.range(0, 2000, numPartitions=1).select(
        F.col("id"), ((F.col("id") / 20).cast("int") % 100 + 1).alias("customer_id")
    )
    metrics = AsyncMetrics(spark)
    rows = ordered_wait(
        orders, lookup, timeout=10, capacity=8, output_schema="name string", metrics=metrics,
        chunk_size=chunk_size,
    ).collect()  # fmt: skip
    assert [r.name for r in rows] == [f"customer-{r.customer_id}" for r in rows]
    s = metrics.summary()
    if chunk_size is None:  # one cache lookup per row
        assert s["cache_hits"] + s["cache_misses"] == 2000
        assert s["cache_misses"] >= 100 and s["cache_hits"] > 0
    else:  # columnar: one per distinct key of a chunk (one chunk of 5,000 rows here)
        assert (s["cache_hits"], s["cache_misses"]) == (0, 100)
    assert s["cache_evictions"] > 0


@pytest.mark.spark
@pytest.mark.postgres
def test_cache_is_checkpointed_and_warms_the_next_run(
    spark: SparkSession, pg_tables: PgTables, tmp_path: Path
) -> None:
    def run() -> dict[str, Any]:
        lookup = PostgresLookup(
            pg_tables.dsn,
            f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)",
            key="customer_id", on="id", columns=("name",), cache=LookupCache(ttl=600),
        )  # fmt: skip
        orders = spark.range(0, 300, numPartitions=2).select(
            F.col("id"), (F.col("id") % 100 + 1).cast("int").alias("customer_id")
        )
        metrics = AsyncMetrics(spark)
        rows = ordered_wait(
            orders, lookup, timeout=10, output_schema="name string", metrics=metrics,
            checkpoint_location=str(tmp_path / "ckpt"), uid="customers",
        ).collect()  # fmt: skip
        assert [r.name for r in rows] == [f"customer-{r.customer_id}" for r in rows]
        return metrics.summary()

    first = run()
    assert first["cache_misses"] >= 100
    assert list((tmp_path / "ckpt" / "customers").glob("run-*/fnstate-*.ckpt"))
    second = run()  # a new job run: a new function, its cache restored from the checkpoint
    # columnar (the default for PostgresLookup): one cache lookup per distinct key of a
    # chunk, and each partition's 150 rows are one chunk of its 100 distinct keys
    assert second["cache_misses"] == 0 and second["cache_hits"] == 200
