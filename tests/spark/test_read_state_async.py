"""``read_state`` of the async operator's checkpoint, in real Spark: a streaming
``unordered_wait`` / ``ordered_wait`` (keyed and not, with and without event time, rows and
chunks) whose lookups of some rows block until released carries rows over; what
``read_state`` says it carried is compared with what the operator did with them: the rows
the sink did not get, and, after a restart that releases the lookups, the requests made
again (exactly the rows read as in flight; a complete one is emitted without a request).
Also: watermarks, the replay log of a micro-batch and of a batch run, and the errors."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import AsyncFunction, CheckpointError, ConfigurationError
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import Kind
from asyncio_ops.spark import ordered_wait, read_state, unordered_wait
from tests.cross_process import log_request, requests

pytestmark = pytest.mark.spark

ROWS = 20
HANGS = {0, 5, 10, 15}  # their lookups block until released
TIMEOUT = 600.0


class Blocks(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """With ``hang``, the lookups of rows in ``HANGS`` wait on an ``asyncio.Event`` that
    nothing sets (until the micro-batch ends and carries them over); every request is
    logged (workers are other processes). ``async_invoke_chunk`` answers a chunk the same
    way (``chunk_size``): it waits if one of its rows does."""

    def __init__(self, log: str, hang: bool) -> None:
        self.log = log
        self.hang = hang

    async def _wait(self) -> None:
        if self.hang:
            await asyncio.Event().wait()

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        log_request(self.log, row["id"])
        if row["id"] in HANGS:
            await self._wait()
        return [{"v": row["id"] * 3}]

    async def async_invoke_chunk(self, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        for row in rows:
            log_request(self.log, row["id"])
        if any(row["id"] in HANGS for row in rows):
            await self._wait()
        return [[{"v": row["id"] * 3}] for row in rows]


def _file(src: Path, f: int, ids: range) -> None:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"part-{f:03d}.json"
    path.write_text("\n".join(json.dumps({"id": i, "k": i % 3, "ts": float(i)}) for i in ids))
    stamp = 1_700_000_000 + f
    os.utime(path, (stamp, stamp))  # read in this order, one file per micro-batch


def _run(
    spark: SparkSession, tmp: Path, run: int, mode: str, key: str | None,
    event_time: str | None, chunk_size: int | None = None,
) -> None:  # fmt: skip
    wait = ordered_wait if mode == "ordered" else unordered_wait
    stream = (
        spark.readStream.schema("id long, k long, ts double").option("maxFilesPerTrigger", 1)
        .json(str(tmp / "in"))
    )  # fmt: skip
    out = wait(
        stream, Blocks(str(tmp / f"requests-{run}.txt"), hang=run == 0),
        timeout=TIMEOUT, capacity=100, output_schema="v long", key=key, event_time=event_time,
        watermark_delay=None if event_time is None else 2,
        checkpoint_location=str(tmp / "aops"), uid="look",
        drain_timeout=1.0, num_partitions=2, chunk_size=chunk_size,
    )  # fmt: skip
    query = (
        out.writeStream.format("parquet").option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()


CASES = [
    ("unordered", None, None),
    ("ordered", None, "ts"),
    ("unordered", "k", "ts"),
    ("ordered", "k", None),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "key", "event_time"), CASES,
                         ids=["-".join(str(x) for x in c) for c in CASES])  # fmt: skip
def test_read_state_gives_what_the_async_operator_carried_over(
    spark: SparkSession, tmp_path: Path, mode: str, key: str | None, event_time: str | None
) -> None:
    _file(tmp_path / "in", 0, range(ROWS))
    started = time.time()
    _run(spark, tmp_path, 0, mode, key, event_time)
    emitted = [r.id for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    location = str(tmp_path / "aops")

    carried = read_state(spark, location, uid="look").collect()  # version 0, the newest
    assert carried == read_state(spark, location, uid="look", version=0).collect()
    ids = [r.row.id for r in carried]
    # exactly the rows the sink did not get, each once
    assert sorted(ids + emitted) == list(range(ROWS)), (ids, emitted)
    for r in carried:
        assert r.row.asDict() == {"id": r.row.id, "k": r.row.id % 3, "ts": float(r.row.id)}
        assert r.partition in (0, 1) and r.seq >= 0
        assert (r.key_group is None) == (key is None)
        if event_time is None:
            assert (r.event_time, r.late, r.after_watermark) == (None, None, None)
        else:
            assert r.event_time.timestamp() == r.row.ts and r.late is False
        if r.row.id in HANGS:  # waiting for its lookup: a deadline, no results
            assert (r.state, r.results, r.attempts) == ("in_flight", None, 1)
            assert started + TIMEOUT - 1 <= r.deadline.timestamp() <= time.time() + TIMEOUT
        else:  # complete, held back behind one in flight (ordered, or keyed: its key's)
            assert r.state == "complete" and r.deadline is None
            assert any(
                b.partition == r.partition and b.seq < r.seq and b.state == "in_flight"
                and (mode == "ordered" or b.row.k == r.row.k)
                for b in carried
            ), r  # fmt: skip
            (out,) = r.results
            want = {**r.row.asDict(), "v": 3 * r.row.id}
            if event_time is not None:
                want["_late"] = False
            assert out.asDict() == want
    assert set(ids) >= HANGS
    by_partition: dict[int, list[Any]] = {}
    for r in carried:
        by_partition.setdefault(r.partition, []).append(r)
    for rows in by_partition.values():  # a queue's head is in flight, or it would have left
        assert len({r.seq for r in rows}) == len(rows)
        assert min(rows, key=lambda r: r.seq).state == "in_flight"
    if key is not None:  # Spark's key group, the one each row travelled with
        hashed = {
            r.id: r.kg for r in spark.sql(
                f"SELECT id, pmod(hash(k), 128) AS kg FROM VALUES {_values()} AS t(id, k)"
            ).collect()
        }  # fmt: skip
        assert {r.row.id: r.key_group for r in carried} == {i: hashed[i] for i in ids}

    marks = read_state(spark, location, uid="look", watermarks=True).collect()
    assert sorted(m.partition for m in marks) == [0, 1]
    if event_time is None:
        assert {(m.max_seen, m.current) for m in marks} == {(None, None)}
    else:  # union state: the highest is the input's latest event time
        assert max(m.max_seen.timestamp() for m in marks) == ROWS - 1
        for m in marks:
            assert m.current is None or m.current.timestamp() <= m.max_seen.timestamp() - 2
            seen = [r.row.ts for r in carried if r.partition == m.partition]
            assert m.max_seen.timestamp() >= max(seen, default=-1.0)

    logged = read_state(spark, location, uid="look", replay_log=True, version=0).collect()
    done = [i for i in range(ROWS) if i not in HANGS]  # every other lookup completed once
    assert sorted(r.results[0].v // 3 for r in logged) == done
    assert sorted(requests(tmp_path / "requests-0.txt")) == list(range(ROWS))

    # the restart no longer blocks: it requests again exactly the rows read as in
    # flight, emits the complete ones as they were, and every row reaches the sink once
    _file(tmp_path / "in", 1, range(ROWS, ROWS + 4))
    _run(spark, tmp_path, 1, mode, key, event_time)
    again = set(requests(tmp_path / "requests-1.txt")) - set(range(ROWS, ROWS + 4))
    assert again == {r.row.id for r in carried if r.state == "in_flight"}
    final = [r.id for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(final) == list(range(ROWS + 4))
    assert read_state(spark, location, uid="look").collect() == []  # version 1: nothing left


def _values() -> str:
    return ", ".join(f"({i}, CAST({i % 3} AS BIGINT))" for i in range(ROWS))


@pytest.mark.timeout(300)
def test_a_chunked_operator_carries_chunks_read_as_arrays_of_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    _file(tmp_path / "in", 0, range(ROWS))
    _run(spark, tmp_path, 0, "unordered", None, None, chunk_size=4)
    emitted = [r.id for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    df = read_state(spark, str(tmp_path / "aops"), uid="look")
    assert dict(df.dtypes)["row"] == "array<struct<id:bigint,k:bigint,ts:double>>"
    chunks = df.collect()
    ids = [row.id for c in chunks for row in c.row]
    assert sorted(ids + emitted) == list(range(ROWS))
    for c in chunks:  # a chunk holding a row that blocks waits whole; no other is carried
        assert 1 <= len(c.row) <= 4 and HANGS & {row.id for row in c.row}
        assert (c.state, c.results, c.attempts) == ("in_flight", None, 1)


@pytest.mark.timeout(300)
def test_the_replay_log_of_a_batch_run(spark: SparkSession, tmp_path: Path) -> None:
    location = str(tmp_path / "aops")
    out = unordered_wait(
        spark.range(0, 300, numPartitions=2),
        Blocks(str(tmp_path / "requests.txt"), hang=False),
        timeout=10, output_schema="v long", checkpoint_location=location, uid="batch",
    )  # fmt: skip
    assert out.count() == 300
    (run,) = CheckpointStorage(location, "batch").runs()
    logged = read_state(spark, location, uid="batch", replay_log=True)  # the newest run
    rows = logged.collect()
    assert rows == read_state(spark, location, uid="batch", replay_log=True,
                              version=run).collect()  # fmt: skip
    assert sorted(r.results[0].v for r in rows) == [3 * i for i in range(300)]
    assert sorted((r.partition, r.position) for r in rows) == sorted(
        {(r.partition, r.position) for r in rows}
    )  # one completion per position of a partition (one attempt each)
    assert {r.partition for r in rows} == {0, 1} and len({r.attempt for r in rows}) == 2
    assert {len(r.fingerprint) for r in rows} == {12}
    with pytest.raises(CheckpointError, match=r"run 'nope' does not exist under .*aops"):
        read_state(spark, location, uid="batch", replay_log=True, version="nope")


@pytest.mark.timeout(300)
def test_errors_name_the_location_uid_and_version(spark: SparkSession, tmp_path: Path) -> None:
    _file(tmp_path / "in", 0, range(ROWS))
    _run(spark, tmp_path, 0, "unordered", "k", None)
    location = str(tmp_path / "aops")
    where = rf"checkpoint_location {location} \(uid 'look', version 0\)"
    for kw in ({"state": "n"}, {"timers": True}, {"changes": True, "from_version": 0}):
        with pytest.raises(CheckpointError, match=where + ".* the async operator"):
            read_state(spark, location, uid="look", **kw)
    with pytest.raises(ConfigurationError, match="one thing at a time"):
        read_state(spark, location, uid="look", watermarks=True, replay_log=True)
    with pytest.raises(ConfigurationError, match="replay_log=True only"):
        read_state(spark, location, uid="look", version="some-run")
    # a version written before manifests recorded the output schema
    storage = CheckpointStorage(location, "look")
    for name in storage.list_files(0, "subtask-"):
        manifest = storage.read(0, name, Kind.MANIFEST)
        meta = dict(manifest.schema.metadata)
        del meta[b"aops.output_schema"]
        storage.write(0, name, Kind.MANIFEST, manifest.replace_schema_metadata(meta))
    with pytest.raises(CheckpointError, match=where + ".*subtask-00000.ckpt records no output"):
        read_state(spark, location, uid="look")
    marks = read_state(spark, location, uid="look", watermarks=True)  # still read
    assert marks.count() == 2
