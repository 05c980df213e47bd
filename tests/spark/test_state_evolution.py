"""Typed state across restarts of a streaming ``keyed_process`` query, in real Spark, on both
backends: a compatible change of the descriptors (a struct field added, dropped and
reordered, numbers widened, a state added, one removed) restores the old state into the new
shape; an incompatible one (a type narrowed, typed to untyped, the key's type, a field
re-added with another type than the one key groups the query did not touch still hold) is
refused on the driver when ``keyed_process`` is called, before any job, and the checkpoint is
left as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from asyncio_ops import IncompatibleStateError
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops.spark import keyed_process, read_state
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ListStateDescriptor,
    ValueStateDescriptor,
)
from tests.runtime.specs import keyed_process_spec

Row = dict[str, Any]
OUT = "user string, count long, n long, total double, note string, events int"


class Stats(KeyedProcessFunction[Any, Row, Row]):
    """Per user: a count, a struct of running stats and the list of values seen, each
    declared with the types it is given (None: untyped)."""

    def __init__(self, count: str | None, stats: str | None, events: str | None) -> None:
        self.types = (count, stats, events)

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        count, stats, events = self.types
        self.count = runtime_context.get_state(ValueStateDescriptor("count", count))
        self.stats = runtime_context.get_state(ValueStateDescriptor("stats", stats))
        self.events = (
            runtime_context.get_list_state(ListStateDescriptor("events", events))
            if events is not None
            else None
        )

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        stats = dict(self.stats.value() or {"n": 0, "total": 0.0})
        stats["n"] = (stats.get("n") or 0) + 1
        stats["total"] = (stats.get("total") or 0.0) + value["v"]
        self.stats.update(stats)
        events = 0
        if self.events is not None:
            self.events.add({"v": value["v"]})
            events = len(self.events.get())
        yield {"user": value["user"], "count": n, "n": stats["n"], "total": stats["total"],
               "note": stats.get("note"), "events": events}  # fmt: skip


def _write(src: Path, name: str, rows: list[tuple[str, int]]) -> None:
    path = src / name
    path.write_text("\n".join(json.dumps({"user": u, "v": v}) for u, v in rows))
    stamp = 1_700_000_000 + len(list(src.iterdir())) * 10
    os.utime(path, (stamp, stamp))


def _query(
    spark: SparkSession,
    tmp: Path,
    fn: KeyedProcessFunction[Any, Row, Row],
    backend: str,
    key_type: str = "string",
    output_schema: str = OUT,
) -> DataFrame:
    stream = (
        spark.readStream.schema("user string, v int").option("maxFilesPerTrigger", 1)
        .json(str(tmp / "in")).withColumn("user", F.col("user").cast(key_type))
    )  # fmt: skip
    return keyed_process(
        stream, fn, key="user", output_schema=output_schema,
        checkpoint_location=str(tmp / "state"),
        uid="stats", num_partitions=2, state_backend=backend,
    )  # fmt: skip


def _run(out: DataFrame, tmp: Path) -> list[Row]:
    """The rows the query emits until its input is used up (each restart: the new ones)."""
    got: list[Row] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        got.extend(r.asDict() for r in batch.collect())

    query = (
        out.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp / "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(180)
    assert query.exception() is None
    return got


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_compatible_changes_restore_and_incompatible_ones_fail_on_the_driver(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", "a.json", [("u1", 1), ("u2", 10), ("u1", 2)])
    first = Stats("int", "struct<n int, total float, note string>", "struct<v int>")
    rows = _run(_query(spark, tmp_path, first, backend), tmp_path)
    assert max(r["count"] for r in rows if r["user"] == "u1") == 2

    # compatible: int -> bigint, a struct reordered with a field dropped (note), one added
    # and float -> double; the list state "events" removed (kept, unclaimed)
    _write(tmp_path / "in", "b.json", [("u1", 4), ("u3", 5)])
    second = Stats("bigint", "struct<total double, n bigint, note2 string>", None)
    rows = _run(_query(spark, tmp_path, second, backend), tmp_path)
    assert {(r["user"], r["count"], r["n"], r["total"], r["note"]) for r in rows} == {
        ("u1", 3, 3, 7.0, None),
        ("u3", 1, 1, 5.0, None),
    }
    stats = read_state(spark, str(tmp_path / "state"), uid="stats", state="stats")
    value_type = stats.schema["value"].dataType.simpleString()
    assert value_type == "struct<total:double,n:bigint,note2:string>"
    assert {(r["user"], r["value"]["n"], r["value"]["total"]) for r in stats.collect()} == {
        ("u1", 3, 7.0), ("u2", 1, 10.0), ("u3", 1, 5.0),
    }  # fmt: skip
    # the removed state is still there, in its old type, for a function that asks again
    events = read_state(spark, str(tmp_path / "state"), uid="stats", state="events")
    assert sorted((r["user"], r["value"]["v"]) for r in events.collect()) == [
        ("u1", 1), ("u1", 2), ("u2", 10),
    ]  # fmt: skip

    versions = CheckpointStorage(str(tmp_path / "state"), "stats").versions()
    refused = [
        (Stats("int", "struct<total double, n bigint, note2 string>", None),
         r"state 'count'.*value state of bigint.*value state of int.*bigint -> int narrows"),
        (Stats("bigint", "struct<total double, n bigint, note2 string>", "struct<v string>"),
         r"state 'events'.*struct<v:int>.*struct<v:string>.*int -> string \(at v\)"),
        (Stats("bigint", None, None), r"state 'stats'.*typed state cannot become untyped"),
    ]  # fmt: skip
    for fn, message in refused:
        with pytest.raises(IncompatibleStateError, match=message) as info:
            _query(spark, tmp_path, fn, backend)
        assert "checkpoint version 1 of keyed_process uid 'stats'" in str(info.value)
        assert "new state name" in str(info.value)
    with pytest.raises(IncompatibleStateError, match=r"key columns were user string.*user int"):
        _query(spark, tmp_path, second, backend, key_type="int")
    assert CheckpointStorage(str(tmp_path / "state"), "stats").versions() == versions

    # the query goes on with the compatible descriptors
    _write(tmp_path / "in", "c.json", [("u2", 1)])
    rows = _run(_query(spark, tmp_path, second, backend), tmp_path)
    assert [(r["user"], r["count"], r["n"], r["total"]) for r in rows] == [("u2", 2, 2, 11.0)]


class Pair(KeyedProcessFunction[Any, Row, Row]):
    """Per user a struct state ``pair`` of the type it is given: ``a`` the last value,
    ``b`` (when given) set to ``b``; emits the user, ``a`` and the ``b`` it restored."""

    def __init__(self, pair: str, b: Any) -> None:
        self.type, self.b = pair, b

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.pair = runtime_context.get_state(ValueStateDescriptor("pair", self.type))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        old = self.pair.value() or {}
        self.pair.update({"a": value["v"], **({} if self.b is None else {"b": self.b})})
        yield {"user": value["user"], "a": value["v"], "b": old.get("b")}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_field_re_added_with_another_type_than_untouched_key_groups_hold_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A struct field dropped by a run that touched one key, then re-added with another
    type: the newest version records the struct without it, but the chains of the key
    groups that run did not touch still name the first run's sections, which hold the
    field in its old type; the driver refuses before any job, naming that version."""
    out = "user string, a int, b string"
    src = tmp_path / "in"
    src.mkdir()
    _write(src, "a.json", [(f"u{i}", i) for i in range(1, 7)])
    _run(
        _query(spark, tmp_path, Pair("struct<a int, b string>", "x"), "heap", output_schema=out),
        tmp_path,
    )
    _write(src, "b.json", [("u1", 10)])
    rows = _run(
        _query(spark, tmp_path, Pair("struct<a int>", None), "heap", output_schema=out), tmp_path
    )
    assert [(r["user"], r["a"]) for r in rows] == [("u1", 10)]

    state = tmp_path / "state"
    versions = CheckpointStorage(str(state), "stats").versions()
    files = _files(state)
    with pytest.raises(IncompatibleStateError) as info:
        _query(spark, tmp_path, Pair("struct<a int, b int>", 1), "heap", output_schema=out)
    message = str(info.value)
    assert "state 'pair'" in message
    assert "string -> int (at b)" in message
    assert "struct<a:int,b:string>" in message and "struct<a:int,b:int>" in message
    assert "checkpoint version 0 of keyed_process uid 'stats'" in message
    assert CheckpointStorage(str(state), "stats").versions() == versions
    assert _files(state) == files

    # re-added with its old type: the untouched keys get their old field back
    _write(src, "c.json", [("u1", 11), ("u2", 12)])
    again = Pair("struct<a int, b string>", None)
    rows = _run(_query(spark, tmp_path, again, "heap", output_schema=out), tmp_path)
    assert sorted((r["user"], r["a"], r["b"]) for r in rows) == [("u1", 11, None), ("u2", 12, "x")]


def test_the_types_held_are_known_after_the_older_manifests_are_deleted(
    spark: SparkSession, tmp_path: Path
) -> None:
    """On local disk a partition deletes its manifest of a version 10 versions on, while
    the sections its successors' chains name stay: the manifests carry the types of the
    versions their chains name forward, so the driver still refuses a type an untouched
    key group holds. Versions written by the partition runner (a micro-batch each, as a
    query's tasks write them), the refusal by ``keyed_process`` on the driver."""
    import pyarrow as pa

    from asyncio_ops._keygroups import assign_to_key_group
    from asyncio_ops._runtime import KEY_GROUP_COLUMN, TaskInfo
    from asyncio_ops._runtime._keyed_partition import run_keyed_process

    storage = CheckpointStorage(str(tmp_path / "state"), "stats")

    def version(n: int, fn: Pair, users: list[str]) -> None:
        spec = keyed_process_spec(
            function=fn, key=("user",), num_partitions=1, checkpoint=storage,
            output_schema=pa.schema([("user", pa.string()), ("a", pa.int32()),
                                     ("b", pa.string())]),
            key_schema=StructType([StructField("user", StringType())]).json(),
        )  # fmt: skip
        rows = [{"user": u, "v": n, KEY_GROUP_COLUMN: assign_to_key_group(u, 128)}
                for u in users]  # fmt: skip
        task = TaskInfo(partition_id=0, num_partitions=1, batch_id=n)
        list(run_keyed_process(spec, [pa.RecordBatch.from_pylist(rows)], task))

    version(0, Pair("struct<a int, b string>", "x"), [f"u{i}" for i in range(1, 7)])
    for n in range(1, 12):  # the field dropped; only u1 written, 11 versions
        version(n, Pair("struct<a int>", None), ["u1"])
    first = tmp_path / "state" / "stats" / "v0000000000"
    assert not list(first.glob("subtask-*")) and list(first.glob("kg-*"))
    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema("user string, v int").json(str(tmp_path / "in"))
    with pytest.raises(IncompatibleStateError, match=r"(?s)checkpoint version 0 .*string -> int"):
        keyed_process(
            stream, Pair("struct<a int, b int>", 1), key="user",
            output_schema="user string, a int, b string",
            checkpoint_location=str(tmp_path / "state"), uid="stats", num_partitions=1,
        )  # fmt: skip
