"""Exactly-once output across micro-batches, killed task attempts and rescaling (a property).

Each example runs a stream of micro-batches through the partition runtime with a checkpoint,
as Spark would: the partition count may change between batches, and any task attempt may die
after handing out some of its output (its output is then discarded, as Spark discards a failed
attempt's, and the task runs again). Some lookups hang on their first request, so rows are
carried over batch boundaries. Elements are rows (keyed or not) or chunks of three rows (dicts
or Arrow). A last batch without input and without a drain bound ends the stream. Every input
row must come out exactly once, in key order per key in keyed mode. ``capacity`` exceeds the
rows of a micro-batch: a hung lookup at the head of a full queue holds the input back until
its timeout (backpressure, as in Flink), not just the drain. On local disk and on S3, where
partition 0's retention deletes old versions in a thread of its own beside its tasks.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops import AsyncFunction, OutputMode
from asyncio_ops._keygroups import assign_to_key_group, compute_operator_index_for_key_group
from asyncio_ops._runtime import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo, run_partition
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from tests.runtime.specs import partition_spec

MAXP = 16


class HangsOnce(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Rows in ``slow`` hang on their first request (per process), then answer."""

    def __init__(self, slow: set[int]) -> None:
        self.slow = set(slow)

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        i = row["id"]
        if i in self.slow:
            self.slow.discard(i)
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return [{"v": i * 5}]


class HangsOnceChunks(HangsOnce):
    """The same, a chunk at a time: a chunk with a slow row hangs on its first request."""

    async def async_invoke_chunk(self, rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        ids = [r["id"] for r in rows]
        slow = self.slow & set(ids)
        if slow:
            self.slow -= slow
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return [[{"v": i * 5}] for i in ids]


class HangsOnceArrow(HangsOnceChunks):
    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> Any:
        ids = batch.column("id").to_pylist()
        slow = self.slow & set(ids)
        if slow:
            self.slow -= slow
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        return None, {"v": [i * 5 for i in ids]}


def _batch(ids: list[int], keyed: bool) -> list[pa.RecordBatch]:
    if not ids:
        return []
    cols: dict[str, Any] = {"id": pa.array(ids, pa.int64()), "k": pa.array([i % 7 for i in ids])}
    if keyed:
        groups = [assign_to_key_group(i % 7, MAXP) for i in ids]
        cols[KEY_GROUP_COLUMN] = pa.array(groups, pa.int32())
    return [pa.RecordBatch.from_pydict(cols)]


def _spec(fn: HangsOnce, location: str, keyed: bool, parts: int, mode: OutputMode,
          drain: float | None, token: str, chunk: int | None) -> PartitionSpec:  # fmt: skip
    fields = [pa.field("id", pa.int64()), pa.field("k", pa.int64())]
    if keyed:
        fields.append(pa.field(KEY_GROUP_COLUMN, pa.int32()))
    fields.append(pa.field("v", pa.int64()))
    return partition_spec(
        function=fn, function_token=token, mode=mode, timeout=600.0, capacity=16, retry=None,
        output_schema=pa.schema(fields), added_columns=("v",),
        key=("k",) if keyed else (), num_partitions=parts, max_parallelism=MAXP,
        checkpoint=CheckpointStorage(location, "op"), drain_timeout=drain,
        checkpoint_flush_rows=3, batch_size=4, chunk_size=chunk, retain_versions=2,
    )  # fmt: skip


def _owner(i: int, parts: int, keyed: bool) -> int:
    if keyed:
        return compute_operator_index_for_key_group(MAXP, parts, assign_to_key_group(i % 7, MAXP))
    return i % parts


batches_strategy = st.lists(
    st.tuples(
        st.integers(1, 3),  # partitions of this micro-batch
        st.integers(0, 12),  # rows in it
        st.sets(st.integers(0, 2)),  # partitions whose first attempt dies
        st.integers(0, 2),  # output batches a dying attempt hands out first
    ),
    min_size=1,
    max_size=4,
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["local", "s3"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=batches_strategy,
    element=st.sampled_from(["row", "keyed row", "chunk", "arrow chunk"]),
    ordered=st.booleans(),
    slow_every=st.integers(2, 5),
)
def test_every_row_exactly_once_through_kills_carry_over_and_rescaling(
    tmp_path_factory: pytest.TempPathFactory,
    s3_server: Any,
    where: str,
    batches: list[tuple[int, int, set[int], int]],
    element: str,
    ordered: bool,
    slow_every: int,
) -> None:
    if where == "s3":  # partition 0's retention then runs beside its tasks
        location = s3_server(f"exactly-once-{uuid.uuid4().hex[:8]}")
    else:
        location = str(tmp_path_factory.mktemp("ckpt"))
    total = sum(n for _, n, _, _ in batches)
    slow = {i for i in range(total) if i % slow_every == 0}
    keyed = element == "keyed row"
    chunk = 3 if "chunk" in element else None
    cls = {"chunk": HangsOnceChunks, "arrow chunk": HangsOnceArrow}.get(element, HangsOnce)
    fn = cls(slow)
    mode = OutputMode.ORDERED if ordered else OutputMode.UNORDERED
    token = uuid.uuid4().hex
    out: list[dict[str, Any]] = []
    zombies = []
    next_id = 0
    schedule = [*batches, (batches[-1][0], 0, set(), 0)]  # a last batch drains everything
    for batch_id, (parts, n, dying, handed) in enumerate(schedule):
        last = batch_id == len(schedule) - 1
        spec = _spec(fn, location, keyed, parts, mode, None if last else 0.05, token, chunk)
        ids = list(range(next_id, next_id + n))
        next_id += n
        for p in range(parts):
            mine = _batch([i for i in ids if _owner(i, parts, keyed) == p], keyed)
            if p in dying:  # the first attempt hands out some output, then its worker dies
                gen = run_partition(spec, mine, TaskInfo(p, parts, 0, batch_id=batch_id))
                for _ in range(handed):
                    if next(gen, None) is None:
                        break
                zombies.append(gen)  # left suspended: no failure path runs
            attempt = 1 if p in dying else 0
            result = run_partition(spec, mine, TaskInfo(p, parts, attempt, batch_id=batch_id))
            out.extend(r for b in result for r in b.to_pylist())
    for gen in zombies:
        gen.close()
    assert sorted(r["id"] for r in out) == list(range(total))
    assert all(r["v"] == 5 * r["id"] for r in out)
    if keyed and ordered:  # per key, input order, across batches and rescaling
        for k in range(7):
            seen = [r["id"] for r in out if r["k"] == k]
            assert seen == sorted(seen)
