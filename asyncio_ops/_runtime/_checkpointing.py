"""What one partition reads from and writes to checkpoint storage, as typed Arrow tables.

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

What is written (every file one Arrow IPC table, see ``asyncio_ops._checkpoint``):

- ``results-p<i>-<token>-<seq>``: the replay log, lookups this attempt completed
  (row position, row fingerprint, the function's results typed by the output
  columns). Written every ``flush_rows`` lookups or ``flush_interval``
  seconds, so a retried attempt re-requests at most the elements in flight
  plus the lookups of one unflushed stretch.
- ``kg-p<i>-<token>`` (streaming, keyed): partition i's key groups that changed
  in this version, a row each: the key group, ``keys`` and its sealed blob.
  ``keys`` null: the blob is the key group's full state (keyed state and
  timers; for the async operator its in-flight elements as one record batch
  and their timeout timers, ``asyncio_ops._runtime._inflight``); otherwise a
  delta: the canonical bytes of the keys it replaces whole and their state
  and timers (``asyncio_ops.state._keyed_snapshot``). The token is the
  attempt's, so two attempts never write one name.
- ``ops-<i>`` (streaming, the async operator): partition i's sealed
  operator-state blob: the watermark state (union) and, unkeyed, its in-flight
  elements (even split). ``keyed_process`` writes its watermark state into
  its manifest instead (``aops.watermark``: one file and, for every
  partition, one read per old partition less; its ``ops-<i>`` files of
  earlier releases still read).
- ``subtask-<i>`` (streaming): the manifest, written last: per key group of
  partition i its chain, the files (with their versions) that rebuild it:
  its last full blob and the deltas after it, in order; the number of
  partitions, and the attempt's token (``aops.writer``). A key group follows
  to whichever partition owns it next, which reads its chain. Manifests of
  earlier releases (a ``file`` per key group, a full blob; files of one key
  group each, ``kg-<kg>``) still read.

Incremental checkpoints (keyed_process): a version writes, per key group,
the keys its micro-batch made current (a delta) and, once every
``full_snapshot_interval`` versions per key group (staggered: key group
``kg`` at the versions where ``(version + kg) % interval == 0``), when it has
no chain yet, or when its chain's deltas hold as many bytes as its full blob,
its full state instead, so a micro-batch writes what it touched plus
``1/interval`` of the state, a chain holds at most ``interval`` files, and
reading one costs at most about twice its full blob. Retention (partition 0,
after its write) keeps the newest ``retain_versions`` versions and every older
version directory their chains name.
- ``fnstate-p<i>``: the function's own state (:class:`CheckpointedFunction`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from .._checkpoint import CheckpointStorage, Version
from .._elements import Watermark
from .._exceptions import CheckpointError, OutputSchemaError
from .._functions import CheckpointedFunction
from .._keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from .._snapshot import SnapshotEntry
from ._coerce import coerced_array
from ._inflight import (
    ARROW,
    ROW,
    ROWS,
    CarryOver,
    ElementSerializer,
    WatermarkState,
    as_kind,
    in_order,
    to_stored,
)
from ._spec import KEY_GROUP_COLUMN, PartitionSpec, TaskInfo

log = logging.getLogger("asyncio_ops.runtime")

_KIND: Final = b"aops.kind"
_KEYED: Final = b"aops.keyed"
_NUM_PARTITIONS: Final = b"aops.num_partitions"
_PARTITION: Final = b"aops.partition"
_ELEMENT: Final = b"aops.element"
_INPUT_SCHEMA: Final = b"aops.input_schema"
# capacity="auto": the limit a partition's operator ended the micro-batch with
_LIMIT: Final = b"aops.limit"
# the attempt that wrote a manifest (a warm worker proves with it what it holds)
_WRITER: Final = b"aops.writer"
_BLOB: Final = "blob"
_KEY_GROUP: Final = "key_group"
_KEYS: Final = "keys"
_KEY_GROUPS_SCHEMA: Final = pa.schema(
    [pa.field(_KEY_GROUP, pa.int32(), nullable=False), pa.field(_BLOB, pa.binary(), nullable=False)]
)  # earlier releases: full blobs only
_CHANGES_SCHEMA: Final = pa.schema(
    [
        pa.field(_KEY_GROUP, pa.int32(), nullable=False),
        pa.field(_KEYS, pa.list_(pa.field("item", pa.binary(), nullable=False))),
        pa.field(_BLOB, pa.binary(), nullable=False),
    ]
)
_MANIFEST_SCHEMA: Final = pa.schema(
    [
        pa.field(_KEY_GROUP, pa.int32(), nullable=False),
        pa.field("versions", pa.list_(pa.field("item", pa.int64(), nullable=False))),
        pa.field("files", pa.list_(pa.field("item", pa.string(), nullable=False))),
        # the bytes of the key group's blob in each file (what the chain costs to read)
        pa.field("sizes", pa.list_(pa.field("item", pa.int64(), nullable=False))),
    ]
)

Chain = tuple[tuple[int, str, int], ...]
"""A key group's chain: ``(version, file, bytes)`` of its last full blob, then of its
deltas (bytes: the key group's blob in that file; 0 where a manifest of an earlier
release does not say)."""
Change = tuple[list[bytes] | None, bytes]
"""One key group's item in a file: (None, full blob) or (keys, delta blob)."""
_OPERATOR: Final = b"aops.operator"
ASYNC_WAIT: Final = b"async_wait"


@dataclass(frozen=True)
class Restored:
    """What the previous version hands this partition."""

    entries: tuple[SnapshotEntry, ...]
    watermarks: WatermarkState
    input_schema: pa.Schema | None


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
        array = coerced_array(values, type_)  # as the output does (see _coerce)
        if array is None:
            raise _explain(values, type_, what, exc) from exc
        return array


def _column(table: pa.Table, column: str, name: str) -> list[Any]:
    """A column of a checkpoint file as Python values; CheckpointError naming the file."""
    if column not in table.column_names:
        raise CheckpointError(f"checkpoint file {name} lacks the column {column!r}")
    return table.column(column).to_pylist()  # type: ignore[no-any-return]


def _blob_table(blob: bytes) -> pa.Table:
    return pa.table({_BLOB: pa.array([blob], pa.binary())})


def _key_group_file(table: pa.Table, name: str) -> dict[int, Change] | None:
    """``{key_group: (keys, blob)}`` of a partition's key-group file; None for a file of
    one blob (earlier releases). CheckpointError naming the file for anything else."""
    if _KEY_GROUP not in table.column_names:
        return None
    if table.schema == _KEY_GROUPS_SCHEMA:  # earlier releases: full blobs
        keys: list[Any] = [None] * table.num_rows
    elif table.schema.remove_metadata() == _CHANGES_SCHEMA:
        keys = table.column(_KEYS).to_pylist()
    else:
        raise CheckpointError(
            f"checkpoint file {name} has the columns {table.schema}, not {_CHANGES_SCHEMA}"
        )
    groups = table.column(_KEY_GROUP).to_pylist()
    blobs = table.column(_BLOB).to_pylist()
    held = {kg: (k, b) for kg, k, b in zip(groups, keys, blobs, strict=True)}
    if len(held) != len(groups):
        raise CheckpointError(f"checkpoint file {name} repeats a key group")
    return held


def _blob(table: pa.Table, name: str) -> bytes:
    values = _column(table, _BLOB, name)
    if len(values) != 1 or not isinstance(values[0], bytes):
        raise CheckpointError(f"checkpoint file {name} does not hold one state blob")
    return values[0]


# -- one version's state files, shared by the operators that keep state -------------------
@dataclass(frozen=True)
class VersionFiles:
    """The manifests of every partition that wrote one version (see the module docstring)."""

    storage: CheckpointStorage
    version: Version
    manifests: list[pa.Table]
    paths: list[str]

    def check_operator(self, operator: bytes) -> None:
        """CheckpointError naming the file if another kind of operator wrote this version."""
        for manifest, path in zip(self.manifests, self.paths, strict=True):
            wrote = (manifest.schema.metadata or {}).get(_OPERATOR, ASYNC_WAIT)
            if wrote != operator:
                raise CheckpointError(
                    f"checkpoint file {path} was written by {wrote.decode(errors='replace')}, "
                    f"not {operator.decode()}: give each operator its own uid or location"
                )

    def operator_blobs(self) -> list[bytes]:
        """Every old partition's operator-state blob, in partition order."""
        out = []
        for index in range(len(self.manifests)):
            name = f"ops-{index:05d}.ckpt"
            path = self.storage.path(self.version, name)
            out.append(_blob(self.storage.read(self.version, name), path))
        return out

    def chains(self, key_groups: KeyGroupRange, max_parallelism: int) -> dict[int, Chain]:
        """The chain of every key group in ``key_groups`` that holds state.

        Every manifest is checked whole first: a key group outside
        ``0 .. max_parallelism - 1`` (a version written with another max_parallelism,
        or a damaged manifest), or one named by two manifests, is a CheckpointError
        naming the file, since no partition would ever restore it.
        """
        seen: dict[int, str] = {}
        out: dict[int, Chain] = {}
        for manifest, path in zip(self.manifests, self.paths, strict=True):
            groups = _column(manifest, _KEY_GROUP, path)
            for kg in groups:
                if not 0 <= kg < max_parallelism:
                    raise CheckpointError(
                        f"checkpoint file {path} names key group {kg}, outside 0.."
                        f"{max_parallelism - 1} (max_parallelism={max_parallelism}): was the "
                        "version written with another max_parallelism?"
                    )
                if kg in seen:
                    raise CheckpointError(
                        f"checkpoint files {seen[kg]} and {path} both name key group {kg}"
                    )
                seen[kg] = path
            if "file" in manifest.column_names:  # earlier releases: one full file each
                assert isinstance(self.version, int)
                version = self.version
                chains: list[Chain] = [
                    ((version, f, 0),) for f in _column(manifest, "file", path)
                ]
            else:
                versions = _column(manifest, "versions", path)
                files = _column(manifest, "files", path)
                sizes = (
                    _column(manifest, "sizes", path)
                    if "sizes" in manifest.column_names
                    else [None] * len(groups)
                )
                chains = []
                for kg, vs, fs, ss in zip(groups, versions, files, sizes, strict=True):
                    ss = ss if ss is not None else [0] * len(vs or ())
                    if not vs or not fs or len(vs) != len(fs) or len(ss) != len(vs):
                        raise CheckpointError(
                            f"checkpoint file {path}: key group {kg} has no chain"
                        )
                    chains.append(tuple(zip(vs, fs, ss, strict=True)))
            for kg, chain in zip(groups, chains, strict=True):
                if kg in key_groups:
                    out[kg] = chain
        return out

    def key_group_blobs(
        self, key_groups: KeyGroupRange, max_parallelism: int
    ) -> list[tuple[str, int, bytes]]:
        """``(file, key group, blob)`` of the key groups in ``key_groups``, each a full blob
        (what the async operator writes); CheckpointError naming the file otherwise."""
        reader = ChainReader(self.storage)
        out = []
        for kg, chain in sorted(self.chains(key_groups, max_parallelism).items()):
            ((where, keys, blob),) = reader.read(kg, chain[-1:])
            if keys is not None or len(chain) != 1:
                raise CheckpointError(
                    f"checkpoint file {where}: key group {kg} is a delta, where a full "
                    "snapshot was expected"
                )
            out.append((where, kg, blob))
        return out


class ChainReader:
    """Reads key groups' chains; each file read once."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self._files: dict[tuple[int, str], tuple[dict[int, Change] | None, pa.Table]] = {}
        self.files_read = 0

    def read(self, kg: int, chain: Chain) -> list[tuple[str, list[bytes] | None, bytes]]:
        """``(path, keys, blob)`` of each item of ``kg``'s ``chain`` (or of a part of it);
        CheckpointError naming the file for one that is missing, damaged or lacks ``kg``."""
        out: list[tuple[str, list[bytes] | None, bytes]] = []
        for version, file, _ in chain:
            where = self.storage.path(version, file)
            cached = self._files.get((version, file))
            if cached is None:
                table = self.storage.read(version, file)
                self.files_read += 1
                cached = self._files[(version, file)] = (_key_group_file(table, where), table)
            held, table = cached
            if held is None:  # one key group per file (earlier releases)
                out.append((where, None, _blob(table, where)))
            elif kg in held:
                keys, blob = held[kg]
                out.append((where, keys, blob))
            else:
                raise CheckpointError(f"checkpoint file {where} lacks key group {kg}")
        return out


def read_version(storage: CheckpointStorage, version: Version) -> VersionFiles | None:
    """The manifests of ``version`` (None if it holds none); CheckpointError naming the
    missing ones if some partitions did not finish writing it."""
    names = storage.list_files(version, "subtask-")
    if not names:
        return None
    first = storage.read(version, names[0])
    first_path = storage.path(version, names[0])
    old_parallelism = _int(first.schema.metadata or {}, _NUM_PARTITIONS, first_path)
    expected = [f"subtask-{i:05d}.ckpt" for i in range(old_parallelism)]
    missing = sorted(set(expected) - set(names))
    if missing:
        raise CheckpointError(
            f"checkpoint version {version} of {storage.describe(storage.root)} "
            f"is incomplete: missing {[storage.path(version, m) for m in missing]}"
        )
    manifests = [first] + [storage.read(version, n) for n in expected[1:]]
    return VersionFiles(storage, version, manifests, [storage.path(version, n) for n in expected])


def read_previous(storage: CheckpointStorage, version: int) -> VersionFiles | None:
    """The version a streaming micro-batch ``version + 1`` restores: ``version``'s files.

    None only when the operator has no version yet (its first micro-batch, or an
    operator new to a running query). A ``version`` that holds files but no manifest
    (a committed micro-batch wrote one per partition: it was deleted), or that holds
    no manifest while an earlier one does (deleted, or written where this executor
    cannot see it) is a CheckpointError naming it: restoring an earlier one, or
    nothing, would drop the changes of the micro-batches after it without a word.
    """
    found = read_version(storage, version)
    if found is not None:
        return found
    held = storage.list_files(version)
    if held:  # files of a committed micro-batch, but no manifest: damaged, not "no state"
        raise CheckpointError(
            f"checkpoint version {version} of {storage.describe(storage.root)} holds files "
            f"({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) but no manifest "
            f"(subtask-*.ckpt) in {storage.path(version, '')}: it is damaged, and micro-batch "
            f"{version + 1} cannot start from it"
        )
    earlier = [v for v in storage.versions() if v < version]
    for older in sorted(earlier, reverse=True):
        if storage.list_files(older, "subtask-"):
            raise CheckpointError(
                f"checkpoint version {version} of {storage.describe(storage.root)} holds no "
                f"state ({storage.path(version, '')} is missing or empty) while version "
                f"{older} does: micro-batch {version + 1} cannot start from version {version}. "
                "Is checkpoint_location shared by every executor? To go back to version "
                f"{older} on purpose, also roll the query's own checkpoint back to its batch "
                f"{older + 1} (delete its offsets and commits from {older + 1} on)"
            )
    return None


def write_version(
    storage: CheckpointStorage,
    version: int,
    partition: int,
    num_partitions: int,
    keyed: bool,
    changes: dict[int, Change],
    operator_blob: bytes | None,
    meta: dict[bytes, bytes],
    operator: bytes = b"",
    chains: dict[int, Chain] | None = None,
    writer: str = "",
) -> dict[int, Chain]:
    """Write one partition's key-group file (a row per key group in ``changes``: full
    blobs, and deltas over the key group's chain in ``chains``, the previous version's),
    its operator state (if any: ``keyed_process`` keeps its watermark in the manifest's
    ``meta``), then its manifest (every key group's chain); returns the chains.

    A key group in ``chains`` but not in ``changes`` keeps its chain; a full blob starts
    a new one. ``writer``: the attempt's token, in the file's name and the manifest.
    """
    writer = writer or uuid.uuid4().hex[:12]
    new: dict[int, Chain] = dict(chains or {})
    if changes:
        name = f"kg-p{partition:05d}-{writer}.ckpt"
        groups = sorted(changes)
        for kg in groups:
            keys, blob = changes[kg]
            size = len(blob) + sum(len(k) for k in keys or ())
            if keys is None:
                new[kg] = ((version, name, size),)
            elif kg in new:
                new[kg] = new[kg] + ((version, name, size),)
            else:
                raise CheckpointError(f"key group {kg}: a delta without a full snapshot before it")
        table = pa.Table.from_arrays(
            [
                pa.array(groups, pa.int32()),
                pa.array([changes[kg][0] for kg in groups], _CHANGES_SCHEMA.field(_KEYS).type),
                pa.array([changes[kg][1] for kg in groups], pa.binary()),
            ],
            schema=_CHANGES_SCHEMA,
        )
        storage.write(version, name, table)
    if operator_blob is not None:  # keyed_process: its watermark is in the manifest
        storage.write(version, f"ops-{partition:05d}.ckpt", _blob_table(operator_blob))
    kgs = sorted(new)
    manifest = pa.Table.from_arrays(
        [
            pa.array(kgs, pa.int32()),
            pa.array([[c[0] for c in new[kg]] for kg in kgs], _MANIFEST_SCHEMA.field(1).type),
            pa.array([[c[1] for c in new[kg]] for kg in kgs], _MANIFEST_SCHEMA.field(2).type),
            pa.array([[c[2] for c in new[kg]] for kg in kgs], _MANIFEST_SCHEMA.field(3).type),
        ],
        schema=_MANIFEST_SCHEMA,
    ).replace_schema_metadata(
        {
            _KIND: b"manifest",
            _KEYED: b"1" if keyed else b"0",
            _NUM_PARTITIONS: str(num_partitions).encode(),
            _PARTITION: str(partition).encode(),
            _OPERATOR: operator or ASYNC_WAIT,
            _WRITER: writer.encode(),
            **meta,
        }
    )
    storage.write(version, f"subtask-{partition:05d}.ckpt", manifest)
    return new


def writer_of(manifest: pa.Table) -> str:
    """The token of the attempt that wrote ``manifest`` ("" for earlier releases)."""
    raw: bytes = (manifest.schema.metadata or {}).get(_WRITER, b"")
    return raw.decode(errors="replace")


def prune_versions(storage: CheckpointStorage, version: int, retain: int) -> None:
    """Delete the versions older than the newest ``retain`` that no retained version's
    chains name (partition 0 does it, after writing ``version``)."""
    oldest = version - retain + 1
    keep_from = oldest
    found = read_version(storage, oldest) if oldest >= 0 else None
    if found is not None:
        for manifest, path in zip(found.manifests, found.paths, strict=True):
            if "versions" in manifest.column_names:
                for vs in _column(manifest, "versions", path):
                    if vs:
                        keep_from = min(keep_from, min(vs))
    storage.delete_versions([v for v in storage.versions() if v < keep_from])


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
            max_parallelism=spec.max_parallelism,
            key_groups=compute_key_group_range_for_operator_index(
                spec.max_parallelism, num_partitions, self.partition
            ),
            state_backend=spec.state_backend,
        )

    def _check_manifests(
        self, manifests: list[pa.Table], paths: list[str], keyed: bool
    ) -> tuple[pa.Schema | None, str]:
        """The input schema and the element kind the old partitions wrote their elements
        with; CheckpointError naming the file for a manifest of another key mode, an
        unknown element kind, or a kind or schema other than the other manifests'."""
        schema: pa.Schema | None = None
        schema_path = ""
        kinds: dict[str, str] = {}
        for manifest, path in zip(manifests, paths, strict=True):
            meta = manifest.schema.metadata or {}
            if (meta.get(_KEYED) == b"1") != keyed:
                raise CheckpointError(
                    f"checkpoint file {path} was written "
                    f"{'with' if not keyed else 'without'} key=, and the operator now runs "
                    f"{'with' if keyed else 'without'} it: use another uid or location"
                )
            kind = meta.get(_ELEMENT, b"?").decode(errors="replace")
            if kind not in (ROW, ROWS, ARROW):
                raise CheckpointError(
                    f"checkpoint file {path} holds elements of an unknown kind {kind!r}"
                )
            kinds.setdefault(kind, path)
            if len(kinds) > 1:
                (a, path_a), (b, path_b) = kinds.items()
                raise CheckpointError(
                    f"checkpoint files {path_a} and {path_b} hold elements of different kinds "
                    f"({a!r} and {b!r})"
                )
            raw = meta.get(_INPUT_SCHEMA)
            if not raw:
                continue  # a partition that saw no input knows no schema, and wrote nothing
            try:
                found = pa.ipc.read_schema(pa.py_buffer(raw))
            except (pa.ArrowException, ValueError) as exc:
                raise CheckpointError(f"checkpoint file {path}: unreadable input schema") from exc
            if schema is None:
                schema, schema_path = found, path
            elif not found.equals(schema):
                raise CheckpointError(
                    f"checkpoint files {schema_path} and {path} were written with different "
                    f"input schemas ({schema} and {found})"
                )
        return schema, next(iter(kinds), self.kind)

    def _previous_files(self) -> VersionFiles | None:
        """The previous micro-batch's version (read once per partition)."""
        if self._previous_read is None:
            previous = self._previous()
            found = None if previous is None else read_previous(self.storage, previous)
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
        if len(found.manifests) == (self.task.num_partitions or 1):
            own = (found.manifests[self.partition].schema.metadata or {}).get(_LIMIT)
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
        keyed = bool(self.spec.key_columns)
        p_new = self.task.num_partitions or 1
        input_schema, kind = self._check_manifests(found.manifests, found.paths, keyed)
        carry = self._carry_over(input_schema, p_new, kind)
        where = self.storage.path(previous, "")
        ops_blobs = found.operator_blobs()
        names = [
            self.storage.path(previous, f"ops-{i:05d}.ckpt") for i in range(len(ops_blobs))
        ]
        watermarks, stored = carry.restore_operator(
            self.partition, p_new, ops_blobs, where, names
        )
        if keyed:
            stored = carry.restore_keyed(
                found.key_group_blobs(carry.key_groups, self.spec.max_parallelism)
            )
        if kind != self.kind:  # rows carried into chunks, or chunks into rows
            log.info(
                "partition %s: restoring %d element(s) of kind %r as %r",
                self.partition, len(stored), kind, self.kind,
            )  # fmt: skip
            stored = as_kind(stored, kind, self.kind)
        event_time = self.spec.event_time is not None
        entries = in_order(stored, self.kind, input_schema, self.spec.output_schema, event_time)
        current = watermarks.current
        if event_time and entries and current > max(s.after_watermark for s in stored):
            entries.append(SnapshotEntry(Watermark(current)))  # the watermark they were behind
        return Restored(tuple(entries), watermarks, input_schema)

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
        p = self.task.num_partitions or 1
        carry = self._carry_over(input_schema, p)
        keyed = bool(self.spec.key_columns)
        stored = to_stored(remaining, self.partition, self.kind)
        kg_blobs: dict[int, bytes] = {}
        if keyed:
            triples = [(key, _key_group(e.row, self.kind), e) for key, e in stored]
            kg_blobs = carry.snapshot_keyed(triples)
        op_blob = carry.snapshot_operator(
            self.partition, p, watermarks, None if keyed else [e for _, e in stored]
        )
        schema = b"" if input_schema is None else input_schema.serialize().to_pybytes()
        assert isinstance(self.version, int)
        write_version(
            self.storage, self.version, self.partition, p, keyed,
            {kg: (None, blob) for kg, blob in kg_blobs.items()}, op_blob,
            {_ELEMENT: self.kind.encode(), _INPUT_SCHEMA: schema,
             **({_LIMIT: str(limit).encode()} if limit is not None else {})},
        )  # fmt: skip
        if self.partition == 0 and isinstance(self.version, int):
            prune_versions(self.storage, self.version, self.spec.retain_versions)

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


def _key_group(row: Any, kind: str) -> int:
    """The element's key group (keyed: every row of a chunk is of one key group)."""
    first = row if kind == ROW else row[0] if row else None
    kg = first.get(KEY_GROUP_COLUMN) if first is not None else None
    if kg is None:
        raise CheckpointError(f"an in-flight row has no {KEY_GROUP_COLUMN} in keyed mode")
    return int(kg)
