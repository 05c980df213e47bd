"""Benchmark of a streaming micro-batch boundary: writing and restoring what is carried over.

Run: ``python -m bench.carry_over`` (``--elements N``, ``--repeat R``, default 101).

A partition ends a micro-batch with N elements not yet emitted (half still in
flight with a deadline, half complete with one result each) and writes them
as the next micro-batch's carry-over; the next micro-batch restores them. For
keyed (one key per element, spread over 64 of the partition's key groups,
as Spark's hash would give), with ``state_backend`` heap and RocksDB (which
only reads earlier releases' keyed carry-overs, so the two should agree), and
unkeyed, this prints the best and the median of R runs (the garbage of the
cases before collected before a case's first run, each run's result released
after its timing; the median counts the collections a run's own garbage
triggers) of the wall time of ``finish`` (write) and ``restore`` (read) through a local
checkpoint directory, per element, beside two floors, each one Arrow IPC
table written and read (to Python values) in one piece through the same
storage: the input rows alone (``floor (input rows)``, the floor the target
of "within 3x" was set against), and the table a carry-over must hold, the
same elements with their places, results, attempts and deadlines
(``floor (elements)``: what is left above it is the layout and the
operator's objects, not the data). The process's garbage collector is tuned
as a Python worker's is (``asyncio_ops._runtime._worker``: the modules
frozen, a first threshold of 20,000 allocations), where the carry-over runs.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from asyncio_ops._elements import Record
from asyncio_ops._engine._operator_snapshot import SnapshotEntry
from asyncio_ops._engine._wait_operator import OutputMode
from asyncio_ops._functions import as_async_function
from asyncio_ops._runtime import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo, WaitOptions
from asyncio_ops._runtime._adapters import RowValue
from asyncio_ops._runtime._inflight import WatermarkState
from asyncio_ops._runtime._partition_checkpoint import PartitionCheckpoint
from asyncio_ops._runtime._stored import to_stored
from asyncio_ops._runtime._worker import _tune_gc
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import Kind

IN = pa.schema([("id", pa.int64()), ("name", pa.string()), (KEY_GROUP_COLUMN, pa.int32())])
OUT = pa.schema([("score", pa.float64())])


def entries(n: int, keyed: bool) -> list[SnapshotEntry]:
    out = []
    for i in range(n):
        row = {"id": i, "name": f"name-{i}", KEY_GROUP_COLUMN: i % 64 if keyed else None}
        done = (({"score": i / 2},)) if i % 2 else None
        record = Record(RowValue(row, None, i), None)
        out.append(SnapshotEntry(record, done, i if keyed else None, 1, time.time() + 60))
    return out


async def echo(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [row]


def spec(root: Path, keyed: bool, backend: str) -> PartitionSpec:
    storage = CheckpointStorage(str(root), "op")
    return PartitionSpec(
        options=WaitOptions.of(
            timeout=60.0, state_backend=backend, checkpoint_location=storage.location
        ),
        function=as_async_function(echo),
        function_token="bench",
        mode=OutputMode.UNORDERED,
        output_schema=OUT,
        added_columns=("score",),
        capacity=100,
        on_empty="drop",
        output_buffer=0,
        batch_size=10_000,
        uid="op",
        key=("id",) if keyed else (),
        num_partitions=2,
        checkpoint=storage,
    )


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """The best and the median of ``repeat`` timed runs of ``fn``: the garbage of the
    cases before collected once, before the first; each run's result released after
    its timing, before the next (so no run pays for freeing another's)."""
    times = []
    gc.collect()
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result
    return min(times), statistics.median(times)


def bench(n: int, repeat: int, keyed: bool, backend: str) -> tuple[tuple[float, float], ...]:
    with tempfile.TemporaryDirectory() as tmp:
        s = spec(Path(tmp), keyed, backend)
        todo = entries(n, keyed)
        # partition 0 of 2 owns key groups 0..63 of 128
        writer = PartitionCheckpoint(s, TaskInfo(0, 2, batch_id=1), pa.list_(pa.struct(list(OUT))))

        def write() -> None:
            writer.finish(todo, WatermarkState(-math.inf, -math.inf), IN)

        write_s = best(write, repeat)
        other = PartitionCheckpoint(s, TaskInfo(1, 2, batch_id=1), pa.list_(pa.struct(list(OUT))))
        other.finish([], WatermarkState(-math.inf, -math.inf), IN)  # partition 1: nothing
        reader = PartitionCheckpoint(s, TaskInfo(0, 2, batch_id=2), pa.list_(pa.struct(list(OUT))))

        def read() -> Any:
            restored = reader.restore()
            assert restored is not None
            return restored.entries

        read_s = best(read, repeat)
        assert len(read()) == n
        return write_s, read_s


def floor(n: int, repeat: int) -> tuple[tuple[float, float], ...]:
    rows = [{"id": i, "name": f"name-{i}", KEY_GROUP_COLUMN: i % 64} for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        storage = CheckpointStorage(tmp, "op")

        def write() -> None:
            storage.write(1, "floor.ckpt", Kind.REPLAY_LOG, pa.Table.from_pylist(rows, schema=IN))

        def read() -> Any:
            return storage.read(1, "floor.ckpt", Kind.REPLAY_LOG).to_pylist()

        return best(write, repeat), best(read, repeat)


def floor_elements(n: int, repeat: int) -> tuple[tuple[float, float], ...]:
    with tempfile.TemporaryDirectory() as tmp:
        s = spec(Path(tmp), True, "heap")
        writer = PartitionCheckpoint(s, TaskInfo(0, 2, batch_id=1), pa.list_(pa.struct(list(OUT))))
        schema = writer._carry_over(IN, 2).batches.schema
        rows = [e._asdict() for e in to_stored(entries(n, True), 0, writer.kind)]
        storage = CheckpointStorage(tmp, "op")

        def write() -> None:
            table = pa.Table.from_pylist(rows, schema=schema)
            storage.write(1, "floor.ckpt", Kind.REPLAY_LOG, table)

        def read() -> Any:
            return storage.read(1, "floor.ckpt", Kind.REPLAY_LOG).to_pylist()

        return best(write, repeat), best(read, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=101)
    args = parser.parse_args()
    _tune_gc()  # as in a worker
    n = args.elements
    print(f"{n} elements carried over; {args.repeat} runs; microseconds per element")
    print("(x: the best against the input-row floor's best, the goal's yardstick)")
    print(f"{'':<19} {'write':>22}  {'restore':>22}")
    print(f"{'case':<19} {'best':>7} {'median':>7} {'x':>6}  {'best':>7} {'median':>7} {'x':>6}")
    rows: list[tuple[str, tuple[tuple[float, float], ...]]] = [
        ("floor (input rows)", floor(n, args.repeat)),
        ("floor (elements)", floor_elements(n, args.repeat)),
    ]
    for name, keyed, backend in (
        ("unkeyed", False, "heap"),
        ("keyed, heap", True, "heap"),
        ("keyed, rocksdb", True, "rocksdb"),
    ):
        rows.append((name, bench(n, args.repeat, keyed, backend)))
    (floor_w, _), (floor_r, _) = rows[0][1]
    for name, ((w, wm), (r, rm)) in rows:
        us = [t / n * 1e6 for t in (w, wm, r, rm)]
        print(
            f"{name:<19} {us[0]:7.2f} {us[1]:7.2f} {w / floor_w:5.1f}x  "
            f"{us[2]:7.2f} {us[3]:7.2f} {r / floor_r:5.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
