"""What one partition of the async operator reads from and writes to checkpoint storage.

Versions. A streaming micro-batch ``N`` (Spark's ``streaming.sql.batchId``)
restores what version ``N - 1`` carried over and writes version ``N``, so a
re-run batch is idempotent. A batch job writes one run directory per action:
its id is the DataFrame's token (random, drawn on the driver when the
DataFrame is built) and the action's SQL execution id, so every attempt of
every task of one action shares it, a second action or a second DataFrame
never does, and the run is chosen when the job runs, not when it is built. The
run's name starts with the Spark application's start time and the zero-padded
execution id, so that names sort in the order the runs ran (retention and the
function state's source pick by that order, on object stores too).
``checkpoint_version=N`` pins an int version instead.

What is written (every file one Arrow IPC table, see ``asyncio_ops._storage._checkpoint_storage``):

- ``results-p<i>-<token>-<seq>``: the replay log (``_replay_log``).
- streaming: the carried-over elements, per key group (keyed) or in the
  partition's operator state (unkeyed), and the manifest, which holds the
  partition's watermark state (``_versions``, ``_inflight``).
- ``fnstate-p<i>``: the function's own state (:class:`CheckpointedFunction`).

What a version carried over is read back two ways, with the same readers
(:class:`CarryOver`): a restoring partition takes its share (by key-group
range, or the even split), in queue order (:meth:`PartitionCheckpoint.restore`);
``read_state`` takes each old partition's elements as written
(:func:`carried_elements`) and its watermark state (:func:`version_watermarks`).
Both check the manifests with :func:`carried_format`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from .._elements import Watermark
from .._engine._operator_snapshot import SnapshotEntry
from .._exceptions import CheckpointError
from .._functions import CheckpointedFunction
from .._keygroups import (
    UPPER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    compute_key_group_range_for_operator_index,
)
from .._storage._checkpoint_storage import Version
from .._storage._container import KEY_GROUP_FIELD, SHARED, Kind, Section
from ._claim import claim
from ._inflight import (
    WATERMARK_META,
    CarryOver,
    WatermarkState,
    manifest_watermark,
    restore_operator_state,
)
from ._replay_log import ReplayLog, read_segment
from ._retention import Retention
from ._spec import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo
from ._stored import (
    ARROW,
    ROW,
    ROWS,
    ElementSerializer,
    StoredElement,
    as_kind,
    in_order,
    to_stored,
)
from ._versions import (
    _ELEMENT,
    _INPUT_SCHEMA,
    _KEYED,
    _LIMIT,
    ASYNC_WAIT,
    IN_FLIGHT,
    OUTPUT_SCHEMA,
    VersionFiles,
    concurrently,
    read_previous,
    write_version,
)

log = logging.getLogger("asyncio_ops.runtime")


@dataclass(frozen=True)
class Restored:
    """What the previous version hands this partition."""

    entries: tuple[SnapshotEntry, ...]
    watermarks: WatermarkState
    input_schema: pa.Schema | None


class Opening(NamedTuple):
    """What a task reads before it runs (:meth:`PartitionCheckpoint.open_state`)."""

    replay: dict[int, tuple[bytes, Any]]
    """Completions earlier attempts of this task logged (``load_replay``)."""
    carried: Restored | None
    """The previous micro-batch's elements and watermarks (``restore``)."""
    function_state: list[pa.Table]
    """Every partition's state of the function in the previous version (empty: none)."""


# -- one partition's checkpoint ------------------------------------------------------------------
def run_version(spec: PartitionSpec, task: TaskInfo) -> Version:
    """The version this task reads and writes (see the module docstring)."""
    if task.batch_id is not None:
        return task.batch_id
    if spec.options.checkpoint_version is not None:
        return spec.options.checkpoint_version
    # <start>-<action>-<token>: the name orders runs (CheckpointStorage.runs), never a
    # modification time, which object stores do not keep for directories
    if task.execution_id is not None:
        action = f"e{int(task.execution_id):010d}"
    else:
        action = f"s{task.stage_id:010d}"
    return f"{spec.run_epoch:013d}-{action}-{spec.run_token}"


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
        self._previous_read: tuple[VersionFiles | None] | None = None  # read once
        self._retention: Retention | None = None
        self.kind = ARROW if columnar else ROWS if spec.chunk_size is not None else ROW
        self.log = ReplayLog(
            self.storage, self.version, self.partition, log_type,
            spec.options.checkpoint_flush_rows, spec.options.checkpoint_flush_interval,
        )  # fmt: skip

    # -- replay log ------------------------------------------------------------------------
    def load_replay(self) -> dict[int, tuple[bytes, Any]]:
        """Completions earlier attempts of this partition logged in this version.

        Per position: (fingerprint, logged results), as Python values, or (columnar)
        as a struct array of output rows.
        """
        found: dict[int, tuple[bytes, Any]] = {}
        for name in self.storage.list_files(self.version, f"results-p{self.partition:05d}-"):
            table = read_segment(self.storage, self.version, name)
            path = self.storage.path(self.version, name)
            if table.schema.field("results").type != self.log.results_type:
                # written by the operator with another element kind (rows, chunks, or
                # columnar chunks; chunk_size or the function changed): its lookups are
                # requested again, never served as another kind's results
                log.warning(
                    "replay log %s was written for elements of another kind; its lookups "
                    "are requested again", path,
                )  # fmt: skip
                continue
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

    def open_state(self, fn: object) -> Opening:
        """What a task reads before it runs, from files that do not depend on each other:
        this version's replay log (:meth:`load_replay`), the previous version's elements
        (:meth:`restore`) and, for a :class:`CheckpointedFunction` ``fn``, every
        partition's state of it (:meth:`function_state_tables`). On a remote store at
        once, the replay log and the function's state each in a thread of its own,
        always waited for: the restore's error if it fails, else theirs."""
        wants = isinstance(fn, CheckpointedFunction)
        if not self.storage.remote:
            replay, carried = self.load_replay(), self.restore()
            return Opening(replay, carried, self.function_state_tables() if wants else [])
        with ThreadPoolExecutor(2, thread_name_prefix="aops-read") as pool:
            replay_read = pool.submit(self.load_replay)
            tables_read = pool.submit(self.function_state_tables) if wants else None
            carried = self.restore()
            tables = tables_read.result() if tables_read is not None else []
            return Opening(replay_read.result(), carried, tables)

    # -- carry-over between micro-batches ----------------------------------------------------
    def _previous(self) -> int | None:
        if not self.streaming or not isinstance(self.version, int) or self.version <= 0:
            return None
        return self.version - 1

    def _carry_over(
        self, input_schema: pa.Schema | None, num_partitions: int, kind: str | None = None
    ) -> CarryOver:
        """``kind``: the element kind to read (default: the one this operator writes)."""
        spec = self.spec
        return CarryOver(
            ElementSerializer(kind or self.kind, spec.output_schema, input_schema),
            max_parallelism=spec.options.max_parallelism,
            key_groups=self._key_groups(num_partitions),
            state_backend=spec.options.state_backend,
        )

    def _key_groups(self, num_partitions: int) -> KeyGroupRange:
        """The key groups this partition owns at ``num_partitions`` partitions."""
        return compute_key_group_range_for_operator_index(
            self.spec.options.max_parallelism, num_partitions, self.partition
        )

    def _narrow(self) -> bool:
        """Keyed, without event time: of the previous version a partition needs the
        manifests of partition 0 and of its key groups' old owners (its own, at the same
        number of partitions), not every partition's (whose watermarks no one reads): its
        requests do not grow with the number of partitions."""
        return bool(self.spec.key) and self.spec.options.event_time is None

    def _previous_files(self) -> VersionFiles | None:
        """The previous micro-batch's version (read once per partition)."""
        if self._previous_read is None:
            previous = self._previous()
            found = None
            if previous is not None:
                p = self.task.num_partitions or 1
                maxp = self.spec.options.max_parallelism
                mine = (self._key_groups(p), maxp) if self._narrow() else None
                found = read_previous(self.storage, previous, mine, p)
            if self.streaming:  # another query's state is never restored (nor overwritten)
                assert isinstance(self.version, int)
                claim(self.storage, self.version, self.task.query_id, found)
            self._previous_read = (found,)
        return self._previous_read[0]

    def previous_limit(self) -> int | None:
        """capacity="auto": the limit this partition's operator ended the previous
        micro-batch with, on whichever worker ran it (the median of all partitions'
        when their number changed); None if the previous version holds none."""
        found = self._previous_files()
        if found is None:
            return None
        limits = [
            int(raw) for m in found.manifests
            if (raw := (m.schema.metadata or {}).get(_LIMIT)) is not None
        ]  # fmt: skip
        if not limits:
            return None
        mine = found.manifest_of(self.partition)
        if found.num_partitions == (self.task.num_partitions or 1) and mine is not None:
            own = (mine.schema.metadata or {}).get(_LIMIT)
            if own is not None:
                return int(own)
        return sorted(limits)[len(limits) // 2]

    def restore(self) -> Restored | None:
        """The elements and watermark state the previous micro-batch left for this partition."""
        found = self._previous_files()
        if found is None:
            return None
        previous = found.version
        found.check_operator(ASYNC_WAIT)
        keyed = bool(self.spec.key)
        p_new = self.task.num_partitions or 1
        written = carried_format(found, keyed, self.kind)
        input_schema, kind = written.input_schema, written.kind
        carry = self._carry_over(input_schema, p_new, kind)
        from_files: WatermarkState | None = None  # unkeyed: the operator-state files'
        if keyed:
            stored = self._restore_keyed(found, carry)
        else:
            where = self.storage.path(previous, "")
            from_files, stored = carry.restore_operator(
                self.partition, p_new, found.operator_states(), where
            )
        watermarks = WatermarkState() if self._narrow() else old_watermarks(found, from_files)
        if stored is None or not stored.num_rows:
            return Restored((), watermarks, input_schema)
        if kind != self.kind:  # rows carried into chunks, or chunks into rows
            log.info(
                "partition %s: restoring %d element(s) of kind %r as %r",
                self.partition, stored.num_rows, kind, self.kind,
            )  # fmt: skip
            converted = as_kind(carry.batches.elements(stored), kind, self.kind)
            now = self._carry_over(input_schema, p_new).batches
            stored = pa.Table.from_batches([now.to_batch(converted, deadlines=True)])
        event_time = self.spec.options.event_time is not None
        entries = in_order(stored, self.kind, input_schema, self.spec.output_schema, event_time)
        current = watermarks.current
        if event_time and current > pc.max(stored.column("after_watermark")).as_py():
            entries.append(SnapshotEntry(Watermark(current)))  # the watermark they were behind
        return Restored(tuple(entries), watermarks, input_schema)

    def _restore_keyed(self, found: VersionFiles, carry: CarryOver) -> pa.Table:
        """The elements of this partition's key groups: tables of elements (kind
        ``IN_FLIGHT``), or keyed state written by earlier releases (``KEY_GROUPS``)."""
        marked = [(m.schema.metadata or {}).get(IN_FLIGHT) == b"1" for m in found.manifests]
        if any(marked) and not all(marked):
            raise CheckpointError(
                f"checkpoint files {found.paths[marked.index(True)]} and "
                f"{found.paths[marked.index(False)]} hold in-flight elements in two layouts "
                "(of two releases): run the micro-batch again with one release"
            )
        maxp = self.spec.options.max_parallelism
        if marked and marked[0]:
            return carry.restore_keyed(found.element_sections(carry.key_groups, maxp))
        return carry.restore_keyed_state(found.key_group_sections(carry.key_groups, maxp))

    def finish(
        self,
        remaining: Sequence[SnapshotEntry],
        watermarks: WatermarkState,
        input_schema: pa.Schema | None,
        limit: int | None = None,
    ) -> None:
        """Write this partition's state, then its manifest (streaming), with ``limit``
        (capacity="auto": where the operator's limit ended); prune old versions."""
        self.log.flush()
        if not self.streaming:
            self._prune_runs()
            return
        self.start_retention()
        p = self.task.num_partitions or 1
        carry = self._carry_over(input_schema, p)
        keyed = bool(self.spec.key)
        stored = to_stored(remaining, self.partition, self.kind)
        sections: dict[int, Section] = {}
        if keyed:
            sections = carry.snapshot_keyed(stored, _key_groups(stored, self.kind))
        operator_state = None if keyed else carry.snapshot_operator(self.partition, p, stored)
        schema = b"" if input_schema is None else input_schema.serialize().to_pybytes()
        output = self.spec.output_schema.serialize().to_pybytes()
        assert isinstance(self.version, int)
        try:
            write_version(
                self.storage, self.version, self.partition, p, keyed,
                sections, operator_state,
                {_ELEMENT: self.kind.encode(), _INPUT_SCHEMA: schema, OUTPUT_SCHEMA: output,
                 IN_FLIGHT: b"1", WATERMARK_META: watermarks.encoded(),
                 **({_LIMIT: str(limit).encode()} if limit is not None else {})},
                kind=Kind.IN_FLIGHT, query=self.task.query_id,
            )  # fmt: skip
        except BaseException:
            self.end_retention()
            raise
        if self._retention is not None:
            self._retention.join()

    def start_retention(self) -> None:
        """Partition 0 of a stream: start deleting the versions older than the newest
        ``retain_versions`` (on a remote store in a thread of its own, beside the task:
        ``_retention.Retention``; once). :meth:`finish` starts it if the task did not,
        and waits for it once the version is written; after a failure,
        :meth:`end_retention`."""
        if self._retention is None and self.partition == 0 and isinstance(self.version, int):
            self._retention = Retention(
                self.storage, self.version, self.spec.options.retain_versions, None, chained=False
            )

    def end_retention(self) -> None:
        """The task failed: wait for the retention started, if any (its error is logged:
        the task's is the one raised)."""
        if self._retention is not None:
            self._retention.abandon()

    def _prune_runs(self) -> None:
        if self.partition != 0 or not isinstance(self.version, str):
            return
        runs = [r for r in self.storage.runs() if r != self.version]
        keep = self.spec.options.retain_versions - 1
        self.storage.delete_versions(runs[: max(0, len(runs) - keep)])

    # -- state of the function itself (e.g. a lookup cache) -----------------------------------
    def _function_state_source(self) -> Version | None:
        if isinstance(self.version, str):  # a batch run: the newest other run
            runs = [r for r in self.storage.runs() if r != self.version]
            return runs[-1] if runs else None
        return self.version - 1 if self.version > 0 else None

    def function_state_tables(self) -> list[pa.Table]:
        """Every partition's table of a :class:`CheckpointedFunction`'s state in the
        previous version (or run), in partition order; the files read at once on a
        remote store."""
        source = self._function_state_source()
        if source is None:
            return []
        names = self.storage.list_files(source, "fnstate-")  # one per partition
        return concurrently(
            self.storage, lambda name: self.storage.read(source, name, Kind.FUNCTION_STATE), names
        )

    @staticmethod
    def offer_function_state(fn: object, tables: list[pa.Table]) -> None:
        """Offer a :class:`CheckpointedFunction` what every partition wrote last time
        (:meth:`function_state_tables`), if anything."""
        if tables and isinstance(fn, CheckpointedFunction):
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
        self.storage.write(
            self.version, f"fnstate-p{self.partition:05d}.ckpt", Kind.FUNCTION_STATE, table
        )


def _key_groups(stored: Sequence[StoredElement], kind: str) -> list[Any]:
    """Each element's key group (keyed: every row of a chunk is of one key group);
    CheckpointError if a row has none."""
    if kind == ROW:
        kgs = [e.row.get(KEY_GROUP_COLUMN) for e in stored]
    else:
        kgs = [e.row[0].get(KEY_GROUP_COLUMN) if e.row else None for e in stored]
    if None in kgs:
        raise CheckpointError(f"an in-flight row has no {KEY_GROUP_COLUMN} in keyed mode")
    return kgs


# -- what a version carried over, as written (read_state) ----------------------------------------
@dataclass(frozen=True)
class CarriedFormat:
    """How the old partitions of a version wrote their elements (their manifests agree):
    keyed or not, the element kind, the input schema (None: no partition saw input, and
    none carried anything) and the output schema (None: an earlier release's version)."""

    keyed: bool
    kind: str
    input_schema: pa.Schema | None
    output_schema: pa.Schema | None

    def check_readable(self, found: VersionFiles) -> pa.Schema:
        """The output schema, if ``found``'s elements can be read without the job;
        CheckpointError naming the file if not: manifests without an output schema, or
        keyed ones in the keyed-state layout (both: earlier releases)."""
        if self.output_schema is None:
            raise CheckpointError(
                f"checkpoint file {found.paths[0]} records no output schema (an earlier "
                "release wrote it): its carried-over elements cannot be read without the job"
            )
        for manifest, path in zip(found.manifests, found.paths, strict=True):
            if self.keyed and (manifest.schema.metadata or {}).get(IN_FLIGHT) != b"1":
                raise CheckpointError(
                    f"checkpoint file {path} names its elements in the keyed-state layout of "
                    "an earlier release, which only a restore reads"
                )
        return self.output_schema


def carried_format(
    found: VersionFiles, keyed: bool | None = None, kind: str = ROW
) -> CarriedFormat:
    """The format of ``found``'s elements, from its manifests. CheckpointError naming the
    file for a manifest of another key mode than ``keyed`` (None: the first manifest's),
    an unknown element kind, or a kind or schema other than the other manifests'.
    ``kind``: the one to assume when no manifest names one."""
    schemas: dict[bytes, tuple[pa.Schema | None, str]] = {}
    kinds: dict[str, str] = {}
    for manifest, path in zip(found.manifests, found.paths, strict=True):
        meta = manifest.schema.metadata or {}
        wrote_keyed = meta.get(_KEYED) == b"1"
        if keyed is None:
            keyed = wrote_keyed
        elif wrote_keyed != keyed:
            raise CheckpointError(
                f"checkpoint file {path} was written "
                f"{'with' if not keyed else 'without'} key=, and the operator now runs "
                f"{'with' if keyed else 'without'} it: use another uid or location"
            )
        wrote = meta.get(_ELEMENT, b"?").decode(errors="replace")
        if wrote not in (ROW, ROWS, ARROW):
            raise CheckpointError(
                f"checkpoint file {path} holds elements of an unknown kind {wrote!r}"
            )
        kinds.setdefault(wrote, path)
        if len(kinds) > 1:
            (a, path_a), (b, path_b) = kinds.items()
            raise CheckpointError(
                f"checkpoint files {path_a} and {path_b} hold elements of different kinds "
                f"({a!r} and {b!r})"
            )
        for key, what in ((_INPUT_SCHEMA, "input"), (OUTPUT_SCHEMA, "output")):
            raw = meta.get(key)
            if not raw:
                continue  # a partition that saw no input knows no input schema
            try:
                schema = pa.ipc.read_schema(pa.py_buffer(raw))
            except (pa.ArrowException, ValueError) as exc:
                raise CheckpointError(f"checkpoint file {path}: unreadable {what} schema") from exc
            held, held_path = schemas.setdefault(key, (schema, path))
            if held is not None and not schema.equals(held):
                raise CheckpointError(
                    f"checkpoint files {held_path} and {path} were written with different "
                    f"{what} schemas ({held} and {schema})"
                )
    return CarriedFormat(
        bool(keyed), next(iter(kinds), kind), schemas.get(_INPUT_SCHEMA, (None, ""))[0],
        schemas.get(OUTPUT_SCHEMA, (None, ""))[0],
    )  # fmt: skip


def carried_elements(
    found: VersionFiles, partition: int, written: CarriedFormat
) -> list[tuple[int | None, StoredElement]]:
    """Everything old partition ``partition`` of ``found`` carried over, as it wrote it:
    ``(key group, element)`` pairs (unkeyed: key group None) in its queue order, read
    with a restore's readers (:meth:`VersionFiles.element_sections` and
    :class:`CarryOver`: the partition's shared section whole, each row's key group its
    column; or its operator state's batch), never rescaled, reordered or turned
    into queue entries. ``read_state``'s view; a restore reads by key-group range
    (:meth:`PartitionCheckpoint.restore`). CheckpointError naming the file for a version
    :meth:`CarriedFormat.check_readable` refuses, or a file that does not read back."""
    index = found.partitions.index(partition)
    path = found.paths[index]
    output_schema = written.check_readable(found)
    everything = KeyGroupRange(0, UPPER_BOUND_MAX_PARALLELISM - 1)
    carry = CarryOver(
        ElementSerializer(written.kind, output_schema, written.input_schema),
        max_parallelism=UPPER_BOUND_MAX_PARALLELISM, key_groups=everything,
    )  # fmt: skip
    if not written.keyed:
        where = found.storage.path(found.version, "")
        _, elements = restore_operator_state(
            0, 1, [found.operator_state(partition)], where, carry.batches
        )
        return [] if elements is None else [(None, e) for e in carry.batches.elements(elements)]
    one = replace(found, manifests=[found.manifests[index]], paths=[path],
                  partitions=[partition])  # fmt: skip
    out: list[tuple[int | None, StoredElement]] = []
    for name, section in one.element_sections(everything, UPPER_BOUND_MAX_PARALLELISM):
        table = section.table  # every row is in range: restore_keyed keeps them, in order
        kgs = (
            table.column(KEY_GROUP_FIELD).to_pylist() if section.tag == SHARED
            else [section.tag] * table.num_rows
        )  # fmt: skip
        elements = carry.batches.elements(carry.restore_keyed([(name, section)]))
        out += zip(kgs, elements, strict=True)
    out.sort(key=lambda pair: pair[1].seq)
    return out


def version_watermarks(found: VersionFiles, partition: int) -> WatermarkState:
    """Old partition ``partition``'s watermark state, read as a restore reads it: its
    manifest's, else (earlier releases) the union operator state ``watermark`` of its
    operator-state file."""
    manifest = found.manifest_of(partition)
    if manifest is not None:
        path = found.paths[found.partitions.index(partition)]
        if (mark := manifest_watermark(manifest, path)) is not None:
            return mark
    return _file_watermarks(found, partition)


def _file_watermarks(found: VersionFiles, partition: int) -> WatermarkState:
    """Old partition ``partition``'s watermark state as earlier releases kept it: the
    union operator state ``watermark`` of its operator-state file."""
    where = found.storage.path(found.version, "")
    marks, _ = restore_operator_state(0, 1, [found.operator_state(partition)], where)
    return marks


def old_watermarks(found: VersionFiles, from_files: WatermarkState | None) -> WatermarkState:
    """The union of the old partitions' watermark states (every manifest read): each
    manifest's; one of an earlier release holds none, its operator-state file does:
    ``from_files`` when the caller read them all already (unkeyed: they hold its
    elements; a file of this release adds ``-inf``), else that file is read."""
    marks = [] if from_files is None else [from_files]
    for index, (manifest, path) in enumerate(zip(found.manifests, found.paths, strict=True)):
        mark = manifest_watermark(manifest, path)
        if mark is None and from_files is None:
            mark = _file_watermarks(found, found.partitions[index])
        if mark is not None:
            marks.append(mark)
    return WatermarkState.highest(marks)
