"""``keyed_process(initial_state=...)`` in real Spark: a job seeded from a table of 3,000
keys (over Arrow batches of 1,000 rows, as this module sets) gives the same output, and
the same state (read back with ``read_state``), as one that replayed the history that
produced the table; batch and streaming, both backends; typed state seeded and read back
as its type."""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import keyed_process, read_state
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from tests.spark.conftest import arrow_batch_rows

Row = dict[str, Any]
BATCH_ROWS = 1_000  # rows per Arrow batch in this module's jobs (Spark's default: 10,000)
KEYS = 3_000  # over two Arrow batches per partition
OUT = "k long, n long, total long"


@pytest.fixture(autouse=True)
def _small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Several Arrow batches per partition, of the table and of the events, at a tenth of
    the rows Spark's default batches would need."""
    with arrow_batch_rows(spark, BATCH_ROWS):
        yield


class SumCount(KeyedProcessFunction[int, Row, Row]):
    """Per key the number of events and the sum of their values; emits both per event."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor[int]("n"))
        self.total = runtime_context.get_state(ValueStateDescriptor[int]("total"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.n.update((self.n.value() or 0) + 1)
        self.total.update((self.total.value() or 0) + value["v"])
        out.collect({"k": value["k"], "n": self.n.value(), "total": self.total.value()})

    def handle_initial_state(self, key: int, rows: list[Row], ctx: KeyedProcessContext) -> None:
        (row,) = rows
        self.n.update(row["n"])
        self.total.update(row["total"])


def _history() -> list[tuple[int, int]]:
    return [(k, k * 3 + i) for k in range(KEYS) for i in range(k % 4 + 1)]


def _new() -> list[tuple[int, int]]:
    return [(k, 7) for k in range(0, KEYS, 3)] + [(KEYS + 5, 1)]  # and one key never seen


def _write(src: Path, name: str, events: list[tuple[int, int]]) -> None:
    path = src / name
    path.write_text("\n".join(json.dumps({"k": k, "v": v}) for k, v in events))
    stamp = 1_700_000_000 + len(list(src.iterdir())) * 10
    os.utime(path, (stamp, stamp))


def _stream(spark: SparkSession, tmp: Path, backend: str, **seed: Any) -> list[tuple[int, ...]]:
    stream = (
        spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1)
        .json(str(tmp / "in"))
    )  # fmt: skip
    out = keyed_process(
        stream, SumCount(), key="k", output_schema=OUT, uid="sum",
        checkpoint_location=str(tmp / "state"), state_backend=backend, num_partitions=2, **seed,
    )  # fmt: skip
    query = (
        out.writeStream.format("parquet").option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    return sorted(tuple(r) for r in spark.read.parquet(str(tmp / "out")).collect())


def _table(spark: SparkSession) -> Any:
    seen: dict[int, list[int]] = {}
    for k, v in _history():
        seen.setdefault(k, []).append(v)
    return spark.createDataFrame(
        [(k, len(vs), sum(vs)) for k, vs in seen.items()], "k long, n long, total long"
    )


def _state(spark: SparkSession, location: str) -> set[tuple[Any, ...]]:
    df = read_state(spark, location, uid="sum")
    return {(r.k, r.state, r.value) for r in df.collect()}


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_seeded_stream_gives_the_output_and_state_of_a_replayed_one(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    replayed, seeded = tmp_path / "replayed", tmp_path / "seeded"
    for d in (replayed, seeded):
        (d / "in").mkdir(parents=True)
    _write(replayed / "in", "a.json", _history())
    _write(replayed / "in", "b.json", _new())
    _write(seeded / "in", "b.json", _new())
    want = [r for r in _stream(spark, replayed, backend) if r[0] % 3 == 0 or r[0] > KEYS]
    new_keys = {k for k, _ in _new()}
    want = [r for r in want if r[0] in new_keys]
    want = sorted({r[0]: r for r in want}.values())  # each new key's last output
    got = _stream(spark, seeded, backend, initial_state=_table(spark))
    assert got == want and len(got) == len(new_keys)
    assert _state(spark, str(seeded / "state")) == _state(spark, str(replayed / "state"))
    # a restart restores version 0: the table is not applied again
    _write(seeded / "in", "c.json", [(0, 1)])
    again = _stream(spark, seeded, backend, initial_state=_table(spark))
    assert (0, 2 + 1, 7 + 1) in again  # key 0: 1 event of history, 7, then 1


def test_a_micro_batch_0_that_died_writing_its_version_is_seeded_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", "b.json", _new())
    # what a micro-batch 0 that failed after writing its key-group file leaves behind
    torn = tmp_path / "state" / "sum" / "v0000000000"
    torn.mkdir(parents=True)
    (torn / "kg-p00000-0123456789ab.ckpt").write_bytes(b"torn")
    got = _stream(spark, tmp_path, "heap", initial_state=_table(spark))
    history = {k: (len(vs), sum(vs)) for k, vs in _by_key(_history()).items()}
    assert (3, history[3][0] + 1, history[3][1] + 7) in got


def test_a_seeded_batch_job_gives_the_output_of_a_replayed_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    new = spark.createDataFrame(_new(), "k long, v long")
    got = keyed_process(
        new, SumCount(), key="k", output_schema=OUT, initial_state=_table(spark),
        checkpoint_location=str(tmp_path / "state"), uid="sum", state_backend="rocksdb",
    ).collect()  # fmt: skip
    history = {k: (len(vs), sum(vs)) for k, vs in _by_key(_history()).items()}
    want = sorted((k, history.get(k, (0, 0))[0] + 1, history.get(k, (0, 0))[1] + v)
                  for k, v in _new())  # fmt: skip
    assert sorted(tuple(r) for r in got) == want


def _by_key(events: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for k, v in events:
        out.setdefault(k, []).append(v)
    return out


def test_initial_state_options_are_checked_on_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = spark.createDataFrame([(1, 2)], "k long, v long")
    with pytest.raises(ConfigurationError, match="key column 'k' is int, the input's bigint"):
        keyed_process(
            df, SumCount(), key="k", output_schema=OUT, checkpoint_location=str(tmp_path),
            initial_state=spark.createDataFrame([(1, 1, 1)], "k int, n long, total long"),
        )  # fmt: skip
    with pytest.raises(ConfigurationError, match="initial_state needs checkpoint_location"):
        keyed_process(df, SumCount(), key="k", output_schema=OUT, initial_state=df)
    with pytest.raises(ConfigurationError, match="initial_state_fn needs initial_state"):
        keyed_process(
            df, SumCount(), key="k", output_schema=OUT, initial_state_fn=lambda k, r, c: None
        )


class TypedLast(KeyedProcessFunction[int, Row, Row]):
    """A typed struct state per key, seeded from a table with nested columns, and a typed
    reducing state (the length of the tags seen)."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.last = runtime_context.get_state(
            ValueStateDescriptor("last", "struct<n long, tags array<string>>")
        )
        self.chars = runtime_context.get_reducing_state(
            ReducingStateDescriptor("chars", operator.add, "long")
        )

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        old = self.last.value() or {"n": 0, "tags": []}
        self.last.update({"n": old["n"] + 1, "tags": [*old["tags"], value["tag"]]})
        self.chars.add(len(value["tag"]))
        out.collect({"k": value["k"], "n": old["n"] + 1})

    def handle_initial_state(self, key: int, rows: list[Row], ctx: KeyedProcessContext) -> None:
        (row,) = rows
        self.last.update({"n": row["n"], "tags": row["tags"]})
        self.chars.add(sum(len(t) for t in row["tags"]))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_typed_state_is_seeded_checked_and_read_back_as_its_type(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    """A typed struct state seeded from a table with nested columns goes on counting from
    the seed in the first micro-batch, and read_state gives it back as a column of the
    declared type: seeded keys the micro-batch did not touch as seeded."""
    (tmp_path / "in").mkdir()
    _write_tags(tmp_path / "in" / "a.json", [(1, "x"), (3, "y")])
    seed = spark.createDataFrame(
        [(k, k * 10, [f"t{k}"]) for k in range(1, 4)], "k long, n long, tags array<string>"
    )
    stream = spark.readStream.schema("k long, tag string").json(str(tmp_path / "in"))
    out = keyed_process(
        stream, TypedLast(), key="k", output_schema="k long, n long", uid="last",
        checkpoint_location=str(tmp_path / "state"), state_backend=backend,
        initial_state=seed,
    )  # fmt: skip
    query = (
        out.writeStream.format("memory").queryName(f"typed_seed_{backend}")
        .option("checkpointLocation", str(tmp_path / "spark")).trigger(availableNow=True)
        .start()
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    got = sorted(tuple(r) for r in spark.sql(f"SELECT * FROM typed_seed_{backend}").collect())
    assert got == [(1, 11), (3, 31)]  # counted on from the seed
    df = read_state(spark, str(tmp_path / "state"), uid="last", state="last")
    assert df.schema["value"].dataType.simpleString() == "struct<n:bigint,tags:array<string>>"
    assert sorted((r.k, r.value.n, list(r.value.tags)) for r in df.collect()) == [
        (1, 11, ["t1", "x"]),
        (2, 20, ["t2"]),
        (3, 31, ["t3", "y"]),
    ]
    chars = read_state(spark, str(tmp_path / "state"), uid="last", state="chars")
    assert chars.schema["value"].dataType.simpleString() == "bigint"  # typed reducing
    assert sorted((r.k, r.value) for r in chars.collect()) == [(1, 3), (2, 2), (3, 3)]


def _write_tags(path: Path, events: list[tuple[int, str]]) -> None:
    path.write_text("\n".join(json.dumps({"k": k, "tag": t}) for k, t in events))
