"""A lookup registered as a Spark SQL table function (``asyncio_ops.spark.register_table``)
gives, as a multiset of rows, what ``unordered_wait`` gives over the same rows: against a
real PostgreSQL (one-to-one and one-to-many, columnar; rows without a match kept or
dropped as ``on_empty`` says, NULL keys never sent) and the customer HTTP service
(one-to-many answers, refused requests as error rows with ``on_error="error_column"``),
with and without ``PARTITION BY``; lookups stay in flight across Arrow batches; the
driver checks the options and the worker the table argument's columns."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.services.customers import ServiceThread, customer
from pyspark.sql import DataFrame, Row, SparkSession

from asyncio_ops import AsyncOperatorError, AsyncRetryStrategy, ConfigurationError
from asyncio_ops.spark import AsyncMetrics, register_table, unordered_wait
from tests.connectors.conftest import pg_dsn, pg_tables
from tests.connectors.support import PgTables
from tests.spark.conftest import arrow_batch_rows, spark

__all__ = ["pg_dsn", "pg_tables", "spark"]

pytestmark = [pytest.mark.spark]


def _multiset(rows: list[Row]) -> Counter[tuple[Any, ...]]:
    """Rows as a multiset of plain tuples (nested structs, the error, as tuples too)."""
    return Counter(tuple(tuple(v) if isinstance(v, Row) else v for v in r) for r in rows)


@pytest.fixture
def orders(spark: SparkSession) -> Iterator[DataFrame]:
    """60 orders over 3 partitions: customers 1..30 (those of 1..20 have 0 to 3
    addresses), unknown ones (500, 501), NULL keys; ``ids`` asks the HTTP service for the
    customer and the next one (one to two answers), NULL with a NULL key, and for some
    orders a value the service refuses (400)."""
    rows = []
    for i in range(60):
        cid = None if i % 13 == 5 else (500 + i % 2 if i % 11 == 7 else i % 30 + 1)
        ids = None if cid is None else (f"{cid},x" if i % 9 == 4 else f"{cid},{cid + 1}")
        rows.append((i, cid, ids))
    df = spark.createDataFrame(rows, "order_id long, customer_id int, ids string")
    df = df.repartition(3, "order_id")
    df.createOrReplaceTempView("sql_tf_orders")
    yield df
    spark.catalog.dropTempView("sql_tf_orders")


@pytest.mark.postgres
def test_table_function_is_unordered_wait_row_by_row_against_postgres(
    spark: SparkSession, pg_tables: PgTables, orders: DataFrame
) -> None:
    def addresses() -> PostgresLookup:  # one-to-many: customer c has c % 4 addresses (c <= 20)
        return PostgresLookup(
            pg_tables.dsn, f"SELECT customer_id, seq, city FROM {pg_tables.addresses} "
            "WHERE customer_id = ANY($1) ORDER BY customer_id, seq",
            key="customer_id", many=True, columns=("seq", "city"),
        )  # fmt: skip

    def customers() -> PostgresLookup:
        return PostgresLookup(
            pg_tables.dsn, f"SELECT id, name, tier FROM {pg_tables.customers} WHERE id = ANY($1)",
            key="customer_id", on="id", columns=("name", "tier"),
        )  # fmt: skip

    metrics = AsyncMetrics(spark)
    schema = "order_id long, customer_id int"
    common: dict[str, Any] = {"timeout": 30, "capacity": 2, "input_schema": schema}
    register_table(spark, "sql_tf_addresses", addresses(), output_schema="seq int, city string",
                   **common)  # fmt: skip
    register_table(spark, "sql_tf_addresses_only", addresses(), on_empty="drop",
                   output_schema="seq int, city string", **common)  # fmt: skip
    register_table(spark, "sql_tf_customers", customers(), output_schema="name string, tier string",
                   metrics=metrics, **common)  # fmt: skip
    table = "TABLE(SELECT order_id, customer_id FROM sql_tf_orders)"
    with arrow_batch_rows(spark, 4):  # many Arrow batches per partition, lookups across them
        kept = spark.sql(f"SELECT * FROM sql_tf_addresses({table})").collect()
        dropped = spark.sql(f"SELECT * FROM sql_tf_addresses_only({table})").collect()
        by_value = spark.sql(
            f"SELECT * FROM sql_tf_addresses({table} PARTITION BY customer_id % 3)"
        ).collect()
        one = spark.sql(f"SELECT * FROM sql_tf_customers({table})").collect()
        base = orders.select("order_id", "customer_id")
        want_kept = unordered_wait(base, addresses(), timeout=30, capacity=2,
                                   output_schema="seq int, city string").collect()  # fmt: skip
        want_dropped = unordered_wait(base, addresses(), timeout=30, capacity=2, on_empty="drop",
                                      output_schema="seq int, city string").collect()  # fmt: skip
        want_one = unordered_wait(base, customers(), timeout=30, capacity=2,
                                  output_schema="name string, tier string").collect()  # fmt: skip
    assert [f.name for f in spark.sql(f"SELECT * FROM sql_tf_addresses({table})").schema] == [
        "order_id", "customer_id", "seq", "city"]  # fmt: skip
    assert _multiset(kept) == _multiset(want_kept) == _multiset(by_value)
    assert _multiset(dropped) == _multiset(want_dropped)
    assert _multiset(one) == _multiset(want_one)
    # what that means: one row per address; a row without one (no address, an unknown
    # customer, a NULL key) kept with NULLs by default, dropped with on_empty="drop"
    with_address = {c for c in range(1, 21) if c % 4}
    for r in kept:
        if r.customer_id in with_address:
            assert r.city == f"city-{r.customer_id}-{r.seq}", r
        else:
            assert r.seq is None and r.city is None, r
    assert Counter(r.order_id for r in dropped) == Counter(
        {r.order_id: r.customer_id % 4 for r in want_one if r.customer_id in with_address})
    assert len(kept) == len(dropped) + sum(r.customer_id not in with_address for r in want_one)
    assert len(one) == 60 and all(
        (r.name is None) == (r.customer_id is None or r.customer_id > 200) for r in one)
    summary = metrics.summary()
    assert summary["received"] == 60 and summary["skipped_null_keys"] == 5


def test_table_function_matches_unordered_wait_with_error_rows_over_http(
    spark: SparkSession, orders: DataFrame
) -> None:
    retry = AsyncRetryStrategy.fixed_delay(2, 10)
    with ServiceThread(customers=30) as service:
        # GET /customers?ids=3,4 answers {"items": [...]}: one row per known customer
        http = HttpLookup(service.url + "/customers?ids={ids}", result_path="items")
        common: dict[str, Any] = {"timeout": 30, "retry": retry, "on_error": "error_column",
                                  "output_schema": "id int, name string, tier string"}  # fmt: skip
        register_table(spark, "sql_tf_http", http, input_schema="order_id long, ids string",
                       capacity=8, **common)  # fmt: skip
        table = "TABLE(SELECT order_id, ids FROM sql_tf_orders)"
        with arrow_batch_rows(spark, 5):
            got = spark.sql(f"SELECT * FROM sql_tf_http({table})").collect()
            ok = spark.sql(
                f"SELECT count(*) FROM sql_tf_http({table}) WHERE _error IS NULL"
            ).first()
            want = unordered_wait(orders.select("order_id", "ids"), http, capacity=8,
                                  **common).collect()  # fmt: skip
    assert _multiset(got) == _multiset(want)
    refused = [r for r in got if r._error is not None]
    assert sorted(r.order_id for r in refused) == [i for i in range(60) if i % 9 == 4 and
                                                   i % 13 != 5]  # fmt: skip
    for r in refused:  # the service refused the ids (400): one error row each
        assert r.ids.endswith(",x") and r.name is None and "400" in r._error.message, r
    for r in got:
        if r._error is None and r.id is not None:  # one row per known customer asked for
            assert r.id in {int(x) for x in r.ids.split(",")} and r.id <= 30, r
            assert (r.name, r.tier) == (customer(r.id)["name"], customer(r.id)["tier"]), r
    per_order = Counter(r.order_id for r in got if r.id is not None)
    assert per_order[0] == 2 and per_order[59] == 1  # customers 1, 2; customer 30 alone
    assert ok is not None and ok[0] == len(got) - len(refused)


def test_lookups_stay_in_flight_across_arrow_batches(spark: SparkSession) -> None:
    """Every lookup waits until 12 are in flight in its partition at once; the table
    argument comes in batches of 2 rows: only lookups kept in flight across batches (and
    not drained at each batch's end) ever get there."""

    class Gate:
        def __init__(self) -> None:
            self.waiting = 0
            self.open = asyncio.Event()

    gates: dict[int, Gate] = {}

    async def gather(row: dict[str, Any]) -> list[dict[str, Any]]:
        gate = gates.setdefault(row["id"] // 12, Gate())
        gate.waiting += 1
        if gate.waiting == 12:
            gate.open.set()
        await asyncio.wait_for(gate.open.wait(), 20)
        return [{"twice": 2 * row["id"]}, {"twice": 2 * row["id"] + 1}]

    register_table(spark, "sql_tf_gather", gather, timeout=30, capacity=12,
                   input_schema="id long", output_schema="twice long")  # fmt: skip
    with arrow_batch_rows(spark, 2):
        rows = spark.sql("SELECT * FROM sql_tf_gather(TABLE(SELECT id FROM range(0, 48, 1, 2)))")
        got = sorted((r.id, r.twice) for r in rows.collect())
    assert got == [(i, 2 * i + j) for i in range(48) for j in (0, 1)]


def test_register_table_checks_options_and_the_table_argument(spark: SparkSession) -> None:
    async def one(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"v": row["id"]}]

    no_buffer = r"register_table\(\) has no option 'output_buffer'"
    with pytest.raises(ConfigurationError, match=no_buffer):
        register_table(spark, "sql_tf_bad", one, timeout=5, input_schema="id long",
                       output_schema="v long", output_buffer=10)  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"no option 'checkpoint_location'"):
        register_table(spark, "sql_tf_bad", one, timeout=5, input_schema="id long",
                       output_schema="v long", checkpoint_location="/nowhere")  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"output_schema column\(s\) \['id'\] are also"):
        register_table(spark, "sql_tf_bad", one, timeout=5, input_schema="id long",
                       output_schema="id long")  # fmt: skip
    with pytest.raises(ConfigurationError, match="on_empty must be one of"):
        register_table(spark, "sql_tf_bad", one, timeout=5, input_schema="id long",
                       output_schema="v long", on_empty="maybe")  # fmt: skip
    assert not spark.catalog.functionExists("sql_tf_bad")

    udtf = register_table(spark, "sql_tf_one", one, timeout=5, input_schema="id long, k int",
                          output_schema="v long")  # fmt: skip
    # the DataFrame API calls it too, with a DataFrame as its table argument; a column that
    # input_schema declares as int arrives cast from the table's bigint
    got = udtf(spark.range(3).selectExpr("id", "id * 2 AS k").asTable()).collect()
    assert sorted((r.id, r.k, r.v) for r in got) == [(0, 0, 0), (1, 2, 1), (2, 4, 2)]
    with pytest.raises(ConfigurationError, match=r"has the columns \['id'\]: it lacks \['k'\]"):
        spark.sql("SELECT * FROM sql_tf_one(TABLE(SELECT id FROM range(0, 3, 1, 1)))").collect()
    extra = r"\['x'\] are not declared in input_schema.*TABLE\(SELECT \.\.\. FROM t\)"
    with pytest.raises(ConfigurationError, match=extra):
        spark.sql("SELECT * FROM sql_tf_one(TABLE("
                  "SELECT id, 1 AS k, 2 AS x FROM range(0, 3, 1, 1)))").collect()  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"takes one table argument.*called with 1"):
        spark.sql("SELECT * FROM sql_tf_one(7)").collect()

    async def fails_for_7(row: dict[str, Any]) -> list[dict[str, Any]]:
        if row["id"] == 7:
            raise ValueError("no value for 7")
        return [{"v": row["id"]}]

    # on_error="fail" (the default): the failed lookup fails the query, the library's
    # exception naming the row raised by the action, whichever batch it was in
    register_table(spark, "sql_tf_strict", fails_for_7, timeout=5, input_schema="id long",
                   output_schema="v long")  # fmt: skip
    with arrow_batch_rows(spark, 3), pytest.raises(AsyncOperatorError, match=r"\{'id': 7\}.*no va"):
        spark.sql("SELECT * FROM sql_tf_strict(TABLE(SELECT id FROM range(0, 12, 1, 1)))").collect()
