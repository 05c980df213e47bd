"""The files of one streaming version of an operator's state, and retention.

Per version directory (see ``asyncio_ops._checkpoint`` for the framing; every
file one Arrow IPC table):

- ``kg-p<i>-<token>`` (keyed): partition i's key groups that changed in this
  version, a row each: the key group, ``keys`` and its sealed blob. ``keys``
  null: the blob is the key group's full state (keyed state and timers; for
  the async operator its in-flight elements as one record batch and their
  timeout timers, ``asyncio_ops._runtime._inflight``); otherwise a delta: the
  canonical bytes of the keys it replaces whole and their state and timers
  (``asyncio_ops.state._keyed_snapshot``). The token is the attempt's, so two
  attempts never write one name.
- ``ops-<i>`` (the async operator): partition i's sealed operator-state blob:
  the watermark state (union) and, unkeyed, its in-flight elements (even
  split). ``keyed_process`` writes its watermark state into its manifest
  instead (``aops.watermark``: one file and, for every partition, one read per
  old partition less; its ``ops-<i>`` files of earlier releases still read).
- ``subtask-<i>``: the manifest, written last: per key group of partition i
  its chain, the files (with their versions and bytes) that rebuild it: its
  last full blob and the deltas after it, in order; the number of partitions,
  and the attempt's token (``aops.writer``). A key group follows to whichever
  partition owns it next, which reads its chain. Manifests of earlier
  releases (a ``file`` per key group, a full blob; files of one key group
  each, ``kg-<kg>``) still read.

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
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from .._checkpoint import CheckpointStorage, Version
from .._exceptions import CheckpointError
from .._keygroups import KeyGroupRange

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


def _int(meta: dict[bytes, bytes], key: bytes, name: str) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {name} lacks a valid {key.decode()}") from exc


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

    def read(self, kg: int, chain: Chain) -> list[tuple[str, list[bytes] | None, bytes]]:
        """``(path, keys, blob)`` of each item of ``kg``'s ``chain`` (or of a part of it);
        CheckpointError naming the file for one that is missing, damaged or lacks ``kg``."""
        out: list[tuple[str, list[bytes] | None, bytes]] = []
        for version, file, _ in chain:
            where = self.storage.path(version, file)
            cached = self._files.get((version, file))
            if cached is None:
                table = self.storage.read(version, file)
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
