"""The heap backend: state in Python dicts.

Layout: per state, per namespace, one dict ``key -> stored entry`` per key
group of the backend's range (a list, indexed by the key group's position in
the range), as Flink's heap backend keeps one state map per key group.
``set_current_key`` validates a key once (canonical encoding, key group inside
the range; cached per key with its key-group index) and then only records the
key and its index, so a state access is one list index and one dict
operation. A snapshot walks the dicts of each key group directly and lists
its keys in the order of their canonical bytes (RocksDB's order), not the
dicts' (the order keys came in, a restored key moved to the end): a key
group's section then costs the same bytes whatever order its keys came in
(a full key group of 7,800 integer keys compressed alone: 14.7 KB sorted,
22.8 KB in random order, 16.8 KB with half its keys moved to the end, as
restores of deltas leave a dict). A key group whose states are all value
states without TTL and whose keys are all integers is written as columns
(``value_runs``): its keys' bytes built and sorted as arrays, the same table.
A restore puts each key group's entries into its own dict.

Stored entries (``ts`` is the last-access timestamp of TTL state):

- value without TTL: the value itself; with TTL: ``(value, ts)``
- list without TTL: a list of elements; with TTL: a list of ``(element, ts)``
- map: a dict ``map_key -> (value, ts)``
- reducing, aggregating: ``(value_or_accumulator, ts)``

(``ts`` is 0.0 where there is no TTL.) Values are stored by reference, as in
Flink's heap backend: a value read from state and mutated in place changes the
state. Serializers run only in ``snapshot`` and ``restore``.

Before the first ``set_current_key`` the backend's current key is
:data:`NO_KEY`, which is unhashable: the hot paths (value state ``value`` /
``update``, list state ``add``) need no "is there a key" test, the dict
operation raises TypeError and the state turns it into a clear StateError.

The current key lives in a key context: ``set_current_key`` is its method,
and value state without TTL is a cell reading it. Both are implemented in C
(``_heapfast.c``, built at install when a compiler is present) with the
pure-Python classes below as the fallback, same semantics;
``ASYNCIO_OPS_PURE_PYTHON=1`` forces the fallback (the test suite runs both).
A Python method call costs about as much as the dict operation it wraps,
so three of them per record (set the key, read, write) cost three dict
operations' worth; the C methods cost a third of that.

One class with one job, :class:`HeapKeyedStateBackend` (with the state objects it
hands out, which are its dicts' views).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

from .._clock import Clock
from .._exceptions import StateError, UnsupportedKeyError
from .._keygroups import KeyGroupRange, canonical_bytes
from .._native import in_use
from ._api import ListState, MapState, State, ValueState
from ._backend import (
    NO_KEY,
    Entry,
    KeyedStateBackend,
    StateDump,
    TableBase,
    check_element,
    no_current_key,
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
from ._keycodec import decode_canonical, int_key_column
from ._payloads import ValueRun

__all__ = ["HeapKeyedStateBackend"]

_KEY_BYTES = itemgetter(0)  # a dumped (canonical key bytes, entry): snapshots sort by it

try:
    from . import _heapfast
except ImportError:  # not built (no compiler at install): the Python classes below
    _heapfast = None  # type: ignore[assignment]


class _PyKeyContext:
    """The current key of a heap backend (the fallback of ``_heapfast.KeyContext``).

    ``key`` and ``kg``, its key group's index in the backend's range (None
    before the first key). ``cache`` maps validated keys to ``(index, ...)``.
    """

    __slots__ = ("_cache", "_no_key", "_on_new_key", "key", "kg", "touched")

    def __init__(
        self,
        no_key: Any,
        cache: dict[Any, Any],
        on_new_key: Callable[[Any], None],
        no_key_error: Callable[[], StateError],
    ) -> None:
        self.key = self._no_key = no_key
        self.kg: int | None = None
        self._cache = cache
        self._on_new_key = on_new_key
        self.touched: set[Any] | None = None  # every key made current goes in (tracking)

    def set_current_key(self, key: Any) -> None:
        try:
            entry = self._cache.get(key)
        except TypeError:  # unhashable: the validation names the type
            entry = None
        if entry is None:
            self._on_new_key(key)
            entry = self._cache[key]
        self.kg = entry[0]
        self.key = key
        if self.touched is not None:
            self.touched.add(key)

    def reset(self) -> None:
        self.key = self._no_key
        self.kg = None


class _HeapTable(TableBase):
    def __init__(self, backend: HeapKeyedStateBackend, descriptor: StateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self.namespaces: dict[Any, list[dict[Any, Any]]] = {}
        self.n_groups = len(backend.key_group_range)
        self.kg_start = backend.key_group_range.start
        self._cursor: Iterator[tuple[dict[Any, Any], Any]] | None = None
        # Which stored form this table uses (see module docstring).
        self.raw = not self.has_ttl and self.kind in (VALUE, LIST)
        # Snapshot values: the serializer's bytes, or a typed state's (normalised) values.
        self.snap_dumps: Callable[[Any], Any] = self.dumps if self.typing is None else _same
        self.snap_loads: Callable[[Any], Any] = self.loads if self.typing is None else _same

    def entries(self, namespace: Any) -> list[dict[Any, Any]]:
        """The dicts ``key -> entry`` of ``namespace``, one per key group of the range
        (created empty; never replaced)."""
        groups = self.namespaces.get(namespace)
        if groups is None:
            groups = self.namespaces[namespace] = [{} for _ in range(self.n_groups)]
        return groups

    # -- TTL cleanup ------------------------------------------------------------------
    def _walk(self) -> Iterator[tuple[dict[Any, Any], Any]]:
        for groups in list(self.namespaces.values()):
            for d in groups:
                for k in list(d):  # a copy: cleanup and user writes mutate d meanwhile
                    yield d, k

    def cleanup_step(self) -> None:
        n = self.incremental
        if not n:
            return
        if self._cursor is None:
            self._cursor = self._walk()
        now = self.now()
        cursor = self._cursor
        for _ in range(n):
            try:
                d, k = next(cursor)
            except StopIteration:
                self._cursor = None
                return
            self.prune(d, k, now)

    def prune(self, d: dict[Any, Any], k: Any, now: float) -> None:
        """Remove what is expired from the entry of ``k`` in ``d``."""
        entry = d.get(k)
        if entry is None or not self.has_ttl:
            return
        expired = self.expired
        if self.kind == LIST:
            kept = [e for e in entry if not expired(e[1], now)]
            if len(kept) != len(entry):
                if kept:
                    d[k] = kept
                else:
                    del d[k]
        elif self.kind == MAP:
            for mk in [mk for mk, (_, ts) in entry.items() if expired(ts, now)]:
                del entry[mk]
            if not entry:
                del d[k]
        elif expired(entry[1], now):
            del d[k]

    # -- snapshot ---------------------------------------------------------------------
    def dump(
        self,
        located: dict[Any, tuple[int, bytes]],
        enc: dict[Any, bytes],
        key_groups: Collection[int] | None = None,
    ) -> dict[int, list[Entry]]:
        """Logical entries by key group (of ``key_groups``, if given; expired ones dropped
        if configured).

        ``located`` caches each key's (key group, canonical bytes) and ``enc``
        the canonical bytes of map keys, across the states of one snapshot.
        """
        start = self.kg_start

        def buckets(groups: list[dict[Any, Any]]) -> Iterator[tuple[int, list[Any]]]:
            for index, d in enumerate(groups):
                kg = start + index
                if not d or (key_groups is not None and kg not in key_groups):
                    continue
                bucket = []
                for key, entry in d.items():
                    where = located.get(key)
                    if where is None:
                        where = located[key] = (kg, canonical_bytes(key))
                    bucket.append((where[1], entry))
                bucket.sort(key=_KEY_BYTES)
                yield kg, bucket

        return self._dump(buckets, enc)

    def dump_keys(
        self, keys: Mapping[int, Sequence[tuple[Any, bytes]]], enc: dict[Any, bytes]
    ) -> dict[int, list[Entry]]:
        """Logical entries of ``keys`` (``{kg: [(key, canonical bytes), ...]}``)."""
        start = self.kg_start

        def buckets(groups: list[dict[Any, Any]]) -> Iterator[tuple[int, list[Any]]]:
            for kg, pairs in keys.items():
                d = groups[kg - start]
                bucket = [(key_enc, d[key]) for key, key_enc in pairs if key in d]
                if bucket:  # in the order of pairs (encoded_keys: sorted by bytes)
                    yield kg, bucket

        return self._dump(buckets, enc)

    def _dump(
        self,
        buckets: Callable[[list[dict[Any, Any]]], Iterator[tuple[int, list[Any]]]],
        enc: dict[Any, bytes],
    ) -> dict[int, list[Entry]]:
        """Encode, per namespace, the ``(key group, [(key bytes, entry), ...])`` that
        ``buckets`` picks from the namespace's dicts."""
        out: dict[int, list[Entry]] = {}
        now = self.now()

        def e(x: Any) -> bytes:
            b = enc.get(x)
            if b is None:
                b = enc[x] = canonical_bytes(x)
            return b

        for ns, groups in self.namespaces.items():
            ns_enc: bytes | None = None
            for kg, bucket in buckets(groups):
                if ns_enc is None:
                    ns_enc = canonical_bytes(ns)
                try:
                    self._encode(bucket, ns_enc, out.setdefault(kg, []), e, now)
                except StateError as exc:
                    raise StateError(f"{exc} (snapshot of key group {kg})") from exc
        return out

    def _encode(
        self,
        bucket: list[tuple[bytes, Any]],
        ns_enc: bytes,
        group: list[Entry],
        e: Callable[[Any], bytes],
        now: float,
    ) -> None:
        dumps = self.snap_dumps
        has_ttl = self.has_ttl
        drop = self.full_snapshot_cleanup
        expired = self.expired
        kind = self.kind
        raw = self.raw
        for key_enc, entry in bucket:
            payload: Any
            if kind == LIST:
                if raw:
                    payload = [(None, dumps(x)) for x in entry]
                else:
                    payload = [(ts, dumps(x)) for x, ts in entry if not (drop and expired(ts, now))]
                if not payload:
                    continue
            elif kind == MAP:
                payload = [
                    (e(mk), ts if has_ttl else None, dumps(v))
                    for mk, (v, ts) in entry.items()
                    if not (drop and expired(ts, now))
                ]
                if not payload:
                    continue
            elif raw:
                payload = (None, dumps(entry))
            else:
                v, ts = entry
                if drop and expired(ts, now):
                    continue
                payload = (ts if has_ttl else None, dumps(v))
            group.append((key_enc, ns_enc, payload))

    def load(self, kg: int, entries: list[Entry]) -> None:
        """Put the entries of key group ``kg`` (inside the range) into its dicts."""
        loads = self.snap_loads
        stamp = self.now()
        kind = self.kind
        raw = self.raw
        index = kg - self.kg_start
        for key_enc, ns_enc, payload in entries:
            key = decode_canonical(key_enc)
            d = self.entries(decode_canonical(ns_enc))[index]
            if kind == LIST:
                if raw:
                    items = [loads(b) for _, b in payload]
                else:
                    items = [(loads(b), stamp if ts is None else ts) for ts, b in payload]
                d.setdefault(key, []).extend(items)
            elif kind == MAP:
                m = d.setdefault(key, {})
                for mk_enc, ts, b in payload:
                    m[decode_canonical(mk_enc)] = (loads(b), stamp if ts is None else ts)
            else:
                ts, b = payload
                d[key] = loads(b) if raw else (loads(b), stamp if ts is None else ts)


def _same(value: Any) -> Any:
    return value


class _HeapState:
    """Shared plumbing: the entry dict of one (state, namespace)."""

    __slots__ = ("_b", "_g", "_k", "_t")
    _b: HeapKeyedStateBackend
    _g: list[dict[Any, Any]]  # one dict per key group of the range
    _k: Any  # the backend's key context
    _t: _HeapTable

    def __init__(self, backend: HeapKeyedStateBackend, table: _HeapTable, namespace: Any):
        self._b = backend
        self._k = backend._ctx
        self._t = table
        self._g = table.entries(namespace)

    @property
    def _d(self) -> dict[Any, Any]:
        """The current key group's dict, or StateError if there is no current key."""
        kg = self._k.kg
        if kg is None:
            raise no_current_key()
        d: dict[Any, Any] = self._g[kg]
        return d

    def _current(self) -> Any:
        """The current key, or StateError if there is none."""
        key = self._k.key
        if key is NO_KEY:
            raise no_current_key()
        return key

    def clear(self) -> None:
        self._d.pop(self._current(), None)


class _HeapValueState(_HeapState, ValueState[Any]):
    """Value state without TTL: the hot path is one dict op with the current key."""

    __slots__ = ()

    def value(self) -> Any:
        k = self._k
        try:
            return self._g[k.kg].get(k.key)
        except TypeError:  # no key: the index is None
            raise no_current_key() from None

    def update(self, value: Any) -> None:
        k = self._k
        try:
            d = self._g[k.kg]
        except TypeError:
            raise no_current_key() from None
        if value is None:
            d.pop(k.key, None)
        else:
            d[k.key] = value


if _heapfast is not None:

    class _FastValueState(_heapfast.ValueCell, ValueState[Any]):
        """Value state without TTL in C: ``value``, ``update``, ``clear`` of ``ValueCell``."""

        __slots__ = ()


class _HeapCell(_HeapState):
    """A single (value, ts) entry per key: TTL value state, reducing, aggregating."""

    __slots__ = ()

    def _read(self, *, for_write: bool = False) -> Any:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._d
        key = self._current()
        entry = d.get(key)
        if entry is None:
            return None
        if not t.has_ttl:
            return entry[0]
        now = t.now()
        if t.expired(entry[1], now):
            del d[key]
            # A write (reduce/aggregate) never folds into an expired value (Flink's rule).
            return entry[0] if (t.return_expired and not for_write) else None
        if t.update_on_read and not for_write:
            d[key] = (entry[0], now)
        return entry[0]

    def _write(self, value: Any) -> None:
        self._d[self._current()] = (value, self._t.now())


class _HeapTtlValueState(_HeapCell, TtlValueCell):
    __slots__ = ()


class _HeapReducingState(_HeapCell, ReducingCell):
    __slots__ = ()


class _HeapAggregatingState(_HeapCell, AggregatingCell):
    __slots__ = ()


class _HeapListState(_HeapState, ListState[Any]):
    """List state without TTL."""

    __slots__ = ()

    def get(self) -> list[Any]:
        lst = self._d.get(self._current())
        return list(lst) if lst else []

    def add(self, value: Any) -> None:
        k = self._k
        key = k.key
        try:
            d = self._g[k.kg]
        except TypeError:  # no key: the index is None
            raise no_current_key() from None
        if value is None:
            check_element(self._t.name, value)
        lst = d.get(key)
        if lst is None:
            d[key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        if items:
            self._d.setdefault(self._current(), []).extend(items)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        key = self._current()
        if items:
            self._d[key] = items
        else:
            self._d.pop(key, None)


class _HeapTtlListState(_HeapState, ListState[Any]):
    """List state with TTL: a timestamp per element."""

    __slots__ = ()

    def get(self) -> list[Any]:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._d
        key = self._current()
        lst = d.get(key)
        if not lst:
            return []
        now = t.now()
        expired = t.expired
        live = [e for e in lst if not expired(e[1], now)]
        out = [e[0] for e in (lst if t.return_expired else live)]
        if t.update_on_read:
            live = [(e[0], now) for e in live]
        if live:
            d[key] = live
        else:
            del d[key]
        return out

    def add(self, value: Any) -> None:
        check_element(self._t.name, value)
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        now = t.now()
        items = []
        for v in values:
            check_element(t.name, v)
            items.append((v, now))
        if items:
            self._d.setdefault(self._current(), []).extend(items)

    def update(self, values: Iterable[Any]) -> None:
        self._d.pop(self._current(), None)
        self.add_all(values)


class _HeapMapState(_HeapState, MapState[Any, Any]):
    """Map state (with or without TTL): ``map_key -> (value, ts)``."""

    __slots__ = ()

    def _map(self, create: bool) -> dict[Any, Any] | None:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._d
        key = self._current()
        m: dict[Any, Any] | None = d.get(key)
        if m is None and create:
            m = d[key] = {}
        return m

    def _drop_if_empty(self, m: dict[Any, Any]) -> None:
        if not m:
            self._d.pop(self._current(), None)

    def get(self, key: Any) -> Any:
        m = self._map(False)
        if m is None:
            return None
        entry = m.get(key)
        if entry is None:
            return None
        t = self._t
        if not t.has_ttl:
            return entry[0]
        now = t.now()
        if t.expired(entry[1], now):
            del m[key]
            self._drop_if_empty(m)
            return entry[0] if t.return_expired else None
        if t.update_on_read:
            m[key] = (entry[0], now)
        return entry[0]

    def put(self, key: Any, value: Any) -> None:
        canonical_bytes(key)  # same map-key contract as the RocksDB backend
        m = self._map(True)
        assert m is not None
        m[key] = (value, self._t.now())

    def put_all(self, mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        pairs = list(mapping.items() if isinstance(mapping, Mapping) else mapping)
        for k, _ in pairs:
            canonical_bytes(k)
        if not pairs:
            return
        m = self._map(True)
        assert m is not None
        now = self._t.now()
        for k, v in pairs:
            m[k] = (v, now)

    def remove(self, key: Any) -> None:
        m = self._map(False)
        if m is not None and m.pop(key, None) is not None:
            self._drop_if_empty(m)

    def contains(self, key: Any) -> bool:
        m = self._map(False)
        if m is None or key not in m:
            return False
        t = self._t
        if not t.has_ttl:
            return True
        if t.expired(m[key][1], t.now()):
            if t.return_expired:
                return True
            del m[key]
            self._drop_if_empty(m)
            return False
        return True

    def items(self) -> Iterator[tuple[Any, Any]]:
        m = self._map(False)
        if not m:
            return iter(())
        t = self._t
        if not t.has_ttl:
            return iter([(k, e[0]) for k, e in m.items()])
        now = t.now()
        out = []
        for k, (v, ts) in list(m.items()):
            if t.expired(ts, now):
                del m[k]
                if t.return_expired:
                    out.append((k, v))
            else:
                out.append((k, v))
                if t.update_on_read:
                    m[k] = (v, now)
        self._drop_if_empty(m)
        return iter(out)

    def is_empty(self) -> bool:
        for _ in self.items():
            return False
        return True


class HeapKeyedStateBackend(KeyedStateBackend):
    """Keyed state in Python dicts, one per key group (see the module docstring).

    ``HeapKeyedStateBackend(max_parallelism=128, key_group_range=r, clock=None)``;
    the clock (anything with ``now()`` in seconds) is the processing time of TTL.

    Example: state written, snapshotted and restored into a new backend.

    >>> from asyncio_ops.state import HeapKeyedStateBackend, KeyGroupRange, ValueStateDescriptor
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> count = backend.get_state(ValueStateDescriptor("count"))
    >>> backend.set_current_key("user-1")
    >>> count.update(3)
    >>> blobs = backend.snapshot()  # {key_group: blob}
    >>> restored = HeapKeyedStateBackend(max_parallelism=128,
    ...                                  key_group_range=KeyGroupRange(0, 127))
    >>> restored.restore(blobs)
    1
    >>> again = restored.get_state(ValueStateDescriptor("count"))
    >>> restored.set_current_key("user-1")
    >>> again.value()
    3
    """

    def __init__(
        self,
        *,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> None:
        # The key context comes first: the base class sets the current key through it.
        cache: dict[Any, tuple[int, bytes]] = {}
        self._fast = in_use(_heapfast)
        context = _heapfast.KeyContext if self._fast else _PyKeyContext
        self._ctx: Any = context(NO_KEY, cache, self._validate_new_key, no_current_key)
        super().__init__(
            max_parallelism=max_parallelism, key_group_range=key_group_range, clock=clock
        )
        self._key_cache = cache
        # The context's method itself (C when built): no Python frame per record.
        self.set_current_key = self._ctx.set_current_key  # type: ignore[method-assign,assignment]

    @property
    def _key(self) -> Any:
        return self._ctx.key

    @_key.setter
    def _key(self, key: Any) -> None:
        if key is NO_KEY:
            self._ctx.reset()
        else:
            self._ctx.set_current_key(key)

    def _create_table(self, descriptor: StateDescriptor) -> _HeapTable:
        return _HeapTable(self, descriptor)

    def _make_state(self, table: _HeapTable, namespace: Any) -> State:
        kind = table.kind
        if kind == VALUE:
            if table.raw:
                if self._fast:
                    return _FastValueState(self._ctx, table.entries(namespace))
                return _HeapValueState(self, table, namespace)
            return _HeapTtlValueState(self, table, namespace)
        if kind == LIST:
            if table.raw:
                return _HeapListState(self, table, namespace)
            return _HeapTtlListState(self, table, namespace)
        if kind == MAP:
            return _HeapMapState(self, table, namespace)
        if kind == REDUCING:
            return _HeapReducingState(self, table, namespace)
        if kind == AGGREGATING:
            return _HeapAggregatingState(self, table, namespace)
        raise AssertionError(kind)  # pragma: no cover - descriptors validate kinds

    def _keys(self, table: _HeapTable, namespace: Any) -> Iterator[Any]:
        groups = table.namespaces.get(namespace)
        if groups is None:
            return iter(())
        return iter([k for d in groups for k in d])

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` the key that state reads and writes.

        Raises :class:`UnsupportedKeyError` for a key with no canonical encoding
        and :class:`KeyGroupError` for a key outside this backend's key-group
        range; the current key is unchanged then. (Each instance replaces this
        method by its key context's: see the module docstring.)
        """
        self._ctx.set_current_key(key)

    def _validate_new_key(self, key: Any) -> None:
        """A key the context has not seen: validate it (and cache it) or raise."""
        try:
            if key not in self._key_cache:
                self._new_key_entry(key)  # KeyGroupError / UnsupportedKeyError
        except TypeError:  # unhashable (or unsupported): canonical_bytes names the type
            canonical_bytes(key)
            raise UnsupportedKeyError(  # pragma: no cover - hashable tuple of unhashables
                f"key {key!r} is not hashable"
            ) from None

    def _dump_groups(self, key_groups: Collection[int] | None = None) -> dict[int, list[StateDump]]:
        out: dict[int, list[StateDump]] = {}
        located: dict[Any, tuple[int, bytes]] = {}
        enc: dict[Any, bytes] = {}

        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            for kg, entries in table.dump(located, enc, key_groups).items():
                out.setdefault(kg, []).append(
                    (table.name, table.kind, table.has_ttl, entries, table.typing)
                )
        return out

    def value_runs(self, key_group: int) -> list[ValueRun] | None:
        """A key group of value states without TTL and integer keys as columns: per state
        and namespace its keys' canonical bytes sorted (as :meth:`_HeapTable.dump` sorts
        them) and its values in that order, a pass in C over the keys instead of an
        encoding and a tuple per key."""
        self._check_open()
        if self._pending:  # restored states not registered yet: dump() merges them
            return None
        index = key_group - self.key_group_range.start
        runs: list[ValueRun] = []
        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            if table.kind != VALUE or not table.raw:
                return None
            for ns, groups in table.namespaces.items():
                d = groups[index]
                if not d:
                    continue
                found = int_key_column(list(d))
                if found is None:
                    return None
                order, keys = found
                values = list(map(list(d.values()).__getitem__, order))
                if table.typing is None:
                    try:
                        values = table.dump_values(values)
                    except StateError as exc:
                        raise StateError(f"{exc} (snapshot of key group {key_group})") from exc
                runs.append(
                    ValueRun(table.name, table.kind, table.typing, keys, canonical_bytes(ns),
                             values)
                )  # fmt: skip
        return runs

    def _dump_keys(
        self, keys: Mapping[int, Sequence[tuple[Any, bytes]]]
    ) -> dict[int, list[StateDump]]:
        out: dict[int, list[StateDump]] = {}
        enc: dict[Any, bytes] = {}
        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            for kg, entries in table.dump_keys(keys, enc).items():
                out.setdefault(kg, []).append(
                    (table.name, table.kind, table.has_ttl, entries, table.typing)
                )
        return out

    def _remove_keys(self, key_group: int, keys: Sequence[tuple[Any, bytes]]) -> None:
        index = key_group - self.key_group_range.start
        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            for groups in table.namespaces.values():
                d = groups[index]
                for key, _ in keys:
                    d.pop(key, None)

    def _clear_key_group(self, key_group: int) -> None:
        index = key_group - self.key_group_range.start
        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            for groups in table.namespaces.values():
                groups[index].clear()

    def track_changes(self, keys: bool = True) -> None:
        super().track_changes(keys)
        self._ctx.touched = self._touched

    def take_touched(self) -> set[Any]:
        touched = super().take_touched()
        self._ctx.touched = self._touched
        return touched

    def _load_entries(self, table: _HeapTable, kg: int, entries: list[Entry]) -> None:
        table.load(kg, entries)

    def __repr__(self) -> str:
        r = self.key_group_range
        return (
            f"HeapKeyedStateBackend(max_parallelism={self.max_parallelism}, "
            f"key_group_range={r.start}..{r.end}, states={sorted(self._tables)})"
        )
