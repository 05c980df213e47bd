"""Crash safety of ``keyed_process``'s checkpoints, driven through the runtime without Spark.

A micro-batch ``N`` of partition ``p`` is ``run_keyed_process`` over the rows Spark would route
to ``p`` (by the key group in ``__aops_key_group``) with ``TaskInfo(batch_id=N)``; it commits
when every partition has one successful attempt. Each Hypothesis example is a stream of
micro-batches of ``(key, value)`` events, each run with 1 to 4 partitions (rescaling between
batches), in which task attempts crash and are retried, in a drawn interleaving of the
partitions' attempts, with drawn attempt numbers:

- ``write``: ``CheckpointStorage.write`` fails after ``k`` successful writes of the attempt
  (``k`` from 0), or all but the last ``m`` writes succeed (``m`` = 1: every file but the
  manifest, which is written last);
- ``element``: the function fails on the ``j``-th element of the attempt (mid-input, after
  some output may have been handed out);
- ``done``: the attempt runs to its end and its worker dies before Spark hears of it.

A crash either raises in this process (the attempt's exception path runs) or kills a child
process with ``os._exit`` at the injected point, so nothing of the attempt survives in this
process: a real worker death. The heap backend's children are forked from this process
(``fork``), unless it runs other threads (earlier tests' servers or Spark gateway: a fork
could copy a lock one of them holds). RocksDB's children come from ``forkserver``: RocksDB is
not fork-safe, and a child forked from a process that has used RocksDB hangs in its first
flush (its background-thread pool is not re-created in the child); a forkserver child is
forked from a fresh process that never opened a database, as PySpark's workers are forked
from its daemon.

The function keeps a running sum (ValueState) and the values (ListState) per key; the
"map-timers" variant also counts values by residue (MapState) and registers an event-time
timer per event (deterministic: every row of micro-batch ``N`` has event time ``10 (N + 1)``,
watermarks only at the end of a micro-batch, so a timer set in batch ``N`` for ``10 (N + 2)``
fires at the end of the first later batch with input if its key's partition has rows in it,
else at the start of the next one, from the restored watermark; either way with the key's
state after that batch). After every micro-batch commits, the committed attempts' output must
be the model's (each event exactly once, running sums in input order per key, timers), and a
last micro-batch of one probe row per key reads every key's state back.

Then damaged checkpoints: deleting or flipping a byte of any one file of the version the next
micro-batch restores (every file listed in its directory, so new file kinds are covered)
must raise a CheckpointError naming that file; damaging a file of an older version must
either raise so or change nothing.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops._exceptions import CheckpointError
from asyncio_ops._keygroups import assign_to_key_group, compute_key_group_range_for_operator_index
from asyncio_ops._runtime import KEY_GROUP_COLUMN, STATE_BACKENDS, KeyedProcessSpec, TaskInfo, _warm
from asyncio_ops._runtime._keyed_partition import run_keyed_process
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage, Version
from asyncio_ops._storage._container import Kind, Section, encode
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from tests.runtime.specs import keyed_process_spec

Row = dict[str, Any]
UID: Final = "sums"
CRASH_EXIT: Final = 71  # a child's exit status at its injected crash
CHILD_HANG_GUARD: Final = 300.0  # seconds: only a hung child's bound, never a timing check
STEP: Final = 10.0  # event time of micro-batch N: STEP * (N + 1)
KEYS: Final = ("a", "b", "c", "d", "e", "é", "k-7", "")

INPUT: Final = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("value", pa.int64()),
        pa.field("probe", pa.bool_()),
        pa.field("ts", pa.float64()),
        pa.field(KEY_GROUP_COLUMN, pa.int32()),
    ]
)
OUTPUT: Final = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("kind", pa.string()),  # "event", "timer" or "state" (a probe's answer)
        pa.field("id", pa.int64()),
        pa.field("total", pa.int64()),
        pa.field("items", pa.list_(pa.int64())),
        pa.field("counts", pa.string()),
        pa.field("ts", pa.float64()),
    ]
)


class Crash(Exception):
    """An injected crash of an attempt that runs in this process."""


def crash(die: bool) -> None:
    if die:
        os._exit(CRASH_EXIT)  # the worker dies: no finally, no close, no flush
    raise Crash


def event_time(batch_id: int) -> float:
    return STEP * (batch_id + 1)


def output_row(key: str, kind: str, total: int, **extra: Any) -> Row:
    return {"key": key, "kind": kind, "id": None, "total": total, "items": None,
            "counts": None, "ts": None, **extra}  # fmt: skip


class Sums(KeyedProcessFunction[str, Row, Row]):
    """A running sum and the values per key (and, ``full``, counts by residue and a timer);
    a probe row reads the key's state back. Fails (``die``: kills its process) on the
    ``crash_at``-th element of the attempt."""

    def __init__(self, full: bool, crash_at: int | None = None, die: bool = False) -> None:
        self.full = full
        self.crash_at = crash_at
        self.die = die

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.seen = 0
        self.total = runtime_context.get_state(ValueStateDescriptor[int]("total"))
        self.items = runtime_context.get_state(ListStateDescriptor[int]("items"))
        if self.full:
            self.counts = runtime_context.get_state(MapStateDescriptor[int, int]("counts"))

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        if self.seen == self.crash_at:
            crash(self.die)
        self.seen += 1
        key = value["key"]
        if value["probe"]:
            counts = json.dumps(sorted(self.counts.items())) if self.full else None
            out.collect(output_row(key, "state", self.total.value() or 0,
                                   items=self.items.get(), counts=counts))  # fmt: skip
            return
        total = (self.total.value() or 0) + value["value"]
        self.total.update(total)
        self.items.add(value["value"])
        if self.full:
            residue = value["value"] % 3
            self.counts.put(residue, (self.counts.get(residue) or 0) + 1)
            ctx.timer_service().register_event_time_timer(value["ts"] + STEP)
        out.collect(output_row(key, "event", total, id=value["id"]))

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        out.collect(output_row(ctx.current_key, "timer", self.total.value() or 0, ts=timestamp))


# -- faults ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """How one attempt fails (see the module docstring); ``die``: in a child, by os._exit."""

    where: str  # "write", "element" or "done"
    die: bool
    k: int  # write: successful writes first; element: the element (modulo the input's rows)
    from_end: int = 0  # write, if > 0: every write but the last ``from_end`` succeeds


class FaultyStorage(CheckpointStorage):
    """A checkpoint storage whose writes fail as ``failure`` says (None: never).

    With ``from_end`` each write is held back until ``from_end`` later ones are asked for;
    the held ones are dropped, and the attempt crashes, when it deletes old versions
    (partition 0 prunes after writing) or ends.
    """

    def __init__(self, location: str, uid: str, failure: Failure | None = None) -> None:
        super().__init__(location, uid)
        self.failure = failure
        self.written = 0
        self.held: list[tuple[Version, str, Kind, list[Section], bool, bool]] = []

    def write_sections(
        self, version: Version, name: str, kind: Kind, sections: Sequence[Section],
        local: bool = False, thorough: bool = False,
    ) -> list[tuple[int, int, int]]:  # fmt: skip
        f = self.failure
        if f is None:
            return super().write_sections(version, name, kind, sections, local, thorough)
        _, extents = encode(kind, sections, self.identity(version, name), thorough)
        if f.from_end:
            self.held.append((version, name, kind, list(sections), local, thorough))
            while len(self.held) > f.from_end:
                super().write_sections(*self.held.pop(0))
        else:
            if self.written == f.k:
                crash(f.die)
            super().write_sections(version, name, kind, sections, local, thorough)
            self.written += 1
        return extents

    def delete_versions(self, versions: Any) -> None:
        self.end()
        super().delete_versions(versions)

    def end(self) -> None:
        """Crash if writes are held back (the last ``from_end`` writes never happen)."""
        if self.held:
            assert self.failure is not None
            self.held.clear()
            crash(self.failure.die)


# -- one task attempt ------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What every attempt of one example shares (picklable, for forkserver children)."""

    location: str
    backend: str
    full: bool
    max_parallelism: int
    retain_versions: int
    # a key group's full state every this many versions (else deltas), and the plan's
    # token: fixed per example, so a later task in this process finds what an earlier
    # one kept warm (a crashed child's copy dies with it)
    full_snapshot_interval: int = 50
    plan_token: str = "crash-test"

    def spec(self, fn: Sums, storage: CheckpointStorage, parts: int) -> KeyedProcessSpec:
        return keyed_process_spec(
            function=fn, key=("key",), output_schema=OUTPUT,
            event_time="ts" if self.full else None, watermark_interval=10**9,
            max_parallelism=self.max_parallelism, num_partitions=parts, checkpoint=storage,
            state_backend=self.backend, retain_versions=self.retain_versions, batch_size=3,
            full_snapshot_interval=self.full_snapshot_interval, plan_token=self.plan_token,
        )  # fmt: skip


def run_attempt(
    job: Job, task: TaskInfo, batches: list[pa.RecordBatch], failure: Failure | None = None
) -> list[Row]:
    """One task attempt in this process: its output, or its injected crash."""
    rows = sum(b.num_rows for b in batches)
    if failure is not None and failure.where == "element" and rows == 0:
        failure = replace(failure, where="write")  # no element to fail on
    crash_at = None
    if failure is not None and failure.where == "element":
        crash_at = failure.k % rows
    write_failure = failure if failure is not None and failure.where == "write" else None
    storage = FaultyStorage(job.location, UID, write_failure)
    die = failure is not None and failure.die
    spec = job.spec(Sums(job.full, crash_at, die), storage, task.num_partitions)
    out = [r for b in run_keyed_process(spec, batches, task) for r in b.to_pylist()]
    storage.end()
    if failure is not None:  # "done", or a write plan past the attempt's last write
        crash(failure.die)
    return out


def _child(
    job: Job, task: TaskInfo, batches: list[pa.RecordBatch], failure: Failure, tmp: str
) -> None:
    tempfile.tempdir = tmp  # where RocksDB's working directory is left when the child dies
    run_attempt(job, task, batches, failure)
    os._exit(0)  # unreachable: run_attempt always crashes


def run_dying_attempt(
    job: Job, task: TaskInfo, batches: list[pa.RecordBatch], failure: Failure, tmp: Path
) -> None:
    """The attempt in a child process that dies (os._exit) at the injected point."""
    if job.backend == "rocksdb" or threading.active_count() > 1:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    else:
        ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_child, args=(job, task, batches, failure, str(tmp)))
    proc.start()
    proc.join(CHILD_HANG_GUARD)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        pytest.fail(f"the child attempt {task} with {failure} hung")
    assert proc.exitcode == CRASH_EXIT, f"the child attempt {task} with {failure} failed"


# -- the stream -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    key: str
    id: int
    value: int


@dataclass(frozen=True)
class Plan:
    """One micro-batch's run: its partitions, each one's failing attempts (then a successful
    one), the attempt numbers, and the order in which the attempts run (partition ids)."""

    parts: int
    failures: tuple[tuple[Failure, ...], ...]
    attempt_numbers: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]


def owner(key: str, max_parallelism: int, parts: int) -> int:
    """The partition Spark routes ``key`` to (its key group in that partition's range)."""
    kg = assign_to_key_group(key, max_parallelism)
    for p in range(parts):
        if kg in compute_key_group_range_for_operator_index(max_parallelism, parts, p):
            return p
    raise AssertionError(f"key group {kg} in no partition's range")


def partition_batches(
    rows: list[Row], max_parallelism: int, parts: int
) -> list[list[pa.RecordBatch]]:
    """Each partition's input (rows in their order; no batch for a partition without rows)."""
    mine: list[list[Row]] = [[] for _ in range(parts)]
    for row in rows:
        kg = assign_to_key_group(row["key"], max_parallelism)
        mine[owner(row["key"], max_parallelism, parts)].append({**row, KEY_GROUP_COLUMN: kg})
    return [[pa.RecordBatch.from_pylist(m, schema=INPUT)] if m else [] for m in mine]


def input_rows(events: list[Event], batch_id: int) -> list[Row]:
    ts = event_time(batch_id)
    return [{"key": e.key, "id": e.id, "value": e.value, "probe": False, "ts": ts}
            for e in events]  # fmt: skip


def probe_rows(keys: list[str], batch_id: int) -> list[Row]:
    ts = event_time(batch_id)
    return [{"key": k, "id": None, "value": 0, "probe": True, "ts": ts} for k in keys]


def run_micro_batch(job: Job, batch_id: int, rows: list[Row], plan: Plan, tmp: Path) -> list[Row]:
    """Every attempt of every partition of one micro-batch, in the plan's order; the
    committed (successful) attempts' output, in partition order."""
    inputs = partition_batches(rows, job.max_parallelism, plan.parts)
    tried = [0] * plan.parts
    committed: dict[int, list[Row]] = {}
    for p in plan.order:
        i = tried[p]
        tried[p] += 1
        task = TaskInfo(partition_id=p, num_partitions=plan.parts,
                        attempt_number=plan.attempt_numbers[p][i], stage_id=batch_id,
                        batch_id=batch_id)  # fmt: skip
        if i < len(plan.failures[p]):
            failure = plan.failures[p][i]
            if failure.die:
                run_dying_attempt(job, task, inputs[p], failure, tmp)
            else:
                with pytest.raises(Crash):
                    run_attempt(job, task, inputs[p], failure)
        else:
            assert p not in committed
            committed[p] = run_attempt(job, task, inputs[p])
    assert sorted(committed) == list(range(plan.parts))
    return [r for p in range(plan.parts) for r in committed[p]]


# -- the model --------------------------------------------------------------------------------
def by_key(rows: list[Row], kind: str) -> dict[str, list[Any]]:
    """``{key: [(id, total), ...]}`` of the rows of ``kind``, in output order."""
    out: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        if r["kind"] == kind:
            out[r["key"]].append((r["id"], r["total"]))
    return dict(out)


@dataclass
class Model:
    """The plain-Python result of the stream, micro-batch by micro-batch."""

    totals: dict[str, int]
    items: dict[str, list[int]]
    counts: dict[str, Counter[int]]

    @classmethod
    def empty(cls) -> Model:
        return cls({}, defaultdict(list), defaultdict(Counter))

    def apply(self, events: list[Event]) -> dict[str, list[tuple[int, int]]]:
        """Run the events; their output rows ``{key: [(id, running sum), ...]}``."""
        out: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for e in events:
            self.totals[e.key] = self.totals.get(e.key, 0) + e.value
            self.items[e.key].append(e.value)
            self.counts[e.key][e.value % 3] += 1
            out[e.key].append((e.id, self.totals[e.key]))
        return dict(out)


def expected_timers(
    inputs: list[list[Row]], plans: list[Plan], max_parallelism: int
) -> list[Counter[tuple[str, float, int]]]:
    """Per micro-batch, the timer rows ``(key, timestamp, total)`` it emits (see the module
    docstring): a timer set in batch N fires in the first later batch M with input if its
    key's partition there has rows, else at the start of M + 1; with the state after M."""
    n = len(inputs)
    totals_after: list[dict[str, int]] = []
    totals: dict[str, int] = {}
    for rows in inputs:
        for r in rows:
            if not r["probe"]:
                totals[r["key"]] = totals.get(r["key"], 0) + r["value"]
        totals_after.append(dict(totals))
    fired: list[Counter[tuple[str, float, int]]] = [Counter() for _ in range(n)]
    for b, rows in enumerate(inputs):
        for key in sorted({r["key"] for r in rows if not r["probe"]}):
            m = next(m for m in range(b + 1, n) if inputs[m])  # the probe batch has rows
            q = owner(key, max_parallelism, plans[m].parts)
            has_rows = any(owner(r["key"], max_parallelism, plans[m].parts) == q
                           for r in inputs[m])  # fmt: skip
            at = m if has_rows else m + 1
            assert at < n, "the probe batch always has the key's partition's rows"
            fired[at][(key, event_time(b) + STEP, totals_after[m][key])] += 1
    return fired


# -- strategies -------------------------------------------------------------------------------
failures_st = st.builds(
    Failure,
    where=st.sampled_from(["write", "write", "element", "done"]),
    die=st.sampled_from([False, False, True]),
    k=st.integers(0, 7),
    from_end=st.sampled_from([0, 0, 1, 2]),
)


@st.composite
def plans_st(draw: st.DrawFn) -> Plan:
    parts = draw(st.integers(1, 4))
    failures = tuple(
        tuple(draw(st.lists(failures_st, max_size=2))) for _ in range(parts)
    )  # fmt: skip
    numbers = tuple(
        tuple(draw(st.lists(st.integers(0, 3), min_size=len(f) + 1, max_size=len(f) + 1)))
        for f in failures
    )  # fmt: skip
    tokens = [p for p in range(parts) for _ in range(len(failures[p]) + 1)]
    order = tuple(draw(st.permutations(tokens)))
    return Plan(parts, failures, numbers, order)


@dataclass(frozen=True)
class Scenario:
    events: list[list[Event]]  # per micro-batch
    plans: list[Plan]  # per micro-batch, then the probe batch's
    max_parallelism: int
    retain_versions: int
    full_snapshot_interval: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 4))
    events: list[list[Event]] = []
    next_id = 0
    for _ in range(n):
        pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-50, 50)),
                              max_size=8))  # fmt: skip
        events.append([Event(k, next_id + i, v) for i, (k, v) in enumerate(pairs)])
        next_id += len(pairs)
    plans = [draw(plans_st()) for _ in range(n + 1)]
    return Scenario(
        events, plans, draw(st.sampled_from([4, 8, 128])), draw(st.sampled_from([2, 3, 10])),
        draw(st.sampled_from([1, 2, 50])),
    )  # fmt: skip


# -- the property -----------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _no_leftover_children() -> Iterator[None]:
    yield
    for child in multiprocessing.active_children():  # joined already; reaps any zombie
        child.join()


@pytest.fixture
def scratch(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The temp directory of this test's RocksDB working directories (the runtime makes them
    with ``tempfile``), and its children's: in memory where ``/dev/shm`` is, since opening a
    RocksDB database syncs its files, which costs most of an attempt's time on a disk."""
    shm = Path("/dev/shm")
    # made now, before tempfile's default changes: pytest's and multiprocessing's (where
    # the forkserver's socket lives) temp directories
    basetemp = tmp_path_factory.getbasetemp()
    multiprocessing.util.get_temp_dir()
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else basetemp
    directory = Path(tempfile.mkdtemp(prefix="aops-crash-", dir=base))
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    yield directory
    _warm.clear()  # what the test's tasks kept warm lives in this directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.timeout(600)  # a hang's bound only: about 10 s each unloaded
@pytest.mark.parametrize("full", [False, True], ids=["value-list", "map-timers"])
@pytest.mark.parametrize("backend", STATE_BACKENDS)
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
def test_committed_output_and_state_survive_crashed_attempts(
    tmp_path_factory: pytest.TempPathFactory,
    scratch: Path,
    backend: str,
    full: bool,
    scenario: Scenario,
) -> None:
    location = tmp_path_factory.mktemp("ckpt")
    tmp = Path(tempfile.mkdtemp(prefix="children-", dir=scratch))
    job = Job(str(location), backend, full, scenario.max_parallelism, scenario.retain_versions,
              scenario.full_snapshot_interval, f"crash-{uuid.uuid4().hex}")  # fmt: skip
    model = Model.empty()
    keys = sorted({e.key for batch in scenario.events for e in batch})
    inputs = [input_rows(events, b) for b, events in enumerate(scenario.events)]
    inputs.append(probe_rows(keys, len(scenario.events)))
    timers = expected_timers(inputs, scenario.plans, scenario.max_parallelism) if full else None
    for b, (rows, plan) in enumerate(zip(inputs, scenario.plans, strict=True)):
        out = run_micro_batch(job, b, rows, plan, tmp)
        events = scenario.events[b] if b < len(scenario.events) else []
        # every event exactly once, its key's running sum, in input order per key
        assert by_key(out, "event") == model.apply(events), f"micro-batch {b}"
        if timers is not None:
            got = Counter((r["key"], r["ts"], r["total"]) for r in out if r["kind"] == "timer")
            assert got == timers[b], f"timers of micro-batch {b}"
        else:
            assert not [r for r in out if r["kind"] == "timer"]
        state = {r["key"]: (r["total"], r["items"], r["counts"])
                 for r in out if r["kind"] == "state"}  # fmt: skip
        if b < len(scenario.events):
            assert not state
        else:  # the probe batch: every key's state read back
            assert len([r for r in out if r["kind"] == "state"]) == len(keys)
            assert state == {
                k: (model.totals[k], model.items[k],
                    json.dumps(sorted(model.counts[k].items())) if full else None)
                for k in keys
            }  # fmt: skip


# -- damaged checkpoints ------------------------------------------------------------------------
DAMAGE_KEYS: Final = tuple(f"user-{i}" for i in range(16))


def _clean_plan(parts: int) -> Plan:
    return Plan(parts, ((),) * parts, ((0,),) * parts, tuple(range(parts)))


def _damage_run(job: Job, batch_id: int, parts: int) -> tuple[list[Row], list[Exception]]:
    """Micro-batch ``batch_id``'s partitions, each run once: the output of those that
    succeed, and what the others raised (any exception but a CheckpointError propagates)."""
    rows = input_rows([Event(k, 1000 + i, i) for i, k in enumerate(DAMAGE_KEYS)], batch_id)
    inputs = partition_batches(rows, job.max_parallelism, parts)
    out: list[Row] = []
    errors: list[Exception] = []
    for p in range(parts):
        task = TaskInfo(partition_id=p, num_partitions=parts, batch_id=batch_id)
        try:
            out.extend(run_attempt(job, task, inputs[p]))
        except CheckpointError as exc:
            errors.append(exc)
    return out, errors


def _damages(path: Path) -> Iterator[str]:
    """Damage ``path`` in each way in turn (restored between), yielding the way's name."""
    pristine = path.read_bytes()
    path.unlink()
    yield "deleted"
    flipped = bytearray(pristine)
    flipped[len(flipped) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    yield "byte flipped"
    path.write_bytes(pristine[: len(pristine) // 2])
    yield "truncated"
    path.write_bytes(pristine)


def _kind(name: str) -> str:
    return "".join("#" if c.isdigit() else c for c in name)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", STATE_BACKENDS)
def test_a_damaged_checkpoint_file_is_named_never_lost(
    tmp_path: Path, scratch: Path, backend: str
) -> None:
    """Three micro-batches (2, 3, then 2 partitions); before the third, each file of
    versions 0 and 1 is deleted, flipped and truncated in turn."""
    job = Job(str(tmp_path / "ckpt"), backend, True, 128, 10)
    for b, parts in ((0, 2), (1, 3)):
        events = [Event(k, 100 * b + i, i + b) for i, k in enumerate(DAMAGE_KEYS)]
        run_micro_batch(job, b, input_rows(events, b), _clean_plan(parts), tmp_path)
    storage = CheckpointStorage(job.location, UID)
    shutil.copytree(job.location, tmp_path / "undamaged")
    expected, errors = _damage_run(replace(job, location=str(tmp_path / "undamaged")), 2, 2)
    assert not errors and len(by_key(expected, "event")) == len(DAMAGE_KEYS)
    previous = Path(storage.version_dir(1))
    names = sorted(p.name for p in previous.iterdir())
    kinds = {_kind(n) for n in names}
    assert any(k.startswith("subtask-") for k in kinds), names  # a manifest, at least
    problems: list[str] = []
    cases = 0
    for version in (0, 1):
        directory = Path(storage.version_dir(version))
        for name in sorted(p.name for p in directory.iterdir()):
            for damage in _damages(directory / name):
                cases += 1
                work = tmp_path / f"case-{cases}"
                shutil.copytree(job.location, work)
                damaged = f"{work}/{UID}/{directory.name}/{name}"
                out, errors = _damage_run(replace(job, location=str(work)), 2, 2)
                named = [e for e in errors if damaged in str(e)]
                if version == 1 and not named:
                    problems.append(f"{name} ({damage}): raised {errors!r}, none naming it")
                elif version == 0 and not named and (errors or out != expected):
                    problems.append(f"old {name} ({damage}): raised {errors!r} or changed output")
                shutil.rmtree(work)
    assert not problems, "\n".join(problems)
    assert cases >= 3 * len(names)


@pytest.mark.parametrize("backend", STATE_BACKENDS)
@pytest.mark.parametrize(
    "restored",
    [
        0,
        1,
    ],
)
def test_the_only_manifest_of_the_previous_version_deleted(
    tmp_path: Path, scratch: Path, backend: str, restored: int
) -> None:
    """One partition: deleting its manifest leaves the version without one; restoring from
    it must raise (naming the version's directory), never start from an older version or
    from nothing."""
    job = Job(str(tmp_path / "ckpt"), backend, False, 128, 10)
    for b in range(restored + 1):
        events = [Event(k, 100 * b + i, i) for i, k in enumerate(DAMAGE_KEYS)]
        run_micro_batch(job, b, input_rows(events, b), _clean_plan(1), tmp_path)
    storage = CheckpointStorage(job.location, UID)
    (manifest,) = [n for n in storage.list_files(restored) if n.startswith("subtask-")]
    Path(storage.path(restored, manifest)).unlink()
    task = TaskInfo(partition_id=0, num_partitions=1, batch_id=restored + 1)
    rows = input_rows([Event("user-1", 10_000, 1)], restored + 1)
    with pytest.raises(CheckpointError) as raised:
        run_attempt(job, task, partition_batches(rows, job.max_parallelism, 1)[0])
    assert storage.version_dir(restored) in str(raised.value)
