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


# rows 40..49 fail, rows 100..109 never answer (timed out): whole chunks of 10 on the chunk paths
FAILING, HANGING = range(40, 50), range(100, 110)


async def _answer(ids: Sequence[int]) -> None:
    if any(i in HANGING for i in ids):
        await asyncio.sleep(3600)
    if any(i in FAILING for i in ids):
        raise LookupError(f"no customer among {list(ids)}")


class FaultyPerRow(AsyncFunction[dict[str, Any], dict[str, Any]]):
    async def async_invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        await _answer([value["id"]])
        return [{"name": f"a{value['id']}"}]


class FaultyChunks(FaultyPerRow):
    async def async_invoke_chunk(self, rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
        await _answer([r["id"] for r in rows])
        return [[{"name": f"a{r['id']}"}] for r in rows]


class FaultyColumnar(FaultyPerRow):
    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> tuple[Any, Any]:
        ids = batch.column("id").to_pylist()
        await _answer(ids)
        return None, {"name": [f"a{i}" for i in ids]}


@pytest.mark.parametrize(
    ("cls", "chunk_size"),
    [(FaultyPerRow, None), (FaultyChunks, 10), (FaultyColumnar, 10)],
    ids=["per-row", "chunks", "columnar"],
)
def test_metrics_count_rows_on_every_path_and_chunks_beside_them(
    spark: SparkSession, cls: type, chunk_size: int | None
) -> None:
    """received, completed, timed_out, failed count rows whatever travels through the
    operator; ``chunks`` says how many chunks carried them (0 row by row)."""
    from asyncio_ops.spark import AsyncMetrics

    n = 200
    metrics = AsyncMetrics(spark)
    out = unordered_wait(
        spark.range(0, n, numPartitions=2), cls(), timeout=1.5, capacity=30,
        output_schema="name string", on_error="error_column", chunk_size=chunk_size,
        metrics=metrics,
    )  # fmt: skip
    rows = out.collect()
    assert len(rows) == n
    errors = sorted(r.id for r in rows if r._error is not None)
    assert errors == [*FAILING, *HANGING]
    m = metrics.summary()
    assert m["received"] == n and m["completed"] == n and m["emitted"] == n, m
    assert m["timed_out"] == len(HANGING), m
    assert m["failed"] == len(FAILING) + len(HANGING) == m["error_rows"], m
    assert m["chunks"] == (0 if chunk_size is None else n // chunk_size), m
