"""Incremental checkpoints and warm state of ``keyed_process``, in-process, without Spark.

Each micro-batch runs every partition's task as a Spark task would, on one of
two simulated worker processes (each with its own cache of warm state, swapped
in before the task), or on a fresh one: warm, caught up from older versions, or
cold, every output row must be what a plain-Python model says.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops._exceptions import CheckpointError
from asyncio_ops._keygroups import (
    assign_to_key_group,
    canonical_bytes,
    compute_key_group_range_for_operator_index,
)
from asyncio_ops._runtime import KEY_GROUP_COLUMN, KeyedProcessSpec, TaskInfo, _parked, _warm
from asyncio_ops._runtime._keyed_partition import run_keyed_process
from asyncio_ops._runtime._versions import Chain, concurrently, full_due, read_previous
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops._storage._container import DELTA, SHARED, Kind, split_shared
from asyncio_ops._storage._local_copies import LocalCopies
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from tests.helpers import retention_threads
from tests.runtime.specs import keyed_process_spec

Row = dict[str, Any]
OUTPUT = pa.schema(
    [("k", pa.int64()), ("total", pa.int64()), ("recent", pa.int64()), ("kinds", pa.int64())]
)
MAXP = 16


class Agg(KeyedProcessFunction[int, Row, Row]):
    """Per key: a running total (value), the last three values (list), how often each
    value mod 3 was seen (map); a value of 0 clears the key's state."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor[int]("total"))
        self.recent = runtime_context.get_list_state(ListStateDescriptor[int]("recent"))
        self.kinds = runtime_context.get_map_state(MapStateDescriptor[int, int]("kinds"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        v = value["v"]
        if v == 0:
            self.total.clear()
            self.recent.clear()
            self.kinds.clear()
        else:
            self.total.update((self.total.value() or 0) + v)
            self.recent.update(([*self.recent.get(), v])[-3:])
            self.kinds.put(v % 3, (self.kinds.get(v % 3) or 0) + 1)
        out.collect(
            {
                "k": value["k"],
                "total": self.total.value() or 0,
                "recent": len(self.recent.get()),
                "kinds": len(list(self.kinds.keys())),
            }
        )


class Model:
    def __init__(self) -> None:
        self.total: dict[int, int] = {}
        self.recent: dict[int, list[int]] = {}
        self.kinds: dict[int, dict[int, int]] = {}

    def apply(self, k: int, v: int) -> Row:
        if v == 0:
            self.total.pop(k, None)
            self.recent.pop(k, None)
            self.kinds.pop(k, None)
        else:
            self.total[k] = self.total.get(k, 0) + v
            self.recent[k] = ([*self.recent.get(k, []), v])[-3:]
            m = self.kinds.setdefault(k, {})
            m[v % 3] = m.get(v % 3, 0) + 1
        return {"k": k, "total": self.total.get(k, 0), "recent": len(self.recent.get(k, [])),
                "kinds": len(self.kinds.get(k, {}))}  # fmt: skip


class Workers:
    """Simulated Python worker processes: each keeps its own warm state."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.caches: list[OrderedDict[Any, Any]] = [OrderedDict(), OrderedDict()]
        self.monkeypatch = monkeypatch

    def use(self, worker: int) -> None:
        """Run the next task on ``worker`` (0, 1), or on a new process (2)."""
        if worker == 2:
            for cache in self.caches:
                for entry in cache.values():
                    entry.operator.backend.close()
                cache.clear()
            cache = OrderedDict()
        else:
            cache = self.caches[worker]
        self.monkeypatch.setattr(_warm, "_cache", cache)

    def close(self) -> None:
        self.use(2)


def run_partition(spec: KeyedProcessSpec, batch_id: int, p: int, parts: int,
                  events: list[tuple[int, int]]) -> list[Row]:  # fmt: skip
    kgr = compute_key_group_range_for_operator_index(MAXP, parts, p)
    rows = []
    for k, v in events:
        kg = assign_to_key_group(k, MAXP)
        if kg in kgr:
            rows.append({"k": k, "v": v, KEY_GROUP_COLUMN: kg})
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), (KEY_GROUP_COLUMN, pa.int32())])
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    task = TaskInfo(partition_id=p, num_partitions=parts, batch_id=batch_id)
    return [r for b in run_keyed_process(spec, [batch], task) for r in b.to_pylist()]


def spec_for(tmp: Path, backend: str, interval: int, retain: int = 3) -> KeyedProcessSpec:
    return keyed_process_spec(
        function=Agg(), key=("k",), output_schema=OUTPUT, max_parallelism=MAXP,
        checkpoint=CheckpointStorage(str(tmp), "agg"), state_backend=backend,
        retain_versions=retain, full_snapshot_interval=interval,
    )  # fmt: skip


micro_batches = st.lists(
    st.tuples(
        st.integers(1, 3),  # partitions
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), max_size=30),  # events
        st.lists(st.integers(0, 2), min_size=3, max_size=3),  # worker of each partition
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("copies", [False, True], ids=["", "local-copies"])
@pytest.mark.parametrize("backend", ["heap", "rocksdb", "rocksdb-unparked"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=micro_batches, interval=st.integers(1, 4))
def test_warm_caught_up_or_cold_every_row_matches_the_model(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, backend: str,
    copies: bool, batches: list[tuple[int, list[tuple[int, int]], list[int]]], interval: int,
) -> None:  # fmt: skip
    """``copies``: local copies of the key-group files (as on a remote location), which a
    cold worker reads its chains from. RocksDB: a worker holding nothing opens the
    database another parked (on this machine), or, ``unparked``, reads the chains."""
    if backend == "rocksdb-unparked":
        backend = "rocksdb"
        monkeypatch.setenv("ASYNCIO_OPS_PARKED", "0")
    spec = spec_for(tmp_path_factory.mktemp("ckpt"), backend, interval)
    if copies:
        assert spec.checkpoint is not None
        spec.checkpoint.local = LocalCopies(tmp_path_factory.mktemp("copies"), "agg")
    _matches_the_model(spec, Workers(monkeypatch), batches)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=micro_batches, interval=st.integers(1, 4))
def test_on_s3_with_retention_beside_the_tasks_every_row_matches_the_model(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, backend: str,
    batches: list[tuple[int, list[tuple[int, int]], list[int]]], interval: int,
) -> None:  # fmt: skip
    """The same on S3, where partition 0's retention deletes old versions in a thread of
    its own while the partitions of its micro-batch restore (cold ones read their
    chains from the store: no local copies), process and write."""
    import uuid

    monkeypatch.setenv("ASYNCIO_OPS_LOCAL_COPIES", "0")
    spec = dataclasses.replace(
        spec_for(Path("."), backend, interval),
        checkpoint=CheckpointStorage(s3_server(f"model-{uuid.uuid4().hex[:8]}"), "agg"),
    )
    _matches_the_model(spec, Workers(monkeypatch), batches)


def _matches_the_model(
    spec: KeyedProcessSpec, workers: Workers,
    batches: list[tuple[int, list[tuple[int, int]], list[int]]],
) -> None:  # fmt: skip
    """Run ``batches`` (partitions, events, the worker of each partition) and check every
    output row against the model, per key in input order."""
    model = Model()
    try:
        for batch_id, (parts, events, placement) in enumerate(batches):
            got: list[Row] = []
            for p in range(parts):
                workers.use(placement[p])
                got += run_partition(spec, batch_id, p, parts, events)
            expected = [model.apply(k, v) for k, v in events]
            key = lambda r: (r["k"], r["total"], r["recent"], r["kinds"])  # noqa: E731
            # per key in input order; partitions interleave keys
            for k in {k for k, _ in events}:
                assert [key(r) for r in got if r["k"] == k] == [
                    key(r) for r in expected if r["k"] == k
                ]
            assert len(got) == len(expected)
    finally:
        workers.close()


@settings(max_examples=60, deadline=None)
@given(interval=st.integers(1, 64), groups=st.integers(1, 300), versions=st.integers(1, 250))
def test_full_snapshots_are_staggered_and_never_follow_a_bulk_one_within_half_the_interval(
    interval: int, groups: int, versions: int
) -> None:
    """Every key group full at version 0 (a bulk micro-batch), then touched by every
    version with small deltas: no key group's full snapshot comes within ``interval // 2``
    versions of its last, no chain grows past ``interval + interval // 2`` sections, no
    version writes more than its share of the key groups in full, and from version
    ``interval + interval // 2`` on each key group's chain is exactly ``interval`` long
    when its turn comes."""
    chains: dict[int, Chain] = {kg: ((0, "f", 0, 1, 1000),) for kg in range(groups)}
    last_full = dict.fromkeys(range(groups), 0)
    for version in range(1, versions + 1):
        due = {kg for kg, chain in chains.items() if full_due(chain, kg, version, interval)}
        assert len(due) <= -(-groups // interval)  # a turn is every interval-th key group
        for kg in range(groups):
            if kg in due:
                since = version - last_full[kg]
                assert since >= max(1, interval // 2)
                if last_full[kg] > 0:  # past its first turn: every interval versions
                    assert since == interval
                else:
                    assert since <= max(1, interval + interval // 2 - 1)
                chains[kg], last_full[kg] = ((version, "f", 0, 1, 1000),), version
            else:
                chains[kg] = (*chains[kg], (version, "f", 0, 1, 0))
            assert len(chains[kg]) <= interval + interval // 2


def test_a_key_group_whose_deltas_outgrow_its_full_snapshot_starts_a_new_chain() -> None:
    """The bytes rule holds whatever the turn: deltas as large as the full section (their
    first link carries their sum) restart the chain at the next version."""
    full = (0, "f", 0, 1, 1000)
    assert not full_due((full, (1, "f", 0, 1, 999)), 5, 2, 50)
    assert full_due((full, (1, "f", 0, 1, 1000)), 5, 2, 50)
    assert full_due((full, (1, "f", 0, 1, 600), (2, "f", 0, 1, 0)), 5, 3, 50) is False
    assert full_due((full, (1, "f", 0, 1, 1000), (2, "f", 0, 1, 0)), 5, 3, 50)


def test_a_small_micro_batch_writes_only_the_keys_it_touched(tmp_path: Path) -> None:
    """1,000 keys stored, 5 touched: version 1's file holds deltas of 5 keys, one section
    for all their key groups (and the full state of the key groups whose turn it is);
    later versions name version 0's files."""
    spec = spec_for(tmp_path, "heap", interval=MAXP * 4)
    run_partition(spec, 0, 0, 1, [(k, 1) for k in range(1000)])
    touched = [3, 77, 500, 501, 999]
    full_turn = {kg for kg in range(MAXP) if (1 + kg) % (MAXP * 4) == 0}
    assert not full_turn
    run_partition(spec, 1, 0, 1, [(k, 2) for k in touched])
    storage = spec.checkpoint
    assert storage is not None
    (name,) = storage.list_files(1, "kg-")
    sections = storage.read_sections(1, name, Kind.KEY_GROUPS)
    assert {s.part for s in sections} == {DELTA}
    # each touched key once, named by its entry (no key was deleted)
    rows = [(row, k) for s in sections for k, row in zip(s.table.column("key").to_pylist(),
            s.table.column("row").to_pylist(), strict=True)]  # fmt: skip
    assert {row for row, _ in rows} == {0}
    assert {k for _, k in rows} == {canonical_bytes(k) for k in touched}
    # one section for the deltas of every key group touched, sorted by key group
    (shared,) = sections
    assert shared.tag == SHARED
    groups = [s.tag for s in split_shared(shared, name)]
    assert groups == sorted({assign_to_key_group(k, MAXP) for k in touched})
    manifest = storage.read(1, "subtask-00000.ckpt", Kind.MANIFEST)
    # a row per section the chains name: version 0's full sections, version 1's delta once
    versions = manifest.column("version").to_pylist()
    assert set(versions) == {0, 1} and versions.count(1) == 1
    (delta_row,) = [r for r in manifest.to_pylist() if r["version"] == 1]
    assert delta_row["key_groups"] == groups


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_cold_restore_goes_into_the_states_open_obtained(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition restored from the checkpoint (a worker holding nothing) runs the
    function's open() first, then applies the chains: each key group's entries go into
    the states open() obtained, none held aside whole until a state is obtained."""
    monkeypatch.setenv("ASYNCIO_OPS_PARKED", "0")
    seen: list[tuple[str, list[str]]] = []

    class Watched(Agg):
        def open(self, runtime_context: KeyedRuntimeContext) -> None:
            held = runtime_context._backend  # type: ignore[attr-defined]
            seen.append(("open", held.unclaimed_state_names()))
            super().open(runtime_context)

    spec = spec_for(tmp_path, backend, interval=4)
    model = Model()
    assert run_partition(spec, 0, 0, 1, [(k, k + 1) for k in range(50)]) == [
        model.apply(k, k + 1) for k in range(50)
    ]
    _warm.clear()
    cold = dataclasses.replace(spec, function=Watched())
    got = run_partition(cold, 1, 0, 1, [(7, 5), (49, 1)])
    assert got == [model.apply(7, 5), model.apply(49, 1)]  # the state was restored
    assert seen == [("open", [])]  # ... after open(): nothing was restored when it ran


def test_state_kept_warm_is_not_used_when_another_attempt_rewrote_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0 commits version 0; another attempt of micro-batch 0 (worker 1, other
    input: a nondeterministic source) commits it again. Micro-batch 1 on worker 0 must
    start from the checkpoint's version 0, not from what worker 0 kept."""
    spec = spec_for(tmp_path, "heap", interval=4)
    workers = Workers(monkeypatch)
    try:
        workers.use(0)
        run_partition(spec, 0, 0, 1, [(1, 5)])
        workers.use(1)
        run_partition(spec, 0, 0, 1, [(1, 7)])
        workers.use(0)
        assert run_partition(spec, 1, 0, 1, [(1, 1)])[0]["total"] == 8
    finally:
        workers.close()


def test_a_missing_delta_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_for(tmp_path, "rocksdb", interval=8)
    workers = Workers(monkeypatch)
    monkeypatch.setenv("ASYNCIO_OPS_PARKED", "0")  # no parked database to open instead
    try:
        run_partition(spec, 0, 0, 1, [(k, 1) for k in range(50)])
        run_partition(spec, 1, 0, 1, [(3, 1)])
        storage = spec.checkpoint
        assert storage is not None
        (delta,) = storage.list_files(1, "kg-")
        (tmp_path / "agg" / "v0000000001" / delta).unlink()
        workers.use(2)  # a new worker: reads every chain
        with pytest.raises(CheckpointError, match=rf"{delta} is missing"):
            run_partition(spec, 2, 0, 1, [(3, 1)])
    finally:
        workers.close()


def test_a_cold_partition_reads_its_manifests_and_the_files_of_its_chains_at_once(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State on S3. Partition 1 of 2, on a worker of another machine (which never held it
    and has no local copies), restoring chains that span three versions' files: it reads
    partition 0's manifest and its own together, then the chains' files together (each
    read here waits until another is in flight, which a reader going one file at a time
    never lets happen); its state is the model's."""
    import uuid

    spec = keyed_process_spec(
        function=Agg(), key=("k",), output_schema=OUTPUT, max_parallelism=MAXP,
        checkpoint=CheckpointStorage(s3_server(f"at-once-{uuid.uuid4().hex[:8]}"), "agg"),
        state_backend="heap", retain_versions=3, full_snapshot_interval=8,
    )  # fmt: skip
    workers = Workers(monkeypatch)
    model = Model()
    mine = compute_key_group_range_for_operator_index(MAXP, 2, 1)
    keys = [k for k in range(60) if assign_to_key_group(k, MAXP) in mine]
    try:
        for batch_id, events in enumerate(
            [[(k, 1) for k in range(60)], [(keys[0], 2)], [(keys[1], 0)]]
        ):
            for p in range(2):
                run_partition(spec, batch_id, p, 2, events)
            for k, v in events:
                model.apply(k, v)
        workers.use(2)
        assert spec.checkpoint is not None
        spec.checkpoint.local = None  # a worker on another machine: no local copies
        in_flight, lock = [0], threading.Lock()
        overlapped = {"subtask": threading.Event(), "kg": threading.Event()}
        read_frames = CheckpointStorage.read_frames  # every read of a file goes through it
        files: list[str] = []

        def overlapping(
            self: CheckpointStorage, version: Any, name: str, *a: Any, **kw: Any
        ) -> Any:
            kind = name.split("-")[0]
            with lock:
                files.append(name)
                in_flight[0] += 1
                if in_flight[0] >= 2:
                    overlapped[kind].set()
            try:
                if not overlapped[kind].wait(60):
                    raise AssertionError(f"the {kind} files were read one at a time: {files}")
                return read_frames(self, version, name, *a, **kw)
            finally:
                with lock:
                    in_flight[0] -= 1

        monkeypatch.setattr(CheckpointStorage, "read_frames", overlapping)
        events = [(k, 1) for k in keys[:3]]
        rows = run_partition(spec, 3, 1, 2, events)
        assert sorted(f.split("-")[0] for f in files) == ["kg"] * 3 + ["subtask"] * 2
        assert rows == [model.apply(k, v) for k, v in events]
    finally:
        workers.close()


@pytest.mark.parametrize("remote", [True, False])
def test_concurrent_reads_keep_their_order_and_raise_the_first_failure(
    tmp_path: Path, remote: bool
) -> None:
    storage = CheckpointStorage(str(tmp_path), "agg")
    storage.remote = remote  # on local disk the reads run one after the other
    threads: set[str] = set()

    def read(i: int) -> int:
        threads.add(threading.current_thread().name)
        if i in (3, 5):
            raise ValueError(f"file {i}")
        return i * i

    assert concurrently(storage, read, list(range(3))) == [0, 1, 4]
    assert concurrently(storage, read, []) == [] and concurrently(storage, read, [2]) == [4]
    with pytest.raises(ValueError, match="file 3"):
        concurrently(storage, read, list(range(20)))
    assert any(t.startswith("aops-read") for t in threads) is remote


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_worker_catches_up_from_an_older_version_with_the_deltas_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Worker 0 commits version 0, worker 1 versions 1 and 2 (a full snapshot of some key
    groups among them); worker 0 then runs micro-batch 3 from what it kept plus the
    chains' parts written since, reading only those files."""
    spec = spec_for(tmp_path, backend, interval=2, retain=5)
    workers = Workers(monkeypatch)
    model = Model()
    try:
        plan = [
            (0, [(k, 1) for k in range(30)]),
            (1, [(k, 2) for k in range(0, 30, 3)]),
            (1, [(k, 0) for k in range(0, 30, 5)]),
            (0, [(k, 4) for k in range(30)]),
        ]
        for batch_id, (worker, events) in enumerate(plan):
            workers.use(worker)
            got = run_partition(spec, batch_id, 0, 1, events)
            expected = [model.apply(k, v) for k, v in events]
            assert sorted(got, key=lambda r: r["k"]) == sorted(expected, key=lambda r: r["k"])
    finally:
        workers.close()


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_manifests_of_earlier_releases_a_row_per_key_group_still_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Versions 0 to 2 with chains of several links, their manifests rewritten as
    earlier releases wrote them (a row per key group, its chain as lists): a worker
    holding nothing restores them, and the next version's manifest is a row per section."""
    from .earlier_releases import manifest_as_earlier_releases_wrote

    spec = spec_for(tmp_path, backend, interval=MAXP * 4, retain=5)
    storage = spec.checkpoint
    assert storage is not None
    workers = Workers(monkeypatch)
    model = Model()
    plan = [[(k, 1) for k in range(40)], [(k, 2) for k in range(0, 40, 3)],
            [(k, 3) for k in range(0, 40, 7)], [(k, 4) for k in range(40)]]  # fmt: skip
    try:
        for batch_id, events in enumerate(plan):
            if batch_id == 3:  # earlier releases wrote versions 0 to 2
                for version in range(3):
                    for p in range(2):
                        name = f"subtask-{p:05d}.ckpt"
                        now = storage.read(version, name, Kind.MANIFEST)
                        assert "key_groups" in now.column_names
                        storage.write(version, name, Kind.MANIFEST,
                                      manifest_as_earlier_releases_wrote(now))  # fmt: skip
            workers.use(2)  # a worker holding nothing: it reads the manifests
            got = [r for p in range(2) for r in run_partition(spec, batch_id, p, 2, events)]
            expected = [model.apply(k, v) for k, v in events]
            assert sorted(got, key=lambda r: r["k"]) == sorted(expected, key=lambda r: r["k"])
        assert "key_groups" in storage.read(3, "subtask-00000.ckpt", Kind.MANIFEST).column_names
    finally:
        workers.close()


class Late(KeyedProcessFunction[int, Row, Row]):
    """Emits the watermark the micro-batch starts with (event time ``ts``)."""

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        out.collect({"k": value["k"], "wm": ctx.timer_service().current_watermark()})


def test_the_watermark_travels_in_the_manifest(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), "late")
    spec = keyed_process_spec(
        function=Late(), key=("k",), output_schema=pa.schema([("k", pa.int64()),
        ("wm", pa.float64())]), max_parallelism=MAXP, checkpoint=storage, event_time="ts",
    )  # fmt: skip
    schema = pa.schema([("k", pa.int64()), ("ts", pa.float64()), (KEY_GROUP_COLUMN, pa.int32())])

    def run(batch_id: int, ts: float) -> float:
        rows = [{"k": 1, "ts": ts, KEY_GROUP_COLUMN: assign_to_key_group(1, MAXP)}]
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        task = TaskInfo(partition_id=0, num_partitions=1, batch_id=batch_id)
        (out,) = [r for b in run_keyed_process(spec, [batch], task) for r in b.to_pylist()]
        return float(out["wm"])

    run(0, 100.0)
    assert storage.list_files(0, "ops-") == []  # one file less per version
    assert run(1, 200.0) == 100.0  # the watermark of micro-batch 0's end
    _warm.clear()  # read from the manifest, not a warm worker
    assert run(2, 300.0) == 200.0
    manifest = storage.read(2, "subtask-00000.ckpt", Kind.MANIFEST)
    meta = dict(manifest.schema.metadata or {})
    meta[b"aops.watermark"] = b"not a watermark"
    storage.write(2, "subtask-00000.ckpt", Kind.MANIFEST, manifest.replace_schema_metadata(meta))
    _warm.clear()
    with pytest.raises(CheckpointError, match=r"subtask-00000\.ckpt: unreadable watermark"):
        run(3, 400.0)


def test_a_partition_reads_the_manifests_of_the_partitions_that_held_its_key_groups(
    s3_server: Any,
) -> None:
    """State on S3, 4 partitions: a partition restoring a version reads partition 0's
    manifest (how many partitions wrote it) and its own, at once, not the other two;
    after a rescale to 2, partition 1 reads those of old partitions 2 and 3 besides
    partition 0's (and old partition 1's, read with partition 0's on the guess that the
    number of partitions had not changed, then dropped). Requests per partition do not
    grow with the number of partitions (counted from the server's own log)."""
    import uuid

    location = s3_server(f"owners-{uuid.uuid4().hex[:8]}")
    spec = keyed_process_spec(
        function=Agg(), key=("k",), output_schema=OUTPUT, max_parallelism=MAXP,
        checkpoint=CheckpointStorage(location, "agg"), state_backend="heap",
        retain_versions=10, full_snapshot_interval=50,
    )  # fmt: skip
    events = [(k, 1) for k in range(200)]
    for p in range(4):
        run_partition(spec, 0, p, 4, events)

    def manifests_read(batch_id: int, p: int, parts: int) -> set[str]:
        s3_server.requests.clear()
        run_partition(spec, batch_id, p, parts, events)
        return {
            r.rsplit("/", 1)[1] for r in s3_server.requests
            if r.startswith("GET ") and f"/v{batch_id - 1:010d}/subtask-" in r
        }  # fmt: skip

    for p in range(4):
        assert manifests_read(1, p, 4) == {"subtask-00000.ckpt", f"subtask-{p:05d}.ckpt"}
        # this process ran the partition's version 0 (warm): no key-group file read, and in
        # all 6 requests (partition 0: 4; it lists no version for retention while the query
        # has no more than retain_versions)
        made = [
            "LIST" if "list-type=2" in r
            else r.split(" ")[0] + " " + r.rsplit("/", 1)[1].split("-")[0]
            for r in s3_server.requests
        ]  # fmt: skip
        reads = ["HEAD subtask", "GET subtask"] * (1 if p == 0 else 2)
        assert sorted(made) == sorted([*reads, "PUT kg", "PUT subtask"]), made
    assert manifests_read(2, 0, 2) == {"subtask-00000.ckpt", "subtask-00001.ckpt"}
    assert manifests_read(2, 1, 2) == {
        "subtask-00000.ckpt", "subtask-00001.ckpt", "subtask-00002.ckpt", "subtask-00003.ckpt"
    }  # fmt: skip
    # the state went along: every key counted three times, once per micro-batch
    rows = run_partition(spec, 3, 0, 1, events)
    assert sorted(r["k"] for r in rows) == list(range(200))
    assert {r["total"] for r in rows} == {4}


def _s3_spec(s3_server: Any, name: str, interval: int = 8) -> KeyedProcessSpec:
    import uuid

    return keyed_process_spec(
        function=Agg(), key=("k",), output_schema=OUTPUT, max_parallelism=MAXP,
        checkpoint=CheckpointStorage(s3_server(f"{name}-{uuid.uuid4().hex[:8]}"), "agg"),
        state_backend="heap", retain_versions=3, full_snapshot_interval=interval,
    )  # fmt: skip


def _requests(s3_server: Any) -> list[str]:
    """The server's requests since cleared, as ``METHOD kind`` (the file name's first
    part: kg, subtask) or LIST."""
    return sorted(
        "LIST" if "list-type=2" in r else r.split(" ")[0] + " " + r.rsplit("/", 1)[1].split("-")[0]
        for r in s3_server.requests
    )  # fmt: skip


def _chain_files(manifest: pa.Table) -> set[tuple[int, str]]:
    """``(version, file)`` of every link of a manifest's chains."""
    columns = (manifest.column(c).to_pylist() for c in ("version", "file"))
    return set(zip(*columns, strict=True))


def test_a_cold_partition_reads_its_chains_from_the_local_copies_of_the_machine_that_wrote_them(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """State on S3, 2 partitions, chains over four versions' files. Partition 1 restored
    on a new worker of the machine that wrote them reads its manifests from S3 and its
    chains from the local copies: 6 requests in all (2 manifests read, HEAD and GET each,
    its two writes); on another machine 2 more per file its chains name, which it keeps
    as local copies there: restored again on that machine (another new worker), it
    reads no key-group file. Every time the state is the model's."""
    spec = _s3_spec(s3_server, "copies")
    storage = spec.checkpoint
    assert storage is not None and storage.local is not None
    workers = Workers(monkeypatch)
    model = Model()
    mine = compute_key_group_range_for_operator_index(MAXP, 2, 1)
    keys = [k for k in range(60) if assign_to_key_group(k, MAXP) in mine]
    # one key of three key groups (of several keys each) per version: every delta stays
    # smaller than its key group's full snapshot, so no chain restarts
    keys = [next(k for k in keys if assign_to_key_group(k, MAXP) == kg) for kg in (12, 8, 11)]
    history = [[(k, 1) for k in range(60)], [(keys[0], 2)], [(keys[1], 0)], [(keys[2], 4)]]
    try:
        for batch_id, events in enumerate(history):
            for p in range(2):
                run_partition(spec, batch_id, p, 2, events)
            for k, v in events:
                model.apply(k, v)
        manifest = storage.read(3, "subtask-00001.ckpt", Kind.MANIFEST)
        files = _chain_files(manifest)
        assert len(files) == 4  # version 0's full snapshots and three deltas
        home, other = storage.local, LocalCopies(tmp_path / "another-machine", "agg")
        for batch_id, machine in ((4, "same"), (5, "other"), (6, "other again")):
            events = [(k, 1) for k in keys[:3]]  # partition 1's keys
            run_partition(spec, batch_id, 0, 2, events)
            workers.use(2)
            if machine != "same":
                monkeypatch.setattr(storage, "local", other)
            named = _chain_files(storage.read(batch_id - 1, "subtask-00001.ckpt", Kind.MANIFEST))
            s3_server.requests.clear()
            rows = run_partition(spec, batch_id, 1, 2, events)
            assert rows == [model.apply(k, v) for k, v in events]
            chain_reads = (["GET kg", "HEAD kg"] * len(named)) if machine == "other" else []
            assert _requests(s3_server) == sorted(
                ["HEAD subtask", "GET subtask"] * 2 + ["PUT kg", "PUT subtask"] + chain_reads
            ), machine
            monkeypatch.setattr(storage, "local", home)  # partition 0's machine
    finally:
        workers.close()


def test_a_local_copy_that_fails_verification_is_dropped_and_the_checkpoint_read(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = _s3_spec(s3_server, "bad-copy")
    storage = spec.checkpoint
    assert storage is not None and storage.local is not None
    workers = Workers(monkeypatch)
    try:
        run_partition(spec, 0, 0, 1, [(k, 1) for k in range(40)])
        (name,) = storage.list_files(0, "kg-")
        copy = storage.local.root / "v0000000000" / name
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0xFF
        copy.write_bytes(bytes(data))
        workers.use(2)
        s3_server.requests.clear()
        with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
            rows = run_partition(spec, 1, 0, 1, [(3, 1)])
        assert rows[0]["total"] == 2
        assert "GET kg" in _requests(s3_server)
        assert f"the local copy of {storage.describe(storage.path(0, name))}" in caplog.text or (
            f"the local copy of checkpoint file {storage.path(0, name)} failed" in caplog.text
        )
        # replaced by the store's file, read whole (the partition's own)
        with storage.fs.open_input_stream(storage.path(0, name)) as f:
            assert copy.read_bytes() == f.read()
    finally:
        workers.close()


def test_a_partition_keeps_only_the_local_copies_its_chains_name(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Full snapshots every 2 versions: after each version, the partition's local copies
    are exactly the files its manifest's chains name, and those of another partition are
    left alone."""
    spec = _s3_spec(s3_server, "prune", interval=2)
    storage = spec.checkpoint
    assert storage is not None and storage.local is not None
    storage.local.put("v0000000000/kg-p00007-otherpartition.ckpt", b"x")
    for batch_id in range(6):
        run_partition(spec, batch_id, 0, 1, [(k, batch_id + 1) for k in range(30)])
        manifest = storage.read(batch_id, "subtask-00000.ckpt", Kind.MANIFEST)
        named = {f"v{v:010d}/{f}" for v, f in _chain_files(manifest)}
        held = {str(p.relative_to(storage.local.root)) for p in storage.local.root.rglob("kg-*")}
        assert held == named | {"v0000000000/kg-p00007-otherpartition.ckpt"}
        assert len(named) <= 2


def test_local_copies_go_where_the_environment_says_and_only_for_a_remote_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: Any
) -> None:
    from asyncio_ops._storage import _local_copies

    monkeypatch.delenv(_local_copies.LOCAL_COPIES_ENV, raising=False)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/a,{tmp_path}/b")
    assert _local_copies.directory() == (tmp_path / "a" / "asyncio_ops-local-copies", False)
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    monkeypatch.setattr(_local_copies.tempfile, "gettempdir", lambda: str(tmp_path))
    private = tmp_path / f"asyncio_ops-local-copies-{os.getuid()}"
    assert _local_copies.directory() == (private, True)
    # nothing is created before a copy is written or read; then this user's only
    storage = CheckpointStorage(s3_server("tmp"), "agg")
    assert storage.local is not None and not private.exists()
    storage.local.put("v0000000000/kg-p00000-x.ckpt", b"x")
    assert private.stat().st_mode & 0o777 == 0o700
    assert storage.local.read("v0000000000/kg-p00000-x.ckpt", None) == [b"x"]
    private.chmod(0o777)  # writable by others: not used
    late = CheckpointStorage(s3_server("tmp"), "agg").local
    assert late is not None and late.read("v0000000000/kg-p00000-x.ckpt", None) is None
    shutil.rmtree(private)
    private.symlink_to(tmp_path)  # a link someone planted: not followed
    late = CheckpointStorage(s3_server("tmp"), "agg").local
    assert late is not None and late.read("v0000000000/kg-p00000-x.ckpt", None) is None
    late.put("v0000000000/kg-p00000-y.ckpt", b"y")
    assert not (tmp_path / late.root.name).exists()
    private.unlink()
    for off in ("0", "off", "OFF", "false"):
        monkeypatch.setenv(_local_copies.LOCAL_COPIES_ENV, off)
        assert _local_copies.directory() is None
        assert CheckpointStorage(s3_server("off"), "agg").local is None
    monkeypatch.setenv(_local_copies.LOCAL_COPIES_ENV, str(tmp_path / "mine"))
    assert _local_copies.directory() == (tmp_path / "mine", False)
    assert CheckpointStorage(str(tmp_path / "ckpt"), "agg").local is None  # local disk
    one, two = CheckpointStorage(s3_server("x"), "agg"), CheckpointStorage(s3_server("y"), "agg")
    assert one.local is not None and two.local is not None
    assert one.local.root.parent == tmp_path / "mine" and one.local.root != two.local.root


def test_a_local_copy_that_cannot_be_written_is_logged_and_the_version_committed(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    spec = _s3_spec(s3_server, "no-room")
    storage = spec.checkpoint
    assert storage is not None
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    storage.local = LocalCopies(blocker, "agg")  # its directory cannot be created
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        run_partition(spec, 0, 0, 1, [(k, 1) for k in range(10)])
        run_partition(spec, 1, 0, 1, [(k, 1) for k in range(10)])
    assert caplog.text.count("cannot keep a local copy") == 1
    assert storage.read(1, "subtask-00000.ckpt", Kind.MANIFEST).num_rows > 0


@pytest.mark.parametrize("parts", [2, 4])
def test_partition_0s_retention_on_s3_lists_the_oldest_retained_version_and_no_manifest(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    """Past ``retain_versions`` versions, partition 0 deletes after each write what no
    retained version's chains name: it lists the oldest retained version (whose
    key-group files' names say the oldest version their chains name), reads no other
    partition's manifest at any number of partitions, and deletes from where its
    manifest before says the deleted versions end. Before it deletes, one listing of the
    operator's directory gives the versions and the readers' leases. Counted from the
    server's log, partition 0 kept warm: at most 11 requests."""
    spec = _s3_spec(s3_server, f"retain-{parts}", interval=2)
    storage = spec.checkpoint
    assert storage is not None
    events = [(k, 1) for k in range(40)]
    workers = Workers(monkeypatch)
    try:
        for batch_id in range(8):
            for p in range(parts):
                workers.use(p % 2)
                if p == 0:
                    s3_server.requests.clear()
                run_partition(spec, batch_id, p, parts, events)
                if p == 0:
                    made, raw = _requests(s3_server), list(s3_server.requests)
        # retained: 5, 6, 7; and 4, where chains of 5 start (a full every 2 versions)
        assert storage.versions() == [4, 5, 6, 7]
        # its manifest of 6 (HEAD, GET), its two PUTs, one listing of version 5; as it
        # deletes, one listing of the operator's directory (versions and leases); pyarrow's
        # deletion of version 3 (HEAD, LIST, POST of the objects, DELETE and PUT of
        # directory markers): 11. No manifest of another partition is read.
        root = storage.root.split("/", 1)[1]
        lists = [r.split("prefix=")[1].split(" ")[0] for r in raw if "list-type=2" in r]
        assert sorted(lists) == [f"{root}/", *(f"{root}/v{v:010d}/" for v in (3, 5))]
        assert len(made) <= 11 and made.count("GET subtask") == 1, made  # its own manifest
    finally:
        workers.close()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_partition_0s_retention_runs_beside_its_task_on_a_remote_store(
    where: str, s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 partition 0 lists the oldest retained version and deletes the versions before
    it in a thread of its own, started with the task, so its requests wait beside the
    task's restore, processing and writes; on local disk, in line at the end. Either way
    the same versions stay and every count carries on."""
    if where == "s3":
        spec = _s3_spec(s3_server, "beside", interval=2)
    else:
        spec = spec_for(tmp_path, "heap", interval=2)
    storage = spec.checkpoint
    assert storage is not None
    seen = retention_threads(storage, monkeypatch, listings=True)
    model = Model()
    workers = Workers(monkeypatch)
    try:
        for batch_id in range(8):
            events = [(k, batch_id + 1) for k in range(batch_id, 40, 2)]
            got = [r for p in range(2) for r in run_partition(spec, batch_id, p, 2, events)]
            expected = [model.apply(k, v) for k, v in events]
            assert sorted(got, key=lambda r: r["k"]) == sorted(expected, key=lambda r: r["k"])
    finally:
        workers.close()
    assert storage.versions() == [4, 5, 6, 7]  # as in the test above: chains of 5 start at 4
    thread = "aops-retention" if where == "s3" else threading.main_thread().name
    assert any(s.startswith("delete") for s in seen), seen
    assert all(s.split(" ")[1].startswith(thread) for s in seen), seen
    assert not [t for t in threading.enumerate() if t.name.startswith("aops-retention")]


class FailsOnTheThird(Agg):
    """Agg, failing on the third element of the task."""

    seen = 0

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.seen += 1
        if self.seen == 3:
            raise ValueError(f"the function failed on key {value['k']}")
        super().process_element(value, ctx, out)


@pytest.mark.parametrize("fails", ["deletion", "write", "function"])
def test_a_failed_retention_beside_the_task_fails_the_attempt_and_leaves_no_thread(
    fails: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A deletion that fails in partition 0's retention thread fails the attempt with its
    error; when the version's writes or the function fail too, theirs is the attempt's
    error and the deletion's is logged. No retention thread outlives the attempt, and the
    next attempt commits the version."""
    spec = _s3_spec(s3_server, f"fails-{fails}", interval=2)
    storage = spec.checkpoint
    assert storage is not None
    events = [(k, 1) for k in range(40)]
    workers = Workers(monkeypatch)
    try:
        for batch_id in range(5):
            for p in range(2):
                run_partition(spec, batch_id, p, 2, events)
        delete_versions, write = storage.delete_versions, storage.write

        def broken_delete(versions: Any) -> None:
            raise OSError("the store refused the deletion")

        def broken_write(*args: Any, **kwargs: Any) -> Any:
            raise OSError("the store refused the manifest")

        monkeypatch.setattr(storage, "delete_versions", broken_delete)
        if fails == "write":
            monkeypatch.setattr(storage, "write", broken_write)
        workers.use(2)  # the attempt after the failure starts cold
        failing = spec
        if fails == "function":
            failing = dataclasses.replace(spec, function=FailsOnTheThird())
        raised = {
            "deletion": "the store refused the deletion",
            "write": "the store refused the manifest",
            "function": "the function failed on key",
        }[fails]
        with pytest.raises(Exception, match=raised):
            run_partition(failing, 5, 0, 2, events)
        assert not [t for t in threading.enumerate() if t.name.startswith("aops-retention")]
        if fails != "deletion":
            assert "retention of version 5 failed too" in caplog.text
        monkeypatch.setattr(storage, "delete_versions", delete_versions)
        monkeypatch.setattr(storage, "write", write)
        workers.use(2)
        run_partition(spec, 5, 0, 2, events)
        run_partition(spec, 5, 1, 2, events)
        assert storage.versions()[-1] == 5 and 0 not in storage.versions()
    finally:
        workers.close()


# -- parked RocksDB databases: another Python worker of the machine opens the database --------
def _kg_files(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("agg/v*/kg-*"))


def test_another_worker_opens_the_parked_database_and_reads_no_key_group_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0 commits versions 0 and 1 on RocksDB; micro-batch 2 runs on worker 1,
    which holds nothing: it claims the database worker 0 parked and reads no key-group
    file (they are deleted: a cold restore would fail), and every count carries on."""
    spec = spec_for(tmp_path, "rocksdb", interval=8, retain=5)
    workers = Workers(monkeypatch)
    monkeypatch.setattr(_parked, "PARK_EVERY", 1)  # every version parked
    model = Model()
    try:
        for batch_id, (worker, events) in enumerate([
            (0, [(k, 1) for k in range(40)]),
            (0, [(k, 2) for k in range(0, 40, 3)] + [(5, 0)]),
            (1, [(k, 4) for k in range(40)]),
        ]):  # fmt: skip
            workers.use(worker)
            if batch_id == 2:
                for f in _kg_files(tmp_path):
                    f.unlink()
            got = run_partition(spec, batch_id, 0, 1, events)
            expected = [model.apply(k, v) for k, v in events]
            assert sorted(got, key=lambda r: r["k"]) == sorted(expected, key=lambda r: r["k"])
        workers.use(0)  # worker 0 kept version 1 warm: it catches up with version 2's deltas
        assert run_partition(spec, 3, 0, 1, [(7, 1)]) == [model.apply(7, 1)]
    finally:
        workers.close()


def test_a_parked_copy_some_versions_old_is_caught_up_with_the_deltas_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parked only every PARK_EVERY versions: worker 0 parks version 0 and keeps running;
    worker 1 opens that copy at version 4 and applies versions 1 to 3's parts of the
    chains (version 0's key-group file, which a cold restore needs, is deleted)."""
    spec = spec_for(tmp_path, "rocksdb", interval=8, retain=6)
    workers = Workers(monkeypatch)
    model = Model()
    try:
        workers.use(0)
        for batch_id in range(4):
            events = [(k, batch_id + 1) for k in range(batch_id, 40, 3)]
            run_partition(spec, batch_id, 0, 1, events)
            for k, v in events:
                model.apply(k, v)
        (v0,) = tmp_path.glob("agg/v0000000000/kg-*")
        v0.unlink()
        workers.use(1)
        events = [(k, 9) for k in range(40)]
        got = run_partition(spec, 4, 0, 1, events)
        expected = [model.apply(k, v) for k, v in events]
        assert sorted(got, key=lambda r: r["k"]) == sorted(expected, key=lambda r: r["k"])
    finally:
        workers.close()


def test_a_parked_database_the_checkpoint_no_longer_holds_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0 commits and parks version 0; another attempt of micro-batch 0 (not
    parking) commits it again with other input. A new worker must start from the
    checkpoint's version 0, not from the parked copy, and drops the copy."""
    spec = spec_for(tmp_path, "rocksdb", interval=4)
    workers = Workers(monkeypatch)
    try:
        workers.use(0)
        run_partition(spec, 0, 0, 1, [(1, 5)])
        parked = os.environ["ASYNCIO_OPS_PARKED"]
        assert [p.name[:11] for p in Path(parked).glob("*/v*")] != []
        monkeypatch.setenv("ASYNCIO_OPS_PARKED", "0")
        workers.use(1)
        run_partition(spec, 0, 0, 1, [(1, 7)])
        monkeypatch.setenv("ASYNCIO_OPS_PARKED", parked)
        workers.use(2)
        assert run_partition(spec, 1, 0, 1, [(1, 1)])[0]["total"] == 8
    finally:
        workers.close()


class Lazy(KeyedProcessFunction[int, Row, Row]):
    """A state registered in process_element, and only for v == 9 (not in open)."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.ctx = runtime_context
        self.total = runtime_context.get_state(ValueStateDescriptor[int]("total"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.total.update((self.total.value() or 0) + value["v"])
        nines = 0
        if value["v"] == 9:
            seen = self.ctx.get_list_state(ListStateDescriptor[int]("nines"))
            seen.add(9)
            nines = len(seen.get())
        out.collect({"k": value["k"], "total": self.total.value(), "recent": nines, "kinds": 0})


def test_a_parked_database_with_a_state_open_does_not_register_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state registered after open() would be in no table of the opened database
    (nor in its snapshots): the worker reads the checkpoint instead, and the state's
    values carry on."""
    spec = spec_for(tmp_path, "rocksdb", interval=8)
    spec = dataclasses.replace(spec, function=Lazy())
    workers = Workers(monkeypatch)
    try:
        workers.use(0)
        assert run_partition(spec, 0, 0, 1, [(1, 9)])[0]["recent"] == 1
        workers.use(1)  # opens the parked database, finds "nines" unregistered: cold
        assert run_partition(spec, 1, 0, 1, [(1, 1)])[0]["total"] == 10
        monkeypatch.setenv("ASYNCIO_OPS_PARKED", "0")
        workers.use(2)  # from the checkpoint: version 1's delta of key 1 kept its "nines"
        row = run_partition(spec, 2, 0, 1, [(1, 9)])[0]
        assert (row["total"], row["recent"]) == (19, 2)  # no list element lost or doubled
    finally:
        workers.close()


class Alarm(KeyedProcessFunction[int, Row, Row]):
    """Sets an event-time timer 10 after each row; on_timer emits the key's total."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.total = runtime_context.get_state(ValueStateDescriptor[int]("total"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.total.update((self.total.value() or 0) + 1)
        ctx.timer_service().register_event_time_timer(value["ts"] + 10)

    def on_timer(self, timestamp: float, ctx: Any, out: Collector[Row]) -> None:
        out.collect({"k": ctx.get_current_key(), "fired": timestamp, "total": self.total.value()})


def test_timers_travel_with_the_parked_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = keyed_process_spec(
        function=Alarm(), key=("k",), max_parallelism=MAXP, event_time="ts",
        output_schema=pa.schema([("k", pa.int64()), ("fired", pa.float64()),
                                 ("total", pa.int64())]),
        checkpoint=CheckpointStorage(str(tmp_path), "agg"), state_backend="rocksdb",
    )  # fmt: skip
    schema = pa.schema([("k", pa.int64()), ("ts", pa.float64()), (KEY_GROUP_COLUMN, pa.int32())])

    def run(batch_id: int, rows: list[tuple[int, float]]) -> list[Row]:
        batch = pa.RecordBatch.from_pylist(
            [{"k": k, "ts": ts, KEY_GROUP_COLUMN: assign_to_key_group(k, MAXP)} for k, ts in rows],
            schema=schema,
        )
        task = TaskInfo(partition_id=0, num_partitions=1, batch_id=batch_id)
        return [r for b in run_keyed_process(spec, [batch], task) for r in b.to_pylist()]

    workers = Workers(monkeypatch)
    try:
        workers.use(0)
        assert run(0, [(1, 100.0), (2, 100.0), (1, 101.0)]) == []
        for f in _kg_files(tmp_path):
            f.unlink()  # the timers can only come from the parked copy
        workers.use(1)
        got = run(1, [(3, 130.0)])
        assert sorted((r["k"], r["fired"], r["total"]) for r in got) == [
            (1, 110.0, 2),
            (1, 111.0, 2),
            (2, 110.0, 1),
        ]
    finally:
        workers.close()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_version_no_longer_restored_keeps_the_files_chains_name_and_not_its_manifests(
    s3_server: Any, tmp_path: Path, store: str
) -> None:
    """``retain_versions=3``, 2 partitions, 13 versions, the chains all starting at
    version 0. On local disk a partition deletes its manifest of the version
    ``max(retain_versions, PARK_EVERY)`` before the one it wrote, so versions 0 to 2 keep
    their key-group files (the chains name version 0's) and no manifest, and restoring
    one is an error that says why. On S3 the manifests stay, and a micro-batch makes
    no request more than one that deletes nothing. Every row is the model's."""
    if store == "s3":
        spec = _s3_spec(s3_server, "manifests", interval=64)
    else:
        spec = spec_for(tmp_path, "heap", interval=64, retain=3)
    storage = spec.checkpoint
    assert storage is not None
    model = Model()
    made = []
    for batch_id in range(13):
        events = [(k, 1) for k in range(40)] if batch_id == 0 else [(batch_id, 2)]
        s3_server.requests.clear()
        for p in range(2):
            rows = run_partition(spec, batch_id, p, 2, events)
            mine = compute_key_group_range_for_operator_index(MAXP, 2, p)
            assert rows == [model.apply(k, v) for k, v in events
                            if assign_to_key_group(k, MAXP) in mine]  # fmt: skip
        made.append(_requests(s3_server))
    held = {v: storage.list_files(v) for v in storage.versions()}
    assert sorted(held) == list(range(13))  # every chain still starts at version 0
    dropped = 3 if store == "local" else 0
    for v, names in held.items():
        manifests = [n for n in names if n.startswith("subtask-")]
        assert manifests == ([] if v < dropped else ["subtask-00000.ckpt", "subtask-00001.ckpt"])
        assert len([n for n in names if n.startswith("kg-")]) == 2
    if store == "local":
        with pytest.raises(CheckpointError, match="retain_versions"):
            read_previous(storage, 1, None)
    else:  # micro-batch 12 would drop version 2's manifests: the same requests as 9's
        assert made[12] == made[9] and made[9]
