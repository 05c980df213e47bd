"""The partition runtime without Spark: Arrow batches in and out, replay, carry-over."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops import (
    AdaptiveLimit,
    AsyncFunction,
    CheckpointError,
    OutputMode,
    OutputSchemaError,
)
from asyncio_ops._keygroups import assign_to_key_group, compute_operator_index_for_key_group
from asyncio_ops._runtime import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo, run_partition
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import Kind
from tests.helpers import retention_threads
from tests.runtime.specs import partition_spec

MAXP = 16


class Lookup(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Doubles ``id``; records every request; rows in ``hang`` never answer, once."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.hang: set[int] = set()
        self.fail_at: int | None = None

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        i = row["id"]
        self.calls.append(i)
        if i == self.fail_at:
            raise RuntimeError(f"boom at {i}")
        if i in self.hang:
            self.hang.discard(i)
            await asyncio.sleep(3600)
        await asyncio.sleep(0)
        return [{"double": i * 2}]


def spec_for(fn: Lookup, tmp_path: Path | None, **kw: Any) -> PartitionSpec:
    keyed = bool(kw.get("key"))
    fields = [pa.field("id", pa.int64())]
    if keyed:
        fields.append(pa.field(KEY_GROUP_COLUMN, pa.int32()))
    fields.append(pa.field("double", pa.int64()))
    defaults: dict[str, Any] = {
        "function": fn,
        "function_token": uuid.uuid4().hex,
        "mode": OutputMode.ORDERED,
        "timeout": 30.0,
        "capacity": 50,
        "retry": None,
        "output_schema": pa.schema(fields),
        "added_columns": ("double",),
        "max_parallelism": MAXP,
        "checkpoint": CheckpointStorage(str(tmp_path), "op") if tmp_path else None,
    }
    defaults.update(kw)
    return partition_spec(**defaults)


def batches(ids: list[int], size: int = 10, keyed: bool = False) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        cols: dict[str, Any] = {"id": pa.array(chunk, pa.int64())}
        if keyed:
            cols[KEY_GROUP_COLUMN] = pa.array(
                [assign_to_key_group(i, MAXP) for i in chunk], pa.int32()
            )
        out.append(pa.RecordBatch.from_pydict(cols))
    return out


def rows_of(out: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in out for r in b.to_pylist()]


def test_rows_flow_in_order_with_bounded_batches() -> None:
    fn = Lookup()
    spec = spec_for(fn, None, batch_size=7)
    out = list(run_partition(spec, batches(list(range(30))), TaskInfo()))
    assert [r["double"] for r in rows_of(out)] == [i * 2 for i in range(30)]
    assert max(b.num_rows for b in out) <= 7


def test_output_schema_errors_name_the_row() -> None:
    class Bad(Lookup):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"double": "two"}] if row["id"] == 3 else [{"double": 1}]

    with pytest.raises(OutputSchemaError, match=r"'double'.*'two'.*'id': 3"):
        list(run_partition(spec_for(Bad(), None), batches(list(range(5))), TaskInfo()))


def test_retried_attempt_does_not_request_completed_lookups_again(tmp_path: Path) -> None:
    fn = Lookup()
    fn.fail_at = 55
    spec = spec_for(fn, tmp_path, checkpoint_version=1)
    with pytest.raises(Exception, match="boom at 55"):
        list(run_partition(spec, batches(list(range(100))), TaskInfo(attempt_number=0)))
    assert fn.calls == list(range(56))

    fn.calls.clear()
    fn.fail_at = None
    out = list(run_partition(spec, batches(list(range(100))), TaskInfo(attempt_number=1)))
    assert [r["double"] for r in rows_of(out)] == [i * 2 for i in range(100)]
    # what the failing attempt completed was logged as it failed: only the rest is requested
    assert fn.calls == list(range(55, 100))


def test_a_dead_attempt_repeats_at_most_capacity_plus_the_flush_count(tmp_path: Path) -> None:
    fn = Lookup()
    spec = spec_for(
        fn, tmp_path, checkpoint_version=2, capacity=8, checkpoint_flush_rows=10, batch_size=5
    )
    first = run_partition(spec, batches(list(range(200)), size=50), TaskInfo(attempt_number=0))
    got = [r for _ in range(8) for r in next(first).to_pylist()]  # 40 rows out, then it dies:
    assert len(got) == 40  # ... left suspended, so no failure path runs (a killed worker)
    fn.calls.clear()
    out = rows_of(list(run_partition(spec, batches(list(range(200)), size=50), TaskInfo(0, 1, 1))))
    assert [r["double"] for r in out] == [2 * i for i in range(200)]
    repeated = [i for i in fn.calls if i < 50]
    # completed before the death: at least the 40 emitted; repeated: at most what was in
    # flight (capacity) plus the lookups not yet flushed (fewer than flush_rows)
    assert len(repeated) <= 8 + 10 - 1
    assert fn.calls == sorted(fn.calls) and fn.calls[-1] == 199
    first.close()


def test_replay_log_is_ignored_for_a_different_row(tmp_path: Path) -> None:
    fn = Lookup()
    spec = spec_for(fn, tmp_path, checkpoint_version=4)
    list(run_partition(spec, batches(list(range(20))), TaskInfo(attempt_number=0)))
    fn.calls.clear()
    changed = list(range(20))
    changed[5] = 500  # the input changed at position 5: its logged result must not be used
    out = list(run_partition(spec, batches(changed), TaskInfo(attempt_number=1)))
    assert fn.calls == [500]
    assert rows_of(out)[5] == {"id": 500, "double": 1000}


def test_streaming_carry_over_replays_in_flight_elements_first(tmp_path: Path) -> None:
    fn = Lookup()
    fn.hang = {0, 10, 20}
    # the healthy rows must finish within drain_timeout: a margin for a loaded machine
    spec = spec_for(fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=2.0)
    out0 = rows_of(list(run_partition(spec, batches(list(range(30))), TaskInfo(batch_id=0))))
    assert sorted(r["id"] for r in out0) == [i for i in range(30) if i % 10]
    assert spec.checkpoint is not None
    assert spec.checkpoint.list_files(0, "subtask-") == ["subtask-00000.ckpt"]

    out1 = rows_of(list(run_partition(spec, batches([100, 101]), TaskInfo(batch_id=1))))
    assert [r["id"] for r in out1] == [0, 10, 20, 100, 101]  # carried over, then new input
    # re-running batch 1 (a restarted query) restores version 0 again: idempotent
    again = rows_of(list(run_partition(spec, batches([100, 101]), TaskInfo(batch_id=1))))
    assert again == out1


def test_carry_over_moves_by_key_group_on_rescale(tmp_path: Path) -> None:
    fn = Lookup()
    ids = list(range(200))
    fn.hang = set(ids)
    spec2 = spec_for(
        fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=0.2, key=("id",),
        num_partitions=2, capacity=500,
    )  # fmt: skip
    for p in range(2):
        mine = [i for i in ids if compute_operator_index_for_key_group(
            MAXP, 2, assign_to_key_group(i, MAXP)) == p]  # fmt: skip
        out = list(run_partition(spec2, batches(mine, keyed=True), TaskInfo(p, 2, batch_id=0)))
        assert rows_of(out) == []
    spec3 = spec_for(
        fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=5, key=("id",),
        num_partitions=3, function_token=spec2.function_token,
    )  # fmt: skip
    seen: list[int] = []
    for p in range(3):
        task = TaskInfo(p, 3, batch_id=1)
        out = rows_of(list(run_partition(spec3, batches([], keyed=True), task)))
        for r in out:
            kg = assign_to_key_group(r["id"], MAXP)
            assert compute_operator_index_for_key_group(MAXP, 3, kg) == p
        seen.extend(r["id"] for r in out)
    assert sorted(seen) == ids  # nothing lost, nothing duplicated


def test_incomplete_previous_version_is_an_error_naming_the_file(tmp_path: Path) -> None:
    fn = Lookup()
    spec = spec_for(fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=0.2, num_partitions=2)
    for p in range(2):
        list(run_partition(spec, batches([p]), TaskInfo(p, 2, batch_id=0)))
    assert spec.checkpoint is not None
    missing = tmp_path / "op" / "v0000000000" / "subtask-00001.ckpt"
    missing.unlink()
    with pytest.raises(CheckpointError, match=r"incomplete.*subtask-00001\.ckpt"):
        list(run_partition(spec, batches([]), TaskInfo(0, 2, batch_id=1)))


def _carried_keyed(fn: Lookup, tmp_path: Path) -> PartitionSpec:
    fn.hang = set(range(40))
    spec = spec_for(
        fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=0.2, key=("id",),
        num_partitions=1, capacity=100,
    )  # fmt: skip
    assert rows_of(list(run_partition(spec, batches(list(range(40)), keyed=True),
                                      TaskInfo(0, 1, batch_id=0)))) == []  # fmt: skip
    return spec


def test_a_keyed_carry_over_written_by_an_earlier_release_restores(tmp_path: Path) -> None:
    """Version 0 rewritten as earlier releases wrote a keyed carry-over (each key
    group's elements keyed state, deadlines timers, a KEY_GROUPS file, a manifest
    without ``aops.in_flight``): micro-batch 1 restores it and every row leaves once."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._inflight import CarryOver, WatermarkState, snapshot_operator_state
    from asyncio_ops._runtime._stored import ROW, ElementSerializer
    from asyncio_ops._runtime._versions import (
        _ELEMENT,
        _INPUT_SCHEMA,
        IN_FLIGHT,
        read_previous,
        write_version,
    )  # fmt: skip

    from .earlier_releases import keyed_carry_over_as_earlier_releases_wrote

    fn = Lookup()
    spec = _carried_keyed(fn, tmp_path)
    storage = spec.checkpoint
    assert storage is not None
    found = read_previous(storage, 0)
    assert found is not None
    meta = found.manifests[0].schema.metadata or {}
    assert meta[IN_FLIGHT] == b"1"
    input_schema = pa.ipc.read_schema(pa.py_buffer(meta[_INPUT_SCHEMA]))
    carry = CarryOver(ElementSerializer(ROW, spec.output_schema, input_schema),
                      max_parallelism=MAXP, key_groups=KeyGroupRange(0, MAXP - 1))  # fmt: skip
    elements = carry.batches.elements(
        carry.restore_keyed(found.element_sections(carry.key_groups, MAXP))
    )
    assert len(elements) == 40 and all(e.deadline is not None for e in elements)
    pairs = [(assign_to_key_group(e.row["id"], MAXP), e) for e in elements]
    ops = snapshot_operator_state(0, 1, WatermarkState())  # its watermarks, as then written
    storage.delete_versions([0])
    write_version(storage, 0, 0, 1, True, keyed_carry_over_as_earlier_releases_wrote(carry, pairs),
                  ops, {_ELEMENT: meta[_ELEMENT], _INPUT_SCHEMA: meta[_INPUT_SCHEMA]})  # fmt: skip
    out = rows_of(list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1))))
    assert sorted(r["id"] for r in out) == list(range(40))
    assert all(r["double"] == 2 * r["id"] for r in out)


def test_a_shared_section_is_read_once_whole_and_each_partition_keeps_its_key_groups(
    tmp_path: Path,
) -> None:
    """A keyed carry-over's one section (tag SHARED) is read whole, not split by key
    group: a partition owning half the key groups gets exactly the elements of its
    half, and the two halves are all 40 once; a file that lacks a key group its
    manifest names there, or holds one the manifest does not name there, is an error
    naming the file and the key group."""
    from asyncio_ops._keygroups import KeyGroupRange
    from asyncio_ops._runtime._inflight import CarryOver
    from asyncio_ops._runtime._stored import ROW, ElementSerializer
    from asyncio_ops._runtime._versions import _INPUT_SCHEMA, read_previous, write_version
    from asyncio_ops._storage._container import SHARED, Section

    spec = _carried_keyed(Lookup(), tmp_path)
    storage = spec.checkpoint
    assert storage is not None
    found = read_previous(storage, 0)
    assert found is not None
    meta = found.manifests[0].schema.metadata or {}
    input_schema = pa.ipc.read_schema(pa.py_buffer(meta[_INPUT_SCHEMA]))
    everything = found.element_sections(KeyGroupRange(0, MAXP - 1), MAXP)
    assert [s.tag for _, s in everything] == [SHARED]
    ids: list[int] = []
    for half in (KeyGroupRange(0, MAXP // 2 - 1), KeyGroupRange(MAXP // 2, MAXP - 1)):
        carry = CarryOver(ElementSerializer(ROW, spec.output_schema, input_schema),
                          max_parallelism=MAXP, key_groups=half)  # fmt: skip
        got = carry.batches.elements(carry.restore_keyed(found.element_sections(half, MAXP)))
        assert got and all(assign_to_key_group(e.row["id"], MAXP) in half for e in got)
        ids += [e.row["id"] for e in got]
    assert sorted(ids) == list(range(40))

    ((_, shared),) = everything
    named = sorted(set(shared.table.column("key_group").to_pylist()))
    gone = named[0]
    without = shared.table.filter(pa.compute.not_equal(shared.table.column("key_group"), gone))
    ops = None  # keyed: no operator state (the watermarks are in the manifest)
    storage.delete_versions([0])
    write_version(storage, 0, 0, 1, True, dict.fromkeys(named, Section(SHARED, without)), ops,
                  dict(meta), kind=Kind.IN_FLIGHT)  # fmt: skip
    with pytest.raises(CheckpointError, match=rf"kg-p00000-.*\.ckpt lacks key group {gone} "):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))
    storage.delete_versions([0])  # the manifest names one key group fewer than the file holds
    write_version(storage, 0, 0, 1, True, dict.fromkeys(named[1:], Section(SHARED, shared.table)),
                  ops, dict(meta), kind=Kind.IN_FLIGHT)  # fmt: skip
    with pytest.raises(CheckpointError, match=rf"\.ckpt holds key group {gone}, which the man"):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))


def test_missing_key_group_file_is_an_error_naming_it(tmp_path: Path) -> None:
    spec = _carried_keyed(Lookup(), tmp_path)
    kg_files = sorted((tmp_path / "op" / "v0000000000").glob("kg-*.ckpt"))
    assert kg_files
    kg_files[0].unlink()
    with pytest.raises(CheckpointError, match=rf"{kg_files[0].name} is missing"):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))


def test_corrupt_carried_over_file_is_an_error_naming_it(tmp_path: Path) -> None:
    from asyncio_ops import CorruptCheckpointError

    spec = _carried_keyed(Lookup(), tmp_path)
    victim = sorted((tmp_path / "op" / "v0000000000").glob("kg-*.ckpt"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=rf"{victim.name} fails its checksum"):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))


class Memo(Lookup):
    """A lookup with a memo that it checkpoints (the shape of a connector's cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.memo: dict[int, int] = {}
        self.offered: list[tuple[int, int]] | None = None

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        i = row["id"]
        if i not in self.memo:
            self.calls.append(i)
            self.memo[i] = i * 2
        return [{"double": self.memo[i]}]

    def snapshot_function_state(self) -> pa.Table:
        keys = sorted(self.memo)
        return pa.table({"id": keys, "double": [self.memo[k] for k in keys]})

    def initialize_function_state(self, tables: list[pa.Table]) -> None:
        entries = [(r["id"], r["double"]) for t in tables for r in t.to_pylist()]
        self.offered = entries
        self.memo.update(entries)


def test_function_state_is_checkpointed_and_offered_to_the_next_version(tmp_path: Path) -> None:
    first = Memo()
    spec1 = spec_for(first, tmp_path, checkpoint_version=1)
    list(run_partition(spec1, batches(list(range(10))), TaskInfo(0, 2)))
    list(run_partition(spec1, batches(list(range(10, 20))), TaskInfo(1, 2)))
    assert first.calls == list(range(20))

    second = Memo()  # another job run: a fresh function on a fresh worker
    spec2 = spec_for(second, tmp_path, checkpoint_version=2)
    out = rows_of(list(run_partition(spec2, batches(list(range(25))), TaskInfo(0, 1))))
    assert [r["double"] for r in out] == [2 * i for i in range(25)]
    # the function is worker-wide: each partition wrote all it had; merged, that is 0..19
    assert second.offered is not None and dict(second.offered) == {i: 2 * i for i in range(20)}
    assert second.calls == list(range(20, 25))  # only what no earlier partition had


@pytest.mark.parametrize("where", ["local", "s3"])
def test_every_partitions_function_state_is_read_at_once_on_a_remote_store(
    where: str, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming, each partition offers its function every partition's state of the
    previous version, in partition order: on S3 the files are read at once, in threads
    of their own beside the restore of the previous version's elements; on local disk
    one after the other."""
    location = s3_server(f"fnstate-{uuid.uuid4().hex[:8]}") if where == "s3" else str(tmp_path)
    storage = CheckpointStorage(location, "op")
    for p in range(3):  # micro-batch 0: three workers, each its own function
        spec = spec_for(Memo(), None, checkpoint=storage)  # a token of its own
        ids = list(range(10 * p, 10 * p + 10))
        list(run_partition(spec, batches(ids), TaskInfo(p, 3, batch_id=0)))
    threads: list[str] = []
    read = storage.read

    def reading(version: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("fnstate-"):
            threads.append(threading.current_thread().name)
        return read(version, name, *args, **kwargs)

    monkeypatch.setattr(storage, "read", reading)
    fresh = Memo()  # micro-batch 1 on a new worker
    spec = spec_for(fresh, None, checkpoint=storage)
    out = rows_of(list(run_partition(spec, batches([1, 35]), TaskInfo(0, 3, batch_id=1))))
    assert [r["double"] for r in out] == [2, 70]
    assert fresh.offered == [(i, 2 * i) for i in range(30)]  # partitions 0, 1, 2 in order
    assert fresh.calls == [35]  # 1 came from partition 0's state
    expected = "aops-read" if where == "s3" else threading.main_thread().name
    assert len(threads) == 3 and all(t.startswith(expected) for t in threads), threads


def test_a_worker_keeps_a_bounded_number_of_functions_open() -> None:
    from asyncio_ops._runtime import MAX_OPEN_FUNCTIONS, WorkerRuntime

    class Tracked(Lookup):
        closed = 0

        def close(self) -> None:
            Tracked.closed += 1

    runtime = WorkerRuntime.get()
    for token in list(runtime.functions):  # start from a clean worker
        runtime._close(token, runtime.functions.pop(token))
    fns = [Tracked() for _ in range(MAX_OPEN_FUNCTIONS + 3)]
    for fn in fns:  # many DataFrames built by one driver, each its own function
        list(run_partition(spec_for(fn, None), batches([1]), TaskInfo()))
    assert len(runtime.functions) == MAX_OPEN_FUNCTIONS
    assert Tracked.closed == 3  # the least recently used were closed, not leaked


def test_a_partition_without_input_then_with_input_carries_whole_rows(tmp_path: Path) -> None:
    """A micro-batch with no input writes an empty checkpoint that knows no schema; the next
    one must carry its rows with their own schema, not that empty one."""
    fn = Lookup()
    fn.hang = {7}
    spec = spec_for(fn, tmp_path, mode=OutputMode.UNORDERED, drain_timeout=0.1)
    assert rows_of(list(run_partition(spec, [], TaskInfo(batch_id=0)))) == []
    assert rows_of(list(run_partition(spec, batches([7]), TaskInfo(batch_id=1)))) == []
    out = rows_of(list(run_partition(spec, [], TaskInfo(batch_id=2))))
    assert out == [{"id": 7, "double": 14}]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_float_in_an_integer_column_is_refused_not_truncated(chunked: bool) -> None:
    class Fractional(AsyncFunction[dict[str, Any], dict[str, Any]]):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"double": 1.7 if row["id"] == 3 else float(row["id"] * 2)}]

        async def async_invoke_chunk(self, rows: list[dict[str, Any]]) -> list[Any]:
            return [await self.async_invoke(r) for r in rows]

    kw: dict[str, Any] = {"chunk_size": 4} if chunked else {}
    s = spec_for(Fractional(), None, **kw)  # type: ignore[arg-type]
    with pytest.raises(OutputSchemaError, match=r"'double' \(bigint\) cannot hold 1\.7") as info:
        list(run_partition(s, iter(batches(list(range(8)))), TaskInfo()))
    assert "'id': 3" in str(info.value)
    # whole floats fit, as in Arrow's safe cast
    ok = spec_for(Fractional(), None, **kw)  # type: ignore[arg-type]
    rows = rows_of(list(run_partition(ok, iter(batches([0, 1, 2])), TaskInfo())))
    assert [r["double"] for r in rows] == [0, 2, 4]


def test_a_float_in_an_integer_arrow_column_is_refused_not_truncated() -> None:
    from asyncio_ops._runtime._adapters import _column

    unfit = r"cannot hold 1\.7 \(float, not a whole number\) at output row 1"
    with pytest.raises(OutputSchemaError, match=unfit):
        _column("n", pa.int64(), [1, 1.7, 3], 3)
    assert _column("n", pa.int64(), [1, 2.0, None], 3).to_pylist() == [1, 2, None]


def test_an_adaptive_limit_starts_where_the_workers_last_partition_ended() -> None:
    from asyncio_ops._runtime import RunMetrics, WorkerRuntime

    class Slow(Lookup):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            await asyncio.sleep(0.002)
            return [{"double": row["id"] * 2}]

    spec = spec_for(Slow(), None, capacity="auto", max_capacity=300)
    ended: list[RunMetrics] = []
    for _ in range(2):
        list(run_partition(spec, batches(list(range(3000)), size=500), TaskInfo(),
                           on_done=ended.append))  # fmt: skip
        runtime = WorkerRuntime.get()
        assert runtime.limits[f"function {spec.function_token}"][0] == ended[-1].capacity_limits[0]
    first, second = (m.capacity_limits[0] for m in ended)
    assert 1 <= first <= 300 and 1 <= second <= 300  # within the bound (growth depends on load)
    assert runtime.limiter(spec) is not None and runtime.limiter(spec).limit == second  # type: ignore[union-attr]


def test_an_adaptive_limit_starts_where_the_last_partition_calling_its_service_ended() -> None:
    """Two operators (two functions, two jobs) calling one service: the second starts
    where the first's limit ended; an operator on another service starts afresh."""
    from asyncio_ops._runtime import RunMetrics, WorkerRuntime

    class Calls(Lookup):
        def __init__(self, endpoint: str) -> None:
            self.endpoint = endpoint

        def service_endpoint(self) -> str:
            return self.endpoint

        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            await asyncio.sleep(0.002)
            return [{"double": row["id"] * 2}]

    first = spec_for(Calls("http http://svc.test:80"), None, capacity="auto", max_capacity=300)
    ended: list[RunMetrics] = []
    list(run_partition(first, batches(list(range(3000)), size=500), TaskInfo(),
                       on_done=ended.append))  # fmt: skip
    runtime = WorkerRuntime.get()
    learned = ended[-1].capacity_limits[0]
    assert runtime.limits["service http http://svc.test:80"] == (learned, 0)
    same = spec_for(Calls("http http://svc.test:80"), None, capacity="auto", max_capacity=300)
    other = spec_for(Calls("http http://other.test:80"), None, capacity="auto", max_capacity=300)
    for spec in (same, other):  # opened as a partition would open them
        runtime.function(spec, TaskInfo())
    assert runtime.limiter(same).limit == learned  # type: ignore[union-attr]
    assert runtime.limiter(other).limit == 16  # type: ignore[union-attr]
    runtime.remember(same, AdaptiveLimit(initial=77))  # wherever the load took it
    assert runtime.limiter(first).limit == 77  # type: ignore[union-attr]
    assert runtime.limiter(other).limit == 16  # type: ignore[union-attr]


def test_a_deleted_previous_version_is_an_error_naming_it_not_empty_state(
    tmp_path: Path,
) -> None:
    import shutil

    spec = _carried_keyed(Lookup(), tmp_path)  # version 0 carries 40 in-flight rows
    list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))
    shutil.rmtree(tmp_path / "op" / "v0000000001")  # the newest version, deleted
    with pytest.raises(
        CheckpointError, match=r"version 1 of .* holds no state .* while version 0 does"
    ):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=2)))


def test_an_operator_without_any_version_starts_empty_at_any_micro_batch(
    tmp_path: Path,
) -> None:
    # an operator added to a running query: its first micro-batch is not batch 0
    spec = spec_for(Lookup(), tmp_path, mode=OutputMode.UNORDERED, drain_timeout=0.2,
                    num_partitions=1)  # fmt: skip
    out = rows_of(list(run_partition(spec, batches([1, 2]), TaskInfo(0, 1, batch_id=7))))
    assert sorted(r["id"] for r in out) == [1, 2]


@pytest.mark.parametrize("rewrite", ["outside the range", "named twice"])
def test_a_manifest_naming_a_stray_key_group_is_an_error_naming_it(
    tmp_path: Path, rewrite: str
) -> None:
    spec = _carried_keyed(Lookup(), tmp_path)
    storage = spec.checkpoint
    assert storage is not None
    table = storage.read(0, "subtask-00000.ckpt", Kind.MANIFEST)
    groups = table.column("key_groups").to_pylist()  # of each section the chains name
    assert len(groups[0]) > 1
    # one key group moved outside 0..max_parallelism-1, or renamed as another one there
    maxp = spec.options.max_parallelism
    groups[0][0] = maxp + 7 if rewrite == "outside the range" else groups[0][1]
    index = table.schema.get_field_index("key_groups")
    column = pa.array(groups, table.schema.field(index).type)
    stray = table.set_column(index, table.schema.field(index), column)
    meta = table.schema.metadata
    storage.write(0, "subtask-00000.ckpt", Kind.MANIFEST, stray.replace_schema_metadata(meta))
    last = spec.options.max_parallelism - 1
    message = (
        rf"outside 0\.\.{last}" if rewrite == "outside the range"
        else r"key group \d+'s chain names version 0 after 0"
    )  # fmt: skip
    with pytest.raises(CheckpointError, match=rf"subtask-00000\.ckpt.*{message}"):
        list(run_partition(spec, batches([], keyed=True), TaskInfo(0, 1, batch_id=1)))


def test_an_adaptive_limit_starts_where_the_partition_ended_its_last_micro_batch(
    tmp_path: Path,
) -> None:
    from asyncio_ops._runtime import RunMetrics, WorkerRuntime

    class Slow(Lookup):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            await asyncio.sleep(0.002)
            return [{"double": row["id"] * 2}]

    spec = spec_for(Slow(), tmp_path, capacity="auto", max_capacity=300, num_partitions=1)
    ended: list[RunMetrics] = []
    list(run_partition(spec, batches(list(range(3000)), size=500), TaskInfo(0, 1, batch_id=0),
                       on_done=ended.append))  # fmt: skip
    assert ended[-1].capacity_limits[0] >= 1
    # What the partition's manifest carries, set to a value the limit's own start (16)
    # cannot reach by chance on a loaded machine (how far it grew depends on the load).
    storage = spec.checkpoint
    assert storage is not None
    manifest = storage.read(0, "subtask-00000.ckpt", Kind.MANIFEST)
    meta = dict(manifest.schema.metadata or {})
    assert int(meta[b"aops.limit"]) == ended[-1].capacity_limits[0]
    meta[b"aops.limit"] = b"123"
    storage.write(0, "subtask-00000.ckpt", Kind.MANIFEST, manifest.replace_schema_metadata(meta))
    grown = 123
    WorkerRuntime.get().limits.clear()  # the next micro-batch runs on another worker
    # too few rows for a round to end: the limit it ends with is the one it started with
    list(run_partition(spec, batches(list(range(5))), TaskInfo(0, 1, batch_id=1),
                       on_done=ended.append))  # fmt: skip
    assert ended[-1].capacity_limits[0] == grown


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_async_operators_retention_runs_beside_its_task_on_a_remote_store(
    where: str, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming, partition 0 deletes the versions older than the newest
    ``retain_versions``: on S3 in a thread of its own, started once its task has restored,
    beside the task; on local disk in line at its end. Either way exactly the newest
    ``retain_versions`` versions stay, and every row comes out."""
    location = s3_server(f"async-retain-{uuid.uuid4().hex[:8]}") if where == "s3" else str(tmp_path)
    storage = CheckpointStorage(location, "op")
    spec = spec_for(Lookup(), None, checkpoint=storage, retain_versions=3)
    seen = retention_threads(storage, monkeypatch)
    for b in range(6):
        for p in range(2):
            ids = list(range(100 * b + 10 * p, 100 * b + 10 * p + 10))
            out = rows_of(list(run_partition(spec, batches(ids), TaskInfo(p, 2, batch_id=b))))
            assert [r["double"] for r in out] == [2 * i for i in ids]
    assert storage.versions() == [3, 4, 5]
    thread = "aops-retention" if where == "s3" else threading.main_thread().name
    assert seen and all(s.split(" ")[1].startswith(thread) for s in seen), seen
    assert not [t for t in threading.enumerate() if t.name.startswith("aops-retention")]


@pytest.mark.parametrize("fails", ["deletion", "function"])
def test_the_async_operators_failed_retention_fails_the_task_and_leaves_no_thread(
    fails: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A deletion that fails in partition 0's retention thread fails its task with that
    error; when the function fails too, the function's error is the task's and the
    deletion's is logged. No retention thread outlives the task."""
    storage = CheckpointStorage(s3_server(f"async-fails-{uuid.uuid4().hex[:8]}"), "op")
    fn = Lookup()
    spec = spec_for(fn, None, checkpoint=storage, retain_versions=2)
    for b in range(3):
        list(run_partition(spec, batches([b]), TaskInfo(0, 1, batch_id=b)))

    def broken(versions: Any) -> None:
        raise OSError("the store refused the deletion")

    monkeypatch.setattr(storage, "delete_versions", broken)
    if fails == "function":
        fn.fail_at = 3
    raised = "refused the deletion" if fails == "deletion" else "boom at 3"
    with pytest.raises(Exception, match=raised):
        list(run_partition(spec, batches([3]), TaskInfo(0, 1, batch_id=3)))
    assert not [t for t in threading.enumerate() if t.name.startswith("aops-retention")]
    if fails == "function":
        assert "retention of version 3 failed too" in caplog.text
