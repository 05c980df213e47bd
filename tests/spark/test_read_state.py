"""``read_state`` in real Spark: a streaming ``keyed_process`` job's state and timers read
at several versions (chains of full sections and deltas), and the changes between two,
equal a plain-Python model of what the job did, on both backends; clear errors for a
version or uid that is not there."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from asyncio_ops import CheckpointError, ConfigurationError
from asyncio_ops.spark import keyed_process, read_state
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from tests.runtime.specs import keyed_process_spec

Row = dict[str, Any]
FILES = 4


class Track(KeyedProcessFunction[Any, Row, Row]):
    """Per (user, shard): a count, the list of values, a map value -> times seen and an
    event-time timer 1000 s after each event; ``v == -1`` clears the key's state."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int]("count"))
        self.items = runtime_context.get_list_state(ListStateDescriptor[int]("items"))
        self.seen = runtime_context.get_map_state(MapStateDescriptor[int, int]("seen"))
        ttl = StateTtlConfig(10**6)  # processing time: the TTL timestamp is the write's
        self.last = runtime_context.get_state(ValueStateDescriptor[float]("last", ttl=ttl))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        v = value["v"]
        if v == -1:
            self.count.clear()
            self.items.clear()
            self.seen.clear()
            self.last.clear()
        else:
            self.count.update((self.count.value() or 0) + 1)
            self.items.add(v)
            self.seen.put(v, (self.seen.get(v) or 0) + 1)
            self.last.update(value["ts"])
            ctx.timer_service().register_event_time_timer(value["ts"] + 1000)
        out.collect({"user": value["user"], "v": v})


def _events() -> list[list[tuple[str, int, int, float]]]:
    """FILES micro-batches of (user, shard, v, ts); some keys cleared in later ones."""
    files = []
    for f in range(FILES):
        batch = []
        for i in range(40):
            user, shard = f"u{i % 13}", i % 3
            v = -1 if (f >= 2 and i % 11 == 0) else (f * 7 + i) % 5
            batch.append((user, shard, v, float(f * 50 + i)))
        files.append(batch)
    return files


def _model(files: list[list[tuple[str, int, int, float]]], upto: int) -> tuple[set[Any], set[Any]]:
    """The rows read_state should give after micro-batch ``upto``, and the timers."""
    count: Counter[tuple[str, int]] = Counter()
    items: dict[tuple[str, int], list[int]] = {}
    seen: dict[tuple[str, int], Counter[int]] = {}
    timers: set[tuple[str, int, float]] = set()
    last: dict[tuple[str, int], float] = {}
    for batch in files[: upto + 1]:
        for user, shard, v, ts in batch:
            k = (user, shard)
            if v == -1:
                count.pop(k, None)
                items.pop(k, None)
                seen.pop(k, None)
                last.pop(k, None)
                continue
            count[k] += 1
            items.setdefault(k, []).append(v)
            seen.setdefault(k, Counter())[v] += 1
            timers.add((user, shard, ts + 1000))
            last[k] = ts
    rows: set[Any] = set()
    for (u, s), n in count.items():
        rows.add((u, s, "count", "value", None, None, json.dumps(n)))
    for (u, s), ts in last.items():
        rows.add((u, s, "last", "value", None, None, json.dumps(ts)))
    for (u, s), vs in items.items():
        rows |= {(u, s, "items", "list", None, i, json.dumps(v)) for i, v in enumerate(vs)}
    for (u, s), c in seen.items():
        rows |= {(u, s, "seen", "map", json.dumps(m), None, json.dumps(n)) for m, n in c.items()}
    return rows, timers


def _write(src: Path, name: str, events: list[tuple[str, int, int, float]]) -> None:
    lines = [json.dumps({"user": u, "shard": s, "v": v, "ts": ts}) for u, s, v, ts in events]
    path = src / name
    path.write_text("\n".join(lines))
    stamp = 1_700_000_000 + len(list(src.iterdir())) * 10
    os.utime(path, (stamp, stamp))


def _run_job(spark: SparkSession, tmp: Path, backend: str) -> str:
    (tmp / "in").mkdir()
    for f, batch in enumerate(_events()):
        _write(tmp / "in", f"f-{f}.json", batch)
    stream = (
        spark.readStream.schema("user string, shard int, v long, ts double")
        .option("maxFilesPerTrigger", 1).json(str(tmp / "in"))
    )  # fmt: skip
    location = str(tmp / "state")
    out = keyed_process(
        stream, Track(), key=["user", "shard"], event_time="ts",
        output_schema="user string, v long", checkpoint_location=location, uid="track",
        num_partitions=2, state_backend=backend, full_snapshot_interval=2,
    )  # fmt: skip
    query = (
        out.writeStream.format("parquet").option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(180)
    assert query.exception() is None
    return location


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_state_read_at_every_version_equals_the_model(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    started = time.time()
    location = _run_job(spark, tmp_path, backend)
    files = _events()
    for version in [1, 2, None]:  # version 3 (the newest) by default
        want, want_timers = _model(files, FILES - 1 if version is None else version)
        df = read_state(spark, location, uid="track", version=version)
        assert df.columns[:3] == ["user", "shard", "key_group"]
        got = df.collect()
        assert {r.ttl_timestamp for r in got if r.state != "last"} == {None}  # no TTL
        stamps = {r.ttl_timestamp.timestamp() for r in got if r.state == "last"}
        assert stamps and all(started - 1 <= t <= time.time() for t in stamps), stamps
        rows = {(r.user, r.shard, r.state, r.kind, r.map_key, r.list_index, r.value) for r in got}
        assert len(rows) == len(got)  # no duplicate row
        assert rows == want, (version, sorted(rows ^ want, key=str)[:8])
        timers = read_state(spark, location, uid="track", version=version, timers=True)
        tr = [(r.user, r.shard, r.timestamp_seconds) for r in timers.collect()]
        assert {r.domain for r in timers.collect()} == {"event"}
        assert set(tr) == want_timers and len(tr) == len(want_timers), version
    for old, new in [(1, 3), (0, 2), (2, 2)]:
        _check_changes(spark, location, files, old, new)
    marks = read_state(spark, location, uid="track", watermarks=True).collect()  # manifests'
    assert sorted(m.partition for m in marks) == [0, 1]
    assert max(m.max_seen.timestamp() for m in marks) == max(e[3] for e in files[-1])
    assert all(m.current is None or m.current <= m.max_seen for m in marks)
    only = read_state(spark, location, uid="track", state="count").collect()
    assert {r.state for r in only} == {"count"} and len(only) == len(
        _model(files, 3)[0] and [r for r in _model(files, 3)[0] if r[2] == "count"]
    )


def _check_changes(
    spark: SparkSession, location: str, files: list[Any], old: int, new: int
) -> None:
    """``changes=True`` between two versions equals the difference of the model's rows."""

    def by_identity(rows: set[Any]) -> dict[Any, str]:
        return {(u, s, st, mk, i): v for u, s, st, _kind, mk, i, v in rows}

    then, now = by_identity(_model(files, old)[0]), by_identity(_model(files, new)[0])
    want = {("put", *k, v) for k, v in now.items() if then.get(k) != v}
    want |= {("delete", *k, v) for k, v in then.items() if k not in now}
    df = read_state(spark, location, uid="track", changes=True, from_version=old, to_version=new)
    got = [
        (r.change_type, r.user, r.shard, r.state, r.map_key, r.list_index, r.value)
        for r in df.collect()
    ]
    diff = sorted(set(got) ^ want, key=str)[:5]
    assert set(got) == want and len(got) == len(want), (old, new, diff)


def test_a_version_or_uid_that_is_not_there_is_a_clear_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = _run_job(spark, tmp_path, "heap")
    with pytest.raises(
        CheckpointError, match=r"checkpoint version 99 does not exist under .*state"
    ):
        read_state(spark, location, uid="track", version=99)
    with pytest.raises(CheckpointError, match=r"no checkpoint version under .*uid 'other'"):
        read_state(spark, location, uid="other")
    with pytest.raises(CheckpointError, match="no checkpoint version under"):
        read_state(spark, str(tmp_path / "nowhere"), uid="track")
    with pytest.raises(ConfigurationError, match=r"from_version \(77\) is after the newest"):
        read_state(spark, location, uid="track", changes=True, from_version=77)
    with pytest.raises(ConfigurationError, match="changes=True needs from_version"):
        read_state(spark, location, uid="track", changes=True)


def test_a_checkpoint_without_key_columns_gives_the_key_as_json(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A version whose manifests name no key columns (written before keyed_process wrote
    them; here by the partition runner with no key schema) gives one ``key`` column."""
    import pyarrow as pa

    from asyncio_ops._keygroups import assign_to_key_group
    from asyncio_ops._runtime import KEY_GROUP_COLUMN, TaskInfo
    from asyncio_ops._runtime._keyed_partition import run_keyed_process
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    storage = CheckpointStorage(str(tmp_path), "old")
    spec = keyed_process_spec(
        function=Track(), key=("user", "shard"), num_partitions=1, checkpoint=storage,
        output_schema=pa.schema([("user", pa.string()), ("v", pa.int64())]),
    )  # fmt: skip
    rows = [
        {"user": u, "shard": 1, "v": 3, "ts": 1.0,
         KEY_GROUP_COLUMN: assign_to_key_group((u, 1), spec.options.max_parallelism)}
        for u in ["a", "b"]
    ]  # fmt: skip
    task = TaskInfo(partition_id=0, num_partitions=1, batch_id=0)
    list(run_keyed_process(spec, [pa.RecordBatch.from_pylist(rows)], task))
    got = read_state(spark, str(tmp_path), uid="old", state="count").collect()
    assert sorted((r.key, r.value) for r in got) == [('["a", 1]', "1"), ('["b", 1]', "1")]
    assert read_state(spark, str(tmp_path), uid="old").columns[:2] == ["key", "key_group"]


def test_a_read_of_a_running_query_keeps_its_versions_from_retention(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``read_state`` pins a version when it is called and reads it when an action runs;
    meanwhile the query goes on and its retention would delete the pinned version's
    files. The read's lease keeps them: the DataFrame gives the state as it was at the
    pinned version, however many versions later. Without a lease (``lease=0``) the read
    fails, naming the file gone. The query here is the partition runner, version after
    version, partition 0's retention keeping 2 (full snapshots every 2)."""
    import pyarrow as pa

    from asyncio_ops._keygroups import assign_to_key_group
    from asyncio_ops._runtime import KEY_GROUP_COLUMN, TaskInfo
    from asyncio_ops._runtime._keyed_partition import run_keyed_process
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    storage = CheckpointStorage(str(tmp_path), "running")
    spec = keyed_process_spec(
        function=Track(), key=("user", "shard"), num_partitions=1, checkpoint=storage,
        output_schema=pa.schema([("user", pa.string()), ("v", pa.int64())]),
        retain_versions=2, full_snapshot_interval=2,
    )  # fmt: skip
    files = _events() * 3

    def batch(version: int) -> None:
        rows = [
            {"user": u, "shard": s, "v": v, "ts": ts,
             KEY_GROUP_COLUMN: assign_to_key_group((u, s), spec.options.max_parallelism)}
            for u, s, v, ts in files[version]
        ]  # fmt: skip
        task = TaskInfo(partition_id=0, num_partitions=1, batch_id=version)
        list(run_keyed_process(spec, [pa.RecordBatch.from_pylist(rows)], task))

    def rows(df: Any) -> set[Any]:  # the key as JSON: this spec records no key columns
        return {(*json.loads(r.key), r.state, r.kind, r.map_key, r.list_index, r.value)
                for r in df.collect()}  # fmt: skip

    for version in range(3):
        batch(version)
    unleased = read_state(spark, str(tmp_path), uid="running", lease=0)  # version 2
    for version in range(3, 6):
        batch(version)
    with pytest.raises(Exception, match=r"checkpoint file .*v000000000[0-2]/kg-.* is missing"):
        unleased.collect()
    leased = read_state(spark, str(tmp_path), uid="running")  # version 5, by default
    for version in range(6, 10):
        batch(version)
    assert storage.versions()[0] <= 5 < storage.versions()[-1] == 9  # kept for the lease
    assert rows(leased) == _model(files, 5)[0]
    assert rows(read_state(spark, str(tmp_path), uid="running")) == _model(files, 9)[0]
