"""Postgres types into Spark types, the same on the per-row and the columnar path.

One table holds a value of each Postgres type (and a row of NULLs); a lookup reads
it into the Spark type docs/connectors.md's table names, per row and with
``chunk_size``, and both must give exactly the expected values: ``numeric`` into
``decimal(p,s)`` exactly and into ``double``/``float`` rounded once, ``uuid`` as its
text. A value a declared type cannot hold fails naming the column and the value.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import SparkSession

from asyncio_ops.spark import ordered_wait
from tests.spark.conftest import spark

from .support import pg_execute

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

U = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
# (column, Postgres type, SQL literal, Spark type, the value Spark must hold)
CASES: list[tuple[str, str, str, str, Any]] = [
    ("c_int2", "smallint", "7", "short", 7),
    ("c_int4", "integer", "-70000", "int", -70000),
    ("c_int8", "bigint", "9007199254740993", "long", 9007199254740993),
    ("c_dec", "numeric(12,3)", "123456789.125", "decimal(12,3)", Decimal("123456789.125")),
    ("c_dec_wide", "numeric", "2.84", "decimal(38,10)", Decimal("2.8400000000")),
    ("c_num_double", "numeric", "2.84", "double", 2.84),
    ("c_num_tiny", "numeric", "1e-30", "double", 1e-30),
    ("c_num_float", "numeric", "2.84", "float", 2.8399999141693115),
    ("c_num_long", "numeric", "42", "long", 42),
    ("c_num_frac", "numeric", "7.5", "double", 7.5),
    ("c_real", "real", "1.1", "float", 1.100000023841858),
    ("c_double", "double precision", "2.84", "double", 2.84),
    ("c_text", "text", "'héllo'", "string", "héllo"),
    ("c_varchar", "varchar(10)", "'ab'", "string", "ab"),
    ("c_char", "char(3)", "'ab'", "string", "ab "),
    ("c_bool", "boolean", "true", "boolean", True),
    ("c_date", "date", "'2024-02-29'", "date", dt.date(2024, 2, 29)),
    ("c_ts", "timestamp", "'2024-02-29 12:34:56.789'", "timestamp_ntz",
     dt.datetime(2024, 2, 29, 12, 34, 56, 789000)),
    ("c_bytea", "bytea", "'\\x0102'", "binary", b"\x01\x02"),
    ("c_jsonb", "jsonb", "'{\"a\": 1}'", "string", '{"a": 1}'),
    ("c_uuid", "uuid", f"'{U}'", "string", U),
    ("c_ints", "integer[]", "'{1,2}'", "array<int>", [1, 2]),
    ("c_texts", "text[]", "'{a,NULL}'", "array<string>", ["a", None]),
    ("c_nums", "numeric[]", "'{0.1,2.84}'", "array<double>", [0.1, 2.84]),
]  # fmt: skip


@pytest.fixture(scope="module")
def typed_table(pg_dsn: str) -> Iterator[str]:
    table = f"aops_types_{uuid.uuid4().hex[:10]}"
    columns = ", ".join(f"{c} {pg}" for c, pg, _, _, _ in CASES)
    values = ", ".join(f"{lit}::{pg}" for _, pg, lit, _, _ in CASES)
    pg_execute(
        pg_dsn,
        f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})",
        f"INSERT INTO {table} VALUES (1, {values}), (2{', NULL' * len(CASES)})",
    )
    try:
        yield table
    finally:
        pg_execute(pg_dsn, f"DROP TABLE IF EXISTS {table}")


def _lookup(dsn: str, table: str, columns: str) -> PostgresLookup:
    return PostgresLookup(dsn, f"SELECT id, {columns} FROM {table} WHERE id = ANY($1)",
                          key="id", on="id")  # fmt: skip


@pytest.mark.parametrize("chunk_size", [None, 64], ids=["per-row", "columnar"])
def test_each_postgres_type_arrives_as_its_spark_type(
    spark: SparkSession, pg_dsn: str, typed_table: str, chunk_size: int | None
) -> None:
    schema = ", ".join(f"{c} {st}" for c, _, _, st, _ in CASES)
    lookup = _lookup(pg_dsn, typed_table, ", ".join(c for c, *_ in CASES))
    df = spark.createDataFrame([(1,), (2,), (3,)], "id int")
    rows = ordered_wait(df, lookup, timeout=30, output_schema=schema, chunk_size=chunk_size,
                        on_empty="drop").orderBy("id").collect()  # fmt: skip
    assert [r.id for r in rows] == [1, 2]  # 3 has no match: dropped, as an inner join
    got, nulls = rows[0].asDict(), rows[1].asDict()
    for column, pg, _, spark_type, want in CASES:
        assert got[column] == want, f"{pg} -> {spark_type}: {got[column]!r} != {want!r}"
        assert type(got[column]) is type(want), f"{pg} -> {spark_type}: {got[column]!r}"
        assert nulls[column] is None, f"{pg} -> {spark_type}: NULL became {nulls[column]!r}"


@pytest.mark.parametrize("chunk_size", [None, 64], ids=["per-row", "columnar"])
@pytest.mark.parametrize(
    ("column", "spark_type", "shown"),
    [
        ("c_dec", "decimal(10,3)", "123456789.125"),  # too many digits: would overflow
        ("c_dec", "decimal(12,2)", "123456789.125"),  # too many places: would round
        ("c_num_tiny", "decimal(38,6)", "1E-30"),
        ("c_num_frac", "long", "7.5"),  # a fraction is never truncated
        ("c_text", "double", "héllo"),
    ],
)
def test_a_value_the_declared_type_cannot_hold_is_named(
    spark: SparkSession,
    pg_dsn: str,
    typed_table: str,
    chunk_size: int | None,
    column: str,
    spark_type: str,
    shown: str,
) -> None:
    df = spark.createDataFrame([(1,)], "id int")
    out = ordered_wait(df, _lookup(pg_dsn, typed_table, column), timeout=30,
                       output_schema=f"{column} {spark_type}", chunk_size=chunk_size)  # fmt: skip
    with pytest.raises(Exception, match=rf"output column '{column}' \(.*\) cannot hold .*{shown}"):
        out.collect()
