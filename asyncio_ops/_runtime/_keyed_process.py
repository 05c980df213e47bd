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
  groups of this partition from version ``N - 1`` (keyed state and timers,
  one blob per key group, whichever partition wrote them) and the watermark
  state (the highest of all partitions), then, at its end, emits the pending
  watermark, fires the processing-time timers due and writes version ``N``.
  A re-run batch is idempotent; the number of partitions may change between
  runs (state and timers follow their key groups).
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

The function sees each row as a dict of the input columns; what it emits
(``out.collect``, or returned or yielded) must fit ``output_schema``. An
exception from the function is raised as it is, with a note naming the key and
the row.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from .._elements import Record, Watermark
from .._exceptions import CheckpointError
from .._functions import RuntimeContext
from .._keygroups import compute_key_group_range_for_operator_index
from ..state import KeyedProcessOperator, KeyedStateBackend
from ._adapters import describe_row
from ._checkpointing import prune_versions, read_previous, write_version
from ._feed import BoundedOutOfOrderness, event_time_seconds
from ._inflight import (
    WatermarkState,
    make_backend,
    restore_operator_state,
    snapshot_operator_state,
)
from ._sink import ArrowSink
from ._spec import KEY_GROUP_COLUMN, KeyedProcessSpec, TaskInfo

OPERATOR: bytes = b"keyed_process"

log = logging.getLogger("asyncio_ops.runtime")


def _key_of(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    if len(columns) == 1:
        (column,) = columns
        return lambda row: row[column]
    return lambda row: tuple(row[c] for c in columns)


def run_keyed_process(
    spec: KeyedProcessSpec, batches: Iterable[pa.RecordBatch], task: TaskInfo
) -> Iterator[pa.RecordBatch]:
    """Run ``spec.function`` over one partition's batches; yield output batches lazily."""
    p = task.num_partitions or 1
    key_groups = compute_key_group_range_for_operator_index(
        spec.max_parallelism, p, task.partition_id
    )
    backend = make_backend(spec.state_backend, spec.max_parallelism, key_groups)
    sink = ArrowSink(spec.output_schema, spec.output_schema.names, spec.batch_size)
    key_of = _key_of(spec.key_columns)
    op = KeyedProcessOperator(
        spec.function, key_of, backend=backend, output=sink, schedule_timers=False,
        runtime_context=RuntimeContext(
            task_name="keyed_process", index_of_this_subtask=task.partition_id,
            number_of_parallel_subtasks=p, attempt_number=task.attempt_number,
        ),
    )  # fmt: skip
    streaming = task.batch_id is not None
    if streaming and spec.checkpoint is None:  # the driver refuses this; a worker never runs it
        raise CheckpointError("keyed_process on a stream needs checkpoint_location=")
    watermarks = (
        BoundedOutOfOrderness(spec.watermark_delay, spec.watermark_interval)
        if spec.event_time is not None
        else None
    )
    try:
        restored = _restore(spec, task, op) if streaming else WatermarkState()
        op.open()
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
            _snapshot(spec, task, op, state)
            _warn_unclaimed(spec, task, backend)
    finally:
        op.close()
        backend.close()


def _process(
    spec: KeyedProcessSpec,
    op: KeyedProcessOperator,
    backend: KeyedStateBackend,
    key_of: Callable[[dict[str, Any]], Any],
    watermarks: BoundedOutOfOrderness | None,
    batch: pa.RecordBatch,
) -> None:
    column = spec.event_time
    assign = backend.assign_key_group
    for row in batch.to_pylist():
        kg = row.pop(KEY_GROUP_COLUMN)
        key = key_of(row)
        ts = event_time_seconds(row.get(column), column, row) if column is not None else None
        try:
            assign(key, kg)
            op.process_element(Record(row, ts))
        except Exception as exc:
            exc.add_note(f"keyed_process: key {key!r:.100}, row {describe_row(row)}")
            raise
        if watermarks is not None:
            assert ts is not None
            wm = watermarks.observe(ts)
            if wm is not None:
                op.process_watermark(Watermark(wm))


def _restore(spec: KeyedProcessSpec, task: TaskInfo, op: KeyedProcessOperator) -> WatermarkState:
    """State, timers and watermark the previous micro-batch left (nothing for the first)."""
    assert spec.checkpoint is not None and task.batch_id is not None
    if task.batch_id <= 0:
        return WatermarkState()
    found = read_previous(spec.checkpoint, task.batch_id - 1)
    if found is None:
        return WatermarkState()
    found.check_operator(OPERATOR)
    p = task.num_partitions or 1
    for path, kg, blob in found.key_group_blobs(
        op.backend.key_group_range, spec.max_parallelism
    ):
        try:
            op.restore({kg: blob})
        except (CheckpointError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint file {path}: {exc}") from exc
    where = spec.checkpoint.path(task.batch_id - 1, "")
    watermarks, _ = restore_operator_state(task.partition_id, p, found.operator_blobs(), where)
    return watermarks


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
    spec: KeyedProcessSpec, task: TaskInfo, op: KeyedProcessOperator, watermarks: WatermarkState
) -> None:
    assert spec.checkpoint is not None and task.batch_id is not None
    p = task.num_partitions or 1
    blobs = op.snapshot()
    op_blob = snapshot_operator_state(task.partition_id, p, watermarks)
    write_version(spec.checkpoint, task.batch_id, task.partition_id, p, True, blobs, op_blob,
                  {}, operator=OPERATOR)  # fmt: skip
    if task.partition_id == 0:
        prune_versions(spec.checkpoint, task.batch_id, spec.retain_versions)
