"""A :class:`KeyedProcessFunction` over one partition of a DataFrame (``keyed_process``).

Call order, per task: restore (streaming) → ``fn.open`` → per input batch:
per row, its key filed under the key group Spark computed
(``__aops_key_group``, never re-hashed), its event time observed (watermarks
every ``watermark_interval`` rows: highest event time seen minus the delay),
``fn.process_element``; then the processing-time timers due → end of input →
snapshot (streaming) → ``fn.close``.

- **Batch job**: at the end of input the watermark goes to +inf, so every
  event-time timer registered by then fires (Flink's rule for bounded input),
  and the processing-time timers due by then fire; a timer ``on_timer``
  registers during this final firing is dropped, never fired
  (``KeyedProcessOperator.end_input``); the state ends with the task.
- **Streaming** (``checkpoint`` required): micro-batch ``N`` restores the key
  groups of this partition as of version ``N - 1`` (keyed state and timers,
  whichever partition wrote them: each key group's chain, its last full
  snapshot and the deltas after it) and the watermark state (the highest of
  all partitions), then, at its end, emits the pending watermark, fires the
  processing-time timers due and writes version ``N``: per key group the keys
  this micro-batch made current (a delta), or the key group's full state when
  its turn comes (every ``full_snapshot_interval`` versions, staggered by key
  group; see ``_versions``). A re-run batch is idempotent; the number of
  partitions may change between runs (state and timers follow their key
  groups). A worker that committed this partition before keeps it warm
  (``_warm``): it reads only the deltas written since, or nothing. On
  RocksDB another worker of the machine opens the database the committing
  worker parked (``_parked``), unless the function's ``open`` leaves one of
  its states unregistered; then it reads the checkpoint.
- Initial state (``seeded``): a batch job, or micro-batch 0 of a query with no
  version yet, first applies the seed the driver wrote (``_seed``) to its key
  groups; version 0 then holds their full state.
- Processing-time timers fire when a batch runs past them: after each input
  batch and at the end of the task (a Spark task has no event loop between
  micro-batches, so nothing fires while no batch runs).
- TTL: processing-time TTL reads the wall clock; event-time TTL follows the
  restored and advancing watermark, across micro-batches and restarts.
- Unclaimed state: restored states (by descriptor name) that no descriptor
  registered by the time the micro-batch ends (``open``, ``process_element``
  and ``on_timer`` may all register) are kept as restored, written into
  version ``N`` again, and logged as a warning (logger
  ``asyncio_ops.runtime``) naming them, the operator uid and the version they
  came from: a renamed descriptor starts empty, and the warning says so.
- Each manifest records every state's kind and declared types
  (``STATE_TYPES``), registered or restored: the driver checks a restart's
  descriptors against it, and ``read_state`` types its columns by it. Typed
  state restored under a changed compatible type is converted when its
  descriptor registers (``state._types.evolution``).

The function sees each row as a dict of the input columns; what it emits
(``out.collect``, or returned or yielded) must fit ``output_schema``. An
exception from the function is raised as it is, with a note naming the key and
the row.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from .._elements import Record, Watermark
from .._engine._keyed_operator import KeyedProcessOperator
from .._exceptions import CheckpointError
from .._functions import RuntimeContext
from .._keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from .._storage._container import Kind
from ..state import KeyedStateBackend
from ..state._rocksdb import RocksDBKeyedStateBackend
from ..state._schema import types_json
from . import _parked, _warm
from ._adapters import describe_row
from ._claim import claim
from ._feed import BoundedOutOfOrderness, event_time_seconds
from ._inflight import WATERMARK_META, WatermarkState, make_backend, manifest_watermark
from ._retention import KEPT_FROM, Retention, drop_manifest
from ._seed import seed_chains
from ._sink import ArrowSink
from ._spec import KEY_GROUP_COLUMN, KeyedProcessSpec, TaskInfo, key_selector
from ._versions import (
    Chain,
    VersionFiles,
    apply_chains,
    extends,
    full_due,
    key_group_prefix,
    manifest_name,
    read_previous,
    write_version,
    writer_of,
)

OPERATOR: bytes = b"keyed_process"
# the key columns' names and Spark types (a StructType's JSON), for read_state
KEY_SCHEMA: bytes = b"aops.key_schema"
# every state's kind and declared types (``state._schema.types_json``): read_state's typed
# columns, and the driver's check of a restart's descriptors
STATE_TYPES: bytes = b"aops.state_types"
# the state types of the older versions this partition's chains name, carried forward from
# the manifests restored (``[[types_json, [versions]], ...]``): the driver's check sees every
# type a restore meets even where those versions' own manifests were deleted
HELD_TYPES: bytes = b"aops.held_types"

log = logging.getLogger("asyncio_ops.runtime")


def run_keyed_process(
    spec: KeyedProcessSpec, batches: Iterable[pa.RecordBatch], task: TaskInfo
) -> Iterator[pa.RecordBatch]:
    """Run ``spec.function`` over one partition's batches; yield output batches lazily."""
    p = task.num_partitions or 1
    key_groups = compute_key_group_range_for_operator_index(
        spec.options.max_parallelism, p, task.partition_id
    )
    streaming = task.batch_id is not None
    if streaming and spec.checkpoint is None:  # the driver refuses this; a worker never runs it
        raise CheckpointError("keyed_process on a stream needs checkpoint_location=")
    previous = _previous(spec, task, key_groups) if streaming else None
    if streaming:  # whose state: this query's, this uid's (refused otherwise)
        assert spec.checkpoint is not None and task.batch_id is not None
        claim(spec.checkpoint, task.batch_id, task.query_id, previous,
              spec.options.allow_non_restored_state)  # fmt: skip
    warm_key = _warm_key(spec, task) if streaming else None
    held = _proven(spec, task, previous, _warm.take(warm_key)) if warm_key else None
    parked = None
    if held is None and warm_key is not None and spec.options.state_backend == "rocksdb":
        parked = _parked.claim(
            warm_key,
            lambda path, seq: RocksDBKeyedStateBackend(
                path=path, max_parallelism=spec.options.max_parallelism, key_group_range=key_groups,
                adopt=seq,
            ),
            lambda version, writer: _committed(spec, task, previous, version, writer),
        )  # fmt: skip
    if held is not None:
        backend = held.operator.backend
    elif parked is not None:
        backend = parked.backend
        backend.require_assigned_groups()  # as a new one (_new_backend)
    else:
        backend = _new_backend(spec, key_groups)
    sink = ArrowSink(spec.output_schema, spec.output_schema.names, spec.batch_size)
    key_of = key_selector(spec.key)
    op = _operator(spec, task, backend, sink, key_of)
    adopted = parked is not None
    watermarks = (
        BoundedOutOfOrderness(
            spec.options.watermark_delay or 0.0, spec.options.watermark_interval
        )
        if spec.options.event_time is not None
        else None
    )
    kept = False
    retention: Retention | None = None
    try:
        if streaming and task.partition_id == 0:  # beside the task on a remote store
            assert spec.checkpoint is not None and task.batch_id is not None
            retention = Retention(
                spec.checkpoint, task.batch_id, spec.options.retain_versions, _kept_from(previous)
            )
        restored = WatermarkState()
        chains: dict[int, Chain] = {}
        # open() first: the function obtains its states, and what a restore reads goes
        # into them a key group at a time (restored before open, a state not obtained
        # yet would hold all of its entries aside until open)
        op.open()
        if adopted and isinstance(backend, RocksDBKeyedStateBackend):
            unregistered = backend.unregistered_states()
            if unregistered:  # registered after open: their rows are in no table yet
                log.info(
                    "keyed_process uid %r, partition %d: the parked database holds state(s) "
                    "%s that open() did not register; reading the checkpoint instead",
                    spec.checkpoint.uid if spec.checkpoint else None, task.partition_id,
                    unregistered,
                )  # fmt: skip
                op.close()
                backend.close()
                backend = _new_backend(spec, key_groups)
                op = _operator(spec, task, backend, sink, key_of)
                op.open()
                parked = None
        if streaming:
            have: dict[int, Chain] = {}
            if held is not None:
                op.take_timers(held.operator)
                have = held.chains
            elif parked is not None:
                op.timer_service.restore(parked.timers)
                have = parked.chains
            chains = _sync(spec, task, op, previous, have)
            held = parked = None
            if previous is None and spec.seeded and task.batch_id == 0:
                assert spec.checkpoint is not None
                seed_chains(spec.checkpoint, op)
            if previous is not None:
                restored = _watermarks(previous)
            # a key group without a chain is written in full (_snapshot): when none of
            # this partition's has one (the first micro-batch, a bulk load), the keys made
            # current are not kept
            op.track_changes(keys=bool(chains))
        elif spec.seeded:
            assert spec.checkpoint is not None
            seed_chains(spec.checkpoint, op)
        if watermarks is not None:
            watermarks.restore(restored.max_seen, restored.current)
        if restored.current > -math.inf:
            op.process_watermark(Watermark(restored.current))  # event-time TTL, due timers
        for batch in batches:
            _process(spec, op, backend, key_of, watermarks, batch)
            op.timer_service.fire_processing_time(time.time())
            if sink.full():
                yield from sink.take()
        if not streaming:
            op.end_input(time.time())  # bounded input: the final firing
        else:
            if watermarks is not None:
                pending = watermarks.max_seen - watermarks.delay
                if pending > watermarks.current:
                    watermarks.current = pending
                    op.process_watermark(Watermark(pending))
            op.timer_service.fire_processing_time(time.time())
        yield from sink.take()
        if streaming:
            state = WatermarkState(
                watermarks.max_seen if watermarks is not None else -math.inf,
                watermarks.current if watermarks is not None else restored.current,
            )
            writer, chains = _snapshot(spec, task, op, state, chains, retention, previous)
            _warn_unclaimed(spec, task, backend)
            assert warm_key is not None and task.batch_id is not None
            kept = _warm.put(warm_key, _warm.Warm(task.batch_id, writer, op, chains))
            rocksdb = spec.options.state_backend == "rocksdb"
            if kept and rocksdb and not backend.unclaimed_state_names():
                _parked.park(warm_key, task.batch_id, writer, backend,
                             op.timer_service.snapshot, chains)  # fmt: skip
    finally:
        if retention is not None:  # the task failed (after a join: nothing to do)
            retention.abandon()
        op.close()
        if held is not None:  # proven, but the task failed before taking it over
            _warm.discard(held)
        if parked is not None:  # claimed, but the task failed before taking it over
            parked.backend.close()
        if not kept:
            backend.close()


def _new_backend(spec: KeyedProcessSpec, key_groups: KeyGroupRange) -> KeyedStateBackend:
    """An empty backend of the spec's kind. Spark names every key's group (rows:
    ``__aops_key_group``; timers: where they are filed), so it remembers groups per
    task, not per key stored (``require_assigned_groups``)."""
    backend = make_backend(spec.options.state_backend, spec.options.max_parallelism, key_groups)
    backend.require_assigned_groups()
    return backend


def _operator(
    spec: KeyedProcessSpec,
    task: TaskInfo,
    backend: KeyedStateBackend,
    sink: ArrowSink,
    key_of: Callable[[dict[str, Any]], Any],
) -> KeyedProcessOperator:
    return KeyedProcessOperator(
        spec.function, key_of, backend=backend, output=sink, schedule_timers=False,
        collect=sink.collect,
        runtime_context=RuntimeContext(
            task_name="keyed_process", index_of_this_subtask=task.partition_id,
            number_of_parallel_subtasks=task.num_partitions or 1,
            attempt_number=task.attempt_number,
        ),
    )  # fmt: skip


def _process(
    spec: KeyedProcessSpec,
    op: KeyedProcessOperator,
    backend: KeyedStateBackend,
    key_of: Callable[[dict[str, Any]], Any],
    watermarks: BoundedOutOfOrderness | None,
    batch: pa.RecordBatch,
) -> None:
    column = spec.options.event_time
    assign = backend.assign_key_group
    # the key groups apart from the rows (no pop per row)
    at = batch.schema.get_field_index(KEY_GROUP_COLUMN)
    if at < 0:  # the driver adds it to every keyed_process input
        raise KeyError(KEY_GROUP_COLUMN)
    groups = batch.column(at).to_pylist()
    rows = batch.remove_column(at).to_pylist()
    if column is None and watermarks is None:  # no event time: the shortest loop
        keys = _keys(spec.key, batch)
        if keys is not None and backend.assign_key_groups(keys, groups):
            op.process_values(rows, keys, _note)  # the batch's keys filed at once
            return
        process = op.process_element
        for row, kg in zip(rows, groups, strict=True):
            key = key_of(row)
            try:
                assign(key, kg)
                process(Record(row, None))
            except Exception as exc:
                _note(exc, key, row)
                raise
        return
    for row, kg in zip(rows, groups, strict=True):
        key = key_of(row)
        ts = event_time_seconds(row.get(column), column, row) if column is not None else None
        try:
            assign(key, kg)
            op.process_element(Record(row, ts))
        except Exception as exc:
            _note(exc, key, row)
            raise
        if watermarks is not None:
            assert ts is not None
            wm = watermarks.observe(ts)
            if wm is not None:
                op.process_watermark(Watermark(wm))


def _keys(columns: tuple[str, ...], batch: pa.RecordBatch) -> list[Any] | None:
    """The batch's keys in row order, as the key selector gives them from its rows (one
    column's values, or tuples of several), read as columns; None if a key column is
    not found once by its name."""
    at = [batch.schema.get_field_index(c) for c in columns]
    if min(at) < 0:
        return None
    if len(at) == 1:
        keys: list[Any] = batch.column(at[0]).to_pylist()
        return keys
    return list(zip(*(batch.column(i).to_pylist() for i in at), strict=True))


def _note(exc: Exception, key: Any, row: Any) -> None:
    exc.add_note(f"keyed_process: key {key!r:.100}, row {describe_row(row)}")


def _previous(
    spec: KeyedProcessSpec, task: TaskInfo, key_groups: KeyGroupRange
) -> VersionFiles | None:
    """The version micro-batch ``N`` starts from, ``N - 1`` (None for the first): the
    manifests of the old partitions that held ``key_groups`` (and partition 0's); with
    event time all of them, whose highest watermark the partition starts from."""
    assert spec.checkpoint is not None and task.batch_id is not None
    if task.batch_id <= 0:
        return None
    owners = (key_groups, spec.options.max_parallelism) if spec.options.event_time is None else None
    found = read_previous(spec.checkpoint, task.batch_id - 1, owners, task.num_partitions or 1)
    if found is not None:
        found.check_operator(OPERATOR)
    return found


def _warm_key(spec: KeyedProcessSpec, task: TaskInfo) -> tuple[object, ...]:
    storage = spec.checkpoint
    assert storage is not None
    return (
        storage.location, storage.uid, spec.plan_token, task.partition_id,
        task.num_partitions or 1, spec.options.state_backend, spec.options.max_parallelism,
    )  # fmt: skip


def _committed(
    spec: KeyedProcessSpec, task: TaskInfo, previous: VersionFiles | None, version: int,
    writer: str,
) -> bool:  # fmt: skip
    """Whether the checkpoint still holds, for this partition, ``version`` as ``writer``
    committed it (not pruned, not rewritten by another attempt), at or before the
    version this micro-batch starts from."""
    storage = spec.checkpoint
    assert storage is not None
    if previous is None or not isinstance(previous.version, int) or version > previous.version:
        return False
    try:
        manifest = (
            previous.manifest_of(task.partition_id)
            if version == previous.version
            else storage.read(version, manifest_name(task.partition_id), Kind.MANIFEST)
        )
    except CheckpointError:
        return False
    return manifest is not None and writer_of(manifest) == writer


def _proven(
    spec: KeyedProcessSpec, task: TaskInfo, previous: VersionFiles | None, held: _warm.Warm | None
) -> _warm.Warm | None:
    """``held`` if the checkpoint still holds, for this partition, the very version it
    committed (module ``_warm``); otherwise None, its backend closed."""
    if held is None:
        return None
    storage = spec.checkpoint
    assert storage is not None
    proven = _committed(spec, task, previous, held.version, held.writer)
    if not proven:
        log.info(
            "keyed_process uid %r, partition %d: the state this worker kept from version %d "
            "is not the checkpoint's; reading it from the checkpoint",
            storage.uid, task.partition_id, held.version,
        )  # fmt: skip
        _warm.discard(held)
        return None
    return held


def _sync(
    spec: KeyedProcessSpec,
    task: TaskInfo,
    op: KeyedProcessOperator,
    previous: VersionFiles | None,
    held: dict[int, Chain],
) -> dict[int, Chain]:
    """Bring ``op``'s key groups (holding the ``held`` chains) to ``previous``'s chains:
    per key group only the chain's part after what is held, or, when its chain was
    restarted, all of it; returns the chains now held. Files this partition's index
    wrote that are read from a remote store are kept as local copies (a partition
    that moved here reads them locally next time)."""
    assert spec.checkpoint is not None
    kgr: KeyGroupRange = op.backend.key_group_range
    target = previous.chains(kgr, spec.options.max_parallelism) if previous is not None else {}
    rests: dict[int, Chain] = {}
    tails: set[int] = set()
    for kg in kgr:
        have, want = held.get(kg), target.get(kg)
        if want is None:
            if have is not None:
                op.clear_key_group(kg)
        elif have is None or not extends(want, have):
            rests[kg] = want  # a new chain (or none held): all of it, from its full section
        elif len(want) > len(have):
            rests[kg] = want[len(have) :]  # the deltas written since
            tails.add(kg)
    mine = key_group_prefix(task.partition_id)
    apply_chains(spec.checkpoint, rests, op.apply_change, tails, keep=mine)
    return target


def _watermarks(previous: VersionFiles) -> WatermarkState:
    """The highest watermark state of the old partitions (union), from their manifests."""
    return WatermarkState.highest(
        required_watermark(manifest, path)
        for manifest, path in zip(previous.manifests, previous.paths, strict=True)
    )


def required_watermark(manifest: pa.Table, path: str) -> WatermarkState:
    """The watermark state a ``keyed_process`` manifest holds (every one does):
    CheckpointError naming the file if it holds none or an unreadable one."""
    mark = manifest_watermark(manifest, path)
    if mark is None:
        raise CheckpointError(f"checkpoint file {path}: no watermark ({WATERMARK_META!r})")
    return mark


def _warn_unclaimed(spec: KeyedProcessSpec, task: TaskInfo, backend: KeyedStateBackend) -> None:
    """Warn about restored states no descriptor claimed in this micro-batch (kept as they are)."""
    unclaimed = backend.unclaimed_state_names()
    if not unclaimed:
        return
    assert spec.checkpoint is not None and task.batch_id is not None
    log.warning(
        "keyed_process uid %r, partition %d: state(s) %s restored from checkpoint version %d "
        "of %s were not claimed by any state descriptor of %s in micro-batch %d; they are "
        "kept as they are (written to version %d again), but a descriptor under another name "
        "starts empty: register the old name(s) to read them",
        spec.checkpoint.uid, task.partition_id, unclaimed, task.batch_id - 1,
        spec.checkpoint.describe(spec.checkpoint.root), type(spec.function).__qualname__,
        task.batch_id, task.batch_id,
    )  # fmt: skip


def _snapshot(
    spec: KeyedProcessSpec,
    task: TaskInfo,
    op: KeyedProcessOperator,
    watermarks: WatermarkState,
    chains: dict[int, Chain],
    retention: Retention | None,
    previous: VersionFiles | None,
) -> tuple[str, dict[int, Chain]]:
    """Write version ``N``: deltas, and the full state of the key groups whose turn it is
    (or that have no chain); returns the attempt's token and the chains written.
    Partition 0's ``retention`` (started with the task: beside it on a remote store)
    gives the oldest version kept, recorded in its manifest, and is joined once the
    version is written; then each partition deletes its manifest of the version no
    longer restored (``drop_manifest``)."""
    assert spec.checkpoint is not None and task.batch_id is not None
    version = task.batch_id
    interval = spec.options.full_snapshot_interval
    full = {
        kg for kg in op.backend.key_group_range
        if kg not in chains or full_due(chains[kg], kg, version, interval)
    }  # fmt: skip
    changes = op.snapshot_changes(full)
    p = task.num_partitions or 1
    writer = uuid.uuid4().hex[:12]
    kept = {kg: chain for kg, chain in chains.items() if kg not in full}
    meta = {WATERMARK_META: watermarks.encoded()}
    if spec.key_schema:
        meta[KEY_SCHEMA] = spec.key_schema.encode()
    meta[STATE_TYPES] = types_json(op.backend.state_types()).encode()
    named = {link[0] for chain in kept.values() for link in chain} - {version}
    held = held_types(previous, named)
    if held:
        meta[HELD_TYPES] = held.encode()
    if retention is not None:  # what partition 0 keeps, said in its manifest
        meta[KEPT_FROM] = str(retention.keep_from()).encode()
    written = write_version(
        spec.checkpoint, version, task.partition_id, p, True, changes.deltas, None,
        meta, operator=OPERATOR, chains=kept, writer=writer, full=changes.full,
        query=task.query_id,
    )  # fmt: skip
    if retention is not None:
        retention.join()
    restorable = max(spec.options.retain_versions, _parked.PARK_EVERY)
    drop_manifest(spec.checkpoint, version, task.partition_id, restorable)
    return writer, written


def held_types(previous: VersionFiles | None, named: set[int]) -> str:
    """``HELD_TYPES`` of a manifest whose chains name the older versions ``named``: the
    state types each was written with, from the manifests of ``previous`` (the version
    restored: its own types, and those it carried for older ones); "" when none is known
    (a version written before manifests carried them)."""
    if previous is None or not named:
        return ""
    known: dict[int, str] = {}
    for manifest in previous.manifests:
        known.update((v, t) for v, t in carried_types(manifest).items() if v in named)
        own = (manifest.schema.metadata or {}).get(STATE_TYPES)
        if own is not None and previous.version in named:
            assert isinstance(previous.version, int)
            known[previous.version] = own.decode()  # types_json wrote it
    grouped: dict[str, list[int]] = {}
    for v in sorted(known):
        grouped.setdefault(known[v], []).append(v)
    return json.dumps(sorted(grouped.items())) if grouped else ""


def carried_types(manifest: pa.Table) -> dict[int, str]:
    """What a manifest's ``HELD_TYPES`` says: per older version its chains name, the
    state types (``types_json``) it was written with ({} if it says nothing)."""
    raw = (manifest.schema.metadata or {}).get(HELD_TYPES)
    if raw is None:
        return {}
    return {int(v): types for types, versions in json.loads(raw) for v in versions}


def _kept_from(previous: VersionFiles | None) -> int | None:
    """The version before which partition 0's manifest of the version restored says every
    version was deleted (None if it does not say: listed instead)."""
    manifest = previous.manifest_of(0) if previous is not None else None
    raw = (manifest.schema.metadata or {}).get(KEPT_FROM) if manifest is not None else None
    try:
        return int(raw) if raw else None
    except ValueError:
        return None
