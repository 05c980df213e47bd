"""``PostgresLookup`` with ``on_empty``: ``"drop"`` gives what a Spark inner join of the
same table gives, ``"keep"`` what a left join gives, per row, with dict chunks and
columnar, one-to-one (the vectorised path) and with a cache and a composite key."""

from __future__ import annotations

from typing import Any

import pytest
from asyncio_ops.connectors import LookupCache
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def _orders(spark: SparkSession) -> DataFrame:
    # customers 1..200 exist; ids above 200 and NULL ids find nothing
    return spark.range(0, 300, numPartitions=3).select(
        F.col("id"),
        F.when(F.col("id") % 17 == 0, None)
        .otherwise((F.col("id") % 230 + 1).cast("int"))
        .alias("customer_id"),
    )


def _customers(spark: SparkSession) -> DataFrame:
    return spark.range(1, 201).select(
        F.col("id").cast("int").alias("cid"),
        F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("name"),
    )


@pytest.mark.parametrize("on_empty", ["drop", "keep"])
@pytest.mark.parametrize("chunk_size", [None, 16], ids=["per-row", "columnar"])
@pytest.mark.parametrize("cached", [False, True], ids=["vectorised", "cached"])
def test_drop_and_keep_are_spark_inner_and_left_joins(
    spark: SparkSession, pg_tables: PgTables, on_empty: str, chunk_size: int | None, cached: bool
) -> None:
    query = f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id",
                            cache=LookupCache(ttl=300) if cached else None)  # fmt: skip
    wait: Any = unordered_wait if cached else ordered_wait
    got = wait(_orders(spark), lookup, timeout=30, output_schema="name string",
               chunk_size=chunk_size, on_empty=on_empty).collect()  # fmt: skip
    how = "left" if on_empty == "keep" else "inner"
    joined = (
        _orders(spark)
        .join(_customers(spark), F.col("customer_id") == F.col("cid"), how)
        .select("id", "customer_id", "name")
    )
    want = joined.collect()
    matched = sum(1 for i in range(300) if i % 17 and i % 230 + 1 <= 200)
    assert len(want) == (300 if on_empty == "keep" else matched) and matched < 300
    assert sorted(map(tuple, got), key=repr) == sorted(map(tuple, want), key=repr)


@pytest.mark.parametrize("chunk_size", [None, 16], ids=["per-row", "columnar"])
def test_keep_with_a_composite_key_and_fan_out(
    spark: SparkSession, pg_tables: PgTables, chunk_size: int | None
) -> None:
    query = (f"SELECT customer_id, seq, city FROM {pg_tables.addresses} "
             "WHERE customer_id = ANY($1)")  # fmt: skip
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="customer_id",
                            many=True)  # fmt: skip
    df = spark.range(1, 25, numPartitions=2).select(F.col("id").cast("int").alias("customer_id"))
    got = ordered_wait(df, lookup, timeout=30, output_schema="city string",
                       chunk_size=chunk_size, on_empty="keep").collect()  # fmt: skip
    # customer c has c % 4 addresses for c <= 20: zero-address rows come back once, null
    want = [(c, f"city-{c}-{s}") for c in range(1, 21) for s in range(1, c % 4 + 1)]
    want += [(c, None) for c in range(1, 25) if c > 20 or c % 4 == 0]
    assert sorted(map(tuple, got), key=repr) == sorted(want, key=repr)


@pytest.mark.parametrize("chunk_size", ["auto", None], ids=["columnar", "per-row"])
def test_a_connector_keeps_what_it_cannot_enrich_and_a_plain_function_drops_it(
    spark: SparkSession, pg_tables: PgTables, chunk_size: str | None
) -> None:
    """Not given, on_empty is the function's default: a lookup connector is a left join
    (Beam's Enrichment), a plain async function Flink's inner join; the metrics count
    what was dropped."""
    query = f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    matched = sum(1 for i in range(300) if i % 17 and i % 230 + 1 <= 200)

    kept = AsyncMetrics(spark)
    rows = ordered_wait(_orders(spark), lookup, timeout=30, output_schema="name string",
                        chunk_size=chunk_size, metrics=kept).collect()  # fmt: skip
    assert len(rows) == 300 and sum(r.name is None for r in rows) == 300 - matched
    assert kept.summary()["dropped"] == 0

    dropped = AsyncMetrics(spark)
    rows = ordered_wait(_orders(spark), lookup, timeout=30, output_schema="name string",
                        chunk_size=chunk_size, on_empty="drop",
                        metrics=dropped).collect()  # fmt: skip
    assert len(rows) == matched and dropped.summary()["dropped"] == 300 - matched

    async def evens(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": "even"}] if row["id"] % 2 == 0 else []

    plain = AsyncMetrics(spark)
    rows = ordered_wait(_orders(spark), evens, timeout=30, output_schema="name string",
                        metrics=plain).collect()  # fmt: skip
    assert len(rows) == 150 and plain.summary()["dropped"] == 150
