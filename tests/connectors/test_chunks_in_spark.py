"""Vectorised lookups (``chunk_size=``): PostgresLookup answers whole chunks of rows.

PostgresLookup has both chunk methods; the runtime prefers ``async_invoke_arrow``
(columnar), so the Spark tests here run that path; ``async_invoke_chunk`` (rows as
dicts) is tested directly and through a function that has only it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import (
    LookupAmbiguousError,
    LookupCache,
    LookupKeyError,
    LookupQueryError,
)
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.postgres._columnar import aggregate_sql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops import ArrowResult, AsyncFunction, ConfigurationError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait
from tests.spark.conftest import spark

from .support import CountingLookup, PgTables, columnar_pairs, per_row_pairs, run_isolated

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
        orders, _lookup(pg_tables), timeout=10, output_schema="name string, tier string",
        on_empty="drop",
    ).collect()  # fmt: skip
    metrics = AsyncMetrics(spark)
    chunked = ordered_wait(
        orders, _lookup(pg_tables), timeout=10, output_schema="name string, tier string",
        chunk_size=500, metrics=metrics, on_empty="drop",
    ).collect()  # fmt: skip
    assert [tuple(r) for r in chunked] == [tuple(r) for r in per_row]
    assert all(r.customer_id <= 200 for r in chunked)  # no match: the row is dropped
    assert len(chunked) == len([i for i in range(3000) if i % 250 + 1 <= 200])
    summary = metrics.summary()
    assert summary["received"] == 3000 and summary["chunks"] == 6  # rows, in chunks of 500


def test_unordered_chunks_lose_and_duplicate_nothing(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    rows = unordered_wait(
        _orders(spark, 2000), _lookup(pg_tables), timeout=10,
        output_schema="name string, tier string", chunk_size=64, capacity=8, on_empty="drop",
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
        chunk_size=30, on_error="error_column", preflight=False,  # the chunks' path
    ).collect()  # fmt: skip
    assert [r.id for r in rows] == list(range(100))
    assert all(r._error is not None and "nope" in r._error.message for r in rows)


@pytest.mark.parametrize("late_records", ["keep", "drop"])
def test_keyed_event_time_chunks_equal_per_row_results(
    spark: SparkSession, pg_tables: PgTables, late_records: str
) -> None:
    # an event time running with the id, every 13th row 100 s behind: late by then
    orders = _orders(spark, 2000).withColumn(
        "ts",
        F.timestamp_seconds(
            F.col("id") - F.when(F.col("id") % 13 == 0, F.lit(100)).otherwise(F.lit(0))
        ),
    )
    opts: dict[str, Any] = {
        "timeout": 10, "output_schema": "name string, tier string", "key": "customer_id",
        "event_time": "ts", "watermark_delay": "5 seconds", "watermark_interval": 20,
        "late_records": late_records,
    }  # fmt: skip
    per_row = unordered_wait(orders, _lookup(pg_tables), **opts).collect()
    metrics = AsyncMetrics(spark)
    chunked = unordered_wait(
        orders, _lookup(pg_tables), chunk_size=50, metrics=metrics, **opts
    ).collect()
    # the same rows and lateness (per row, as each arrived), in chunks of one key group
    assert sorted(tuple(r) for r in chunked) == sorted(tuple(r) for r in per_row)
    summary = metrics.summary()
    # rows (those dropped late never reach the operator), in fewer chunks
    assert summary["received"] == 2000 - summary["dropped_late"], summary
    assert 0 < summary["chunks"] < summary["received"], summary
    late = [r for r in per_row if r._late]
    assert (not late) if late_records == "drop" else late


def test_chunk_size_is_validated_on_the_driver(spark: SparkSession, pg_tables: PgTables) -> None:
    async def per_row_only(row: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    orders = _orders(spark, 10)
    opts: dict[str, Any] = {"timeout": 1, "output_schema": "name string, tier string"}
    with pytest.raises(ConfigurationError, match="chunk_size must be"):
        ordered_wait(orders, _lookup(pg_tables), chunk_size=0, **opts)
    with pytest.raises(ConfigurationError, match=r"async_invoke_arrow.*async_invoke_chunk"):
        ordered_wait(orders, per_row_only, chunk_size=10, **opts)


@pytest.mark.asyncio
async def test_chunk_lookup_dedupes_keys_and_splits_by_batch_size(pg_tables: PgTables) -> None:
    lookup = CountingLookup(
        pg_tables.dsn, f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="customer_id", on="id", columns=("name",), batch_size=40,
    )  # fmt: skip
    async with lookup:
        rows = [{"customer_id": i % 100 + 1} for i in range(300)] + [{"customer_id": None}]
        out = await lookup.async_invoke_chunk(rows)
    queries = lookup.sent
    assert sorted(queries) == [20, 40, 40]  # 100 distinct keys, at most 40 per query
    assert [o[0]["name"] for o in out[:-1]] == [f"customer-{i % 100 + 1}" for i in range(300)]
    assert out[-1] == []  # a null key has no match and costs no query


# -- the columnar path: async_invoke_arrow -------------------------------------------------------
@pytest.mark.parametrize("key_type", [pa.int64(), pa.int32()])
def test_arrow_one_to_one_equals_the_per_row_path(pg_tables: PgTables, key_type: Any) -> None:
    ids = [5, 250, None, 5, 17, 199, 3, 0]  # repeats, no match (250, 0) and a null key
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array(ids, key_type)})
    rows = batch.to_pylist()
    expected = per_row_pairs(_lookup(pg_tables), rows)
    assert [i for i, _ in expected] == [0, 3, 4, 5, 6]
    assert columnar_pairs(_lookup(pg_tables), batch) == expected


def test_arrow_every_row_matched_needs_no_row_index(pg_tables: PgTables) -> None:
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([3, 1, 2], pa.int64())})

    async def go() -> Any:
        async with _lookup(pg_tables) as lookup:
            return await lookup.async_invoke_arrow(batch)

    index, columns = run_isolated(go())
    assert index is None  # every row once, in order: the runtime skips the take
    assert pa.array(columns["name"]).to_pylist() == ["customer-3", "customer-1", "customer-2"]


def test_arrow_one_to_many_composite_and_cached_equal_the_per_row_path(
    pg_tables: PgTables,
) -> None:
    many = PostgresLookup(
        pg_tables.dsn,
        f"SELECT customer_id, seq, city FROM {pg_tables.addresses} "
        "WHERE customer_id = ANY($1) ORDER BY customer_id, seq",
        key="customer_id", many=True, columns=("seq", "city"),
    )  # fmt: skip
    ids = pa.array([3, 4, 7, None, 3, 999], pa.int64())
    batch = pa.RecordBatch.from_pydict({"customer_id": ids})
    expected = per_row_pairs(many, batch.to_pylist())
    assert [i for i, _ in expected] == [0, 0, 0, 2, 2, 2, 4, 4, 4]
    assert columnar_pairs(many, batch) == expected

    def regional() -> PostgresLookup:
        return PostgresLookup(
            pg_tables.dsn,
            f"SELECT region, id, name FROM {pg_tables.regional} "
            "WHERE (region, id) IN (SELECT * FROM unnest($1::text[], $2::int[]))",
            key=("r", "i"), on=("region", "id"), columns=("name",),
        )  # fmt: skip

    batch = pa.RecordBatch.from_pydict(
        {"r": ["eu", "us", "eu", None, "us"], "i": pa.array([2, 3, 9, 1, 1], pa.int32())}
    )
    expected = per_row_pairs(regional(), batch.to_pylist())
    assert [r["name"] for _, r in expected] == ["eu-two", "us-three", "us-one"]
    assert columnar_pairs(regional(), batch) == expected

    cached = _lookup(pg_tables, cache=LookupCache(60, max_size=100))
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([1, 2, 1, 300], pa.int64())})
    assert columnar_pairs(cached, batch) == per_row_pairs(_lookup(pg_tables), batch.to_pylist())
    assert columnar_pairs(cached, batch) == per_row_pairs(_lookup(pg_tables), batch.to_pylist())
    assert cached.cache is not None and cached.cache.statistics().hits >= 3


@pytest.mark.parametrize("cached", [False, True], ids=["arrow kernels", "general path"])
def test_arrow_one_to_one_with_two_matches_fails_those_rows_alone(
    pg_tables: PgTables, cached: bool
) -> None:
    ambiguous = PostgresLookup(
        pg_tables.dsn, f"SELECT customer_id, city FROM {pg_tables.addresses} "
        "WHERE customer_id = ANY($1)", key="customer_id", columns=("city",),
        cache=LookupCache(ttl=60) if cached else None,
    )  # fmt: skip
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([3, 1, 3, 5], pa.int64())})

    async def go() -> Any:
        async with ambiguous:
            return await ambiguous.async_invoke_arrow(batch)

    result = run_isolated(go())
    assert isinstance(result, ArrowResult)
    assert sorted(result.errors) == [0, 2]  # the rows of key 3, as one row at a time
    for exc in result.errors.values():
        assert isinstance(exc, LookupAmbiguousError)
        assert "key 3 matched 3 rows" in str(exc)
    answered = pa.array(result.row_index).to_pylist()
    assert answered == [1, 3]  # 1 and 5 have one address each
    one_at_a_time = per_row_pairs(ambiguous, [{"customer_id": 1}, {"customer_id": 5}])
    assert pa.array(result.columns["city"]).to_pylist() == [r["city"] for _, r in one_at_a_time]


def test_arrow_key_column_errors_name_the_column(pg_tables: PgTables) -> None:
    with pytest.raises(LookupKeyError, match=r"no key column 'customer_id'.*\['id'\]"):
        columnar_pairs(_lookup(pg_tables), pa.RecordBatch.from_pydict({"id": [1]}))
    nested = pa.RecordBatch.from_pydict({"customer_id": pa.array([[1]], pa.list_(pa.int64()))})
    with pytest.raises(LookupKeyError, match="'customer_id' has the nested type"):
        columnar_pairs(_lookup(pg_tables), nested)


def test_a_function_with_only_async_invoke_chunk_gets_dict_rows(spark: SparkSession) -> None:
    class DictChunks(AsyncFunction[Any, Any]):
        async def async_invoke(self, row: Any) -> Any:
            raise AssertionError("per-row path used")

        async def async_invoke_chunk(self, rows: list[dict[str, Any]]) -> Any:
            assert all(type(r) is dict for r in rows)
            return [[{"name": f"n{r['customer_id']}"}] * (r["id"] % 2) for r in rows]

    rows = ordered_wait(
        _orders(spark, 50), DictChunks(), timeout=10, output_schema="name string", chunk_size=8,
    ).collect()  # fmt: skip
    assert [(r.id, r.name) for r in rows] == [(i, f"n{i % 250 + 1}") for i in range(1, 50, 2)]


# -- the columnar transport: the query's result as one row of arrays -----------------------------
def test_aggregate_sql_wraps_the_query_and_survives_a_trailing_comment() -> None:
    sql = aggregate_sql('SELECT id, "Na""me" FROM t WHERE id = ANY($1); ', ["id", 'Na"me'])
    assert sql == (
        'SELECT array_agg(q."id"), array_agg(q."Na""me")\n'
        'FROM (\nSELECT id, "Na""me" FROM t WHERE id = ANY($1)\n) AS q'
    )
    assert aggregate_sql("SELECT 1 -- note", ["x"]).endswith("-- note\n) AS q")


def test_arrow_lookup_reads_the_result_as_arrays(pg_tables: PgTables) -> None:
    lookup = CountingLookup(
        pg_tables.dsn,
        # a trailing comment, NULLs in a result column, a computed column
        f"SELECT id, name, tier, id * 2 AS twice FROM {pg_tables.customers} "
        "WHERE id = ANY($1) -- the customers",
        key="customer_id", on="id", batch_size=3,
    )  # fmt: skip
    ids = [5, 250, None, 5, 17, 199, 3, 0, 6, 7]
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array(ids, pa.int64())})
    expected = per_row_pairs(_lookup(pg_tables), batch.to_pylist())
    got = columnar_pairs(lookup, batch)
    assert [(i, {"name": r["name"], "tier": r["tier"]}) for i, r in got] == expected
    assert [r["twice"] for _, r in got] == [2 * ids[i] for i, _ in got]  # type: ignore[operator]
    assert len(lookup.sql) == 3  # 7 distinct keys, at most 3 per query
    assert all(s.startswith("SELECT array_agg(q.") for s in lookup.sql)

    nothing = CountingLookup(
        pg_tables.dsn, f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1);",
        key="customer_id", on="id",
    )  # fmt: skip
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([0, 999], pa.int64())})
    assert columnar_pairs(nothing, batch) == []  # array_agg over no rows is NULL: no match
    assert nothing.sql[0].startswith("SELECT array_agg(")


def test_arrow_lookup_falls_back_to_records_for_columns_arrays_cannot_carry(
    pg_tables: PgTables,
) -> None:
    t = pg_tables.customers
    queries = {
        # an array column: array_agg would make it a two-dimensional array
        "array": f"SELECT id, name, ARRAY[id, id + 1] AS pair FROM {t} WHERE id = ANY($1)",
        # two result columns of one name
        "duplicate": f"SELECT id, name, tier AS name FROM {t} WHERE id = ANY($1)",
    }
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([3, 4, 3, 500], pa.int64())})
    for kind, query in queries.items():
        lookup = CountingLookup(pg_tables.dsn, query, key="customer_id", on="id", columns=("name",))
        got = columnar_pairs(lookup, batch)
        assert got == [(0, {"name": "customer-3"}), (1, {"name": "customer-4"}),
                       (2, {"name": "customer-3"})], kind  # fmt: skip
        assert lookup.sql == [query], kind  # records, not arrays
    pair = columnar_pairs(
        PostgresLookup(pg_tables.dsn, queries["array"], key="customer_id", on="id"), batch
    )
    assert [r["pair"] for _, r in pair] == [[3, 4], [4, 5], [3, 4]]

    # A composite column is of no type in ARRAY_OIDS: the probe chooses records.
    whole = f"SELECT c.id, c AS whole FROM {t} c WHERE c.id = ANY($1)"
    lookup = CountingLookup(pg_tables.dsn, whole, key="customer_id", on="id", columns=("whole",))

    async def probe() -> Any:
        async with lookup:
            return await lookup._probe_columnar(lookup._require_runtime())

    assert run_isolated(probe()) is None


def test_arrow_lookup_with_bad_sql_raises_the_query_error(pg_tables: PgTables) -> None:
    broken = PostgresLookup(
        pg_tables.dsn, f"SELECT id, nme FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="customer_id", on="id",
    )  # fmt: skip
    batch = pa.RecordBatch.from_pydict({"customer_id": pa.array([1], pa.int64())})
    with pytest.raises(LookupQueryError, match=r'column "nme" does not exist'):
        columnar_pairs(broken, batch)
