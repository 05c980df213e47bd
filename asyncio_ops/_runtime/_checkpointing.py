"""What one partition reads from and writes to checkpoint storage, as typed Arrow tables.

Versions. A streaming micro-batch ``N`` (Spark's ``streaming.sql.batchId``)
restores what version ``N - 1`` carried over and writes version ``N``, so a
re-run batch is idempotent. A batch job writes one run directory per action:
its id is the DataFrame's token (random, drawn on the driver when the
DataFrame is built) and the action's SQL execution id, so every attempt of
every task of one action shares it, a second action or a second DataFrame
never does, and the run is chosen when the job runs, not when it is built.
``checkpoint_version=N`` pins an int version instead.

What is written (every file one Arrow IPC table, see ``asyncio_ops._checkpoint``):

- ``results-p<i>-<token>-<seq>``: the replay log, lookups this attempt completed
  (row position, row fingerprint, the function's results typed by the output
  columns). Written every ``flush_rows`` lookups or ``flush_interval``
  seconds, so a retried attempt re-requests at most the elements in flight
  plus the lookups of one unflushed stretch.
- ``subtask-<i>`` (streaming): the manifest: the watermark state (highest
  event time seen, current watermark) and either the elements still in
  flight (unkeyed: operator state, split evenly over the new partitions on
  restore) or the names of the key-group files (keyed).
- ``kg-<kg>`` (streaming, keyed): the in-flight elements of one key group
  (a row, or a chunk: every row of a keyed chunk is of one key group); they
  follow their key group to whichever partition owns it next.
- ``fnstate-p<i>``: the function's own state (:class:`CheckpointedFunction`).

An in-flight element is stored as: its position in its old partition's queue
(``seq``), the last watermark before it in that queue (``after_watermark``),
the row (typed by the input schema), its event time and lateness (a chunk:
its rows, its latest event time and one lateness flag per row), its
results if it completed but was not yet emitted (typed by the output schema),
the attempts made, its absolute deadline (the timeout timer) and its key
group. Restore orders elements by (``after_watermark``, old partition,
``seq``) and puts a watermark before each group, so no row crosses a
watermark across a micro-batch boundary and each key keeps its order.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from .._checkpoint import CheckpointStorage, Version
from .._elements import Record, Watermark
from .._exceptions import CheckpointError, OutputSchemaError
from .._functions import CheckpointedFunction
from .._keygroups import compute_key_group_range_for_operator_index
from .._snapshot import SnapshotEntry
from ._adapters import RowValue
from ._spec import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo

log = logging.getLogger("asyncio_ops.runtime")

_KIND: Final = b"aops.kind"
_KEYED: Final = b"aops.keyed"
_NUM_PARTITIONS: Final = b"aops.num_partitions"
_PARTITION: Final = b"aops.partition"
_MAX_SEEN: Final = b"aops.max_seen"
_WATERMARK: Final = b"aops.watermark"
_ELEMENT: Final = b"aops.element"


@dataclass(frozen=True)
class WatermarkState:
    """Highest event time seen and the current watermark (-inf: none yet)."""

    max_seen: float = -math.inf
    current: float = -math.inf


@dataclass(frozen=True)
class Restored:
    """What the previous version hands this partition."""

    entries: tuple[SnapshotEntry, ...]
    watermarks: WatermarkState
    input_schema: pa.Schema | None


def _struct(schema: pa.Schema) -> pa.StructType:
    return pa.struct(list(schema))


def _float(meta: dict[bytes, bytes], key: bytes, name: str) -> float:
    try:
        return float(meta[key])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {name} lacks a valid {key.decode()}") from exc


def _int(meta: dict[bytes, bytes], key: bytes, name: str) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {name} lacks a valid {key.decode()}") from exc


def _explain(values: list[Any], type_: pa.DataType, what: str, exc: Exception) -> OutputSchemaError:
    """Name the first value that ``type_`` cannot hold."""
    for i, value in enumerate(values):
        try:
            pa.array([value], type=type_)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return OutputSchemaError(f"{what} {i} cannot be written as {type_}: {value!r:.300}")
    return OutputSchemaError(f"{what} cannot be written as {type_}: {exc}")


def _array(values: list[Any], type_: pa.DataType, what: str) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise _explain(values, type_, what, exc) from exc


# -- in-flight elements <-> Arrow ----------------------------------------------------------------
ROW: Final = "row"
ROWS: Final = "rows"
ARROW: Final = "arrow"
"""What an element is: a row, a chunk of row dicts, or a chunk as an Arrow batch."""


def _value_type(kind: str, schema: pa.Schema) -> pa.DataType:
    return _struct(schema) if kind == ROW else pa.list_(_struct(schema))


def entries_table(
    entries: Sequence[SnapshotEntry],
    input_schema: pa.Schema,
    output_schema: pa.Schema,
    kind: str = ROW,
) -> pa.Table:
    """``entries`` (queue order) as a table; watermarks become ``after_watermark``.

    ``row`` holds the element's input: a row, or (chunks) the list of its rows.
    """
    seq: list[int] = []
    after: list[float] = []
    rows: list[Any] = []
    stamps: list[float | None] = []
    late: list[bool | list[bool] | None] = []
    results: list[Any] = []
    attempts: list[int] = []
    deadlines: list[float | None] = []
    groups: list[int | None] = []
    last_watermark = -math.inf
    for i, entry in enumerate(entries):
        element = entry.element
        if type(element) is Watermark:
            last_watermark = element.timestamp
            continue
        assert type(element) is Record
        value: RowValue = element.value
        row = value.row
        seq.append(i)
        after.append(last_watermark)
        rows.append(row.to_pylist() if kind == ARROW else row)
        stamps.append(element.timestamp)
        late.append(value.late)
        done = entry.results
        if done is not None and kind == ARROW:  # one output batch
            results.append([r for batch in done for r in batch.to_pylist()])
        else:
            results.append(list(done) if done is not None else None)
        attempts.append(entry.attempts)
        deadlines.append(entry.deadline)
        groups.append(_key_group(row, kind))
    columns = {
        "seq": pa.array(seq, pa.int64()),
        "after_watermark": pa.array(after, pa.float64()),
        "row": _array(rows, _value_type(kind, input_schema), "carried-over input"),
        "timestamp": pa.array(stamps, pa.float64()),
        "late": pa.array(late, pa.bool_() if kind == ROW else pa.list_(pa.bool_())),
        "results": _array(results, pa.list_(_struct(output_schema)), "carried-over result of row"),
        "attempts": pa.array(attempts, pa.int32()),
        "deadline": pa.array(deadlines, pa.float64()),
        "key_group": pa.array(groups, pa.int32()),
    }
    return pa.table(columns).replace_schema_metadata({_ELEMENT: kind.encode()})


def _key_group(row: Any, kind: str) -> int | None:
    """The element's key group (keyed: a chunk's rows share one), or None (unkeyed)."""
    if kind == ROW:
        kg = row.get(KEY_GROUP_COLUMN)
        return None if kg is None else int(kg)
    if kind == ARROW:
        if KEY_GROUP_COLUMN not in row.schema.names or not row.num_rows:
            return None
        return int(row.column(KEY_GROUP_COLUMN)[0].as_py())
    kg = row[0].get(KEY_GROUP_COLUMN) if row else None
    return None if kg is None else int(kg)


def _column(table: pa.Table, column: str, name: str) -> list[Any]:
    """A column of a checkpoint file as Python values; CheckpointError naming the file."""
    if column not in table.column_names:
        raise CheckpointError(f"checkpoint file {name} lacks the column {column!r}")
    return table.column(column).to_pylist()  # type: ignore[no-any-return]


def _check_entries(table: pa.Table, name: str) -> None:
    wanted = {"seq", "after_watermark", "row", "timestamp", "late", "results", "attempts",
              "deadline", "key_group"}  # fmt: skip
    missing = sorted(wanted - set(table.column_names))
    if missing:
        raise CheckpointError(f"checkpoint file {name} lacks the column(s) {missing}")
    types = table.schema
    for column, check in _ENTRY_TYPES.items():
        if not check(types.field(column).type):
            raise CheckpointError(
                f"checkpoint file {name}: column {column!r} is {types.field(column).type}, "
                "not what an in-flight element is written as"
            )


_ENTRY_TYPES: Final = {
    "seq": pa.types.is_integer,
    "after_watermark": pa.types.is_floating,
    "timestamp": pa.types.is_floating,
    "attempts": pa.types.is_integer,
    "deadline": pa.types.is_floating,
    "key_group": pa.types.is_integer,
    "late": lambda t: pa.types.is_boolean(t) or pa.types.is_null(t) or pa.types.is_list(t),
    "row": lambda t: pa.types.is_struct(t) or pa.types.is_list(t),
    "results": pa.types.is_list,
}


@dataclass(frozen=True)
class _Stored:
    after: float
    partition: int
    seq: int
    entry: SnapshotEntry


def _stored(
    table: pa.Table, old_partition: int, name: str, kind: str, output_schema: pa.Schema
) -> list[_Stored]:
    _check_entries(table, name)
    written = (table.schema.metadata or {}).get(_ELEMENT, ROW.encode()).decode()
    if written != kind:
        raise CheckpointError(
            f"checkpoint file {name} holds elements of kind {written!r} and the operator now "
            f"makes {kind!r} (chunk_size or the function changed): use another uid or location"
        )
    input_schema = _row_schema(table)
    try:
        return _stored_rows(table, old_partition, kind, output_schema, input_schema)
    except (TypeError, ValueError, KeyError, pa.ArrowException) as exc:
        raise CheckpointError(
            f"checkpoint file {name} holds in-flight elements that do not read back: {exc}"
        ) from exc


def _stored_rows(
    table: pa.Table,
    old_partition: int,
    kind: str,
    output_schema: pa.Schema,
    input_schema: pa.Schema | None,
) -> list[_Stored]:
    out = []
    for r in table.to_pylist():
        row, results = r["row"], r["results"]
        if kind == ARROW:
            row = pa.RecordBatch.from_pylist(row, schema=input_schema)
            if results is not None:
                results = [pa.RecordBatch.from_pylist(results, schema=output_schema)]
        value = RowValue(row, r["late"], None)
        entry = SnapshotEntry(
            Record(value, r["timestamp"]),
            tuple(results) if results is not None else None,
            None,
            r["attempts"] or 0,
            r["deadline"],
        )
        out.append(_Stored(r["after_watermark"], old_partition, r["seq"], entry))
    return out


def _in_order(stored: list[_Stored], event_time: bool) -> list[SnapshotEntry]:
    """Elements in (after_watermark, old partition, seq) order, watermarks between groups."""
    stored.sort(key=lambda s: (s.after, s.partition, s.seq))
    out: list[SnapshotEntry] = []
    last = -math.inf
    for i, s in enumerate(stored):
        if event_time and s.after > last:
            last = s.after
            out.append(SnapshotEntry(Watermark(last)))
        e = s.entry
        assert type(e.element) is Record
        old: RowValue = e.element.value
        # a position of its own in this version's replay log: negative, apart from input rows
        value = RowValue(old.row, old.late, -(i + 1))
        out.append(SnapshotEntry(Record(value, e.element.timestamp), e.results, None,
                                 e.attempts, e.deadline))  # fmt: skip
    return out


# -- the replay log --------------------------------------------------------------------------------
class ReplayLog:
    """Completed lookups of one task attempt, flushed by count and by time (module docstring)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        version: Version,
        partition: int,
        results_type: pa.DataType,
        flush_rows: int,
        flush_interval: float,
    ) -> None:
        self.storage = storage
        self.version = version
        self.partition = partition
        self.results_type = results_type
        self.flush_rows = flush_rows
        self.flush_interval = flush_interval
        self.token = uuid.uuid4().hex[:12]
        self.segment = 0
        self.flushes = 0
        self._positions: list[int] = []
        self._fingerprints: list[bytes] = []
        self._results: list[Any] = []
        self._last = time.monotonic()

    def __len__(self) -> int:
        return len(self._positions)

    def append(self, position: int, fp: bytes, results: Any) -> None:
        """Log one completion: Python values of ``results_type``, or an Arrow batch of rows."""
        self._positions.append(position)
        self._fingerprints.append(fp)
        self._results.append(results.to_struct_array() if isinstance(results, pa.RecordBatch)
                             else results)  # fmt: skip
        if len(self._positions) >= self.flush_rows or (
            time.monotonic() - self._last >= self.flush_interval
        ):
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one segment file (nothing if empty)."""
        self._last = time.monotonic()
        if not self._positions:
            return
        table = pa.table(
            {
                "position": pa.array(self._positions, pa.int64()),
                "fingerprint": pa.array(self._fingerprints, pa.binary()),
                "results": self._results_array(),
            }
        )
        name = f"results-p{self.partition:05d}-{self.token}-{self.segment:06d}.ckpt"
        self.segment += 1
        self.flushes += 1
        self.storage.write(self.version, name, table)
        self._positions, self._fingerprints, self._results = [], [], []

    def _results_array(self) -> pa.Array:
        results = self._results
        if results and isinstance(results[0], pa.StructArray):  # columnar chunks: no Python
            offsets = [0]
            for r in results:
                offsets.append(offsets[-1] + len(r))
            values = pa.concat_arrays(results)
            array = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
            return array.cast(self.results_type)
        return _array(results, self.results_type, "logged result of element")


# -- one partition's checkpoint ------------------------------------------------------------------
def run_version(spec: PartitionSpec, task: TaskInfo) -> Version:
    """The version this task reads and writes (see the module docstring)."""
    if task.batch_id is not None:
        return task.batch_id
    if spec.checkpoint_version is not None:
        return spec.checkpoint_version
    action = f"e{task.execution_id}" if task.execution_id is not None else f"s{task.stage_id}"
    return f"{spec.run_token}-{action}"


class PartitionCheckpoint:
    """The checkpoint files one partition reads and writes (see the module docstring)."""

    def __init__(
        self, spec: PartitionSpec, task: TaskInfo, log_type: pa.DataType, columnar: bool = False
    ) -> None:
        """``log_type``: the Arrow type of one logged completion (the row function's);
        ``columnar``: completions are logged and replayed as Arrow rows, never as Python."""
        assert spec.checkpoint is not None
        self.spec = spec
        self.task = task
        self.storage = spec.checkpoint
        self.streaming = task.batch_id is not None
        self.version: Version = run_version(spec, task)
        self.partition = task.partition_id
        self.columnar = columnar
        self.kind = ARROW if columnar else ROWS if spec.chunk_size is not None else ROW
        self.log = ReplayLog(
            self.storage, self.version, self.partition, log_type,
            spec.flush_rows, spec.flush_interval,
        )  # fmt: skip

    # -- replay log ------------------------------------------------------------------------
    def load_replay(self) -> dict[int, tuple[bytes, Any]]:
        """Completions earlier attempts of this partition logged in this version.

        Per position: (fingerprint, logged results), as Python values, or (columnar)
        as a struct array of output rows.
        """
        found: dict[int, tuple[bytes, Any]] = {}
        for name in self.storage.list_files(self.version, f"results-p{self.partition:05d}-"):
            table = self.storage.read(self.version, name)
            path = self.storage.path(self.version, name)
            missing = {"position", "fingerprint", "results"} - set(table.column_names)
            if missing:
                raise CheckpointError(
                    f"checkpoint file {path} lacks the column(s) {sorted(missing)}"
                )
            positions = table.column("position").to_pylist()
            fps = table.column("fingerprint").to_pylist()
            column = table.column("results").combine_chunks()
            if self.columnar:
                results: list[Any] = [column[i].values for i in range(len(column))]
            else:
                results = column.to_pylist()
            for pos, fp, res in zip(positions, fps, results, strict=True):
                found[pos] = (fp, res)
        return found

    # -- carry-over between micro-batches ----------------------------------------------------
    def _previous(self) -> int | None:
        if not self.streaming or not isinstance(self.version, int) or self.version <= 0:
            return None
        return self.version - 1

    def restore(self) -> Restored | None:
        """The elements and watermark state the previous micro-batch left for this partition."""
        previous = self._previous()
        if previous is None:
            return None
        storage = self.storage
        manifests = storage.list_files(previous, "subtask-")
        if not manifests:
            return None
        first = storage.read(previous, manifests[0])
        first_name = storage.path(previous, manifests[0])
        meta = first.schema.metadata or {}
        old_parallelism = _int(meta, _NUM_PARTITIONS, first_name)
        expected = [f"subtask-{i:05d}.ckpt" for i in range(old_parallelism)]
        missing = sorted(set(expected) - set(manifests))
        if missing:
            raise CheckpointError(
                f"checkpoint version {previous} of {storage.describe(storage.root)} "
                f"is incomplete: missing {[storage.path(previous, m) for m in missing]}"
            )
        keyed = bool(self.spec.key_columns)
        p_new = self.task.num_partitions or 1
        kg_range = compute_key_group_range_for_operator_index(
            self.spec.max_parallelism, p_new, self.partition
        )
        stored: list[_Stored] = []
        max_seen = current = -math.inf
        input_schema: pa.Schema | None = None
        for index, name in enumerate(expected):
            manifest = first if index == 0 else storage.read(previous, name)
            path = storage.path(previous, name)
            m = manifest.schema.metadata or {}
            if (m.get(_KEYED) == b"1") != keyed:
                raise CheckpointError(
                    f"checkpoint file {path} was written "
                    f"{'with' if not keyed else 'without'} key=, and the operator now runs "
                    f"{'with' if keyed else 'without'} it: use another uid or location"
                )
            # Spark's rule: the watermark is global, the highest any partition reached
            max_seen = max(max_seen, _float(m, _MAX_SEEN, path))
            current = max(current, _float(m, _WATERMARK, path))
            if keyed:
                groups = _column(manifest, "key_group", path)
                files = _column(manifest, "file", path)
                for kg, file in zip(groups, files, strict=True):
                    if kg in kg_range:
                        table = storage.read(previous, file)
                        input_schema = input_schema or _row_schema(table)
                        stored.extend(_stored(table, index, storage.path(previous, file),
                                              self.kind, self.spec.output_schema))  # fmt: skip
            elif index % p_new == self.partition:  # even split of the old partitions' state
                input_schema = input_schema or _row_schema(manifest)
                stored.extend(_stored(manifest, index, path, self.kind, self.spec.output_schema))
        event_time = self.spec.event_time is not None
        entries = _in_order(stored, event_time)
        if event_time and entries and current > max(s.after for s in stored):
            entries.append(SnapshotEntry(Watermark(current)))  # the watermark they were behind
        return Restored(tuple(entries), WatermarkState(max_seen, current), input_schema)

    def finish(
        self,
        remaining: Sequence[SnapshotEntry],
        watermarks: WatermarkState,
        input_schema: pa.Schema | None,
    ) -> None:
        """Write this partition's manifest and key-group files (streaming), prune old versions."""
        self.log.flush()
        if not self.streaming:
            self._prune_runs()
            return
        schema = input_schema or pa.schema([])
        out = self.spec.output_schema
        keyed = bool(self.spec.key_columns)
        meta = {
            _KIND: b"manifest",
            _KEYED: b"1" if keyed else b"0",
            _NUM_PARTITIONS: str(self.task.num_partitions or 1).encode(),
            _PARTITION: str(self.partition).encode(),
            _MAX_SEEN: repr(watermarks.max_seen).encode(),
            _WATERMARK: repr(watermarks.current).encode(),
        }
        if keyed:
            table = entries_table(remaining, schema, out, self.kind)
            groups: list[int] = []
            files: list[str] = []
            if table.num_rows:
                kgs = table.column("key_group")
                for kg in sorted(set(kgs.to_pylist())):
                    if kg is None:
                        raise CheckpointError(
                            f"an in-flight row has no {KEY_GROUP_COLUMN} in keyed mode"
                        )
                    name = f"kg-{kg:05d}.ckpt"
                    mask = pc.equal(kgs, pa.scalar(kg, pa.int32()))
                    self.storage.write(self.version, name, table.filter(mask))
                    groups.append(kg)
                    files.append(name)
            manifest = pa.table(
                {"key_group": pa.array(groups, pa.int32()), "file": pa.array(files, pa.string())}
            )
        else:
            manifest = entries_table(remaining, schema, out, self.kind)
        manifest = manifest.replace_schema_metadata({**(manifest.schema.metadata or {}), **meta})
        self.storage.write(self.version, f"subtask-{self.partition:05d}.ckpt", manifest)
        if self.partition == 0 and isinstance(self.version, int):
            old = [
                v for v in self.storage.versions() if v <= self.version - self.spec.retain_versions
            ]
            self.storage.delete_versions(old)

    def _prune_runs(self) -> None:
        if self.partition != 0 or not isinstance(self.version, str):
            return
        runs = [r for r in self.storage.runs() if r != self.version]
        keep = self.spec.retain_versions - 1
        self.storage.delete_versions(runs[: max(0, len(runs) - keep)])

    # -- state of the function itself (e.g. a lookup cache) -----------------------------------
    def _function_state_source(self) -> Version | None:
        if isinstance(self.version, str):  # a batch run: the newest other run
            runs = [r for r in self.storage.runs() if r != self.version]
            return runs[-1] if runs else None
        return self.version - 1 if self.version > 0 else None

    def restore_function_state(self, fn: object) -> None:
        """Offer a :class:`CheckpointedFunction` what every partition wrote last time."""
        if not isinstance(fn, CheckpointedFunction):
            return
        source = self._function_state_source()
        if source is None:
            return
        tables = [
            self.storage.read(source, name) for name in self.storage.list_files(source, "fnstate-")
        ]
        if tables:
            fn.initialize_function_state(tables)

    def snapshot_function_state(self, fn: object) -> None:
        if not isinstance(fn, CheckpointedFunction):
            return
        table = fn.snapshot_function_state()
        if table is None:
            return
        if not isinstance(table, pa.Table):
            raise CheckpointError(
                f"snapshot_function_state() of {fn!r} must return a pyarrow.Table or None, "
                f"got {type(table).__name__}"
            )
        if not table.num_rows:
            return
        self.storage.write(self.version, f"fnstate-p{self.partition:05d}.ckpt", table)


def _row_schema(table: pa.Table) -> pa.Schema | None:
    """The input schema of the rows a table of elements holds (a row, or a list of rows)."""
    if "row" not in table.column_names:
        return None
    type_ = table.schema.field("row").type
    if pa.types.is_list(type_):
        type_ = type_.value_type
    # a partition that saw no input wrote struct<>: it knows no schema
    return pa.schema(list(type_)) if pa.types.is_struct(type_) and type_.num_fields else None
