"""Checkpoints on real Spark: task retries reuse completed lookups; streaming carry-over
survives a restarted query with each row exactly once in the sink."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction, CheckpointError
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait
from tests.cross_process import first_attempt, first_time, log_request, requests
from tests.spark.conftest import arrow_batch_rows

pytestmark = pytest.mark.spark


class RequestLog(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Appends every request to a file (workers are separate processes)."""

    def __init__(self, path: str, kill_at: int | None = None) -> None:
        self.path = path
        self.kill_at = kill_at

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.path, row["id"])
        if row["id"] == self.kill_at and first_attempt():
            os._exit(23)
        await asyncio.sleep(0)
        return [{"double": row["id"] * 2}]


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    with arrow_batch_rows(spark, 100):
        yield


def test_killed_worker_retry_does_not_repeat_completed_lookups(
    spark: SparkSession, tmp_path: Path, small_arrow_batches: None
) -> None:
    log = tmp_path / "requests.txt"
    out = ordered_wait(
        spark.range(0, 2000, numPartitions=2), RequestLog(str(log), kill_at=1500),
        timeout=10, capacity=50, output_schema="double long",
        checkpoint_location=str(tmp_path / "ckpt"), checkpoint_flush_rows=50,
    )  # fmt: skip
    rows = out.collect()
    assert [(r.id, r.double) for r in rows] == [(i, 2 * i) for i in range(2000)]
    counts = requests(log)
    assert set(counts) == set(range(2000))
    repeated = sorted(i for i, n in counts.items() if n > 1)
    # Without the replay log, 1000..1500 (all the crashed attempt did) would repeat;
    # with it, at most the lookups in flight (capacity) and one unflushed stretch do.
    assert repeated, "the first attempt really crashed and was retried"
    tree = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "ckpt").rglob("*"))
    assert min(repeated) >= 1400 and len(repeated) <= 50 + 50, tree


def test_without_checkpoint_the_retry_repeats_everything(
    spark: SparkSession, tmp_path: Path, small_arrow_batches: None
) -> None:
    log = tmp_path / "requests.txt"
    out = ordered_wait(
        spark.range(0, 2000, numPartitions=2), RequestLog(str(log), kill_at=1500),
        timeout=10, capacity=50, output_schema="double long",
    )  # fmt: skip
    assert out.count() == 2000
    counts = requests(log)
    assert all(counts[i] == 2 for i in range(1000, 1500))


def test_unwritable_checkpoint_location_is_named_on_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="a-file"):
        ordered_wait(
            spark.range(3), RequestLog(str(tmp_path / "r")), timeout=1,
            output_schema="double long", checkpoint_location=str(blocker / "ckpt"),
        )  # fmt: skip


class SlowFirstTime(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Rows with ``id % 7 == 0`` below ``slow_below`` hang on their first request."""

    def __init__(self, marker_dir: str, slow_below: int) -> None:
        self.marker_dir = marker_dir
        self.slow_below = slow_below

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        i = row["id"]
        if i % 7 == 0 and i < self.slow_below and first_time(self.marker_dir, i):
            await asyncio.sleep(60)
        return [{"double": i * 2}]


def _write_files(src: Path, start: int, count: int, rows: int = 30) -> None:
    for f in range(start, start + count):
        lines = [json.dumps({"id": f * rows + j, "ts": f * rows + j}) for j in range(rows)]
        (src / f"part-{f:03d}.json").write_text("\n".join(lines))


@pytest.mark.parametrize(
    ("key", "before", "after", "backend"),
    [(None, 2, 2, "heap"), ("id", 2, 3, "heap"), ("id", 3, 2, "rocksdb")],
    ids=["unkeyed", "keyed-rescaled", "keyed-rescaled-rocksdb"],
)
def test_streaming_carry_over_survives_a_restart_exactly_once(
    spark: SparkSession, tmp_path: Path, key: str | None, before: int, after: int, backend: str
) -> None:
    src, sink, markers = tmp_path / "in", tmp_path / "out", tmp_path / "markers"
    for d in (src, markers):
        d.mkdir()
    fn = SlowFirstTime(str(markers), slow_below=90)

    def run_query(partitions: int) -> None:
        stream = (
            spark.readStream.schema("id long, ts double").option("maxFilesPerTrigger", 1)
            .json(str(src))
        )  # fmt: skip
        enriched = unordered_wait(
            stream, fn, timeout=120, capacity=100, output_schema="double long",
            event_time="ts", watermark_delay=5, checkpoint_location=str(tmp_path / "aops"),
            drain_timeout=0.5, num_partitions=partitions, key=key, state_backend=backend,
        )  # fmt: skip
        query = (
            enriched.writeStream.format("parquet").option("path", str(sink))
            .option("checkpointLocation", str(tmp_path / "spark-ckpt"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(120)
        assert query.exception() is None

    _write_files(src, 0, 3)  # ids 0..89: multiples of 7 hang once and are carried over
    run_query(before)
    first = spark.read.parquet(str(sink)).collect()
    ids_first = {r.id for r in first}
    assert ids_first and len(ids_first) < 90  # some rows were still in flight at the end
    assert {r.double for r in first} == {2 * i for i in ids_first}

    _write_files(src, 3, 3)  # the query restarts from its checkpoint with new files
    run_query(after)  # keyed: carried rows move to their key group's new partition
    ids = [r.id for r in spark.read.parquet(str(sink)).collect()]
    assert sorted(ids) == list(range(180))  # every row exactly once
    assert len(os.listdir(markers)) == len([i for i in range(90) if i % 7 == 0])


def test_metrics_count_replayed_rows(
    spark: SparkSession, tmp_path: Path, small_arrow_batches: None
) -> None:
    log = tmp_path / "requests.txt"
    metrics = AsyncMetrics(spark)
    out = unordered_wait(
        spark.range(0, 400, numPartitions=1), RequestLog(str(log)), timeout=10,
        output_schema="double long", checkpoint_location=str(tmp_path / "ckpt"),
        checkpoint_version=7, metrics=metrics,
    )  # fmt: skip
    assert out.count() == 400
    assert metrics.summary()["replayed"] == 0
    # a second action on the same plan is the same job run (same version): served from the log
    assert sorted(r.double for r in out.collect()) == [2 * i for i in range(400)]
    assert metrics.summary()["replayed"] == 400
    assert requests(log) == Counter(range(400))
