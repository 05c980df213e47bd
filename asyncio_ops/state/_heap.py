"""The heap backend: state in Python dicts, one dict per key group.

Layout: per state, per namespace, a list with one dict per key group of the
backend's range, mapping key -> stored entry. ``set_current_key`` caches the
key group's index, so a state access is one list index and one dict lookup.

Stored entries (``ts`` is the last-access timestamp of TTL state):

- value without TTL: the value itself; with TTL: ``(value, ts)``
- list without TTL: a list of elements; with TTL: a list of ``(element, ts)``
- map: a dict ``map_key -> (value, ts)``
- reducing, aggregating: ``(value_or_accumulator, ts)``

(``ts`` is 0.0 where there is no TTL.) Values are stored by reference, as in
Flink's heap backend: a value read from state and mutated in place changes the
state. Serializers run only in ``snapshot`` and ``restore``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .._clock import Clock
from .._exceptions import StateError
from .._keygroups import KeyGroupRange, canonical_bytes
from ._api import AggregatingState, ListState, MapState, ReducingState, State, ValueState
from ._backend import (
    Entry,
    KeyedStateBackend,
    StateDump,
    TableBase,
    check_element,
    no_current_key,
)
from ._descriptors import (
    AGGREGATING,
    LIST,
    MAP,
    REDUCING,
    VALUE,
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from ._keycodec import decode_canonical

__all__ = ["HeapKeyedStateBackend"]


class _HeapTable(TableBase):
    def __init__(self, backend: HeapKeyedStateBackend, descriptor: StateDescriptor) -> None:
        super().__init__(backend, descriptor)
        self.n_groups = backend._n_groups
        self.namespaces: dict[Any, list[dict[Any, Any]]] = {}
        self._cursor: Iterator[tuple[dict[Any, Any], Any]] | None = None
        # Which stored form this table uses (see module docstring).
        self.raw = not self.has_ttl and self.kind in (VALUE, LIST)

    def groups(self, namespace: Any) -> list[dict[Any, Any]]:
        g = self.namespaces.get(namespace)
        if g is None:
            g = self.namespaces[namespace] = [{} for _ in range(self.n_groups)]
        return g

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
    def dump(self, kgi: int, enc: dict[Any, bytes]) -> list[Entry]:
        """Logical entries of key group index ``kgi`` (expired ones dropped if configured)."""
        out: list[Entry] = []
        dumps = self.dumps
        has_ttl = self.has_ttl
        drop = self.full_snapshot_cleanup
        now = self.now()
        expired = self.expired
        kind = self.kind

        def e(x: Any) -> bytes:
            b = enc.get(x)
            if b is None:
                b = enc[x] = canonical_bytes(x)
            return b

        for ns, groups in self.namespaces.items():
            d = groups[kgi]
            if not d:
                continue
            ns_enc = canonical_bytes(ns)
            for key, entry in d.items():
                payload: Any
                if kind == LIST:
                    if self.raw:
                        payload = [(None, dumps(x)) for x in entry]
                    else:
                        payload = [
                            (ts, dumps(x)) for x, ts in entry if not (drop and expired(ts, now))
                        ]
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
                elif self.raw:
                    payload = (None, dumps(entry))
                else:
                    v, ts = entry
                    if drop and expired(ts, now):
                        continue
                    payload = (ts if has_ttl else None, dumps(v))
                out.append((e(key), ns_enc, payload))
        return out

    def load(self, kgi: int, entries: list[Entry]) -> None:
        loads = self.loads
        stamp = self.now()
        kind = self.kind
        for key_enc, ns_enc, payload in entries:
            key = decode_canonical(key_enc)
            d = self.groups(decode_canonical(ns_enc))[kgi]
            if kind == LIST:
                if self.raw:
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
                d[key] = loads(b) if self.raw else (loads(b), stamp if ts is None else ts)


class _HeapState:
    """Shared plumbing: the per-key-group dicts of one (state, namespace)."""

    __slots__ = ("_b", "_groups", "_t")

    def __init__(self, backend: HeapKeyedStateBackend, table: _HeapTable, namespace: Any):
        self._b = backend
        self._t = table
        self._groups = table.groups(namespace)

    def _dict(self) -> dict[Any, Any]:
        try:
            return self._groups[self._b._kgi]
        except IndexError:
            raise no_current_key() from None

    def clear(self) -> None:
        self._dict().pop(self._b._key, None)


class _HeapValueState(_HeapState, ValueState[Any]):
    """Value state without TTL: the hot path is one list index and one dict op."""

    __slots__ = ()

    def value(self) -> Any:
        b = self._b
        try:
            return self._groups[b._kgi].get(b._key)
        except IndexError:
            raise no_current_key() from None

    def update(self, value: Any) -> None:
        b = self._b
        try:
            d = self._groups[b._kgi]
        except IndexError:
            raise no_current_key() from None
        if value is None:
            d.pop(b._key, None)
        else:
            d[b._key] = value


class _HeapCell(_HeapState):
    """A single (value, ts) entry per key: TTL value state, reducing, aggregating."""

    __slots__ = ()

    def _read(self, *, for_write: bool = False) -> Any:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._dict()
        key = self._b._key
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
        self._dict()[self._b._key] = (value, self._t.now())


class _HeapTtlValueState(_HeapCell, ValueState[Any]):
    __slots__ = ()

    def value(self) -> Any:
        return self._read()

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._write(value)


class _HeapReducingState(_HeapCell, ReducingState[Any]):
    __slots__ = ("_reduce",)

    def __init__(self, backend: HeapKeyedStateBackend, table: _HeapTable, namespace: Any):
        super().__init__(backend, table, namespace)
        desc = table.descriptor
        assert isinstance(desc, ReducingStateDescriptor)
        self._reduce = desc.reduce_fn

    def get(self) -> Any:
        return self._read()

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError(f"state {self._t.name!r}: cannot add None to reducing state")
        cur = self._read(for_write=True)
        self._write(value if cur is None else self._reduce(cur, value))


class _HeapAggregatingState(_HeapCell, AggregatingState[Any, Any]):
    __slots__ = ("_agg",)

    def __init__(self, backend: HeapKeyedStateBackend, table: _HeapTable, namespace: Any):
        super().__init__(backend, table, namespace)
        desc = table.descriptor
        assert isinstance(desc, AggregatingStateDescriptor)
        self._agg = desc.aggregate_fn

    def get(self) -> Any:
        acc = self._read()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        acc = self._read(for_write=True)
        if acc is None:
            acc = self._agg.create_accumulator()
        self._write(self._agg.add(value, acc))


class _HeapListState(_HeapState, ListState[Any]):
    """List state without TTL."""

    __slots__ = ()

    def get(self) -> list[Any]:
        lst = self._dict().get(self._b._key)
        return list(lst) if lst else []

    def add(self, value: Any) -> None:
        b = self._b
        try:
            d = self._groups[b._kgi]
        except IndexError:
            raise no_current_key() from None
        if value is None:
            check_element(self._t.name, value)
        lst = d.get(b._key)
        if lst is None:
            d[b._key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        if items:
            self._dict().setdefault(self._b._key, []).extend(items)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        for v in items:
            check_element(self._t.name, v)
        d = self._dict()
        if items:
            d[self._b._key] = items
        else:
            d.pop(self._b._key, None)


class _HeapTtlListState(_HeapState, ListState[Any]):
    """List state with TTL: a timestamp per element."""

    __slots__ = ()

    def get(self) -> list[Any]:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._dict()
        key = self._b._key
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
            self._dict().setdefault(self._b._key, []).extend(items)

    def update(self, values: Iterable[Any]) -> None:
        d = self._dict()
        d.pop(self._b._key, None)
        self.add_all(values)


class _HeapMapState(_HeapState, MapState[Any, Any]):
    """Map state (with or without TTL): ``map_key -> (value, ts)``."""

    __slots__ = ()

    def _map(self, create: bool) -> dict[Any, Any] | None:
        t = self._t
        if t.incremental:
            t.cleanup_step()
        d = self._dict()
        m: dict[Any, Any] | None = d.get(self._b._key)
        if m is None and create:
            m = d[self._b._key] = {}
        return m

    def _drop_if_empty(self, m: dict[Any, Any]) -> None:
        if not m:
            self._dict().pop(self._b._key, None)

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
    """

    def __init__(
        self,
        *,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            max_parallelism=max_parallelism, key_group_range=key_group_range, clock=clock
        )

    def _create_table(self, descriptor: StateDescriptor) -> _HeapTable:
        return _HeapTable(self, descriptor)

    def _make_state(self, table: _HeapTable, namespace: Any) -> State:
        kind = table.kind
        if kind == VALUE:
            if table.raw:
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

    def _dump_groups(self) -> dict[int, list[StateDump]]:
        out: dict[int, list[StateDump]] = {}
        enc: dict[Any, bytes] = {}
        start = self._kg_start
        for table in self._tables.values():
            assert isinstance(table, _HeapTable)
            for kgi in range(self._n_groups):
                entries = table.dump(kgi, enc)
                if entries:
                    out.setdefault(start + kgi, []).append(
                        (table.name, table.kind, table.has_ttl, entries)
                    )
        return out

    def _load_entries(self, table: _HeapTable, kg: int, entries: list[Entry]) -> None:
        table.load(kg - self._kg_start, entries)

    def __repr__(self) -> str:
        r = self.key_group_range
        return (
            f"HeapKeyedStateBackend(max_parallelism={self.max_parallelism}, "
            f"key_group_range={r.start}..{r.end}, states={sorted(self._tables)})"
        )
