"""Keyed state never silently changes owner. A streaming ``keyed_process`` restarted from
its own Spark checkpoint after its source gained a column keeps its state (the default
uid does not change with the input's other columns, nor with the function's module); a
restart whose uid changed (a class renamed) is refused naming the uid the location
holds, unless pinned with ``uid=`` or started empty with
``allow_non_restored_state=True``; a second query on the first one's location and uid,
run after it, is refused naming both query ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import CheckpointError
from asyncio_ops.spark import keyed_process
from tests.spark.test_keyed_process import CountPerId

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


class RenamedCount(CountPerId):
    """The same function under another class name (another default uid)."""


def _file(src: Path, name: str, ids: list[int], extra: bool = False) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {"id": pa.array(ids, pa.int64())}
    if extra:
        columns["note"] = pa.array([f"n{i}" for i in ids])
    src.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), src / f"{name}.parquet")


def _run(
    spark: SparkSession, tmp: Path, query: str, fn: CountPerId, schema: str = "id long",
    **options: Any,
) -> list[tuple[int, int]]:  # fmt: skip
    """Everything in ``tmp/query/src`` through a streaming count per id (its own Spark
    checkpoint ``tmp/query/spark``, state under ``tmp/state``), once; the (id, n) rows
    it wrote in this run."""
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp / query / "src"))
    )
    out = keyed_process(stream, fn, key="id", output_schema="id long, n long",
                        checkpoint_location=str(tmp / "state"), num_partitions=2,
                        **options)  # fmt: skip
    sink = tmp / query / "out"
    before = _written(spark, sink)
    running = (
        out.writeStream.format("parquet").option("path", str(sink))
        .option("checkpointLocation", str(tmp / query / "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    running.awaitTermination()
    rows = _written(spark, sink)
    for row in before:
        rows.remove(row)
    return rows


def _written(spark: SparkSession, sink: Path) -> list[tuple[int, int]]:
    if not (sink / "_spark_metadata").exists():
        return []
    rows = spark.read.schema("id long, n long").parquet(str(sink)).collect()
    return sorted((r.id, r.n) for r in rows)


def test_a_new_input_column_keeps_the_state(spark: SparkSession, tmp_path: Path) -> None:
    _file(tmp_path / "q" / "src", "a", [1, 2])
    assert _run(spark, tmp_path, "q", CountPerId()) == [(1, 1), (2, 1)]
    _file(tmp_path / "q" / "src", "b", [1, 2], extra=True)  # the source gained a column
    again = _run(spark, tmp_path, "q", CountPerId(), schema="id long, note string")
    assert again == [(1, 2), (2, 2)]  # counted on, not from 1


def test_a_changed_uid_is_refused_unless_pinned_or_started_empty_on_purpose(
    spark: SparkSession, tmp_path: Path
) -> None:
    src = tmp_path / "q" / "src"
    _file(src, "a", [1])
    assert _run(spark, tmp_path, "q", CountPerId()) == [(1, 1)]
    (old,) = [p.name for p in (tmp_path / "state").iterdir()]
    _file(src, "b", [1])
    with pytest.raises(CheckpointError) as refused:
        _run(spark, tmp_path, "q", RenamedCount())
    message = str(refused.value)
    assert f"uid(s) ['{old}']" in message and f"uid={old!r}" in message
    assert "allow_non_restored_state=True" in message
    # pinned to the state it had: counted on
    assert _run(spark, tmp_path, "q", RenamedCount(), uid=old) == [(1, 2)]
    _file(src, "c", [1])
    # started empty on purpose: its own uid, from 1
    assert _run(spark, tmp_path, "q", RenamedCount(), allow_non_restored_state=True) == [(1, 1)]


def test_a_second_query_on_one_location_and_uid_is_refused_after_the_first_ran(
    spark: SparkSession, tmp_path: Path
) -> None:
    _file(tmp_path / "one" / "src", "a", [1, 2])
    assert _run(spark, tmp_path, "one", CountPerId()) == [(1, 1), (2, 1)]
    first = Path(tmp_path / "one" / "spark" / "metadata").read_text()
    _file(tmp_path / "two" / "src", "a", [1, 2])  # another query: its own source and sink
    with pytest.raises(CheckpointError) as refused:
        _run(spark, tmp_path, "two", CountPerId())
    message = str(refused.value)
    assert "holds the state of streaming query" in message
    assert first.split('"id":"')[1].split('"')[0] in message  # the first query's id
    # the first query restarted (its own checkpoint, its own id) goes on
    _file(tmp_path / "one" / "src", "b", [2])
    assert _run(spark, tmp_path, "one", CountPerId()) == [(2, 2)]
