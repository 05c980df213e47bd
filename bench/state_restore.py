"""Benchmark: a cold restore of keyed state, and the memory a restored partition holds.

Run: ``python -m bench.state_restore`` (``--keys 1000000``, ``--repeat 3``,
``--no-handover``, ``--no-memory``).

The state: a running count (one ValueState) for N keys, each filed under the
key group an engine named for it (as Spark does: ``pmod(hash(key columns),
128)`` in the JVM, which differs from the core's Murmur3 for 127 keys in 128;
here a second Murmur3 seed stands in for Spark's hash), written as the full
sections of 128 key groups, the form a checkpoint's key-group file holds.
Each case restores them all into a fresh ``KeyedProcessOperator`` (``apply_change``
per key group, as a cold ``keyed_process`` partition does), in a process of its
own, and prints the best of R runs per key, and the resident memory the
process grew by while restoring (``VmRSS`` before and after, after a
garbage collection; RocksDB's memtable and caches count too):

- ``groups pinned``: the backend's default, every restored key pinned to its
  group in a map of all keys (what ``keyed_process`` did before it took
  every key's group from Spark);
- ``groups said per task``: ``require_assigned_groups()``, what
  ``keyed_process`` does: nothing pinned by a restore.

Then (``--handover``, on by default) a small micro-batch (2,000 events) of one
``keyed_process`` partition on RocksDB whose previous version (N keys) another
Python worker of the machine committed: a worker holding nothing either reads
the chains from the checkpoint on local disk (``ASYNCIO_OPS_PARKED=0``), or
opens the database the other worker parked; the best of R runs of the whole
task (restore, rows, snapshot, and for the parked case the next park), and,
as a floor, the same micro-batch on the worker that committed it (warm).

Then (``--memory``, on by default) the memory of one ``keyed_process``
partition of N keys, per backend, each step in a process of its own: the bulk
micro-batch (every key new, every key group's full snapshot written: the
resident memory when its snapshot starts and the peak while it is written,
sampled every 10 ms), then a small micro-batch (2,000 events) on a worker
holding nothing, which restores the partition from that checkpoint (local
disk, nothing parked): how much the process grew at its peak, and the task's
time.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from typing import Any

import mmh3

from asyncio_ops._elements import Record
from asyncio_ops._engine._keyed_operator import KeyedProcessOperator
from asyncio_ops._keygroups import KeyGroupRange
from asyncio_ops._runtime._inflight import make_backend
from asyncio_ops.state import KeyedProcessFunction, ValueStateDescriptor

MAXP = 128
GROUPS = KeyGroupRange(0, MAXP - 1)


class Count(KeyedProcessFunction[Any, Any, Any]):
    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor[int]("count"))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        self.count.update((self.count.value() or 0) + 1)


def operator(kind: str, said: bool) -> KeyedProcessOperator:
    backend = make_backend(kind, MAXP, GROUPS)
    if said:
        backend.require_assigned_groups()
    return KeyedProcessOperator(
        Count(), lambda row: row["k"], backend=backend, output=lambda e: None,
        schedule_timers=False,
    )  # fmt: skip


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - Linux only


def case(kind: str, said: bool, keys: int, repeat: int) -> dict[str, float]:
    """One case, in this process: best µs per key, and the memory one restore grew by."""
    op = operator(kind, True)
    op.track_changes()
    op.open()
    assign = op.backend.assign_key_group
    for k in range(keys):
        assign(k, mmh3.hash(str(k), 42, signed=False) % MAXP)  # the engine's group
        op.process_element(Record({"k": k}))
    sections = list(op.snapshot_changes(set(GROUPS)).full)  # built before the backend closes
    op.close()
    op.backend.close()
    del op
    best, grew = float("inf"), 0.0
    for _ in range(repeat):
        gc.collect()
        before = rss_mb()
        restored = operator(kind, said)
        t0 = time.perf_counter()
        for section in sections:
            restored.apply_change(section, "bench")
        elapsed = time.perf_counter() - t0
        gc.collect()
        grew = max(grew, rss_mb() - before)
        best = min(best, elapsed)
        restored.close()
        restored.backend.close()
        del restored
    return {"us_per_key": best / keys * 1e6, "rss_mb": grew}


def handover(keys: int, repeat: int) -> dict[str, float]:
    """Seconds of a small micro-batch task on a worker holding nothing: cold, parked;
    and on the warm worker."""
    import os
    import random
    import shutil
    import tempfile
    from pathlib import Path

    import pyarrow as pa

    from asyncio_ops._runtime import (
        KEY_GROUP_COLUMN,
        KeyedOptions,
        KeyedProcessSpec,
        TaskInfo,
        _warm,
    )
    from asyncio_ops._runtime._keyed_partition import run_keyed_process
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    schema = pa.schema([("k", pa.int64()), (KEY_GROUP_COLUMN, pa.int32())])
    out = pa.schema([("k", pa.int64())])

    class Counted(Count):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            super().process_element(value, ctx, out)
            out.collect({"k": value["k"]})

    def batch(ks: list[int]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [{"k": k, KEY_GROUP_COLUMN: mmh3.hash(str(k), 42, signed=False) % MAXP} for k in ks],
            schema=schema,
        )

    rng = random.Random(7)
    bulk = batch(list(range(keys)))
    small = batch([rng.randrange(keys) for _ in range(2000)])
    best: dict[str, float] = {}
    for case in ("cold", "parked", "warm"):
        times = []
        for _ in range(repeat):
            tmp = Path(tempfile.mkdtemp(prefix="bench-handover-"))
            os.environ["ASYNCIO_OPS_PARKED"] = str(tmp / "parked") if case == "parked" else "0"
            spec = KeyedProcessSpec(
                options=KeyedOptions.of(max_parallelism=MAXP, state_backend="rocksdb"),
                function=Counted(), key=("k",), output_schema=out, batch_size=10_000,
                checkpoint=CheckpointStorage(str(tmp / "ckpt"), "bench"),
            )  # fmt: skip
            for _ in run_keyed_process(spec, [bulk], TaskInfo(0, 1, batch_id=0)):
                pass
            held = _warm._cache.copy()  # the committing worker keeps its database open
            if case != "warm":
                _warm._cache.clear()  # ... and the next task runs on another worker
            gc.collect()
            t0 = time.perf_counter()
            for _ in run_keyed_process(spec, [small], TaskInfo(0, 1, batch_id=1)):
                pass
            times.append(time.perf_counter() - t0)
            _warm._cache.update(held)
            _warm.clear()
            shutil.rmtree(tmp, ignore_errors=True)
        best[case] = min(times)
    return best


def memory(kind: str, keys: int, root: str, step: str) -> dict[str, float]:
    """One step of ``--memory`` in this process (see the module docstring)."""
    import os
    import random
    import threading
    from pathlib import Path

    import pyarrow as pa

    from asyncio_ops._runtime import KEY_GROUP_COLUMN, KeyedOptions, KeyedProcessSpec, TaskInfo
    from asyncio_ops._runtime import _keyed_partition as partition
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    os.environ["ASYNCIO_OPS_PARKED"] = "0"
    schema = pa.schema([("k", pa.int64()), (KEY_GROUP_COLUMN, pa.int32())])

    class Counted(Count):
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            super().process_element(value, ctx, out)
            out.collect({"k": value["k"]})

    def batch(ks: list[int]) -> pa.RecordBatch:
        groups = [mmh3.hash(str(k), 42, signed=False) % MAXP for k in ks]
        return pa.RecordBatch.from_pydict({"k": ks, KEY_GROUP_COLUMN: groups}, schema=schema)

    def batches(ks: list[int]) -> list[pa.RecordBatch]:  # as Spark hands them: 10,000 rows
        return [batch(ks[i : i + 10_000]) for i in range(0, len(ks), 10_000)]

    spec = KeyedProcessSpec(
        options=KeyedOptions.of(max_parallelism=MAXP, state_backend=kind),
        function=Counted(), key=("k",), output_schema=pa.schema([("k", pa.int64())]),
        batch_size=10_000, checkpoint=CheckpointStorage(str(Path(root) / "ckpt"), "bench"),
    )  # fmt: skip
    todo = (
        batches(list(range(keys))) if step == "bulk"
        else batches([random.Random(7).randrange(keys) for _ in range(2000)])
    )  # fmt: skip
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], rss_mb())

    out: dict[str, float] = {}
    snapshot = partition._snapshot

    def snapshotting(*a: Any, **kw: Any) -> Any:
        out["before_snapshot_mb"] = rss_mb()
        peak[0] = 0.0  # from here: the snapshot's own peak
        return snapshot(*a, **kw)

    if step == "bulk":
        partition._snapshot = snapshotting  # type: ignore[assignment]
    gc.collect()
    out["start_mb"] = rss_mb()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    for _ in partition.run_keyed_process(spec, todo, TaskInfo(0, 1, batch_id=int(step != "bulk"))):
        pass
    out["seconds"] = time.perf_counter() - t0
    done.set()
    thread.join()
    out["peak_mb"] = max(peak[0], rss_mb())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--case", help=argparse.SUPPRESS)  # kind,said: run one case, print JSON
    p.add_argument("--no-handover", dest="handover", action="store_false")
    p.add_argument("--no-memory", dest="memory", action="store_false")
    args = p.parse_args()
    if args.case and args.case.startswith("memory,"):
        _, kind, root, step = args.case.split(",")
        print(json.dumps(memory(kind, args.keys, root, step)))
        return
    if args.case == "handover":
        print(json.dumps(handover(args.keys, args.repeat)))
        return
    if args.case:
        kind, said = args.case.split(",")
        print(json.dumps(case(kind, said == "1", args.keys, args.repeat)))
        return
    print(f"command: python -m bench.state_restore {' '.join(sys.argv[1:])}".rstrip())
    print(f"{args.keys:,} keys, 128 key groups, best of {args.repeat}, a process per case")
    print()
    print("| backend | key groups | restore per key | memory grown by the restore |")
    print("|---|---|---|---|")
    for kind in ("heap", "rocksdb"):
        for said in (False, True):
            r = run_case(args.keys, f"{kind},{int(said)}", args.repeat)
            label = "said per task" if said else "pinned"
            print(f"| {kind} | {label} | {r['us_per_key']:.2f} µs | {r['rss_mb']:,.0f} MB |")
    if args.handover:
        print_handover(args.keys, args.repeat)
    if args.memory:
        print_memory(args.keys)


def run_case(keys: int, case: str, repeat: int | None = None) -> dict[str, Any]:
    """One ``--case`` run in a process of its own: the JSON it prints last."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.state_restore", "--keys", str(keys),
         *([] if repeat is None else ["--repeat", str(repeat)]), "--case", case],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def print_handover(keys: int, repeat: int) -> None:
    """The handover table (see the module docstring), its cases in a process of their own."""
    h = run_case(keys, "handover", repeat)
    print()
    print(f"A small micro-batch (2,000 events) of a RocksDB partition of {keys:,} keys:")
    print()
    print("| the worker running it | task |")
    print("|---|---|")
    print(f"| holds nothing, reads the checkpoint (local disk) | {h['cold']:.2f} s |")
    print(f"| holds nothing, opens the parked database | {h['parked']:.2f} s |")
    print(f"| committed the version before (warm) | {h['warm']:.2f} s |")


def print_memory(keys: int) -> None:
    """``--memory`` (see the module docstring), each step in a process of its own."""
    import shutil
    import tempfile

    print()
    print(f"One keyed_process partition of {keys:,} keys (resident memory, MB):")
    print()
    print("| backend | bulk: at its snapshot | peak writing it | small, cold: grew by | task |")
    print("|---|---|---|---|---|")
    for kind in ("heap", "rocksdb"):
        root = tempfile.mkdtemp(prefix="bench-memory-")
        try:
            got = {}
            for step in ("bulk", "cold"):
                got[step] = run_case(keys, f"memory,{kind},{root},{step}")
            bulk, cold = got["bulk"], got["cold"]
            print(
                f"| {kind} | {bulk['before_snapshot_mb']:,.0f} | {bulk['peak_mb']:,.0f} | "
                f"{cold['peak_mb'] - cold['start_mb']:,.0f} | {cold['seconds']:.2f} s |"
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
