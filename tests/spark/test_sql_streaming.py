"""A registered SQL function in a streaming query (``selectExpr`` on a stream of files, a
Parquet sink with a checkpoint location) is exact through a restart: the query is stopped
while a micro-batch's lookups are in flight and restarted from its checkpoint; the sink
then holds each input row exactly once with its lookup's value, and the stopped
micro-batch's rows were looked up again (a SQL function checkpoints no rows in flight). A
table function works over a streaming view too."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops.spark import register, register_table
from tests.cross_process import first_time, log_request, requests
from tests.spark.conftest import spark

__all__ = ["spark"]

pytestmark = pytest.mark.spark

ROWS = 20  # per file, one file per micro-batch
HANG = 25  # in the second file: its first lookup waits until the query is stopped


class SlowOnce(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """``v = 3 * id``; every lookup logged to a file (workers are other processes); the
    first lookup of ``HANG`` ever made waits, long."""

    def __init__(self, log: str, markers: str) -> None:
        self.log = log
        self.markers = markers

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.log, row["id"])
        if row["id"] == HANG and first_time(self.markers, HANG):
            await asyncio.sleep(300)
        return [{"v": 3 * row["id"]}]


def test_streaming_sql_function_is_exact_through_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    src, sink, markers = tmp_path / "in", tmp_path / "out", tmp_path / "markers"
    src.mkdir()
    markers.mkdir()
    log = tmp_path / "requests.txt"
    first_mtime = int(time.time()) - 10
    for f in range(3):
        path = src / f"part-{f}.json"
        path.write_text("\n".join(json.dumps({"id": f * ROWS + j}) for j in range(ROWS)))
        os.utime(path, (first_mtime + f, first_mtime + f))  # read in this order
    register(spark, "sql_stream_triple", SlowOnce(str(log), str(markers)), timeout=600,
             input_schema="id long", output_schema="v long", capacity=4)  # fmt: skip
    commits = tmp_path / "spark-ckpt" / "commits"

    def start(**trigger: Any) -> Any:
        stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(src))
        enriched = stream.selectExpr("id", "sql_stream_triple(id) AS c").selectExpr("id", "c.v")
        return (
            enriched.writeStream.format("parquet").option("path", str(sink))
            .option("checkpointLocation", str(tmp_path / "spark-ckpt")).trigger(**trigger).start()
        )  # fmt: skip

    query = start(processingTime="0 seconds")
    deadline = time.monotonic() + 120
    while not (markers / str(HANG)).exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the second micro-batch's lookups are in flight
    assert (markers / str(HANG)).exists(), query.lastProgress
    query.stop()
    assert sorted(p.name for p in commits.iterdir() if p.name.isdigit()) == ["0"]

    restarted = start(availableNow=True)  # from the checkpoint: batch 1 runs again
    assert restarted.awaitTermination(120) and restarted.exception() is None

    rows = spark.read.parquet(str(sink)).collect()
    assert Counter(r.id for r in rows) == Counter(range(3 * ROWS))  # each row exactly once
    assert all(r.v == 3 * r.id for r in rows)
    looked_up = requests(log)
    assert all(looked_up[i] == 1 for i in [*range(ROWS), *range(2 * ROWS, 3 * ROWS)])
    # the stopped micro-batch's lookups were made again by the batch that replaced it
    assert all(looked_up[i] == 2 for i in range(ROWS, HANG + 1)), looked_up
    assert all(looked_up[i] in (1, 2) for i in range(HANG + 1, 2 * ROWS)), looked_up


def test_table_function_in_a_streaming_query(spark: SparkSession, tmp_path: Path) -> None:
    """A table function over a streaming view: each micro-batch's rows fan out."""
    src = tmp_path / "in"
    src.mkdir()
    for f in range(2):
        (src / f"part-{f}.json").write_text(
            "\n".join(json.dumps({"id": f * 10 + j}) for j in range(10))
        )

    async def fan(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [] if row["id"] % 5 == 0 else [{"v": row["id"]}, {"v": -row["id"]}]

    register_table(spark, "sql_stream_fan", fan, timeout=30, input_schema="id long",
                   output_schema="v long")  # fmt: skip
    stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(src))
    stream.createOrReplaceTempView("sql_stream_ids")
    try:
        query = (
            spark.sql("SELECT * FROM sql_stream_fan(TABLE(sql_stream_ids))")
            .writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        assert query.awaitTermination(120) and query.exception() is None
    finally:
        spark.catalog.dropTempView("sql_stream_ids")
    got = Counter((r.id, r.v) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == Counter((i, s * i) for i in range(20) if i % 5 for s in (1, -1))
