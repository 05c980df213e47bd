"""Checkpoints across micro-batches and job runs, on real Spark: carried-over rows keep their
deadline, the watermark survives a batch boundary, a killed worker repeats a bounded number
of lookups, checkpoint identities never collide silently, and a crafted file never runs."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction, CheckpointError, ConfigurationError
from asyncio_ops._storage._container import MAGIC
from asyncio_ops.spark import ordered_wait, unordered_wait
from tests.cross_process import log_request, requests
from tests.spark.test_checkpoints import RequestLog

pytestmark = pytest.mark.spark


class Hangs(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Row ``hang`` never answers; every request is logged (workers are other processes)."""

    def __init__(self, log: str, hang: int) -> None:
        self.log = log
        self.hang = hang

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.log, row["id"])
        if row["id"] == self.hang:
            await asyncio.sleep(3600)
        return [{"v": row["id"] * 3}]


def _files(src: Path, rows: list[list[dict[str, Any]]], start: int = 0) -> None:
    src.mkdir(parents=True, exist_ok=True)
    first = 1_700_000_000
    for f, lines in enumerate(rows, start):
        path = src / f"part-{f:03d}.json"
        path.write_text("\n".join(json.dumps(r) for r in lines))
        os.utime(path, (first + f, first + f))  # read in this order, one file per batch


def _run_stream(spark: SparkSession, src: Path, sink: Path, work: Path, build: Any) -> None:
    stream = spark.readStream.schema("id long, ts double").option("maxFilesPerTrigger", 1)
    query = (
        build(stream.json(str(src))).writeStream.format("parquet").option("path", str(sink))
        .option("checkpointLocation", str(work / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key", [None, "id"], ids=["unkeyed", "keyed"])
def test_a_carried_over_row_times_out_at_its_first_deadline(
    spark: SparkSession, tmp_path: Path, key: str | None
) -> None:
    """A lookup slower than a micro-batch is carried over, not re-armed with a fresh
    timeout: it ends as a timeout error row, and the rows after it flow."""
    log, work, sink = tmp_path / "requests.txt", tmp_path / "work", tmp_path / "out"
    files = 12
    _files(tmp_path / "in", [[{"id": f * 10 + j, "ts": 0.0} for j in range(10)]
                             for f in range(files)])  # fmt: skip
    _run_stream(
        spark, tmp_path / "in", sink, work,
        lambda df: ordered_wait(
            df, Hangs(str(log), hang=0), timeout=1.0, output_schema="v long", key=key,
            on_error="error_column", checkpoint_location=str(work / "aops"),
            drain_timeout=0.3, num_partitions=1,
        ),
    )  # fmt: skip
    rows = {r.id: r for r in spark.read.parquet(str(sink)).collect()}
    assert sorted(rows) == list(range(files * 10))  # every row, once; none held back for good
    hung = rows[0]
    assert hung.v is None and hung._error.exception == "AsyncTimeoutError"
    assert all(rows[i].v == 3 * i for i in range(1, files * 10))
    counts = requests(log)
    # requested once per micro-batch it was carried through until its deadline passed
    assert 1 <= counts[0] < files
    assert all(counts[i] == 1 for i in range(1, files * 10))


class Triple(AsyncFunction[dict[str, Any], dict[str, Any]]):
    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"v": row["id"] * 3}]


@pytest.mark.timeout(240)
def test_the_watermark_survives_a_micro_batch_boundary(spark: SparkSession, tmp_path: Path) -> None:
    work, sink = tmp_path / "work", tmp_path / "out"
    _files(tmp_path / "in", [[{"id": 1, "ts": 200.0}], [{"id": 2, "ts": 60.0}]])
    _run_stream(
        spark, tmp_path / "in", sink, work,
        lambda df: unordered_wait(
            df, Triple(), timeout=5, output_schema="v long", event_time="ts",
            watermark_delay=0, watermark_interval=1, checkpoint_location=str(work / "aops"),
            num_partitions=2,
        ),
    )  # fmt: skip
    late = {r.id: r._late for r in spark.read.parquet(str(sink)).collect()}
    assert late == {1: False, 2: True}  # ts=60 arrived after watermark 200 of batch 0


@pytest.mark.timeout(240)
def test_a_killed_worker_repeats_at_most_capacity_plus_the_flush_count(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "requests.txt"
    rows, capacity, flush = 20_000, 64, 500
    out = ordered_wait(
        spark.range(0, rows, numPartitions=2), RequestLog(str(log), kill_at=17_000),
        timeout=30, capacity=capacity, output_schema="double long",
        checkpoint_location=str(tmp_path / "ckpt"), checkpoint_flush_rows=flush,
        checkpoint_flush_interval=60,
    )  # fmt: skip
    assert out.count() == rows
    counts = requests(log)
    assert set(counts) == set(range(rows))
    repeated = sum(n - 1 for n in counts.values())
    assert repeated > 0, "the first attempt really died and was retried"
    # the dead attempt's in-flight lookups plus fewer than one flush of completed ones
    assert repeated <= capacity + flush


class ReadsFile(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Answers with the current content of a file: the external data."""

    def __init__(self, data: str, log: str) -> None:
        self.data = data
        self.log = log

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.log, row["id"])
        with open(self.data) as f:  # noqa: ASYNC230 - a local file of a few bytes
            answer = f.read()
        return [{"answer": answer}]


def test_two_dataframes_built_before_either_runs_never_share_a_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    data, log, ckpt = tmp_path / "data.txt", tmp_path / "requests.txt", str(tmp_path / "ckpt")

    def build() -> Any:
        return ordered_wait(
            spark.range(0, 50, numPartitions=2), ReadsFile(str(data), str(log)), timeout=10,
            output_schema="answer string", checkpoint_location=ckpt, uid="answers",
        )  # fmt: skip

    first, second = build(), build()
    data.write_text("A")
    assert {r.answer for r in first.collect()} == {"A"}
    data.write_text("B")  # the external data changed
    assert {r.answer for r in second.collect()} == {"B"}
    assert {r.answer for r in first.collect()} == {"B"}  # another action, another run
    assert requests(log) == {i: 3 for i in range(50)}


class Plus(AsyncFunction[dict[str, Any], dict[str, Any]]):
    def __init__(self, column: str, add: int, markers: str) -> None:
        self.column = column
        self.add = add
        self.markers = markers

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        from tests.cross_process import first_time

        if row["id"] % 9 == 0 and first_time(self.markers, f"{self.column}-{row['id']}"):
            await asyncio.sleep(3600)  # carried over at least once, in each operator
        return [{self.column: row["id"] + self.add}]


@pytest.mark.timeout(300)
def test_two_operators_in_one_query_keep_their_own_checkpoints(
    spark: SparkSession, tmp_path: Path
) -> None:
    work, sink, markers = tmp_path / "work", tmp_path / "out", tmp_path / "markers"
    markers.mkdir()
    _files(tmp_path / "in", [[{"id": f * 20 + j, "ts": 0.0} for j in range(20)] for f in range(6)])
    location = str(work / "aops")

    def build(df: Any) -> Any:
        one = unordered_wait(
            df, Plus("a", 1, str(markers)), timeout=120, output_schema="a long",
            checkpoint_location=location, drain_timeout=0.3, num_partitions=2,
        )  # fmt: skip
        return unordered_wait(
            one, Plus("b", 2, str(markers)), timeout=120, output_schema="b long",
            checkpoint_location=location, drain_timeout=0.3, num_partitions=2,
        )  # fmt: skip

    _run_stream(spark, tmp_path / "in", sink, work, build)
    _files(tmp_path / "in", [[{"id": f * 20 + j, "ts": 0.0} for j in range(20)]
                             for f in range(6, 8)], start=6)  # fmt: skip
    _run_stream(spark, tmp_path / "in", sink, work, build)  # a restart, and more input
    assert len(os.listdir(location)) == 2  # one directory per operator
    out = spark.read.parquet(str(sink)).collect()
    ids = sorted(r.id for r in out)
    # everything but what the last batch still carries is in the sink, each row once
    assert len(ids) == len(set(ids))
    assert set(range(120)) <= set(ids) <= set(range(160))
    assert all(r.a == r.id + 1 and r.b == r.id + 2 for r in out)


def test_a_second_operator_with_the_same_uid_upstream_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = str(tmp_path / "ckpt")
    one = ordered_wait(
        spark.range(5), Triple(), timeout=5, output_schema="v long",
        checkpoint_location=location, uid="enrich",
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"uid 'enrich'.*ordered wait of .*Triple"):
        ordered_wait(
            one, Triple(), timeout=5, output_schema="w long", checkpoint_location=location,
            uid="enrich", keep_input_columns=False,
        )  # fmt: skip
    for bad in ("a/b", "..", ""):
        with pytest.raises(ConfigurationError, match="uid must be one path segment"):
            ordered_wait(
                spark.range(5), Triple(), timeout=5, output_schema="v long",
                checkpoint_location=location, uid=bad,
            )  # fmt: skip


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("format_version", [1, 2])
def test_a_crafted_checkpoint_file_fails_the_batch_and_never_runs(
    spark: SparkSession, tmp_path: Path, format_version: int
) -> None:
    work, sink, marker = tmp_path / "work", tmp_path / "out", tmp_path / "pwned"
    _files(tmp_path / "in", [[{"id": 0, "ts": 0.0}]])

    def build(df: Any) -> Any:
        return ordered_wait(
            df, Triple(), timeout=5, output_schema="v long", uid="op",
            checkpoint_location=str(work / "aops"), num_partitions=1,
        )  # fmt: skip

    _run_stream(spark, tmp_path / "in", sink, work, build)
    manifest = work / "aops" / "op" / "v0000000000" / "subtask-00000.ckpt"
    body = pickle.dumps(_Payload(marker))
    header = struct.pack("<8sHQI", MAGIC, format_version, len(body), zlib.crc32(body))
    manifest.write_bytes(header + body)  # valid header and checksum, a pickle inside
    _files(tmp_path / "in", [[{"id": 1, "ts": 0.0}]], start=1)
    stream = spark.readStream.schema("id long, ts double").option("maxFilesPerTrigger", 1)
    query = (
        build(stream.json(str(tmp_path / "in"))).writeStream.format("parquet")
        .option("path", str(sink)).option("checkpointLocation", str(work / "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    # the streaming query's failure, raised as the library's exception (Spark's its cause)
    with pytest.raises(CheckpointError, match=r"subtask-00000\.ckpt"):
        query.awaitTermination(120)
    assert not marker.exists()


class ArrowKillOnce(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Columnar: answers whole chunks; the first attempt's worker dies at row ``kill_at``."""

    def __init__(self, log: str, kill_at: int) -> None:
        self.log = log
        self.kill_at = kill_at

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        raise AssertionError("chunks only")

    async def async_invoke_arrow(self, batch: Any) -> Any:
        from tests.cross_process import first_attempt

        ids = batch.column("id").to_pylist()
        for i in ids:
            log_request(self.log, i)
        if self.kill_at in ids and first_attempt():
            os._exit(29)
        await asyncio.sleep(0.001)
        return None, {"v": [i * 3 for i in ids]}


@pytest.mark.timeout(240)
def test_chunks_with_a_checkpoint_replay_what_a_killed_worker_completed(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "requests.txt"
    chunk, capacity, flush = 50, 4, 2
    out = unordered_wait(
        spark.range(0, 4000, numPartitions=2), ArrowKillOnce(str(log), kill_at=3100),
        timeout=30, capacity=capacity, chunk_size=chunk, output_schema="v long",
        checkpoint_location=str(tmp_path / "ckpt"), checkpoint_flush_rows=flush,
    )  # fmt: skip
    rows = out.collect()
    assert sorted((r.id, r.v) for r in rows) == [(i, 3 * i) for i in range(4000)]
    counts = requests(log)
    repeated = sum(n - 1 for n in counts.values())
    assert repeated > 0, "the first attempt really died and was retried"
    assert repeated <= (capacity + flush) * chunk  # not the 1,100 rows the attempt had done


class KillsAndHangs(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Rows in ``kill`` kill their worker once; rows with ``id % 9 == 0`` hang once."""

    def __init__(self, markers: str, kill: set[int]) -> None:
        self.markers = markers
        self.kill = kill

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        from tests.cross_process import first_time

        i = row["id"]
        if i in self.kill and first_time(self.markers, f"kill-{i}"):
            os._exit(41)
        if i % 9 == 0 and first_time(self.markers, f"slow-{i}"):
            await asyncio.sleep(3600)
        return [{"v": i * 3}]


@pytest.mark.timeout(420)
def test_random_worker_kills_and_rescaling_keep_every_row_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Keyed, checkpointed, carried over: workers die at random rows (Spark retries their
    tasks), and the query restarts with 2, then 3, then 1 partitions."""
    import random

    rng = random.Random(20261123)
    work, sink, markers = tmp_path / "work", tmp_path / "out", tmp_path / "markers"
    markers.mkdir()
    files = [[{"id": f * 25 + j, "ts": 0.0} for j in range(25)] for f in range(9)]
    kill = set(rng.sample(range(225), 3))
    fn = KillsAndHangs(str(markers), kill)

    def run(parts: int) -> Any:
        return lambda df: unordered_wait(
            df.withColumn("k", df.id % 13), fn, timeout=120, capacity=32, key="k",
            output_schema="v long", checkpoint_location=str(work / "aops"),
            drain_timeout=0.3, num_partitions=parts,
        )  # fmt: skip

    for parts, (start, stop) in ((2, (0, 4)), (3, (4, 8)), (1, (8, 9))):
        _files(tmp_path / "in", files[start:stop], start=start)
        _run_stream(spark, tmp_path / "in", sink, work, run(parts))
    out = spark.read.parquet(str(sink)).collect()
    ids = [r.id for r in out]
    assert len(ids) == len(set(ids))  # nothing twice
    assert all(r.v == 3 * r.id for r in out)
    missing = set(range(225)) - set(ids)
    # only rows still carried over by the very last micro-batch may be missing: the ones hung
    # in it, and later rows of their keys, which leave after them (per-key order)
    hung = [h for h in range(200, 225) if h % 9 == 0]
    behind = {i for i in range(200, 225) for h in hung if i >= h and i % 13 == h % 13}
    assert missing <= behind
    assert {p.name for p in markers.iterdir()} >= {f"kill-{i}" for i in kill}  # they died
