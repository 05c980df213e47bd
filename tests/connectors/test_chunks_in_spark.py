"""Vectorised lookups (``chunk_size=``): PostgresLookup answers whole chunks of rows."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait
from connectors.postgres import PostgresLookup
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def _lookup(t: PgTables, **kw: Any) -> PostgresLookup:
    return PostgresLookup(
        t.dsn, f"SELECT id, name, tier FROM {t.customers} WHERE id = ANY($1)",
        key="customer_id", on="id", columns=("name", "tier"), **kw,
    )  # fmt: skip


def _orders(spark: SparkSession, n: int) -> Any:
    # customer ids 1..250 over a table of 200: ids above 200 have no match
    return spark.range(0, n, numPartitions=2).select(
        F.col("id"), (F.col("id") % 250 + 1).cast("int").alias("customer_id")
    )


def test_chunked_results_equal_per_row_results(spark: SparkSession, pg_tables: PgTables) -> None:
    orders = _orders(spark, 3000)
    per_row = ordered_wait(
        orders, _lookup(pg_tables), timeout=10, output_schema="name string, tier string"
    ).collect()
    metrics = AsyncMetrics(spark)
    chunked = ordered_wait(
        orders, _lookup(pg_tables), timeout=10, output_schema="name string, tier string",
        chunk_size=500, metrics=metrics,
    ).collect()  # fmt: skip
    assert [tuple(r) for r in chunked] == [tuple(r) for r in per_row]
    assert all(r.customer_id <= 200 for r in chunked)  # no match: the row is dropped
    assert len(chunked) == len([i for i in range(3000) if i % 250 + 1 <= 200])
    assert metrics.summary()["received"] == 6  # 3000 rows in chunks of 500


def test_unordered_chunks_lose_and_duplicate_nothing(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    rows = unordered_wait(
        _orders(spark, 2000), _lookup(pg_tables), timeout=10,
        output_schema="name string, tier string", chunk_size=64, capacity=8,
    ).collect()  # fmt: skip
    ids = sorted(r.id for r in rows)
    assert ids == [i for i in range(2000) if i % 250 + 1 <= 200]
    assert all(r.name == f"customer-{r.customer_id}" for r in rows)


def test_a_failed_chunk_gives_an_error_row_per_row(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    broken = PostgresLookup(
        pg_tables.dsn, f"SELECT id, nope FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="customer_id", on="id",
    )  # fmt: skip
    rows = ordered_wait(
        _orders(spark, 100), broken, timeout=10, output_schema="nope string",
        chunk_size=30, on_error="error_column",
    ).collect()  # fmt: skip
    assert [r.id for r in rows] == list(range(100))
    assert all(r._error is not None and "nope" in r._error.message for r in rows)


def test_chunk_size_is_validated_on_the_driver(spark: SparkSession, pg_tables: PgTables) -> None:
    async def per_row_only(row: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    orders = _orders(spark, 10)
    opts: dict[str, Any] = {"timeout": 1, "output_schema": "name string, tier string"}
    with pytest.raises(ConfigurationError, match="chunk_size must be"):
        ordered_wait(orders, _lookup(pg_tables), chunk_size=0, **opts)
    with pytest.raises(ConfigurationError, match="async_invoke_chunk"):
        ordered_wait(orders, per_row_only, chunk_size=10, **opts)
    with pytest.raises(ConfigurationError, match=r"cannot be combined with \['key'\]"):
        unordered_wait(orders, _lookup(pg_tables), chunk_size=10, key="customer_id", **opts)


@pytest.mark.asyncio
async def test_chunk_lookup_dedupes_keys_and_splits_by_batch_size(pg_tables: PgTables) -> None:
    queries: list[int] = []

    class Counting(PostgresLookup):
        async def _run_query(self, connection: Any, args: Any) -> Any:
            queries.append(len(args[0]))
            return await super()._run_query(connection, args)

    lookup = Counting(
        pg_tables.dsn, f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="customer_id", on="id", columns=("name",), batch_size=40,
    )  # fmt: skip
    async with lookup:
        rows = [{"customer_id": i % 100 + 1} for i in range(300)] + [{"customer_id": None}]
        out = await lookup.async_invoke_chunk(rows)
    assert sorted(queries) == [20, 40, 40]  # 100 distinct keys, at most 40 per query
    assert [o[0]["name"] for o in out[:-1]] == [f"customer-{i % 100 + 1}" for i in range(300)]
    assert out[-1] == []  # a null key has no match and costs no query
