"""Connectors answer what ``output_schema`` declares, as Spark's ``from_json`` does: the
source's other columns or fields are left out; a declared column a query does not return is
an error naming it. The same on the per-row and the columnar (``chunk_size``) paths."""

from __future__ import annotations

from typing import Any

import pytest
from asyncio_ops.connectors import LookupQueryError
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.services.customers import ServiceThread, customer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import ordered_wait
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]

pytestmark = [pytest.mark.spark]


def _orders(spark: SparkSession) -> Any:
    return spark.range(0, 60, numPartitions=2).select(
        F.col("id"), (F.col("id") % 50 + 1).cast("int").alias("customer_id")
    )


@pytest.mark.postgres
@pytest.mark.parametrize("chunk_size", [None, 16], ids=["per-row", "columnar"])
def test_postgres_answers_the_declared_columns_only(
    spark: SparkSession, pg_tables: PgTables, chunk_size: int | None
) -> None:
    query = f"SELECT id, name, tier FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    got = ordered_wait(_orders(spark), lookup, timeout=10, output_schema="tier string",
                       chunk_size=chunk_size).collect()  # fmt: skip
    explicit = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id", columns=["tier"])
    want = ordered_wait(_orders(spark), explicit, timeout=10, output_schema="tier string",
                        chunk_size=chunk_size).collect()  # fmt: skip
    assert got and [tuple(r) for r in got] == [tuple(r) for r in want]


@pytest.mark.postgres
@pytest.mark.parametrize("chunk_size", [None, 16], ids=["per-row", "columnar"])
def test_a_declared_column_the_query_lacks_is_named(
    spark: SparkSession, pg_tables: PgTables, chunk_size: int | None
) -> None:
    query = f"SELECT id, name, tier FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    missing = r"output_schema column\(s\) \['vip'\] are not in the"
    with pytest.raises(LookupQueryError, match=missing):  # the driver's preflight
        ordered_wait(_orders(spark), lookup, timeout=10, chunk_size=chunk_size,
                     output_schema="tier string, vip boolean")  # fmt: skip
    out = ordered_wait(_orders(spark), lookup, timeout=10, chunk_size=chunk_size,
                       output_schema="tier string, vip boolean", preflight=False)  # fmt: skip
    with pytest.raises(Exception, match=missing):  # the executors' check
        out.collect()


def test_http_answers_the_declared_fields_only(spark: SparkSession) -> None:
    with ServiceThread(customers=50, latency=0.001) as service:
        lookup = HttpLookup(service.url + "/customers/{customer_id}")
        rows = ordered_wait(_orders(spark), lookup, timeout=10,
                            output_schema="tier string, nickname string").collect()  # fmt: skip
    assert [(r.customer_id, r.tier, r.nickname) for r in rows] == [
        (c, customer(c)["tier"], None) for c in (i % 50 + 1 for i in range(60))
    ]
