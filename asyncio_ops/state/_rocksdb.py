"""The RocksDB backend: keyed state in rocksdict, one column family per state.

Row layout (see ``_keycodec``)::

    key group | len(key) | key | len(namespace) | namespace | suffix  ->  [ts] value

The 2-byte big-endian key group leads every row key, so the rows of a key
group (and of a key-group range) are one contiguous range. ``suffix`` is
empty for value, reducing and aggregating state, an 8-byte sequence number
per list element (one row per element, so ``add`` is one put) and the
canonically encoded map key per map entry. TTL states prefix every row value
with its last-access timestamp (8-byte big-endian double), so the expiry sweep
reads timestamps without deserialising values.

The database directory is a working copy, as in Flink: durability comes from
snapshots. The write-ahead log is off, ``path`` must be a new or empty
directory (or one this backend left behind), and ``close()`` deletes it.
:meth:`RocksDBKeyedStateBackend.park` leaves a copy of the database (a RocksDB
checkpoint: hard links) for another process to open as its working copy
(``adopt=``): the database, not the timers or anything else held in memory.

Snapshots are two-phase: :meth:`RocksDBKeyedStateBackend.begin_snapshot`
takes a RocksDB checkpoint (flush + hard links, milliseconds: the consistent
point-in-time view), and :meth:`RocksDBSnapshot.materialize` reads that
checkpoint into blobs, which may run later or in another thread while the
backend keeps taking writes. ``snapshot()`` does both. A key group of value
states without TTL whose rows are all one length (integer keys) is read for a
full section in one C loop and cut into columns as arrays (``value_runs``).

A bulk load (the backend held no row when ``track_changes`` began, see
``_backend``): a value state without TTL keeps what it writes in a dict of its
own, key -> the bytes the row would hold, and reads it there (no row exists
that it did not write): no ``get`` of a key that has no row, no ``put`` into a
memtable in random key order. Before anything reads the database (a snapshot,
``keys``, a restore, ``park``, the next ``track_changes``; ``_seal``) each
state's staged rows are written in row-key order through one write batch
(integer keys: their row keys built and sorted as arrays), and the bulk load
ends: the database holds what the puts would have written.

TTL cleanup beyond lazy-on-access: the stand-in for Flink's compaction filter
is a sweep that, after every ``query_time_after_num_entries`` writes to a TTL
state, checks that many more rows from a rotating cursor and deletes the
expired ones; :meth:`RocksDBKeyedStateBackend.sweep_expired` runs it on demand
and :meth:`RocksDBKeyedStateBackend.compact` sweeps everything and compacts.

One class with one job, :class:`RocksDBKeyedStateBackend` (with the state objects
it hands out, which are its rows' views).
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa

from .._clock import Clock
from .._exceptions import ConfigurationError, StateError
from .._keygroups import KeyGroupRange, canonical_bytes
from ._api import ListState, MapState, State, ValueState
from ._backend import (
    Entry,
    KeyedStateBackend,
    StateDump,
    TableBase,
    check_element,
    no_current_key,
    seal_dumps,
)
from ._cells import AggregatingCell, ReducingCell, TtlValueCell
from ._descriptors import (
    AGGREGATING,
    LIST,
    MAP,
    REDUCING,
    VALUE,
    StateDescriptor,
)
from ._keycodec import byte_rows, decode_canonical, int_key_rows, key_prefix, namespace_suffix
from ._payloads import ValueRun

__all__ = ["RocksDBKeyedStateBackend", "RocksDBSnapshot"]

_TS = struct.Struct(">d")
_pack_ts = _TS.pack
_unpack_ts = _TS.unpack_from
_SEQ = struct.Struct(">Q")
_KG = struct.Struct(">H")  # a row key's leading key group
_pack_seq = _SEQ.pack
_unpack_be32 = struct.Struct(">I").unpack_from
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


def _fixed(m: np.ndarray) -> pa.FixedSizeBinaryArray:
    """The rows of a byte matrix as a fixed-size binary array."""
    rows, width = m.shape
    data = pa.py_buffer(np.ascontiguousarray(m).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), rows, [None, data])


_MARKER: Final = ".asyncio_ops_rocksdb"
_CF_PREFIX: Final = "state:"


def _rocksdict() -> Any:
    try:
        import rocksdict
    except ImportError as exc:  # pragma: no cover - rocksdict is a declared extra
        raise ConfigurationError(
            "RocksDBKeyedStateBackend needs rocksdict: pip install 'asyncio-ops[rocksdb]'"
        ) from exc
    return rocksdict


def _successor(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with ``prefix``."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    raise AssertionError("row prefixes start with a key group < 0x8000")  # pragma: no cover


def _parse_row_key(k: bytes) -> tuple[int, bytes, bytes, bytes]:
    """``(key_group, key_enc, ns_enc, suffix)`` of a row key."""
    (klen,) = _unpack_be32(k, 2)
    kend = 6 + klen
    (nlen,) = _unpack_be32(k, kend)
    nend = kend + 4 + nlen
    return (k[0] << 8) | k[1], k[6:kend], k[kend + 4 : nend], k[nend:]


def _scan(cf: Any, prefix: bytes) -> list[tuple[bytes, bytes]]:
    it = cf.iter()
    it.seek(prefix)
    out = []
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            break
        out.append((k, it.value()))
        it.next()
    return out


class _Sealed(NamedTuple):
    """One state's rows of a bulk load, sorted as written (``_seal``): integer keys of
    one namespace, kept for ``value_runs`` until the database changes."""

    groups: np.ndarray  # each row's key group (int64), ascending
    rows: np.ndarray  # each row's key prefix (uint8, 15 bytes: group, length, key)
    namespace: bytes  # the rows' namespace suffix (length, canonical bytes)
    values: list[bytes]  # each row's value bytes


class _RocksTable(TableBase):
    def __init__(self, backend: RocksDBKeyedStateBackend, descriptor: StateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self.cf = backend._column_family(descriptor.name)
        self.writes = 0
        self.cursor = b""
        self.ns_suffixes: dict[Any, bytes] = {}

    def ns_suffix(self, namespace: Any) -> bytes:
        s = self.ns_suffixes.get(namespace)
        if s is None:
            s = self.ns_suffixes[namespace] = namespace_suffix(namespace)
        return s

    def wrote(self) -> None:
        """Count a write; run the compaction-time sweep every N writes."""
        self.writes += 1
        if self.writes >= self.compaction_every:
            self.writes = 0
            self.sweep(self.compaction_every)

    def cleanup_step(self) -> None:
        if self.incremental:
            self.sweep(self.incremental)

    def sweep(self, limit: int | None) -> int:
        """Check up to ``limit`` rows (all if None) from the cursor; delete expired ones."""
        if not self.has_ttl:
            return 0
        it = self.cf.iter()
        if self.cursor:
            it.seek(self.cursor)
        else:
            it.seek_to_first()
        now = self.now()
        expired = self.expired
        dead = []
        n = 0
        while it.valid() and (limit is None or n < limit):
            if expired(_unpack_ts(it.value())[0], now):
                dead.append(it.key())
            n += 1
            it.next()
        self.cursor = it.key() if it.valid() else b""
        delete = self.cf.delete
        for k in dead:
            delete(k)
        return len(dead)

    def encode(self, value: Any, ts: float) -> bytes:
        if self.has_ttl:
            return _pack_ts(ts) + self.dumps(value)
        return self.dumps(value)


class _RocksState:
    __slots__ = ("_b", "_cf", "_delete", "_get", "_ns", "_put", "_t")

    def __init__(self, backend: RocksDBKeyedStateBackend, table: _RocksTable, namespace: Any):
        self._b = backend
        self._t = table
        self._cf = table.cf
        self._get = table.cf.get
        self._put = table.cf.put
        self._delete = table.cf.delete
        self._ns = table.ns_suffix(namespace)

    def _prefix(self) -> bytes:
        p = self._b._kprefix
        if p is None:
            raise no_current_key()
        return p + self._ns

    def clear(self) -> None:
        p = self._prefix()
        if self._t.kind in (LIST, MAP):
            self._cf.delete_range(p, _successor(p))
        else:
            self._delete(p)


class _RocksValueState(_RocksState, ValueState[Any]):
    """Value state without TTL: one get or put of the cached key prefix; in a bulk load
    (the backend's ``_fresh``) one operation on its staged rows' dict, by key."""

    __slots__ = ("_staged",)

    def __init__(self, backend: RocksDBKeyedStateBackend, table: _RocksTable, namespace: Any):
        super().__init__(backend, table, namespace)
        self._staged: dict[Any, bytes] | None = None  # a bulk load's rows (module docstring)

    def value(self) -> Any:
        b = self._b
        p = b._kprefix
        if p is None:
            raise no_current_key()
        if b._fresh:
            staged = self._staged
            raw = None if staged is None else staged.get(b._key)
        else:
            raw = self._get(p + self._ns)
        return None if raw is None else self._t.loads(raw)

    def update(self, value: Any) -> None:
        b = self._b
        p = b._kprefix
        if p is None:
            raise no_current_key()
        if value is None:
            self.clear()
            return
        t = self._t
        try:
            data = t.unnamed_dumps(value)
        except Exception:
            data = t.dumps(value)  # raises, naming the state
        if b._fresh:
            staged = self._staged
            if staged is None:
                staged = self._staged = {}
                b._staging.append(self)
            staged[b._key] = data
        else:
            self._put(p + self._ns, data)

    def clear(self) -> None:
        b = self._b
        if b._fresh:
            if b._kprefix is None:
                raise no_current_key()
            if self._staged is not None:
                self._staged.pop(b._key, None)
            return
        super().clear()


class _RocksCell(_RocksState):
    """One row per key, with a timestamp: TTL value, reducing, aggregating."""

    __slots__ = ()

    def _read(self, *, for_write: bool = False) -> Any:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        k = self._prefix()
        raw = self._get(k)
        if raw is None:
            return None
        if not t.has_ttl:
            return t.loads(raw)
        now = t.now()
        ts = _unpack_ts(raw)[0]
        if t.expired(ts, now):
            self._delete(k)
            return t.loads(raw[8:]) if (t.return_expired and not for_write) else None
        value = t.loads(raw[8:])
        if t.update_on_read and not for_write:
            self._put(k, _pack_ts(now) + raw[8:])
        return value

    def _write(self, value: Any) -> None:
        t = self._t
        self._put(self._prefix(), t.encode(value, t.now()))
        if t.compaction_every:
            t.wrote()


class _RocksTtlValueState(_RocksCell, TtlValueCell):
    __slots__ = ()


class _RocksReducingState(_RocksCell, ReducingCell):
    __slots__ = ()


class _RocksAggregatingState(_RocksCell, AggregatingCell):
    __slots__ = ()


class _RocksListState(_RocksState, ListState[Any]):
    """One row per element, suffixed by a backend-wide increasing sequence number."""

    __slots__ = ()

    def get(self) -> list[Any]:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        rows = _scan(self._cf, self._prefix())
        if not rows:
            return []
        loads = t.loads
        if not t.has_ttl:
            return [loads(v) for _, v in rows]
        now = t.now()
        out = []
        for k, v in rows:
            ts = _unpack_ts(v)[0]
            if t.expired(ts, now):
                self._delete(k)
                if t.return_expired:
                    out.append(loads(v[8:]))
            else:
                out.append(loads(v[8:]))
                if t.update_on_read:
                    self._put(k, _pack_ts(now) + v[8:])
        return out

    def add(self, value: Any) -> None:
        p = self._b._kprefix
        if p is None:
            raise no_current_key()
        if value is None:
            check_element(self._t.name, value)
        t = self._t
        if t.has_ttl:
            if t.incremental:
                t.cleanup_step()
            self._put(p + self._ns + _pack_seq(next(self._b._seq)), t.encode(value, t.now()))
            if t.compaction_every:
                t.wrote()
        else:
            self._put(p + self._ns + _pack_seq(next(self._b._seq)), t.dumps(value))

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        for v in items:
            self.add(v)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        self.clear()
        for v in items:
            self.add(v)


class _RocksMapState(_RocksState, MapState[Any, Any]):
    """One row per map entry, suffixed by the canonically encoded map key."""

    __slots__ = ()

    def _entry(self, key: Any) -> tuple[bytes, Any]:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        k = self._prefix() + canonical_bytes(key)
        return k, self._get(k)

    def get(self, key: Any) -> Any:
        k, raw = self._entry(key)
        if raw is None:
            return None
        t = self._t
        if not t.has_ttl:
            return t.loads(raw)
        now = t.now()
        if t.expired(_unpack_ts(raw)[0], now):
            self._delete(k)
            return t.loads(raw[8:]) if t.return_expired else None
        if t.update_on_read:
            self._put(k, _pack_ts(now) + raw[8:])
        return t.loads(raw[8:])

    def put(self, key: Any, value: Any) -> None:
        t = self._t
        self._put(self._prefix() + canonical_bytes(key), t.encode(value, t.now()))
        if t.compaction_every:
            t.wrote()

    def put_all(self, mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        pairs = list(mapping.items() if isinstance(mapping, Mapping) else mapping)
        for k, _ in pairs:
            canonical_bytes(k)
        for k, v in pairs:
            self.put(k, v)

    def remove(self, key: Any) -> None:
        self._delete(self._prefix() + canonical_bytes(key))

    def contains(self, key: Any) -> bool:
        k, raw = self._entry(key)
        if raw is None:
            return False
        t = self._t
        if t.has_ttl and t.expired(_unpack_ts(raw)[0], t.now()):
            if t.return_expired:
                return True
            self._delete(k)
            return False
        return True

    def items(self) -> Iterator[tuple[Any, Any]]:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        p = self._prefix()
        rows = _scan(self._cf, p)
        n = len(p)
        loads = t.loads
        if not t.has_ttl:
            return iter([(decode_canonical(k[n:]), loads(v)) for k, v in rows])
        now = t.now()
        out = []
        for k, v in rows:
            if t.expired(_unpack_ts(v)[0], now):
                self._delete(k)
                if t.return_expired:
                    out.append((decode_canonical(k[n:]), loads(v[8:])))
            else:
                out.append((decode_canonical(k[n:]), loads(v[8:])))
                if t.update_on_read:
                    self._put(k, _pack_ts(now) + v[8:])
        return iter(out)

    def is_empty(self) -> bool:
        t = self._t
        if not t.has_ttl:
            it = self._cf.iter()
            p = self._prefix()
            it.seek(p)
            return not (it.valid() and it.key().startswith(p))
        for _ in self.items():
            return False
        return True


class RocksDBSnapshot:
    """A point-in-time RocksDB checkpoint of a backend, not yet turned into blobs.

    :meth:`materialize` reads it (safe to call from another thread while the
    backend keeps working) and deletes the checkpoint; :meth:`discard` drops
    it unread.

    Example:

    >>> import tempfile
    >>> from asyncio_ops.state import KeyGroupRange, RocksDBKeyedStateBackend, ValueStateDescriptor
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     backend = RocksDBKeyedStateBackend(path=f"{tmp}/state", max_parallelism=128,
    ...                                        key_group_range=KeyGroupRange(0, 127))
    ...     count = backend.get_state(ValueStateDescriptor("count"))
    ...     backend.set_current_key("user-1")
    ...     count.update(1)
    ...     snapshot = backend.begin_snapshot()  # phase 1: on the operator's thread
    ...     count.update(2)  # not in the snapshot
    ...     blobs = snapshot.materialize()  # phase 2: may run on another thread
    ...     backend.close()
    >>> sorted(blobs)
    [70]
    """

    def __init__(
        self,
        path: Path,
        tables: list[tuple[_RocksTable, bool, float]],
        pending: dict[int, list[StateDump]],
        merge: Any,
    ) -> None:
        self._path = path
        self._tables = tables
        self._pending = pending
        self._merge = merge
        self._done = False

    def materialize(self) -> dict[int, bytes]:
        """``{key_group: blob}`` as of the checkpoint (see ``KeyedStateBackend.snapshot``)."""
        if self._done:
            raise StateError("RocksDBSnapshot.materialize: already materialized or discarded")
        rocksdict = _rocksdict()
        groups: dict[int, list[StateDump]] = {}
        try:
            if self._tables:
                db = rocksdict.Rdict(
                    str(self._path),
                    rocksdict.Options(raw_mode=True),
                    access_type=rocksdict.AccessType.read_only(),
                )
                try:
                    for t, drop, now in self._tables:
                        cf = db.get_column_family(_CF_PREFIX + t.name)
                        try:
                            by_kg = _dump_rows(cf, t, drop, now)
                        finally:
                            cf.close()
                        for kg, entries in by_kg.items():
                            groups.setdefault(kg, []).append(
                                (t.name, t.kind, t.has_ttl, entries, t.typing)
                            )
                finally:
                    db.close()
        finally:
            self.discard()
        return seal_dumps(self._merge(groups, self._pending))

    def discard(self) -> None:
        self._done = True
        shutil.rmtree(self._path, ignore_errors=True)


def _dump_rows(
    cf: Any,
    table: _RocksTable,
    drop: bool,
    now: float,
    prefix: bytes = b"",
    out: dict[int, list[Entry]] | None = None,
    keys: Sequence[bytes] = (),
) -> dict[int, list[Entry]]:
    """Rows of one column family (``table``'s, or a checkpoint's copy of it; those
    starting with ``prefix``, or with any of ``keys``, sorted row-key prefixes of single
    keys) as logical entries, by key group (rows are sorted), added to ``out``. A typed
    state's values are decoded (its snapshot holds values)."""
    if out is None:
        out = {}
    scan = table.kind, table.has_ttl, drop, now, table.expired, prefix, keys
    if table.typing is not None:
        return _decoded(_rows(cf, *scan, {}), table, out)
    return _rows(cf, *scan, out)


def _rows(
    cf: Any,
    kind: str,
    has_ttl: bool,
    drop: bool,
    now: float,
    expired: Any,
    prefix: bytes,
    keys: Sequence[bytes],
    out: dict[int, list[Entry]],
) -> dict[int, list[Entry]]:
    """:func:`_dump_rows` of bytes: a range, or (``keys``) many short ones through one
    iterator, a seek each (an iterator per key cost about 10 us)."""
    multi = kind in (LIST, MAP)
    if not keys and not multi and not has_ttl:  # the common case: one row per entry
        group = -1
        entries: list[Entry] = []
        unpack = _unpack_be32
        for row, body in cf.items(from_key=prefix or None):  # one C loop, no call per step
            if prefix and not row.startswith(prefix):
                break
            kg = (row[0] << 8) | row[1]
            if kg != group:
                group = kg
                entries = out.setdefault(kg, [])
            (klen,) = unpack(row, 2)
            kend = 6 + klen
            (nlen,) = unpack(row, kend)
            entries.append((row[6:kend], row[kend + 4 : kend + 4 + nlen], (None, body)))
        return out
    it = cf.iter()
    for start in keys or (prefix,):
        if start:
            it.seek(start)
        else:
            it.seek_to_first()
        last: tuple[int, bytes, bytes] | None = None
        bucket: list[Any] = []
        while it.valid():
            row = it.key()
            if start and not row.startswith(start):
                break
            kg, key_enc, ns_enc, suffix = _parse_row_key(row)
            v = it.value()
            if has_ttl:
                ts: float | None = _unpack_ts(v)[0]
                body = v[8:]
                if drop and expired(ts, now):
                    it.next()
                    continue
            else:
                ts, body = None, v
            if not multi:
                out.setdefault(kg, []).append((key_enc, ns_enc, (ts, body)))
            else:
                ident = (kg, key_enc, ns_enc)
                if ident != last:
                    bucket = []
                    out.setdefault(kg, []).append((key_enc, ns_enc, bucket))
                    last = ident
                bucket.append((ts, body) if kind == LIST else (suffix, ts, body))
            it.next()
    return out


def _decoded(
    rows: dict[int, list[Entry]], table: _RocksTable, out: dict[int, list[Entry]]
) -> dict[int, list[Entry]]:
    """``rows`` (entries of bytes) with a typed table's values decoded, added to ``out``."""
    loads = table.loads
    kind = table.kind
    for kg, entries in rows.items():
        group = out.setdefault(kg, [])
        for key, ns, data in entries:
            if kind == LIST:
                group.append((key, ns, [(ts, loads(b)) for ts, b in data]))
            elif kind == MAP:
                group.append((key, ns, [(mk, ts, loads(b)) for mk, ts, b in data]))
            else:
                group.append((key, ns, (data[0], loads(data[1]))))
    return out


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state in RocksDB via rocksdict (see the module docstring).

    ``RocksDBKeyedStateBackend(path=..., max_parallelism=128, key_group_range=r,
    clock=None)``. ``path`` is the backend's working directory. With ``adopt=seq``,
    ``path`` is a directory :meth:`park` left and the backend opens its database as
    it is (its states' column families included; list sequence numbers from ``seq``).

    Example:

    >>> import tempfile
    >>> from asyncio_ops.state import KeyGroupRange, ListStateDescriptor, RocksDBKeyedStateBackend
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     backend = RocksDBKeyedStateBackend(path=f"{tmp}/state", max_parallelism=128,
    ...                                        key_group_range=KeyGroupRange(0, 127))
    ...     events = backend.get_state(ListStateDescriptor("events"))
    ...     backend.set_current_key("user-1")
    ...     events.add_all(["login", "buy"])
    ...     print(events.get())
    ...     backend.close()  # deletes its working copy
    ['login', 'buy']
    """

    is_rocksdb = True

    def __init__(
        self,
        *,
        path: str | os.PathLike[str],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
        adopt: int | None = None,
    ) -> None:
        super().__init__(
            max_parallelism=max_parallelism, key_group_range=key_group_range, clock=clock
        )
        rocksdict = _rocksdict()
        self._rd = rocksdict
        root = Path(path)
        existing: list[str] = []
        if adopt is not None:  # a parked working directory (see park): opened as it is
            if not (root / _MARKER).is_file() or not (root / "db").is_dir():
                raise ConfigurationError(
                    f"RocksDB path {str(root)!r} is not a database this backend parked"
                )
            existing = rocksdict.Rdict.list_cf(str(root / "db"))
        elif root.exists():
            if not root.is_dir():
                raise ConfigurationError(f"RocksDB path {str(root)!r} is not a directory")
            if any(root.iterdir()) and not (root / _MARKER).exists():
                raise ConfigurationError(
                    f"RocksDB path {str(root)!r} is not empty and was not created by this "
                    "backend; give a new or empty directory (its contents are a working copy "
                    "and are deleted on close)"
                )
            shutil.rmtree(root)
        if adopt is None:
            root.mkdir(parents=True)
            (root / _MARKER).write_text("asyncio_ops RocksDB working directory\n")
        self._root = root
        self._db_path = root / "db"
        self._snap_ids = itertools.count()
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = rocksdict.Rdict(str(self._db_path), opts)
        self._write_opts = rocksdict.WriteOptions()
        # The database is a working copy (snapshots are the durable form): no WAL.
        self._write_opts.disable_wal = True
        self._db.set_write_options(self._write_opts)
        self._cfs: dict[str, Any] = {}
        for name in sorted(existing):  # a parked database's states: cleared, removed
            if name.startswith(_CF_PREFIX):  # and restored into as any other
                cf = self._db.get_column_family(name)
                cf.set_write_options(self._write_opts)
                self._cfs[name[len(_CF_PREFIX) :]] = cf
        # Sequence numbers of list elements: increasing across the backend's life (and
        # a parked database's next owner's), so elements of one list sort in insertion order.
        self._seq = itertools.count(adopt or 0)
        # the value states holding a bulk load's staged rows (module docstring), and the
        # runs _seal wrote, kept while the database's sequence number is ``_sealed_at``
        self._staging: list[_RocksValueState] = []
        self._sealed: dict[str, _Sealed] | None = None
        self._sealed_at = -1

    def _column_family(self, name: str) -> Any:
        cf = self._cfs.get(name)
        if cf is None:
            cf = self._db.create_column_family(_CF_PREFIX + name, self._rd.Options(raw_mode=True))
            cf.set_write_options(self._write_opts)
            self._cfs[name] = cf
        return cf

    def _create_table(self, descriptor: StateDescriptor) -> _RocksTable:
        return _RocksTable(self, descriptor)

    def _make_state(self, table: _RocksTable, namespace: Any) -> State:
        kind = table.kind
        if kind == VALUE:
            cls = _RocksTtlValueState if table.has_ttl else _RocksValueState
            return cls(self, table, namespace)
        if kind == LIST:
            return _RocksListState(self, table, namespace)
        if kind == MAP:
            return _RocksMapState(self, table, namespace)
        if kind == REDUCING:
            return _RocksReducingState(self, table, namespace)
        if kind == AGGREGATING:
            return _RocksAggregatingState(self, table, namespace)
        raise AssertionError(kind)  # pragma: no cover - descriptors validate kinds

    # -- a bulk load's staged rows (module docstring) ---------------------------------
    def _seal(self) -> None:
        """End a bulk load: write the rows the value states staged into the database,
        each state's in row-key order (integer keys of one namespace: one table file,
        ingested, kept as arrays for ``value_runs`` too; else one write batch); the
        database is read from now on. Called first by everything that reads or changes
        the database other than a value state."""
        if not self._fresh:
            return
        self._fresh = False
        staging, self._staging = self._staging, []
        parts: dict[str, list[tuple[bytes, dict[Any, bytes]]]] = {}
        for state in staging:
            staged, state._staged = state._staged, None
            if staged:
                parts.setdefault(state._t.name, []).append((state._ns, staged))
        sealed: dict[str, _Sealed] | None = {}
        for name, staged_parts in parts.items():
            run = self._int_run(staged_parts)
            if run is not None:
                self._ingest(name, run)
                if sealed is not None:
                    sealed[name] = run
                continue
            sealed = None  # value_runs reads the database
            group_of = self.key_group_of
            pairs = [
                (key_prefix(group_of(key), canonical_bytes(key)) + ns, value)
                for ns, staged in staged_parts
                for key, value in staged.items()
            ]
            pairs.sort(key=_FIRST)
            wb = self._rd.WriteBatch(raw_mode=True)
            wb.set_default_column_family(self._db.get_column_family_handle(_CF_PREFIX + name))
            put = wb.put
            for row, value in pairs:
                put(row, value)
            self._db.write(wb, self._write_opts)
        if sealed:
            self._sealed = sealed
            self._sealed_at = self._db.latest_sequence_number()

    def _int_run(self, parts: list[tuple[bytes, dict[Any, bytes]]]) -> _Sealed | None:
        """One state's staged rows as a sorted run built as arrays, when they are of one
        namespace and every key an integer in the int64 range; else None."""
        if len(parts) != 1:
            return None
        ns, staged = parts[0]
        keys = list(staged)
        try:
            groups = list(map(self._assigned.__getitem__, keys))
        except KeyError:  # a key not named since track_changes: not a bulk load's
            return None
        rows = int_key_rows(keys, groups)
        if rows is None:
            return None
        order = np.lexsort((
            np.ascontiguousarray(rows[:, 7:]).view(">u8").ravel(),
            np.ascontiguousarray(rows[:, :2]).view(">u2").ravel(),
        ))  # fmt: skip
        rows = rows[order]
        values = list(staged.values())
        return _Sealed(
            np.ascontiguousarray(rows[:, :2]).view(">u2").ravel().astype(np.int64),
            rows, ns, list(map(values.__getitem__, order.tolist())),
        )  # fmt: skip

    def _ingest(self, name: str, run: _Sealed) -> None:
        """Write a sorted run's rows into state ``name``'s column family as one table file,
        ingested (moved in: no memtable, nothing for a checkpoint to flush)."""
        n = len(run.values)
        if not n:
            return
        full = np.empty((n, run.rows.shape[1] + len(run.namespace)), np.uint8)
        full[:, : run.rows.shape[1]] = run.rows
        full[:, run.rows.shape[1] :] = np.frombuffer(run.namespace, np.uint8)
        target = self._root / "ingest" / f"{next(self._snap_ids)}.sst"
        target.parent.mkdir(exist_ok=True)
        writer = self._rd.SstFileWriter(self._rd.Options(raw_mode=True))
        writer.open(str(target))
        put = writer.__setitem__
        for row, value in zip(byte_rows(full), run.values, strict=True):
            put(row, value)
        writer.finish()
        opts = self._rd.IngestExternalFileOptions()
        opts.set_move_files(True)
        try:
            self._cfs[name].ingest_external_file([str(target)], opts)
        finally:
            target.unlink(missing_ok=True)

    def _sealed_runs(self) -> dict[str, _Sealed] | None:
        """The runs the last ``_seal`` wrote, if the database has not changed since."""
        if self._sealed is not None and self._db.latest_sequence_number() != self._sealed_at:
            self._sealed = None
        return self._sealed

    def track_changes(self, keys: bool = True) -> None:
        self._seal()
        self._sealed = None
        super().track_changes(keys)

    def load(self, groups: Mapping[int, list[StateDump]]) -> int:
        self._seal()
        self._sealed = None
        return super().load(groups)

    def _holds_nothing(self) -> bool:
        if self._pending:
            return False
        for cf in self._cfs.values():
            it = cf.iter()
            it.seek_to_first()
            if it.valid():
                return False
        return True

    def _keys(self, table: _RocksTable, namespace: Any) -> Iterator[Any]:
        self._seal()
        ns_enc = canonical_bytes(namespace)
        it = table.cf.iter()
        it.seek_to_first()
        out = []
        last = None
        while it.valid():
            _, key_enc, row_ns, _ = _parse_row_key(it.key())
            if row_ns == ns_enc and key_enc != last:
                out.append(decode_canonical(key_enc))
                last = key_enc
            it.next()
        return iter(out)

    # -- snapshot ---------------------------------------------------------------------
    def begin_snapshot(self) -> RocksDBSnapshot:
        """Phase 1: a RocksDB checkpoint (consistent, milliseconds); see RocksDBSnapshot."""
        self._check_open()
        self._seal()
        snap_dir = self._root / "snapshots" / str(next(self._snap_ids))
        snap_dir.parent.mkdir(exist_ok=True)
        tables = []
        for t in self._tables.values():
            assert isinstance(t, _RocksTable)
            tables.append((t, t.full_snapshot_cleanup, t.now()))
        if tables:
            self._rd.Checkpoint(self._db).create_checkpoint(str(snap_dir))
        return RocksDBSnapshot(snap_dir, tables, self._pending_dumps(), self._merger())

    def snapshot(self, key_groups: Collection[int] | None = None) -> dict[int, bytes]:
        if key_groups is None:
            return self.begin_snapshot().materialize()
        return super().snapshot(key_groups)

    def _tables_now(self) -> list[tuple[_RocksTable, float]]:
        out = []
        for t in self._tables.values():
            assert isinstance(t, _RocksTable)
            out.append((t, t.now()))
        return out

    def _dump_groups(self, key_groups: Collection[int] | None = None) -> dict[int, list[StateDump]]:
        """Some key groups (all: :meth:`snapshot` takes a checkpoint instead), read live."""
        self._seal()
        groups = sorted(key_groups) if key_groups is not None else list(self.key_group_range)
        out: dict[int, list[StateDump]] = {}
        for t, now in self._tables_now():
            by_kg: dict[int, list[Entry]] = {}
            for kg in groups:
                _dump_rows(t.cf, t, t.full_snapshot_cleanup, now, _KG.pack(kg), by_kg)
            for kg, entries in by_kg.items():
                out.setdefault(kg, []).append((t.name, t.kind, t.has_ttl, entries, t.typing))
        return out

    def value_runs(self, key_group: int) -> list[ValueRun] | None:
        """A key group of value states without TTL as columns: each state's rows read in
        one C loop and, when they are all one length (one key and namespace length: integer
        keys), their keys and namespaces cut out of them as arrays instead of a parse per
        row (the entries :meth:`_dump_groups` gives, in their order)."""
        self._check_open()
        self._seal()
        if self._pending:
            return None
        prefix = struct.pack(">H", key_group)
        bounds = self._rd.ReadOptions()
        bounds.set_iterate_upper_bound(struct.pack(">H", key_group + 1))
        runs: list[ValueRun] = []
        sealed = self._sealed_runs()
        for table in self._tables.values():
            assert isinstance(table, _RocksTable)
            if table.kind != VALUE or table.has_ttl:
                return None
            if sealed is not None:  # a bulk load's rows as _seal wrote them: no read
                run = sealed.get(table.name)
                if run is None:  # it staged nothing: it has no row
                    continue
                a, b = np.searchsorted(run.groups, (key_group, key_group + 1)).tolist()
                if a == b:
                    continue
                values = run.values[a:b]
                if table.typing is not None:
                    values = list(map(table.loads, values))
                keys = _fixed(run.rows[a:b, 6:])
                runs.append(ValueRun(table.name, table.kind, table.typing, keys,
                                     run.namespace[4:], values))  # fmt: skip
                continue
            pairs = list(table.cf.items(from_key=prefix, read_opt=bounds))
            if not pairs:
                continue
            rows = list(map(_FIRST, pairs))
            width = len(rows[0])
            if width < 10 or any(len(row) != width for row in rows):
                return None
            m = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), width)
            (klen,) = _unpack_be32(rows[0], 2)
            if 10 + klen > width or not (m[:, 2:6] == m[0, 2:6]).all():
                return None
            (nlen,) = _unpack_be32(rows[0], 6 + klen)
            if (
                10 + klen + nlen != width
                or not (m[:, 6 + klen : 10 + klen] == m[0, 6 + klen : 10 + klen]).all()
            ):
                return None  # not one key length and one namespace length, no suffix
            keys = _fixed(m[:, 6 : 6 + klen])
            ns = m[:, 10 + klen :]
            namespace: pa.Array | bytes = bytes(ns[0]) if (ns == ns[0]).all() else _fixed(ns)
            values = list(map(_SECOND, pairs))
            if table.typing is not None:
                values = list(map(table.loads, values))
            runs.append(ValueRun(table.name, table.kind, table.typing, keys, namespace, values))
        return runs

    def _dump_keys(
        self, keys: Mapping[int, Sequence[tuple[Any, bytes]]]
    ) -> dict[int, list[StateDump]]:
        self._seal()
        out: dict[int, list[StateDump]] = {}
        for t, now in self._tables_now():
            by_kg: dict[int, list[Entry]] = {}
            prefixes = sorted(key_prefix(kg, enc) for kg, pairs in keys.items() for _, enc in pairs)
            if prefixes:
                _dump_rows(t.cf, t, t.full_snapshot_cleanup, now, out=by_kg, keys=prefixes)
            for kg, entries in by_kg.items():
                out.setdefault(kg, []).append((t.name, t.kind, t.has_ttl, entries, t.typing))
        return out

    def _remove_keys(self, key_group: int, keys: Sequence[tuple[Any, bytes]]) -> None:
        self._seal()
        for cf in self._cfs.values():
            for _, enc in keys:
                p = key_prefix(key_group, enc)
                cf.delete_range(p, _successor(p))

    def _clear_key_group(self, key_group: int) -> None:
        self._seal()
        p = _KG.pack(key_group)
        for cf in self._cfs.values():
            cf.delete_range(p, _successor(p))

    def _load_entries(self, table: _RocksTable, kg: int, entries: list[Entry]) -> None:
        self._seal()
        wb = self._rd.WriteBatch(raw_mode=True)
        wb.set_default_column_family(self._db.get_column_family_handle(_CF_PREFIX + table.name))
        put = wb.put
        stamp = _pack_ts(table.now())
        has_ttl = table.has_ttl
        kind = table.kind
        encode = table.dumps if table.typing is not None else None  # values, not bytes

        def value(ts: float | None, body: Any) -> bytes:
            data: bytes = body if encode is None else encode(body)
            if not has_ttl:
                return data
            return (stamp if ts is None else _pack_ts(ts)) + data

        for key_enc, ns_enc, payload in entries:
            prefix = key_prefix(kg, key_enc) + struct.pack(">I", len(ns_enc)) + ns_enc
            if kind == LIST:
                for ts, body in payload:
                    put(prefix + _pack_seq(next(self._seq)), value(ts, body))
            elif kind == MAP:
                for mk_enc, ts, body in payload:
                    put(prefix + mk_enc, value(ts, body))
            else:
                ts, body = payload
                put(prefix, value(ts, body))
        self._db.write(wb, self._write_opts)

    # -- TTL maintenance --------------------------------------------------------------
    def sweep_expired(self, state_name: str | None = None) -> int:
        """Delete every expired row of one TTL state (or all); returns how many."""
        self._check_open()
        self._seal()
        n = 0
        for t in list(self._tables.values()):
            if state_name is None or t.name == state_name:
                assert isinstance(t, _RocksTable)
                t.cursor = b""
                n += t.sweep(None)
        return n

    def compact(self) -> int:
        """Sweep every expired row, then compact each column family; returns rows deleted."""
        n = self.sweep_expired()
        for cf in self._cfs.values():
            cf.compact_range(None, None)
        return n

    def unregistered_states(self) -> list[str]:
        """The states of an adopted database no descriptor has registered (their rows
        are invisible to snapshots until one does)."""
        return sorted(n for n in self._cfs if n not in self._tables)

    def park(self, target: str | os.PathLike[str]) -> int:
        """Leave a copy of the database as it is now in ``target`` (a new directory on
        the same filesystem: a RocksDB checkpoint, hard links, milliseconds), for another
        process to open with ``adopt=`` the returned list sequence number; the backend
        keeps working. Its timers and anything else held in memory are the caller's to
        keep (StateError while restored data is still pending a descriptor)."""
        self._check_open()
        self._seal()
        self._sealed = None  # the snapshot is written: the runs are not needed again
        if self._pending:
            raise StateError("a backend holding restored state no descriptor claimed is not parked")
        root = Path(target)
        root.mkdir(parents=True)
        (root / _MARKER).write_text("asyncio_ops RocksDB working directory (parked)\n")
        self._rd.Checkpoint(self._db).create_checkpoint(str(root / "db"))
        seq = next(self._seq)
        self._seq = itertools.count(seq)
        return seq

    def close(self) -> None:
        """Close the database and delete the working directory. Idempotent."""
        if self._closed:
            return
        self._fresh = False
        for state in self._staging:  # a bulk load's rows die with the working copy
            state._staged = None
        self._staging.clear()
        self._sealed = None
        super().close()
        # Every column-family handle shares the database; each must be closed, or the
        # states still referencing one keep the LOCK held.
        for cf in self._cfs.values():
            cf.close()
        self._cfs.clear()
        self._db.close()
        shutil.rmtree(self._root, ignore_errors=True)

    def __repr__(self) -> str:
        r = self.key_group_range
        return (
            f"RocksDBKeyedStateBackend(path={str(self._root)!r}, "
            f"max_parallelism={self.max_parallelism}, key_group_range={r.start}..{r.end}, "
            f"states={sorted(self._tables)})"
        )
