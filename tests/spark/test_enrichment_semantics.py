"""Enrichment semantics, the same on every path (per row, ``chunk_size`` with dict
chunks, columnar): ``on_empty="drop"`` is an inner join, ``"keep"`` a left join (the
row once, its output columns null); a bare value fills a one-column output;
``rows_as="row"`` hands the function ``pyspark.sql.Row``s; a subclass whose per-row
override ``chunk_size`` would bypass is refused on the driver."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from asyncio_ops import AsyncFunction, ConfigurationError
from asyncio_ops.spark import ordered_wait, unordered_wait

N = 40


def _name(i: int) -> list[str]:
    """The lookup's answer for id ``i``: nothing for multiples of 3, two names for
    multiples of 5, else one."""
    if i % 3 == 0:
        return []
    return [f"a{i}", f"b{i}"] if i % 5 == 0 else [f"a{i}"]


class PerRow(AsyncFunction[dict[str, Any], dict[str, Any]]):
    async def async_invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{"name": n} for n in _name(value["id"])]


class Chunks(PerRow):
    async def async_invoke_chunk(self, rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
        await asyncio.sleep(0)
        return [[{"name": n} for n in _name(r["id"])] for r in rows]


class Columnar(PerRow):
    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> tuple[Any, Any]:
        await asyncio.sleep(0)
        index, names = [], []
        for i, row_id in enumerate(batch.column("id").to_pylist()):
            for n in _name(row_id):
                index.append(i)
                names.append(n)
        return index, {"name": names}


PATHS = {"per-row": (PerRow, None), "chunks": (Chunks, 7), "columnar": (Columnar, 7)}


def _ids(spark: SparkSession) -> DataFrame:
    return spark.range(0, N, numPartitions=2).withColumn(
        "ts", F.timestamp_seconds(F.col("id")).cast("timestamp")
    )


def _expected(keep: bool, with_input: bool = True) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i in range(N):
        names = _name(i) or ([None] if keep else [])
        for n in names:
            out.append((i, n) if with_input else (n,))
    return out


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("wait", [ordered_wait, unordered_wait], ids=["ordered", "unordered"])
@pytest.mark.parametrize("on_empty", ["drop", "keep"])
def test_on_empty_is_an_inner_or_a_left_join_on_every_path(
    spark: SparkSession, path: str, wait: Any, on_empty: str
) -> None:
    cls, chunk_size = PATHS[path]
    out = wait(_ids(spark).select("id"), cls(), timeout=30, output_schema="name string",
               chunk_size=chunk_size, on_empty=on_empty)  # fmt: skip
    got = sorted((tuple(r) for r in out.collect()), key=repr)
    assert got == sorted(_expected(on_empty == "keep"), key=repr)


@pytest.mark.parametrize("path", list(PATHS))
def test_kept_rows_keep_input_order_in_ordered_mode(spark: SparkSession, path: str) -> None:
    cls, chunk_size = PATHS[path]
    df = _ids(spark).select("id").coalesce(1)
    out = ordered_wait(df, cls(), timeout=30, output_schema="name string",
                       chunk_size=chunk_size, on_empty="keep")  # fmt: skip
    assert [tuple(r) for r in out.collect()] == _expected(keep=True)


@pytest.mark.parametrize("path", list(PATHS))
def test_kept_rows_with_only_the_output_columns_and_event_time(
    spark: SparkSession, path: str
) -> None:
    cls, chunk_size = PATHS[path]
    out = unordered_wait(_ids(spark), cls(), timeout=30, output_schema="name string",
                         chunk_size=chunk_size, on_empty="keep", event_time="ts",
                         keep_input_columns=False)  # fmt: skip
    assert out.columns == ["name", "_late"]
    rows = out.collect()
    assert sorted((r.name for r in rows), key=repr) == sorted(
        (n for (n,) in _expected(keep=True, with_input=False)), key=repr
    )
    assert all(r._late is False for r in rows)


def test_a_chunk_whose_rows_all_miss_is_kept_whole(spark: SparkSession) -> None:
    class Never(Columnar):
        async def async_invoke_arrow(self, batch: pa.RecordBatch) -> tuple[Any, Any]:
            return [], {}

    out = ordered_wait(_ids(spark).select("id"), Never(), timeout=30, chunk_size=5,
                       output_schema="name string, n int", on_empty="keep")  # fmt: skip
    assert sorted(tuple(r) for r in out.collect()) == [(i, None, None) for i in range(N)]


def test_on_empty_is_validated(spark: SparkSession) -> None:
    with pytest.raises(ConfigurationError, match=r"on_empty.*'left'"):
        ordered_wait(_ids(spark), PerRow(), timeout=5, output_schema="name string",
                     on_empty="left")  # fmt: skip


class MissesAsEmptyDicts(Columnar):
    """Changes the per-row answer below the class that answers chunks."""

    async def async_invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        return await super().async_invoke(value) or [{}]


def test_chunks_that_would_bypass_a_per_row_override_are_refused(spark: SparkSession) -> None:
    df = _ids(spark).select("id")
    with pytest.raises(ConfigurationError, match=r"MissesAsEmptyDicts overrides async_invoke"):
        ordered_wait(df, MissesAsEmptyDicts(), timeout=5, output_schema="name string",
                     chunk_size=8)  # fmt: skip
    # per row, the override is what runs: every row once
    out = ordered_wait(df, MissesAsEmptyDicts(), timeout=5, output_schema="name string")
    assert out.count() == len(_expected(keep=True))


def test_a_bare_value_fills_a_one_column_output(spark: SparkSession) -> None:
    async def length(row: dict[str, Any]) -> list[int]:
        return [len(row["name"])]

    df = spark.createDataFrame([("ab",), ("abcd",)], "name string")
    out = ordered_wait(df, length, timeout=5, output_schema="n int")
    assert [tuple(r) for r in out.collect()] == [("ab", 2), ("abcd", 4)]


class RowReader(AsyncFunction[Row, Any]):
    """Reads its input as a pyspark Row: by attribute, by key and by position."""

    async def async_invoke(self, value: Row) -> list[Any]:
        assert isinstance(value, Row)
        if value.id == 2:
            await asyncio.sleep(60)  # times out: timeout() receives a Row too
        return [(f"{value.name}/{value['day']:%m-%d}/{value[0]}",)]

    def timeout(self, value: Row) -> list[Any]:
        assert isinstance(value, Row)
        return [Row(label=f"late {value.name}")]


def test_rows_as_row_hands_the_function_rows(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [(1, "x", dt.date(2024, 2, 29)), (2, "y", dt.date(2024, 3, 1))],
        "id int, name string, day date",
    )
    out = ordered_wait(df, RowReader(), timeout=1, output_schema="label string", rows_as="row")
    assert [r.label for r in out.collect()] == ["x/02-29/1", "late y"]
    with pytest.raises(ConfigurationError, match=r"rows_as='row'.*chunk_size"):
        ordered_wait(df, Chunks(), timeout=1, output_schema="label string", rows_as="row",
                     chunk_size=4)  # fmt: skip
