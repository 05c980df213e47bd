"""``run_keyed_process`` on one partition, in-process, with a real checkpoint storage:
what a Spark task of ``keyed_process`` does at each micro-batch, without Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops._keygroups import assign_to_key_group
from asyncio_ops._runtime import KEY_GROUP_COLUMN, TaskInfo
from asyncio_ops._runtime._keyed_partition import run_keyed_process
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ValueStateDescriptor,
)
from tests.runtime.specs import keyed_process_spec

Row = dict[str, Any]
OUTPUT = pa.schema([("user", pa.string()), ("n", pa.int64())])


class Count(KeyedProcessFunction[str, Row, Row]):
    """A running count per user, in the value state named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int](self.name))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        out.collect({"user": value["user"], "n": n})


def micro_batch(
    fn: Count, storage: CheckpointStorage, batch_id: int, users: list[str]
) -> list[Row]:
    """One micro-batch of one partition (of one), as a Spark task runs it."""
    spec = keyed_process_spec(function=fn, key=("user",), output_schema=OUTPUT,
                            num_partitions=1, checkpoint=storage)  # fmt: skip
    rows = [{"user": u, KEY_GROUP_COLUMN: assign_to_key_group(u, spec.options.max_parallelism)}
            for u in users]  # fmt: skip
    task = TaskInfo(partition_id=0, num_partitions=1, batch_id=batch_id)
    out = run_keyed_process(spec, [pa.RecordBatch.from_pylist(rows)], task)
    return [r for b in out for r in b.to_pylist()]


def test_restored_state_no_descriptor_claims_is_kept_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = CheckpointStorage(str(tmp_path), "counts")
    assert micro_batch(Count("count"), storage, 0, ["a", "a", "b"])[-1] == {"user": "b", "n": 1}
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        renamed = micro_batch(Count("total"), storage, 1, ["a"])
    assert renamed == [{"user": "a", "n": 1}]  # the renamed descriptor starts empty ...
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    message = warning.getMessage()
    assert "state(s) ['count']" in message  # ... and the warning names what it left behind
    assert "uid 'counts'" in message and "checkpoint version 0" in message
    # the unclaimed state was kept: the old name finds its counts again
    caplog.clear()
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        again = micro_batch(Count("count"), storage, 2, ["a", "b"])
    assert again == [{"user": "a", "n": 3}, {"user": "b", "n": 2}]
    assert "state(s) ['total']" in caplog.text  # now the other one is unclaimed


def test_claimed_state_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = CheckpointStorage(str(tmp_path), "counts")
    micro_batch(Count("count"), storage, 0, ["a"])
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        assert micro_batch(Count("count"), storage, 1, ["a"]) == [{"user": "a", "n": 2}]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
