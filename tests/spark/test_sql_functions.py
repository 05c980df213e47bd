"""A lookup registered as a Spark SQL function (``asyncio_ops.spark.register``) answers,
row by row, what ``ordered_wait`` answers over the same rows: against a real PostgreSQL
(columnar and per row), the customer HTTP service, the example OpenAI-compatible model
service (chat and embeddings) and Redis (behind a cache and a rate limit); NULL keys and
unknown keys give a NULL struct (a left join), failed rows an error struct with
``on_error="error_column"``; the driver checks the options and runs the preflight at
registration."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asyncio_ops.connectors import LookupCache, LookupQueryError, RateLimit
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.redis import RedisLookup
from asyncio_ops.services.customers import ServiceThread, customer
from asyncio_ops.services.models import OpenAIServiceThread, embedding, sentiment
from pyspark.sql import DataFrame, SparkSession

from asyncio_ops import AsyncRetryStrategy, ConfigurationError, OutputSchemaError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, register
from tests.connectors.conftest import pg_dsn, pg_tables, redis_url
from tests.connectors.support import PgTables
from tests.spark.conftest import arrow_batch_rows, spark

__all__ = ["pg_dsn", "pg_tables", "redis_url", "spark"]

pytestmark = [pytest.mark.spark]

NOTES = ["a great film", "dull", None, "I love it"]


def _orders(spark: SparkSession) -> DataFrame:
    """40 orders over 3 partitions: customers 1..36, an unknown one (500, 501: not in
    the table nor the service), NULL keys, and refs that the service refuses (400)."""
    rows = []
    for i in range(40):
        cid = None if i % 13 == 5 else (500 + i % 2 if i % 11 == 7 else i + 1)
        ref = f"x{i}" if i % 9 == 4 else (None if cid is None else str(cid))
        rows.append((i, cid, ref, NOTES[i % len(NOTES)]))
    return spark.createDataFrame(rows, "order_id long, customer_id int, ref string, note string")


@pytest.fixture
def orders(spark: SparkSession) -> Iterator[DataFrame]:
    df = _orders(spark).repartition(3, "order_id")
    df.createOrReplaceTempView("sql_fn_orders")
    yield df
    spark.catalog.dropTempView("sql_fn_orders")


@pytest.mark.postgres
def test_sql_function_is_ordered_wait_row_by_row_against_postgres(
    spark: SparkSession, pg_tables: PgTables, orders: DataFrame
) -> None:
    def lookup() -> PostgresLookup:
        return PostgresLookup(
            pg_tables.dsn, f"SELECT id, name, tier FROM {pg_tables.customers} WHERE id = ANY($1)",
            key="customer_id", on="id", columns=("name", "tier"),
        )  # fmt: skip

    metrics = AsyncMetrics(spark)
    register(spark, "sql_fn_customer", lookup(), timeout=30, input_schema="customer_id int",
             output_schema="name string, tier string", capacity=3, metrics=metrics)  # fmt: skip

    # rows one at a time, each receiving a Row of its arguments only (no position column)
    async def by_row(row: Any) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        if row.customer_id in (1, 2):  # what the function received, as its result
            return [{"fields": ",".join(row.asDict())}]
        return [{"fields": None}] if (row.customer_id or 0) % 2 else []

    register(spark, "sql_fn_fields", by_row, timeout=30, input_schema="customer_id long",
             output_schema="fields string", rows_as="row", capacity=2)  # fmt: skip
    with arrow_batch_rows(spark, 4):  # many Arrow batches per partition, lookups across them
        got = spark.sql(
            "SELECT order_id, customer_id, sql_fn_customer(customer_id) AS c, "
            "sql_fn_fields(customer_id) AS f FROM sql_fn_orders"
        ).collect()
        want = ordered_wait(orders, lookup(), timeout=30, capacity=3,
                            output_schema="name string, tier string").collect()  # fmt: skip
    assert len(got) == len(want) == 40
    by_id = {r.order_id: r for r in want}
    for r in got:
        w = by_id[r.order_id]
        assert r.customer_id == w.customer_id
        if w.name is None:  # a NULL key or an unknown customer: a left join's NULLs
            assert r.c is None and (r.customer_id is None or r.customer_id >= 500), r
        else:
            assert (r.c.name, r.c.tier) == (w.name, w.tier) == (f"customer-{r.customer_id}",
                                                                 w.tier), r  # fmt: skip
        if r.customer_id in (1, 2):
            assert r.f.fields == "customer_id", r  # the argument, named by input_schema
        else:  # nothing answered, or only NULLs: a NULL struct
            assert r.f is None, r
    assert sum(r.c is None for r in got) == sum(r.name is None for r in want) == 5
    summary = metrics.summary()
    assert summary["received"] == 40 and summary["skipped_null_keys"] == 3


def test_sql_functions_match_ordered_wait_with_error_structs_over_http_and_a_model(
    spark: SparkSession, orders: DataFrame
) -> None:
    retry = AsyncRetryStrategy.fixed_delay(2, 10)
    with ServiceThread(customers=30) as service, OpenAIServiceThread() as models:
        http = HttpLookup(service.url + "/customers/{ref}", not_found_empty=True)
        chat = ChatLookup(models.url, "local", prompt="Review: {note}")
        common: dict[str, Any] = {"timeout": 30, "retry": retry, "on_error": "error_column"}
        register(spark, "sql_fn_http", http, input_schema="ref string",
                 output_schema="name string, tier string", **common)  # fmt: skip
        register(spark, "sql_fn_sentiment", chat, input_schema="note string",
                 output_schema="answer string", **common)  # fmt: skip
        query = spark.sql(
            "SELECT order_id, ref, note, sql_fn_http(ref) AS h, sql_fn_sentiment(note) AS s "
            "FROM sql_fn_orders"
        )
        got = query.collect()
        ok = spark.sql(
            "SELECT count(*) FROM (SELECT sql_fn_http(ref) AS h FROM sql_fn_orders) "
            "WHERE h.error IS NULL"
        ).first()
        first = ordered_wait(orders, http, output_schema="name string, tier string", **common)
        first = first.withColumnRenamed("_error", "http_error")
        want = ordered_wait(first, chat, output_schema="answer string", **common).collect()
    by_id = {r.order_id: r for r in want}
    assert len(got) == len(want) == 40
    errors = 0
    for r in got:
        w = by_id[r.order_id]
        if w.http_error is not None:  # the service refused the ref (400): not retried
            errors += 1
            assert r.h.result is None and r.h.error.asDict() == w.http_error.asDict(), r
            assert r.ref.startswith("x") and "400" in r.h.error.message, r
        elif w.name is None:  # a NULL ref (never sent) or an unknown customer (404)
            assert r.h.result is None and r.h.error is None, r
        else:
            assert r.h.error is None and r.h.result.asDict() == {
                "name": w.name, "tier": w.tier} == {k: customer(int(r.ref))[k]
                                                    for k in ("name", "tier")}, r  # fmt: skip
        assert r.s.error is None and w._error is None
        if r.note is None:
            assert r.s.result is None and w.answer is None
        else:
            assert r.s.result.answer == w.answer == sentiment(f"Review: {r.note}"), r
    assert errors == 4 and ok is not None and ok[0] == 40 - errors


def test_register_checks_options_and_runs_the_preflight_on_the_driver(
    spark: SparkSession, pg_dsn: str
) -> None:
    lookup = PostgresLookup(pg_dsn, "SELECT id, name FROM aops_no_such_table WHERE id = ANY($1)",
                            key="customer_id", on="id")  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"input_schema is required.*'customer_id'"):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string")
    with pytest.raises(ConfigurationError, match=r"no option 'checkpoint_location'.*ordered_wait"):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string",
                 input_schema="customer_id int", checkpoint_location="/tmp/x")  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"no option 'capacty'.*did you mean 'capacity'"):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string",
                 input_schema="customer_id int", capacty=3)  # fmt: skip
    twice = r"input_schema names the column\(s\) \['customer_id'\] twice"
    with pytest.raises(ConfigurationError, match=twice):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string",
                 input_schema="customer_id int, customer_id long")  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"output_schema names the column\(s\)"):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string, name int",
                 input_schema="customer_id int")  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"on_error must be one of"):
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string",
                 input_schema="customer_id int", on_error="ignore")  # fmt: skip
    with pytest.raises(LookupQueryError, match="aops_no_such_table") as raised:
        register(spark, "sql_fn_bad", lookup, timeout=5, output_schema="name string",
                 input_schema="customer_id int")  # fmt: skip
    assert any("preflight=False" in note for note in raised.value.__notes__)
    assert not spark.catalog.functionExists("sql_fn_bad")  # nothing registered


def test_more_than_one_result_for_a_row_fails_naming_the_row(spark: SparkSession) -> None:
    async def twice(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"v": 1}, {"v": 2}] if row["k"] == 7 else [{"v": 0}]

    register(spark, "sql_fn_twice", twice, timeout=5, input_schema="k long",
             output_schema="v int")  # fmt: skip
    twice_named = r"sql_fn_twice\(k bigint\).*\{'k': 7\}.*ordered_wait or unordered_wait"
    with pytest.raises(OutputSchemaError, match=twice_named):
        spark.sql("SELECT sql_fn_twice(id) FROM range(10)").collect()


def test_redis_and_embedding_lookups_with_a_cache_and_a_rate_limit_as_sql_functions(
    spark: SparkSession, orders: DataFrame, redis_url: str
) -> None:
    """The columnar connectors of Redis and embeddings, one behind a ``LookupCache`` and a
    ``RateLimit``, answer through SQL what they answer through ``ordered_wait``."""
    import redis

    prefix = f"sqlfn-{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(redis_url)
    for i in range(1, 41):  # every customer of the orders (unknown ones are 500, 501)
        client.hset(f"{prefix}{i}", mapping={"name": f"customer-{i}", "tier": str(i % 3)})
    try:
        with OpenAIServiceThread() as models:

            def lookups() -> tuple[RedisLookup, EmbeddingLookup]:
                stored = RedisLookup(redis_url, key="customer_id", kind="hash",
                                     key_prefix=prefix, cache=LookupCache(max_size=100, ttl=60),
                                     rate_limit=RateLimit(requests_per_second=500, burst=50))
                return stored, EmbeddingLookup(models.url, "local", input="{note}", batch_size=4)

            stored, embed = lookups()
            register(spark, "sql_fn_redis", stored, timeout=30, input_schema="customer_id int",
                     output_schema="name string, tier string")  # fmt: skip
            register(spark, "sql_fn_embed", embed, timeout=30, input_schema="note string",
                     output_schema="embedding array<float>")  # fmt: skip
            got = spark.sql(
                "SELECT order_id, customer_id, note, sql_fn_redis(customer_id) AS r, "
                "sql_fn_embed(note) AS e FROM sql_fn_orders"
            ).collect()
            stored, embed = lookups()
            first = ordered_wait(orders, stored, timeout=30,
                                 output_schema="name string, tier string")  # fmt: skip
            want = ordered_wait(first, embed, timeout=30,
                                output_schema="embedding array<float>").collect()  # fmt: skip
    finally:
        client.delete(*[f"{prefix}{i}" for i in range(1, 41)])
        client.close()
    by_id = {r.order_id: r for r in want}
    assert len(got) == len(want) == 40
    for r in got:
        w = by_id[r.order_id]
        if w.name is None:  # a NULL key (never sent) or an unknown customer: NULL
            assert r.r is None and (r.customer_id is None or r.customer_id >= 500), r
        else:
            assert (r.r.name, r.r.tier) == (w.name, w.tier) == (
                f"customer-{r.customer_id}", str(r.customer_id % 3)), r  # fmt: skip
        if r.note is None:
            assert r.e is None and w.embedding is None, r
        else:
            assert r.e.embedding == pytest.approx(w.embedding), r
            assert r.e.embedding == pytest.approx(embedding(r.note), abs=1e-6), r
