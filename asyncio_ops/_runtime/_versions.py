"""The files of one streaming version of an operator's state: one job, their names,
layout, writing and reading (which versions are deleted: ``_retention``).

Per version directory (every file one container, ``asyncio_ops._storage._container``):

- ``kg-p<i>-<token>-from<v>`` (keyed): partition i's key groups that changed
  in this version, one section each (tag: the key group); ``<v>``: the oldest
  version the partition's chains name once this version is written, which
  retention reads from a listing (``keyed_process`` writes the file, with no
  section, even when nothing changed; earlier releases: ``kg-p<i>-<token>``).
  ``keyed_process`` (kind ``KEY_GROUPS``): a key group's full state (part
  ``FULL``: keyed state and timers, a section of its own), and the deltas of
  all the others in ONE section (tag ``SHARED``, part ``DELTA``: the keys each
  replaces whole, with their state and timers, sorted by key group with it as
  a column, ``asyncio_ops.state._keyed_snapshot``; earlier releases wrote a
  delta section per key group, still read). The async operator (kind
  ``IN_FLIGHT``, manifests marked ``aops.in_flight``): ONE section for all its
  key groups (tag ``SHARED``), the carried-over elements as one table in queue
  order with their key group as a column (earlier releases: sorted by key
  group), which the manifest names for each of them;
  a reader (a restore, ``read_state``) reads it once, whole, and keeps the rows
  of its key groups (:meth:`VersionFiles.element_sections`;
  ``asyncio_ops._runtime._inflight``; earlier releases wrote a section per key
  group, or a key group's elements as keyed state, kind ``KEY_GROUPS``, and
  are still read). The
  token is the attempt's, so two attempts never write one name.
- ``ops-p<i>-<token>`` (the async operator, unkeyed, kind ``OPERATOR_STATE``):
  partition i's operator state, its in-flight elements (even split); the
  manifest names it (``aops.ops``). Both operators keep the partition's
  watermark state in its manifest (``aops.watermark``); the async operator's
  earlier releases kept it in this file (union state ``watermark``), and
  wrote one keyed too.
- ``subtask-<i>`` (kind ``MANIFEST``): the manifest, written last (the
  partition's commit record: its data files are attempt-unique and only the
  manifest names them, so of two attempts that both finish, the one whose
  manifest was written last is in force, whole): per key
  group of partition i its chain, where the sections that rebuild it are:
  ``(version, file, offset, length, size)`` of its last full section and of
  the deltas after it, in order: the frame holding it and the section's own
  bytes (Flink's key-group offsets: a partition reads the frames of its key
  groups, adjacent ones in one read), stored as a row per section named, in
  version order, with the key groups whose chains name it and each one's size
  (a SHARED delta is one row, not a link in every key group's chain; earlier
  releases wrote a row per key group, still read); the number of
  partitions, the operator that wrote it (``aops.operator``) and the attempt's
  token (``aops.writer``); the async operator's also the element kind and the
  input and output schemas of its elements (``aops.element``,
  ``aops.input_schema``, ``aops.output_schema``; earlier releases wrote no
  output schema, which a restore takes from the job and ``read_state``
  cannot). A key group follows to whichever partition owns it next, which
  reads its chain. The manifests of the versions a version's chains name
  (:func:`chain_manifests`) say what their sections were written with
  (``keyed_process``: the state types, read by the driver's check of a restart).

Incremental checkpoints (keyed_process): a version writes, per key group,
the keys its micro-batch made current (a delta) and, when it has no chain
yet, when its chain's deltas hold as many bytes as its full section, or at
its turn, its full state instead (:func:`full_due`). Its turn: the versions
where ``(version + kg) % interval == 0`` (``full_snapshot_interval``,
staggered by key group), once its chain started at least ``interval // 2``
versions before (a turn that comes sooner is skipped: a bulk micro-batch
writes every key group in full, and the turns after it would rewrite half
the state within ``interval / 2`` versions). So a micro-batch writes what it
touched plus ``1/interval`` of the state, a chain holds ``interval``
sections once past its first turn and at most ``interval + interval // 2``,
and reading one costs at most about twice its full section. Retention (which
versions partition 0 deletes): ``asyncio_ops._runtime._retention``. Key-group
files a worker writes to a remote location are also kept on its local disk
(``asyncio_ops._storage._local_copies``), and a restore's reads of chains prefer those
copies.

Reads: a restore's reads are independent (the manifests of a version after
partition 0's, the files of a chain), and on an object store each waits a
round trip or two (20-50 ms). On a remote filesystem (anything but local
disk) they run up to ``READ_CONCURRENCY`` at once, on threads (pyarrow's I/O
releases the GIL); on local disk one after the other (threads would cost
more than they save). Results keep their order and the first failure, in
that order, is raised (the reads not yet started are cancelled). What a read
returns is the file's frames, checked but not parsed: a restore parses them one
at a time, files in version order, and applies each key group's link before the
next frame (:func:`apply_chains`), so it never holds the state decoded whole; a
full snapshot is written the same way round, a key group at a time
(:func:`write_version`'s ``full``).
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from .._exceptions import CheckpointError, CorruptCheckpointError, CorruptStateError
from .._keygroups import KeyGroupRange, compute_key_group_range_for_operator_index
from .._storage._checkpoint_storage import CheckpointStorage, Version
from .._storage._container import (
    DELTA,
    FULL,
    KEY_GROUP_FIELD,
    SHARED,
    Frame,
    Kind,
    Section,
    frame_sections,
)
from .._storage._container import split_shared as _split_shared
from ..state._payloads import read, table

READ_CONCURRENCY: Final = 8
"""Reads of one restore in flight at once (module docstring, "Reads")."""

_KIND: Final = b"aops.kind"
_KEYED: Final = b"aops.keyed"
_NUM_PARTITIONS: Final = b"aops.num_partitions"
_PARTITION: Final = b"aops.partition"
_ELEMENT: Final = b"aops.element"
_INPUT_SCHEMA: Final = b"aops.input_schema"
# the schema of the operator's output rows (a completed element's results): read_state reads
# the elements with it (a restore has the job's own; earlier manifests lack it)
OUTPUT_SCHEMA: Final = b"aops.output_schema"
# capacity="auto": the limit a partition's operator ended the micro-batch with
_LIMIT: Final = b"aops.limit"
# the attempt that wrote a manifest (a warm worker proves with it what it holds)
_WRITER: Final = b"aops.writer"
# the partition's operator state file, attempt-unique as its key-group file (earlier
# manifests lack it: ops-<i>.ckpt)
_OPS: Final = b"aops.ops"
# the async operator's key-group file is one table of elements (kind IN_FLIGHT); earlier
# manifests lack it: keyed state and timers per key group (kind KEY_GROUPS)
IN_FLIGHT: Final = b"aops.in_flight"
_KEY_GROUP: Final = "key_group"


_T = TypeVar("_T")
_R = TypeVar("_R")


def concurrently(
    storage: CheckpointStorage, read: Callable[[_T], _R], items: Sequence[_T]
) -> list[_R]:
    """``[read(item) for item in items]``, up to ``READ_CONCURRENCY`` at once when
    ``storage`` is remote (module docstring, "Reads")."""
    if len(items) <= 1 or not storage.remote:
        return [read(item) for item in items]
    pool = ThreadPoolExecutor(min(len(items), READ_CONCURRENCY), thread_name_prefix="aops-read")
    try:
        return list(pool.map(read, items))
    finally:  # on a failure the reads not started are dropped; those running finish
        pool.shutdown(wait=True, cancel_futures=True)


def manifest_name(partition: int) -> str:
    """The file name of partition ``partition``'s manifest of a version."""
    return f"subtask-{partition:05d}.ckpt"


def key_group_prefix(partition: int) -> str:
    """How the names of partition ``partition``'s key-group files start (``kg-p<i>-``)."""
    return f"kg-p{partition:05d}-"


_WRITTEN_BY: Final = re.compile(r"^kg-p(\d+)-")


def written_by(file: str) -> int | None:
    """The partition whose key-group file ``file`` is (its name says: ``kg-p<i>-``)."""
    m = _WRITTEN_BY.match(file)
    return int(m[1]) if m else None


def _list(name: str, item: pa.DataType) -> pa.Field:
    return pa.field(name, pa.list_(pa.field("item", item, nullable=False)), nullable=False)


_MANIFEST_SCHEMA: Final = pa.schema(
    [  # a row per section some key group's chain names, in version order
        pa.field("version", pa.int64(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),  # where its frame starts in the file
        pa.field("length", pa.int64(), nullable=False),  # the bytes read to reach it
        _list("key_groups", pa.int32()),  # the key groups whose chains name it
        _list("sizes", pa.int64()),  # each one's bytes, uncompressed (see Link)
    ]
)
# earlier releases: a row per key group, its chain as lists (still read): each delta
# section repeated in every key group's lists, so a manifest grew with the key groups
# times their chains' length (chains of 50 links, 64 key groups: 5.0 KB, the same chains
# a row per section 2.8 KB)
_PER_KEY_GROUP_SCHEMA: Final = pa.schema(
    [
        pa.field(_KEY_GROUP, pa.int32(), nullable=False),
        _list("versions", pa.int64()),
        _list("files", pa.string()),
        _list("offsets", pa.int64()),
        _list("lengths", pa.int64()),
        _list("sizes", pa.int64()),
    ]
)

Link = tuple[int, str, int, int, int]
"""One section of a key group's chain: ``(version, file, offset, length, size)``: where
its frame is, and bytes (uncompressed): a full section's own; the chain's first delta
carries the bytes of all its deltas, the others 0 (all the full-snapshot rule reads is
the sum, and a manifest rewrites every chain each version: a size per delta was most of
a manifest's bytes; earlier releases wrote each delta's own, which sum the same)."""
Chain = tuple[Link, ...]
"""A key group's chain: its last full section, then its deltas."""


def _manifest_chains(manifest: pa.Table, path: str) -> list[tuple[int, Chain]]:
    """Every ``(key group, chain)`` a manifest names, of either layout (a row per
    section, or earlier releases' row per key group); CheckpointError naming ``path``
    for a manifest of neither, or a chain out of version order or empty."""
    names, types = manifest.schema.names, manifest.schema.types
    if names == _PER_KEY_GROUP_SCHEMA.names and types == _PER_KEY_GROUP_SCHEMA.types:
        out: list[tuple[int, Chain]] = []
        groups = manifest.column(_KEY_GROUP).to_pylist()
        columns = ("versions", "files", "offsets", "lengths", "sizes")
        links = zip(*(manifest.column(c).to_pylist() for c in columns), strict=True)
        for kg, (vs, fs, offs, lens, sizes) in zip(groups, links, strict=True):
            if not vs or not len(vs) == len(fs) == len(offs) == len(lens) == len(sizes):
                raise CheckpointError(f"checkpoint file {path}: key group {kg} has no chain")
            out.append((kg, tuple(zip(vs, fs, offs, lens, sizes, strict=True))))
        return out
    if names != _MANIFEST_SCHEMA.names or types != _MANIFEST_SCHEMA.types:
        raise CheckpointError(
            f"checkpoint file {path} has the columns {names}, not {_MANIFEST_SCHEMA.names}"
        )
    chains: dict[int, list[Link]] = {}
    rows = zip(*(manifest.column(c).to_pylist() for c in _MANIFEST_SCHEMA.names), strict=True)
    for version, file, offset, length, kgs, sizes in rows:
        if len(kgs) != len(sizes):
            raise CheckpointError(
                f"checkpoint file {path}: the section of {file} at {offset} names "
                f"{len(kgs)} key groups and {len(sizes)} sizes"
            )
        for kg, size in zip(kgs, sizes, strict=True):
            chain = chains.setdefault(kg, [])
            if chain and chain[-1][0] >= version:
                raise CheckpointError(
                    f"checkpoint file {path}: key group {kg}'s chain names version {version} "
                    f"after {chain[-1][0]}"
                )
            chain.append((version, file, offset, length, size))
    return [(kg, tuple(chain)) for kg, chain in chains.items()]


def extends(chain: Chain, held: Chain) -> bool:
    """Whether ``chain`` is ``held`` with deltas after it (the same sections, wherever
    its bytes are counted: see :data:`Link`)."""
    return len(chain) >= len(held) and all(
        a[:4] == b[:4] for a, b in zip(chain, held, strict=False)
    )


def full_due(chain: Chain, kg: int, version: int, interval: int) -> bool:
    """Whether key group ``kg``, whose chain is ``chain`` (non-empty), writes its full
    state at ``version`` (module docstring, "Incremental checkpoints"): at its turn,
    ``(version + kg) % interval == 0``, if the chain started ``interval // 2`` or more
    versions before; once the chain holds ``interval + interval // 2`` sections (turns
    alone never let it grow so long: this bounds a chain written under a larger
    ``interval``, which a restarted query may have lowered); or once its deltas hold as
    many bytes as its full section."""
    turn = (version + kg) % interval == 0 and version - chain[0][0] >= interval // 2
    return (
        turn or len(chain) >= interval + interval // 2
        or sum(link[4] for link in chain[1:]) >= chain[0][4] > 0
    )  # fmt: skip


def _extended(chain: Chain, link: Link, part: int) -> Chain:
    """``chain`` with ``link`` after it (a full section: the chain it starts), the deltas'
    bytes carried by the first delta (see :data:`Link`)."""
    if part == FULL:
        return (link,)
    if len(chain) < 2:
        return (*chain, link)
    version, file, offset, length, size = chain[1]
    first = (version, file, offset, length, size + link[4])
    return (chain[0], first, *chain[2:], (*link[:4], 0))


_OPERATOR: Final = b"aops.operator"
ASYNC_WAIT: Final = b"async_wait"
# the streaming query that wrote a version (its sql.streaming.queryId)
_QUERY: Final = b"aops.query"


def query_of(manifest: pa.Table) -> str | None:
    """The streaming query a manifest says wrote it (None: not recorded)."""
    raw = (manifest.schema.metadata or {}).get(_QUERY)
    return raw.decode() if raw else None


def _int(meta: dict[bytes, bytes], key: bytes, name: str) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {name} lacks a valid {key.decode()}") from exc


# -- one version's state files, shared by the operators that keep state -------------------
@dataclass(frozen=True)
class VersionFiles:
    """The manifests of the partitions that wrote one version (see the module docstring):
    of all of them, or of those a reader needed (``read_version``'s ``key_groups``);
    ``partitions`` names which, in the order of ``manifests``."""

    storage: CheckpointStorage
    version: Version
    manifests: list[pa.Table]
    paths: list[str]
    partitions: list[int]
    num_partitions: int

    def manifest_of(self, partition: int) -> pa.Table | None:
        """The manifest partition ``partition`` wrote, if it was read."""
        try:
            return self.manifests[self.partitions.index(partition)]
        except ValueError:
            return None

    def written_by(self) -> bytes:
        """The operator that wrote this version, as its first manifest names it
        (:meth:`check_operator` holds every manifest to it)."""
        wrote: bytes = (self.manifests[0].schema.metadata or {}).get(_OPERATOR, ASYNC_WAIT)
        return wrote

    def query(self) -> str | None:
        """The streaming query that wrote this version (None: not recorded)."""
        return query_of(self.manifests[0])

    def check_operator(self, operator: bytes) -> None:
        """CheckpointError naming the file if another kind of operator wrote this version."""
        for manifest, path in zip(self.manifests, self.paths, strict=True):
            wrote = (manifest.schema.metadata or {}).get(_OPERATOR, ASYNC_WAIT)
            if wrote != operator:
                raise CheckpointError(
                    f"checkpoint file {path} was written by {wrote.decode(errors='replace')}, "
                    f"not {operator.decode()}: give each operator its own uid or location"
                )

    def operator_states(self) -> list[tuple[str, list[Any]]]:
        """Every old partition's operator state (``OperatorStateBackend.dump``), with its
        file, in partition order."""
        return [self.operator_state(index) for index in range(self.num_partitions)]

    def operator_state(self, index: int) -> tuple[str, list[Any]]:
        """Old partition ``index``'s operator state, with its file: the one its manifest
        names (if read), else ``ops-<index>.ckpt`` (earlier releases)."""
        manifest = self.manifest_of(index)
        raw = (manifest.schema.metadata or {}).get(_OPS) if manifest is not None else None
        name = raw.decode(errors="replace") if raw else f"ops-{index:05d}.ckpt"
        path = self.storage.path(self.version, name)
        table = self.storage.read(self.version, name, Kind.OPERATOR_STATE)
        try:
            return path, read(Kind.OPERATOR_STATE, table, f"checkpoint file {path}")
        except CorruptStateError as exc:
            raise CorruptCheckpointError(str(exc)) from exc

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
            for kg, chain in _manifest_chains(manifest, path):
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
                if kg in key_groups:
                    out[kg] = chain
        return out

    def key_group_sections(
        self, key_groups: KeyGroupRange, max_parallelism: int
    ) -> list[tuple[str, Section]]:
        """``(file, section)`` of the key groups in ``key_groups``, each a full section
        (the async operator's carry-over as earlier releases wrote it, keyed state of kind
        ``KEY_GROUPS``; its tables of elements: :meth:`element_sections`); CheckpointError
        naming the file otherwise."""
        read = read_chains(self.storage, self._whole(key_groups, max_parallelism))
        return [read[kg][0] for kg in sorted(read)]

    def _whole(self, key_groups: KeyGroupRange, max_parallelism: int) -> dict[int, Chain]:
        """The chains of ``key_groups`` (:meth:`chains`), each one full section (what the
        async operator writes); CheckpointError naming the file otherwise."""
        chains = self.chains(key_groups, max_parallelism)
        for kg, chain in chains.items():
            if len(chain) != 1:
                where = self.storage.path(chain[-1][0], chain[-1][1])
                raise CheckpointError(
                    f"checkpoint file {where}: key group {kg} has a chain of deltas, where "
                    "one full section was expected"
                )
        return chains

    def element_sections(
        self, key_groups: KeyGroupRange, max_parallelism: int
    ) -> list[tuple[str, Section]]:
        """``(file, section)`` of every section holding elements of the key groups in
        ``key_groups`` (the async operator's, kind ``IN_FLIGHT``), each read once and
        whole: a SHARED section is not split, and may hold rows of key groups outside
        ``key_groups`` (the reader keeps its own: ``CarryOver.restore_keyed``).
        CheckpointError naming the file for a chain that is not one full section, a
        file that lacks a key group where the manifest says it is, or one holding a key
        group of ``key_groups`` the manifest does not name there (whose rows the reader
        would take twice, or from a file not in force)."""
        chains = self._whole(key_groups, max_parallelism)
        named: dict[tuple[int, str], set[int]] = {}
        for kg, ((version, file, *_),) in chains.items():
            named.setdefault((version, file), set()).add(kg)
        out: list[tuple[str, Section]] = []
        for (version, file), got in _read_files(self.storage, chains, Kind.IN_FLIGHT).items():
            path = self.storage.path(version, file)
            held: set[int] = set()
            for section in _parsed(got, path):
                if section.part != FULL:
                    raise CorruptCheckpointError(
                        f"checkpoint file {path}: in-flight elements in a delta section"
                    )
                if section.tag != SHARED:
                    held.add(section.tag)
                elif (i := section.table.schema.get_field_index(KEY_GROUP_FIELD)) >= 0:
                    held.update(pc.unique(section.table.column(i)).to_pylist())
                out.append((path, section))
            mine = named[(version, file)]
            if missing := sorted(mine - held):
                raise CorruptCheckpointError(
                    f"checkpoint file {path} lacks key group {missing[0]} where the manifest "
                    "says it is"
                )
            if extra := sorted(kg for kg in held - mine if kg in key_groups):
                raise CorruptCheckpointError(
                    f"checkpoint file {path} holds key group {extra[0]}, which the manifest "
                    "does not name there"
                )
        return out


def _read_files(
    storage: CheckpointStorage, chains: dict[int, Chain], kind: Kind, keep: str = ""
) -> dict[tuple[int, str], list[Frame]]:
    """The frames of every file ``chains`` name, verified but not parsed (``_parsed``),
    per ``(version, file)``: per file one read of each run of adjacent sections, or its
    local copy (``keep`` as in :func:`read_chains`)."""
    wanted: dict[tuple[int, str], set[tuple[int, int]]] = {}
    for chain in chains.values():
        for version, file, offset, length, _ in chain:
            wanted.setdefault((version, file), set()).add((offset, length))
    reads: list[tuple[int, str, list[tuple[int, int]]]] = []
    for (version, file), extents in wanted.items():
        runs: list[list[int]] = []
        for offset, length in sorted(extents):
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1][1] += length
            else:
                runs.append([offset, length])
        reads.append((version, file, [(o, n) for o, n in runs]))
    local = kind == Kind.KEY_GROUPS  # keyed_process's chains: a local copy may hold them
    got = concurrently(
        storage,
        lambda r: storage.read_frames(
            r[0], r[1], kind, r[2], local, keep=local and bool(keep) and r[1].startswith(keep)
        ),
        reads,
    )
    return {(r[0], r[1]): frames for r, frames in zip(reads, got, strict=True)}


def _parsed(frames: list[Frame], path: str) -> Iterator[Section]:
    """The sections of verified frames, parsed one frame at a time."""
    for frame in frames:
        yield from frame_sections(frame, f"checkpoint file {path}", CorruptCheckpointError)


def read_chains(
    storage: CheckpointStorage,
    chains: dict[int, Chain],
    tails: Collection[int] = (),
    keep: str = "",
) -> dict[int, list[tuple[str, Section]]]:
    """``(path, section)`` of every link of ``chains``, in chain order, each verified
    (containers of kind ``KEY_GROUPS``); per file one read of each run of adjacent sections, or
    its local copy. ``keep``: files whose names start with it that are read from a
    remote store are read whole and kept as local copies (a partition's own files).
    ``tails``: the key groups whose given chain is the part after a full section
    (deltas only). CheckpointError naming the file for one that is missing or damaged,
    or whose section is not the chain's: another key group, or a delta where the chain
    starts (or a full one after)."""
    out: dict[int, list[tuple[str, Section]]] = {kg: [] for kg in chains}
    for path, section in _links(storage, chains, tails, keep):
        out[section.tag].append((path, section))
    return out


def _links(
    storage: CheckpointStorage, chains: dict[int, Chain], tails: Collection[int], keep: str
) -> Iterator[tuple[str, Section]]:
    """``(path, section)`` of every link of ``chains`` (:func:`read_chains`), the files
    read at once and their frames verified, then parsed one at a time, files in version
    order (so each key group's links come in chain order): what a caller does with a
    link before it takes the next is done before the next frame is parsed. The checks
    are made as the frames are parsed; a link its file lacks is named at the end."""
    links: dict[tuple[int, str, int], int] = {}
    for kg, chain in chains.items():
        for i, (version, file, *_) in enumerate(chain):
            if i and version <= chain[i - 1][0]:
                raise CorruptCheckpointError(
                    f"checkpoint file {storage.path(version, file)}: key group {kg}'s chain "
                    "is not in version order"
                )
            links[(version, file, kg)] = i
    read = _read_files(storage, chains, Kind.KEY_GROUPS, keep)
    for version, file in sorted(read):
        path = storage.path(version, file)
        for got in _parsed(read.pop((version, file)), path):  # its bytes go with it
            for one in split_shared(got, path) if got.tag == SHARED else (got,):
                i = links.pop((version, file, one.tag), -1)
                if i < 0:
                    continue  # a key group restored from another file, or not here
                if one.part != (FULL if i == 0 and one.tag not in tails else DELTA):
                    raise CorruptCheckpointError(
                        f"checkpoint file {path}: key group {one.tag}'s chain "
                        + ("starts with a delta, not a full snapshot" if i == 0 else
                           "holds a full snapshot after its first")
                    )  # fmt: skip
                yield path, one
    if links:
        version, file, kg = min(links, key=lambda link: (link[2], links[link]))
        raise CorruptCheckpointError(
            f"checkpoint file {storage.path(version, file)} lacks key group {kg} where the "
            "manifest says it is"
        )


def split_shared(section: Section, path: str) -> list[Section]:
    """The key groups of a SHARED section, a section each (``_container.split_shared``);
    CorruptCheckpointError naming the file if it is not such a section."""
    return _split_shared(section, f"checkpoint file {path}", CorruptCheckpointError)


def apply_chains(
    storage: CheckpointStorage,
    chains: dict[int, Chain],
    apply: Callable[[Section, str], None],
    tails: Collection[int] = (),
    keep: str = "",
) -> None:
    """Read ``chains`` (``keep`` as in :func:`read_chains`) and hand every link to
    ``apply(section, where)``, each key group's in chain order, as its frame is parsed
    (``_links``): a restore holds the files' stored bytes and one frame's tables, never
    the state decoded whole. A ValueError or TypeError ``apply`` raises becomes a
    CheckpointError naming the file. The checks are :func:`read_chains`'s, made as the
    frames are parsed: what an error stops was partly applied (a failed restore fails
    its task, whose backend is dropped)."""
    for path, section in _links(storage, chains, tails, keep):
        where = f"checkpoint file {path}"
        try:
            apply(section, where)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{where}: {exc}") from exc


def read_version(
    storage: CheckpointStorage,
    version: Version,
    key_groups: tuple[KeyGroupRange, int] | None = None,
    guess: int | None = None,
) -> VersionFiles | None:
    """The manifests of ``version`` (None if it holds none); CheckpointError naming the
    missing ones if some partitions did not finish writing it.

    Partition 0's manifest is read first, without listing the version: it says how
    many partitions wrote the version (the last run of a micro-batch wrote it, where
    an earlier failed run with more partitions may have left manifests of partitions
    the last did not have); the version is listed only when it is missing. Every
    other manifest read must exist (CheckpointError naming it). ``key_groups``:
    ``(range, max_parallelism)``: read only the manifests of the partitions that owned
    key groups of ``range`` besides (one more at the same number of partitions, a few
    after a rescale), not every partition's: a reader's requests then do not grow with
    the number of partitions. ``guess``: how many partitions the reader expects wrote
    the version (its own number): the manifests it would then need are read together
    with partition 0's, and used only if partition 0's says the guess was right (else
    dropped, and the right ones read).
    """
    guessed = _needed(guess, key_groups)[1:] if guess is not None and guess > 1 else []
    early = concurrently(
        storage,
        lambda i: storage.read_if_present(version, manifest_name(i), Kind.MANIFEST),
        [0, *guessed],
    )
    expected = ["subtask-00000.ckpt"]
    first = early[0]
    if first is None:
        names = storage.list_files(version, "subtask-")
        if not names:
            return None
        raise CheckpointError(
            f"checkpoint version {version} of {storage.describe(storage.root)} "
            f"is incomplete: missing {storage.path(version, expected[0])}"
        )
    first_path = storage.path(version, expected[0])
    old_parallelism = _int(first.schema.metadata or {}, _NUM_PARTITIONS, first_path)
    expected = [manifest_name(i) for i in range(old_parallelism)]
    if key_groups is not None and old_parallelism > key_groups[1]:
        raise CheckpointError(
            f"checkpoint file {first_path}: written by {old_parallelism} partitions, more "
            f"than max_parallelism={key_groups[1]}: was the version written with "
            "another max_parallelism?"
        )
    partitions = _needed(old_parallelism, key_groups)
    manifests = [first]
    if old_parallelism == guess:
        others = early[1:]
    else:
        others = concurrently(
            storage,
            lambda i: storage.read_if_present(version, expected[i], Kind.MANIFEST),
            partitions[1:],
        )
    for i, manifest in zip(partitions[1:], others, strict=True):
        if manifest is None:
            raise CheckpointError(
                f"checkpoint version {version} of {storage.describe(storage.root)} "
                f"is incomplete: missing {storage.path(version, expected[i])}"
            )
        manifests.append(manifest)
    paths = [storage.path(version, expected[i]) for i in partitions]
    return VersionFiles(storage, version, manifests, paths, partitions, old_parallelism)


def _needed(partitions: int, key_groups: tuple[KeyGroupRange, int] | None) -> list[int]:
    """The partitions of a version written by ``partitions`` whose manifests a reader of
    ``key_groups`` needs: 0 and the owners of any of them (all, for None)."""
    if key_groups is None:
        return list(range(partitions))
    wanted, max_parallelism = key_groups
    return [0] + [
        i for i in range(1, partitions)
        if compute_key_group_range_for_operator_index(max_parallelism, partitions, i)
        .intersection(wanted)
    ]  # fmt: skip


def chain_manifests(
    found: VersionFiles, chains: Iterable[Chain]
) -> list[tuple[int, str, pa.Table | None]]:
    """The manifests that wrote the links of ``chains`` (``found``'s) older than ``found``:
    for each such link, the manifest of its version by the partition whose key-group file
    it names (:func:`written_by`), each read once (together on a remote store), in
    ``(version, partition)`` order: ``(version, path, manifest)``, the manifest None when
    it is no longer there (each partition deletes its manifest of a version no longer
    restored while the files its successors' chains name stay, not on an object store:
    ``_retention``). Each records the state types its version was written with, so these
    are every type the sections ``chains`` restore hold, from their manifests alone."""
    storage = found.storage
    wanted = sorted(
        {
            (link[0], partition)
            for chain in chains
            for link in chain
            if link[0] != found.version and (partition := written_by(link[1])) is not None
        }
    )
    got = concurrently(
        storage,
        lambda vp: storage.read_if_present(vp[0], manifest_name(vp[1]), Kind.MANIFEST),
        wanted,
    )
    return [
        (version, storage.path(version, manifest_name(partition)), manifest)
        for (version, partition), manifest in zip(wanted, got, strict=True)
    ]


def read_previous(
    storage: CheckpointStorage,
    version: int,
    key_groups: tuple[KeyGroupRange, int] | None = None,
    guess: int | None = None,
) -> VersionFiles | None:
    """The version a streaming micro-batch ``version + 1`` restores: ``version``'s files
    (the manifests ``read_version`` reads for ``key_groups``, ``guess`` as there).

    None only when the operator has no version yet (its first micro-batch, or an
    operator new to a running query). A ``version`` that holds files but no manifest
    (a committed micro-batch wrote one per partition: it was deleted), or that holds
    no manifest while an earlier one does (deleted, or written where this executor
    cannot see it) is a CheckpointError naming it: restoring an earlier one, or
    nothing, would drop the changes of the micro-batches after it without a word.
    """
    found = read_version(storage, version, key_groups, guess)
    if found is not None:
        return found
    held = storage.list_files(version)
    if held:  # files of a committed micro-batch, but no manifest: damaged, not "no state"
        raise CheckpointError(
            f"checkpoint version {version} of {storage.describe(storage.root)} holds files "
            f"({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}) but no manifest "
            f"(subtask-*.ckpt) in {storage.path(version, '')}: it is damaged, or older than "
            "the versions retained (retain_versions: their manifests are deleted, their files "
            f"stay while later versions name them), and micro-batch {version + 1} cannot "
            "start from it"
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
    sections: dict[int, Section],
    operator_state: list[Any] | None,
    meta: dict[bytes, bytes],
    operator: bytes = b"",
    chains: dict[int, Chain] | None = None,
    writer: str = "",
    kind: Kind = Kind.KEY_GROUPS,
    full: Iterable[Section] = (),
    query: str | None = None,
) -> dict[int, Chain]:
    """Write one partition's key-group file (a container of ``kind``, a section per key
    group in ``sections``: full ones, and deltas over the key group's chain in
    ``chains``, the previous version's; a SHARED section given for several key
    groups, the same object, is written once: kind ``IN_FLIGHT``), its operator
    state (if any,
    ``OperatorStateBackend.dump``: ``keyed_process`` keeps its watermark in the
    manifest's ``meta``), then its manifest (every key group's chain); returns the
    chains.

    A key group in ``chains`` but not in ``sections`` keeps its chain; a full section
    starts a new one. ``full``: more full sections, each tagged with its key group
    (none of ``sections``), taken one at a time as the file is written (first, in
    their order): a generator's are never all in memory (``Changes.full``). A key
    group of neither keeps its chain. ``writer``: the attempt's token, in the
    file's name and the manifest; ``query``: the streaming query's id, in the
    manifest (``_claim``).
    """
    writer = writer or uuid.uuid4().hex[:12]
    new: dict[int, Chain] = dict(chains or {})
    groups = sorted(sections)
    for kg in groups:
        section = sections[kg]
        if section.tag not in (kg, SHARED):
            raise CheckpointError(f"key group {kg}: a section tagged {section.tag}")
        if section.part == DELTA and kg not in new:
            raise CheckpointError(f"key group {kg}: a delta without a full snapshot before it")
    # keyed_process's chains span versions: its key-group file is written even when
    # nothing changed (its name carries the oldest version the manifest's chains name,
    # which retention lists, _retention), and kept as a local copy (_local_copies)
    chained = kind == Kind.KEY_GROUPS
    taken: list[int] = []  # the key groups of ``full``, as they are written
    fulls = noted_full(full, sections, taken)
    first = next(fulls, None)
    if sections or chained or first is not None:
        # a full section starts at this version, the newest: it never lowers the floor
        starts = [version if sections[kg].part == FULL else new[kg][0][0] for kg in groups]
        starts += [chain[0][0] for kg, chain in new.items() if kg not in sections]
        floor = min(starts, default=version)
        name = f"{key_group_prefix(partition)}{writer}-from{floor:010d}.ckpt"
        written = {id(sections[kg]): sections[kg] for kg in groups}  # a shared one once
        places = storage.write_sections(
            version, name, kind,
            itertools.chain([] if first is None else [first], fulls, written.values()),
            local=chained and (bool(groups) or first is not None), thorough=chained,
        )  # fmt: skip
        for kg, (offset, length, size) in zip(taken, places[: len(taken)], strict=True):
            new[kg] = _extended((), (version, name, offset, length, size), FULL)
        extents = dict(zip(written, places[len(taken) :], strict=True))
        shares = {
            key: _shares(section, extents[key][2])
            for key, section in written.items() if section.tag == SHARED
        }  # fmt: skip
        for kg in groups:
            section = sections[kg]
            offset, length, size = extents[id(section)]
            if section.tag == SHARED:
                size = shares[id(section)].get(kg, 0)
            new[kg] = _extended(new.get(kg, ()), (version, name, offset, length, size),
                                sections[kg].part)  # fmt: skip
    named: dict[bytes, bytes] = {}
    if operator_state is not None:  # keyed_process: its watermark is in the manifest
        ops = f"ops-p{partition:05d}-{writer}.ckpt"
        storage.write(version, ops, Kind.OPERATOR_STATE, table(Kind.OPERATOR_STATE, operator_state))
        named[_OPS] = ops.encode()
    manifest = _manifest_table(new).replace_schema_metadata(
        {
            _KIND: b"manifest",
            _KEYED: b"1" if keyed else b"0",
            _NUM_PARTITIONS: str(num_partitions).encode(),
            _PARTITION: str(partition).encode(),
            _OPERATOR: operator or ASYNC_WAIT,
            _WRITER: writer.encode(),
            **({_QUERY: query.encode()} if query else {}),
            **named,
            **meta,
        }
    )
    storage.write(version, manifest_name(partition), Kind.MANIFEST, manifest, thorough=chained)
    if chained:  # this partition's local copies: what its chains name
        in_chains = {(link[0], link[1]) for chain in new.values() for link in chain}
        storage.keep_local_copies(key_group_prefix(partition), in_chains)
    return new


def noted_full(
    full: Iterable[Section], sections: dict[int, Section], taken: list[int]
) -> Iterator[Section]:
    """``full``'s sections as a writer takes them (:func:`write_version`, the seed's),
    each's key group noted in ``taken``; CheckpointError for one that is not a key
    group's full section, whose key group ``sections`` also names, or named twice."""
    for section in full:
        kg = section.tag
        if section.part != FULL or kg == SHARED or kg in sections or kg in taken:
            raise CheckpointError(
                f"key group {kg}: a full section given twice, or of part {section.part}"
            )
        taken.append(kg)
        yield section


def _manifest_table(chains: dict[int, Chain]) -> pa.Table:
    """A row per section the ``chains`` name, in version order, with the key groups
    whose chains name it and each one's size (the manifest's table, without its
    metadata): a SHARED delta is one row, not a link in every key group's list."""
    rows: dict[tuple[int, str, int, int], tuple[list[int], list[int]]] = {}
    for kg in sorted(chains):
        for version, file, offset, length, size in chains[kg]:
            groups, sizes = rows.setdefault((version, file, offset, length), ([], []))
            groups.append(kg)
            sizes.append(size)
    order = sorted(rows)
    columns: list[list[Any]] = [[where[i] for where in order] for i in range(4)]
    columns += [[rows[where][0] for where in order], [rows[where][1] for where in order]]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, _MANIFEST_SCHEMA, strict=True)],
        schema=_MANIFEST_SCHEMA,
    )


def _shares(section: Section, size: int) -> dict[int, int]:
    """A SHARED section's bytes each key group's rows stand for (by rows): a link's
    ``size``, which the full-snapshot rule sums over a chain's deltas."""
    counts = pc.value_counts(section.table.column(KEY_GROUP_FIELD)).to_pylist()
    rows = section.table.num_rows or 1
    return {c["values"]: max(1, size * c["counts"] // rows) for c in counts}


def writer_of(manifest: pa.Table) -> str:
    """The token of the attempt that wrote ``manifest`` ("" for earlier releases)."""
    raw: bytes = (manifest.schema.metadata or {}).get(_WRITER, b"")
    return raw.decode(errors="replace")
