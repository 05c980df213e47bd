"""A streaming micro-batch starts from the version the previous one wrote, or fails.

Micro-batch ``N`` restores version ``N - 1``. When that version holds nothing while
an earlier one does (deleted by hand, or written where this executor cannot see
it), the batch fails naming both versions: starting from an older version, or from
nothing, would drop the changes of the micro-batches after it without a word.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from asyncio_ops.spark import keyed_process
from tests.spark.test_keyed_process import RunningCount, _write

pytestmark = pytest.mark.spark


def _run(spark: SparkSession, tmp: Path) -> Exception | None:
    stream = (
        spark.readStream.schema("event long, user string, ts double")
        .option("maxFilesPerTrigger", 1).json(str(tmp / "in"))
    )  # fmt: skip
    out = keyed_process(
        stream, RunningCount(), key="user", event_time="ts", uid="counts",
        output_schema="event long, user string, n long, ok boolean",
        checkpoint_location=str(tmp / "state"), num_partitions=1,
    )  # fmt: skip
    query = (
        out.writeStream.format("parquet").option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        query.awaitTermination(180)
    except Exception as exc:  # the failed batch, raised by awaitTermination
        return exc
    return query.exception()


def test_a_deleted_newest_version_fails_the_next_micro_batch_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    for f in range(2):
        _write(tmp_path / "in", f"a-{f}.json", [(f * 10 + i, "u", f * 10.0 + i) for i in range(3)])
    assert _run(spark, tmp_path) is None
    counts = [r.n for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(counts) == [1, 2, 3, 4, 5, 6]
    newest = tmp_path / "state" / "counts" / "v0000000001"
    assert newest.is_dir()
    shutil.rmtree(newest)

    _write(tmp_path / "in", "b-0.json", [(100, "u", 100.0)])
    error = _run(spark, tmp_path)
    assert error is not None
    assert "checkpoint version 1" in str(error) and "while version 0 does" in str(error)
    # nothing was committed from empty state: u's count never restarted at 1
    counts = [r.n for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(counts) == [1, 2, 3, 4, 5, 6]
