"""The async operator's streaming checkpoint on an S3-compatible server: what a partition
reads of the previous version, counted from the server's own log.

Keyed and without event time, a partition reads partition 0's manifest and those of its
key groups' old owners (its own, at the same number of partitions): its requests do not
grow with the number of partitions. With event time it reads every partition's manifest
(the watermarks' union is in them); unkeyed, also every partition's operator state (the
even split of unkeyed elements). A keyed partition writes no operator state; a version
an earlier release wrote (the watermarks in an operator-state file per partition) is
still read.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops._elements import Record
from asyncio_ops._engine._operator_snapshot import SnapshotEntry
from asyncio_ops._engine._wait_operator import OutputMode
from asyncio_ops._functions import as_async_function
from asyncio_ops._runtime import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo
from asyncio_ops._runtime._adapters import RowValue
from asyncio_ops._runtime._inflight import WatermarkState, snapshot_operator_state
from asyncio_ops._runtime._partition_checkpoint import PartitionCheckpoint
from asyncio_ops._runtime._versions import write_version
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import Kind
from tests.runtime.specs import partition_spec

IN = pa.schema([("id", pa.int64()), (KEY_GROUP_COLUMN, pa.int32())])
OUT = pa.schema([("score", pa.float64())])
RESULTS = pa.list_(pa.struct(list(OUT)))


async def echo(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [row]


def _spec(location: str, keyed: bool, event_time: str | None = None) -> PartitionSpec:
    return partition_spec(
        function=as_async_function(echo), function_token="t", mode=OutputMode.UNORDERED,
        timeout=60.0, capacity=100, retry=None, output_schema=OUT, added_columns=("score",),
        key=("id",) if keyed else (), checkpoint=CheckpointStorage(location, "op"),
        num_partitions=4, event_time=event_time,
    )  # fmt: skip


def _in_flight(ids: range, keyed: bool) -> list[SnapshotEntry]:
    """Elements still in flight at the end of a micro-batch (key group = id % 128)."""
    deadline = time.time() + 60
    out = []
    for i in ids:
        row = {"id": i, KEY_GROUP_COLUMN: i % 128 if keyed else None}
        record = Record(RowValue(row, None, i))
        out.append(SnapshotEntry(record, None, i if keyed else None, 1, deadline))
    return out


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_a_keyed_partition_reads_two_manifests_and_no_operator_state_at_any_parallelism(
    s3_server: Any, keyed: bool
) -> None:
    spec = _spec(s3_server(f"carry-{uuid.uuid4().hex[:8]}"), keyed)
    parts = 4
    for p in range(parts):  # micro-batch 1 ends with elements of every partition in flight
        PartitionCheckpoint(spec, TaskInfo(p, parts, batch_id=1), RESULTS).finish(
            _in_flight(range(p * 32, p * 32 + 32), keyed), WatermarkState(), IN
        )
    s3_server.requests.clear()
    restored = PartitionCheckpoint(spec, TaskInfo(1, parts, batch_id=2), RESULTS).restore()
    assert restored is not None
    # partition 1 of 4 owns key groups 32..63: ids 32..63 (partition 1's own elements);
    # unkeyed, at the same parallelism, also its own
    assert sorted(e.element.value.row["id"] for e in restored.entries) == list(range(32, 64))
    read = sorted(r.split(" ")[0] + " " + r.rsplit("/", 1)[1].split("-")[0]
                  for r in s3_server.requests)  # fmt: skip
    if keyed:  # partition 0's manifest and its own, then its key-group file
        assert read == sorted(["HEAD subtask", "GET subtask"] * 2 + ["HEAD kg", "GET kg"])
    else:  # every partition's manifest and operator state
        assert read == sorted(["HEAD subtask", "GET subtask", "HEAD ops", "GET ops"] * parts)


def test_with_event_time_a_keyed_partition_reads_every_watermark(s3_server: Any) -> None:
    spec = _spec(s3_server(f"carry-et-{uuid.uuid4().hex[:8]}"), True, event_time="ts")
    parts = 4
    s3_server.requests.clear()
    for p in range(parts):
        PartitionCheckpoint(spec, TaskInfo(p, parts, batch_id=1), RESULTS).finish(
            [], WatermarkState(100.0 + p, 90.0 + p), IN
        )
    # each partition wrote its manifest alone: no elements, and the watermarks in it
    assert [r.split(" ")[0] + " " + r.rsplit("/", 1)[1].split("-")[0]
            for r in s3_server.requests] == ["PUT subtask"] * parts  # fmt: skip
    s3_server.requests.clear()
    restored = PartitionCheckpoint(spec, TaskInfo(1, parts, batch_id=2), RESULTS).restore()
    assert restored is not None
    assert (restored.watermarks.max_seen, restored.watermarks.current) == (103.0, 93.0)
    read = sorted(r.split(" ")[0] + " " + r.rsplit("/", 1)[1].split("-")[0]
                  for r in s3_server.requests)  # fmt: skip
    assert read == sorted(["HEAD subtask", "GET subtask"] * parts)


def test_watermarks_of_an_earlier_release_are_read_from_its_operator_state_files(
    s3_server: Any,
) -> None:
    """An earlier release kept a keyed partition's watermarks in an operator-state file
    the manifest names, and none in the manifest: a restore reads those files."""
    spec = _spec(s3_server(f"carry-old-{uuid.uuid4().hex[:8]}"), True, event_time="ts")
    assert spec.checkpoint is not None
    parts = 4
    for p in range(parts):
        write_version(
            spec.checkpoint, 1, p, parts, True, {},
            snapshot_operator_state(p, parts, WatermarkState(100.0 + p, 90.0 + p)),
            {b"aops.element": b"row", b"aops.input_schema": IN.serialize().to_pybytes(),
             b"aops.in_flight": b"1"},
            kind=Kind.IN_FLIGHT,
        )  # fmt: skip
    s3_server.requests.clear()
    restored = PartitionCheckpoint(spec, TaskInfo(1, parts, batch_id=2), RESULTS).restore()
    assert restored is not None and restored.entries == ()
    assert (restored.watermarks.max_seen, restored.watermarks.current) == (103.0, 93.0)
    assert sum("GET" in r and "/ops-p" in r for r in s3_server.requests) == parts


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_replay_log_is_read_beside_the_restore_on_a_remote_store(
    where: str, s3_server: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's replay log (this version's, from its earlier attempts) and the elements the
    previous version carried over are read at once on S3, the replay log in a thread of
    its own; on local disk one after the other. Either way both come back whole, and a
    failure of either is the task's error."""
    location = s3_server(f"carry-replay-{uuid.uuid4().hex[:8]}") if where == "s3" else str(tmp_path)
    spec = _spec(location, True)
    assert spec.checkpoint is not None
    PartitionCheckpoint(spec, TaskInfo(0, 1, batch_id=1), RESULTS).finish(
        _in_flight(range(8), True), WatermarkState(), IN
    )
    first = PartitionCheckpoint(spec, TaskInfo(0, 1, batch_id=2), RESULTS)
    first.log.append(-1, b"fp", [{"score": 0.5}])  # an attempt that failed after a lookup
    first.log.flush()
    threads: list[str] = []
    list_files = spec.checkpoint.list_files

    def listing(version: Any, prefix: str = "") -> list[str]:
        threads.append(threading.current_thread().name)
        return list_files(version, prefix)

    monkeypatch.setattr(spec.checkpoint, "list_files", listing)
    again = PartitionCheckpoint(spec, TaskInfo(0, 1, batch_id=2), RESULTS)
    replay, carried, function_state = again.open_state(None)
    assert replay == {-1: (b"fp", [{"score": 0.5}])} and function_state == []
    assert carried is not None
    assert sorted(e.element.value.row["id"] for e in carried.entries) == list(range(8))
    expected = "aops-read" if where == "s3" else threading.main_thread().name
    assert threads and all(t.startswith(expected) for t in threads), threads

    def broken(version: Any, prefix: str = "") -> list[str]:
        raise OSError("the store refused the listing")

    monkeypatch.setattr(spec.checkpoint, "list_files", broken)
    with pytest.raises(OSError, match="refused the listing"):
        PartitionCheckpoint(spec, TaskInfo(0, 1, batch_id=2), RESULTS).open_state(None)
    assert not [t for t in threading.enumerate() if t.name.startswith("aops-read")]
