"""PostgresLookup runs columnar by default, with the output of one row at a time.

Each case runs the same lookup twice on the same DataFrame: with the defaults
(``chunk_size="auto"``: chunks of ``batch_size * pool_size`` rows answered by
``async_invoke_arrow``) and with ``chunk_size=None`` (the per-row path), and
compares the rows: ordered, unordered, keyed, event time, checkpointed, error
rows (keys that match several rows of a one-to-one lookup fail alone), rows
kept without a match, fan-out.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait
from tests.spark.conftest import spark

from .support import PgTables

pytestmark = [pytest.mark.spark, pytest.mark.postgres]
__all__ = ["spark"]

N = 900


def orders(spark: SparkSession) -> DataFrame:
    """Orders of customers 1..230 (201..230 have no row), with an event time."""
    return spark.range(0, N, numPartitions=3).select(
        F.col("id"),
        ((F.col("id") * 7) % 230 + 1).cast("int").alias("customer_id"),
        F.timestamp_seconds(F.col("id") * 2 - (F.col("id") % 7) * 9).alias("ts"),
    )


def customers(t: PgTables) -> PostgresLookup:
    return PostgresLookup(
        t.dsn, f"SELECT id, name, tier FROM {t.customers} WHERE id = ANY($1)",
        key="customer_id", on="id",
    )  # fmt: skip


def addresses(t: PgTables, many: bool) -> PostgresLookup:
    """Customer c has c % 4 addresses (customers 1..20): one-to-one is ambiguous for some."""
    return PostgresLookup(
        t.dsn, f"SELECT customer_id, city FROM {t.addresses} WHERE customer_id = ANY($1) "
        "ORDER BY customer_id, seq", key="customer_id", many=many,
    )  # fmt: skip


def both(wait: Any, df: DataFrame, lookup: PostgresLookup, **options: Any) -> list[list[Row]]:
    """The rows of the defaults and of the per-row path; the defaults ran as chunks.

    The metrics count rows on both paths; ``chunks`` counts the chunks (none row by row).
    """
    out = []
    for chunk_size in ("auto", None):
        metrics = AsyncMetrics(df.sparkSession)
        rows = wait(
            df, lookup, timeout=30, metrics=metrics, chunk_size=chunk_size, **options
        ).collect()
        summary = metrics.summary()
        assert summary["received"] == N and summary["completed"] == N, summary  # rows
        if chunk_size is None:
            assert summary["chunks"] == 0, summary
        else:
            assert 0 < summary["chunks"] < N / 2, summary  # chunks (keyed: one key group each)
        out.append(rows)
    return out


def test_ordered(spark: SparkSession, pg_tables: PgTables) -> None:
    auto, per_row = both(
        ordered_wait, orders(spark), customers(pg_tables), output_schema="name string, tier string",
        on_empty="drop",
    )  # fmt: skip
    assert auto == per_row
    assert len(auto) == len([i for i in range(N) if (i * 7) % 230 + 1 <= 200])


def test_unordered(spark: SparkSession, pg_tables: PgTables) -> None:
    auto, per_row = both(
        unordered_wait, orders(spark), customers(pg_tables), output_schema="name string"
    )
    assert sorted(auto) == sorted(per_row) and auto


def test_keyed_keeps_each_keys_order(spark: SparkSession, pg_tables: PgTables) -> None:
    auto, per_row = both(
        unordered_wait, orders(spark), customers(pg_tables), output_schema="name string",
        key="customer_id", num_partitions=2,
    )  # fmt: skip
    assert sorted(auto) == sorted(per_row)

    def by_key(rows: list[Row]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            out[r.customer_id].append(r.id)
        return dict(out)

    assert by_key(auto) == by_key(per_row)
    assert all(ids == sorted(ids) for ids in by_key(auto).values())


def test_event_time_marks_the_same_rows_late(spark: SparkSession, pg_tables: PgTables) -> None:
    auto, per_row = both(
        unordered_wait, orders(spark), customers(pg_tables), output_schema="name string",
        event_time="ts", watermark_delay="10 seconds", watermark_interval=50,
    )  # fmt: skip
    assert sorted(auto) == sorted(per_row)
    assert any(r._late for r in auto) and not all(r._late for r in auto)


def test_checkpointed(spark: SparkSession, pg_tables: PgTables, tmp_path: Path) -> None:
    auto, per_row = both(
        ordered_wait, orders(spark), customers(pg_tables), output_schema="name string",
        checkpoint_location=str(tmp_path / "ckpt"), uid="customers",
    )  # fmt: skip
    assert auto == per_row and auto


def test_rows_with_an_ambiguous_key_are_error_rows_alone(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    auto, per_row = both(
        ordered_wait, orders(spark), addresses(pg_tables, many=False),
        output_schema="city string", on_error="error_column", on_empty="keep",
    )  # fmt: skip
    assert auto == per_row
    failed = {r.customer_id for r in auto if r._error is not None}
    assert failed == {c for c in range(1, 21) if c % 4 >= 2}
    assert {r._error.exception for r in auto if r._error is not None} == {"LookupAmbiguousError"}
    assert len(auto) == N  # every row once: matched, kept without a match, or an error row


def test_fan_out(spark: SparkSession, pg_tables: PgTables) -> None:
    auto, per_row = both(
        ordered_wait, orders(spark), addresses(pg_tables, many=True), output_schema="city string"
    )
    assert auto == per_row
    assert len(auto) > len({r.id for r in auto})  # some orders fanned out


def test_backslashes_an_outer_join_and_null_keys_answer_as_per_row(
    spark: SparkSession, pg_tables: PgTables
) -> None:
    # Text with backslashes (bytea's escape character), an outer join whose unmatched
    # keys come back with a NULL key, and input rows with a NULL key.
    lookup = PostgresLookup(
        pg_tables.dsn,
        f"""SELECT c.id, c.name || E'\\\\temp\\\\x\\\\\\\\' AS name
            FROM unnest($1::int[]) AS k(id) LEFT JOIN {pg_tables.customers} c ON c.id = k.id""",
        key="customer_id", on="id",
    )  # fmt: skip
    df = orders(spark).withColumn(
        "customer_id", F.when(F.col("id") % 11 == 0, None).otherwise(F.col("customer_id"))
    )
    auto, per_row = both(ordered_wait, df, lookup, output_schema="name string", on_empty="drop")
    assert auto == per_row
    matched = [i for i in range(N) if i % 11 and (i * 7) % 230 + 1 <= 200]
    assert [r["id"] for r in auto] == matched
    assert auto[0]["name"] == f"customer-{auto[0]['customer_id']}\\temp\\x\\\\"
