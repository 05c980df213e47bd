"""The typed Arrow tables of state snapshots (never a pickle), one per container kind.

:func:`table` turns a kind's payload into its Arrow table (one section of a
container, ``asyncio_ops._storage._container``); :func:`read` turns a verified
section's table back into the payload, checking the schema and every value,
and raises :class:`CorruptStateError` (naming ``where``) for anything else.
Reading runs no code: values come back as str, bytes, float and bool. User
values stay the bytes their descriptor's serializer wrote (pickle by default:
that serializer, not the container, is where user code could be trusted or
not; see ``_serializers``).

Tables, one row per item:

- ``KEYED_STATE`` (one key group's keyed state, a list of ``(state, kind,
  has_ttl, entries)``): ``state``, ``kind``, ``has_ttl``, ``key`` and
  ``namespace`` (canonical bytes), ``map_key`` (map state only), ``ts`` (the
  TTL timestamp, or null), ``value`` (the serializer's bytes) and ``entry``
  (which entry of its state the row is of). A value-like entry is one row; a
  list entry one row per element and a map entry one row per map entry,
  consecutive and in order.
- ``KEY_GROUPS`` (one key group of an operator: ``(state, timers, replaced)``):
  the rows of its keyed state as above (``row`` 0), one row per timer (``row``
  1: ``domain``, ``key``, ``namespace``, ``timestamp``; a timer's key and
  namespace must be canonically encodable, see ``_keygroups.canonical_bytes``)
  and, in a delta, one row per key it replaces whole (``row`` 2: ``key``).
- ``OPERATOR_STATE`` (a list of ``(state, mode, items)``): ``state``, ``mode``
  and ``item`` (the serializer's bytes), one row per item, in order.

Typed state (a descriptor with a type, ``_types``): its rows have a null
``value``, and the table has one more column per typed state in it, named
``typed:<state>``, of the state's Arrow type (a map state's key type in the
field's metadata, ``aops.key_type``; its map keys stay canonical bytes in
``map_key``), holding the value (list element, map value) on that state's
rows and null elsewhere. So a typed value is an Arrow value of its declared
type, never bytes, and the type travels with the data: a restore knows what
it reads and converts it into a changed declaration (``_types.evolution``).

A key group's full state of value states without TTL can also come as columns
(:func:`value_key_group_table`, from a backend's ``value_runs``): the same
table, built without a tuple per entry (a bulk load's full snapshot).

One module with one job: the payloads' tables, both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._exceptions import CorruptStateError
from .._keygroups import canonical_bytes
from .._storage._container import KEY_GROUP_FIELD, Kind
from ._keycodec import decode_canonical
from ._types import StateType

__all__ = [
    "KeyGroupPayload",
    "ValueRun",
    "key_groups_table",
    "read",
    "table",
    "value_key_group_table",
]

_ENTRY_FIELDS: Final = [
    pa.field("state", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("has_ttl", pa.bool_(), nullable=False),
    pa.field("key", pa.binary(), nullable=False),
    pa.field("namespace", pa.binary(), nullable=False),
    pa.field("map_key", pa.binary()),
    pa.field("ts", pa.float64()),
    pa.field("value", pa.binary(), nullable=False),
    # which entry of its state a row is of: a new entry where the value changes from the
    # row before (written as the entry's number modulo 2, which compresses to nothing)
    pa.field("entry", pa.int64(), nullable=False),
]
KEYED_STATE_SCHEMA: Final = pa.schema(_ENTRY_FIELDS)
# with typed states' columns beside: their rows have no bytes
_TYPED_KEYED_STATE_SCHEMA: Final = pa.schema(
    [f.with_nullable(True) if f.name == "value" else f for f in _ENTRY_FIELDS]
)
_ENTRY: Final = 0
_TIMER: Final = 1
_REPLACED: Final = 2
KEY_GROUP_SCHEMA: Final = pa.schema(
    [
        pa.field("row", pa.int8(), nullable=False),  # 0 state entry, 1 timer, 2 replaced key
        *(f if f.name == "key" else f.with_nullable(True) for f in _ENTRY_FIELDS),
        pa.field("domain", pa.string()),
        pa.field("timestamp", pa.float64()),
    ]
)
OPERATOR_STATE_SCHEMA: Final = pa.schema(
    [
        pa.field("state", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("item", pa.binary()),  # null: a state with no items
    ]
)

_PARITY: Final = ([0, 1], [1, 0])  # entries n, n + 1 from an even and an odd n
_FIRST: Final = itemgetter(0)
_SECOND: Final = itemgetter(1)
_THIRD: Final = itemgetter(2)
_LIST: Final = "list"
_MAP: Final = "map"

_TYPED: Final = "typed:"  # the prefix of a typed state's column
_KEY_TYPE: Final = b"aops.key_type"
Typed = dict[str, tuple[Any, list[tuple[int, list[Any]]]]]
"""Per typed state: its typing (value type, key type) and runs ``(first row, values)``."""

KeyGroupPayload = tuple[list[Any], list[tuple[str, Any, Any, float]], list[bytes] | None]
"""One key group of an operator: its keyed state (``(state, kind, has_ttl, entries, typing)``
dumps), its timers ``(domain, key, namespace, timestamp)`` and, in a delta, the
canonical bytes of the keys it replaces whole (None: the key group's full state)."""


def _columns(schema: pa.Schema, table: pa.Table, where: str) -> dict[str, list[Any]]:
    if not table.schema.remove_metadata().equals(schema):
        raise CorruptStateError(
            f"{where}: snapshot payload has the columns {table.schema.names} "
            f"({table.schema.types}), expected {schema.names}"
        )
    columns: dict[str, list[Any]] = table.to_pydict()
    return columns


# -- keyed state ---------------------------------------------------------------------------
def _entry_columns(dumps: list[Any], cols: dict[str, list[Any]], typed: Typed) -> int:
    """Append the rows of ``dumps`` to ``cols`` (the keyed-state columns), a typed state's
    values to ``typed`` instead; returns how many."""
    n = 0
    rows = 0
    for name, kind, has_ttl, entries, typing in dumps:
        if typing is not None:
            start = len(cols["state"])
            typed_values: list[Any] = []
            run = typed.setdefault(name, (typing, []))
            if run[0] != typing:
                raise CorruptStateError(f"state {name!r} is written with two types")
            run[1].append((start, typed_values))
            entries = _split_values(kind, entries, typed_values)
        if kind != _LIST and kind != _MAP:  # one row per entry: column by column
            count = len(entries)
            if count:  # a pass per field (zip(*entries) spread 4x slower per row)
                keys = list(map(_FIRST, entries))
                nss = list(map(_SECOND, entries))
                datas = list(map(_THIRD, entries))
                stamps = list(map(_FIRST, datas))
                values = list(map(_SECOND, datas))
                cols["state"] += [name] * count
                cols["kind"] += [kind] * count
                cols["has_ttl"] += [bool(has_ttl)] * count
                cols["key"] += keys
                cols["namespace"] += nss
                cols["map_key"] += [None] * count
                cols["ts"] += stamps
                cols["value"] += values
                cols["entry"] += _PARITY[n & 1] * (count // 2) + _PARITY[n & 1][: count & 1]
                n += count
                rows += count
            continue
        for key, ns, data in entries:
            if kind == _LIST:
                items = [(None, ts, value) for ts, value in data]
            elif kind == _MAP:
                items = list(data)
            else:
                ts, value = data
                items = [(None, ts, value)]
            for map_key, ts, value in items:
                cols["state"].append(name)
                cols["kind"].append(kind)
                cols["has_ttl"].append(bool(has_ttl))
                cols["key"].append(key)
                cols["namespace"].append(ns)
                cols["map_key"].append(map_key)
                cols["ts"].append(ts)
                cols["value"].append(value)
                cols["entry"].append(n & 1)
                rows += 1
            n += 1
    return rows


def _split_values(kind: str, entries: list[Any], values: list[Any]) -> list[Any]:
    """A typed state's ``entries`` with each value replaced by None, the values appended
    to ``values`` in row order."""
    out: list[Any] = []
    if kind == _LIST:
        for key, ns, data in entries:
            values.extend(v for _, v in data)
            out.append((key, ns, [(ts, None) for ts, _ in data]))
    elif kind == _MAP:
        for key, ns, data in entries:
            values.extend(v for _, _, v in data)
            out.append((key, ns, [(mk, ts, None) for mk, ts, _ in data]))
    else:
        for key, ns, (ts, v) in entries:
            values.append(v)
            out.append((key, ns, (ts, None)))
    return out


def _with_typed(table: pa.Table, typed: Typed) -> pa.Table:
    """``table`` with a column per typed state (see the module docstring)."""
    if not typed:
        return table
    total = table.num_rows
    for name, ((value_type, key_type), runs) in sorted(typed.items()):
        t: pa.DataType = value_type.arrow
        parts: list[pa.Array] = []
        at = 0
        for start, values in runs:
            if start > at:
                parts.append(pa.nulls(start - at, t))
            try:
                parts.append(value_type.column(values))
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise CorruptStateError(
                    f"state {name!r}: a value does not fit its type {value_type.ddl}: {exc}"
                ) from exc
            at = start + len(values)
        if total > at:
            parts.append(pa.nulls(total - at, t))
        meta = {_KEY_TYPE: key_type.ddl.encode()} if key_type is not None else None
        column = pa.concat_arrays(parts) if parts else pa.nulls(0, t)
        table = table.append_column(pa.field(_TYPED + name, t, metadata=meta), column)
    return table


def _keyed_state_table(dumps: list[Any]) -> pa.Table:
    cols: dict[str, list[Any]] = {f.name: [] for f in KEYED_STATE_SCHEMA}
    typed: Typed = {}
    _entry_columns(dumps, cols, typed)
    schema = KEYED_STATE_SCHEMA if not typed else _TYPED_KEYED_STATE_SCHEMA
    return _with_typed(pa.table(cols, schema=schema), typed)


def _split(
    table: pa.Table, schemas: Sequence[pa.Schema], where: str
) -> tuple[pa.Table, dict[str, tuple[Any, pa.ChunkedArray]]]:
    """``table``'s own columns (one of ``schemas``, CorruptStateError otherwise) and its
    typed states' columns ``{state: ((value type, key type), column)}``."""
    typed: dict[str, tuple[Any, pa.ChunkedArray]] = {}
    names = table.schema.names
    own = [i for i, n in enumerate(names) if not n.startswith(_TYPED)]
    base = table.select(own) if len(own) != len(names) else table
    for i, field in enumerate(table.schema):
        if not field.name.startswith(_TYPED):
            continue
        try:
            value_type = StateType.from_arrow(field.type)
            raw_key = (field.metadata or {}).get(_KEY_TYPE)
            key_type = StateType.of(raw_key.decode()) if raw_key else None
        except Exception as exc:
            raise CorruptStateError(f"{where}: typed column {field.name!r}: {exc}") from exc
        typed[field.name[len(_TYPED) :]] = ((value_type, key_type), table.column(i))
    bare = base.schema.remove_metadata()
    if not any(bare.equals(s) for s in schemas):
        _columns(schemas[0], base, where)  # raises, naming the columns
    return base, typed


def _typed_values(base: pa.Table, typed: dict[str, tuple[Any, pa.ChunkedArray]]) -> list[Any]:
    """The ``value`` of every row, a typed state's rows from its own column."""
    values: list[Any] = base.column("value").to_pylist()
    states = base.column("state")
    for name, ((value_type, _), column) in typed.items():
        rows = pc.indices_nonzero(pc.fill_null(pc.equal(states, name), False)).to_pylist()
        if rows:
            for row, v in zip(rows, value_type.values(column.take(rows)), strict=True):
                values[row] = v
    return values


def _dumps(
    rows: Sequence[tuple[Any, ...]], where: str, typings: Mapping[str, Any] | None = None
) -> list[Any]:
    """``(state, kind, has_ttl, key, ns, map_key, ts, value, entry)`` rows back to dumps
    (``typings``: the typed states' types; their values are values, not bytes)."""
    typings = typings or {}
    dumps: dict[str, tuple[str, bool, list[Any]]] = {}
    last_entry = -1
    current: list[Any] | None = None
    for state, kind, has_ttl, key, ns, map_key, ts, value, entry in rows:
        if (
            state is None
            or kind is None
            or has_ttl is None
            or ns is None
            or (value is None and state not in typings)
        ):
            raise CorruptStateError(f"{where}: a state entry lacks its state, kind or value")
        dump = dumps.get(state)
        if dump is None:
            dump = dumps[state] = (kind, has_ttl, [])
        elif dump[0] != kind:
            raise CorruptStateError(f"{where}: state {state!r} has rows of two kinds")
        if kind == _MAP and map_key is None:
            raise CorruptStateError(f"{where}: map state {state!r} has an entry without a key")
        if entry != last_entry:
            last_entry = entry
            if kind in (_LIST, _MAP):
                current = []
                dump[2].append((key, ns, current))
            else:
                current = None
                dump[2].append((key, ns, (ts, value)))
                continue
        elif current is None:
            raise CorruptStateError(f"{where}: state {state!r} repeats a single-value entry")
        current.append((ts, value) if kind == _LIST else (map_key, ts, value))
    return [
        (name, kind, has_ttl, entries, typings.get(name))
        for name, (kind, has_ttl, entries) in dumps.items()
    ]


def _read_keyed_state(table: pa.Table, where: str) -> list[Any]:
    base, typed = _split(table, [KEYED_STATE_SCHEMA, _TYPED_KEYED_STATE_SCHEMA], where)
    c = base.to_pydict()
    if typed:
        c["value"] = _typed_values(base, typed)
    typings = {name: typing for name, (typing, _) in typed.items()}
    return _dumps(
        list(zip(c["state"], c["kind"], c["has_ttl"], c["key"], c["namespace"],
                 c["map_key"], c["ts"], c["value"], c["entry"], strict=True)),
        where, typings,
    )  # fmt: skip


# -- key groups (keyed state, timers and replaced keys of one key group) --------------------
def _canonical(value: Any, what: str) -> bytes:
    try:
        return canonical_bytes(value)
    except Exception as exc:
        raise CorruptStateError(
            f"a timer's {what} {value!r:.100} cannot be written: {exc}"
        ) from exc


def _key_group_table(payload: KeyGroupPayload) -> pa.Table:
    cols: dict[str, list[Any]] = {f.name: [] for f in KEY_GROUP_SCHEMA}
    typed: Typed = {}
    _append_key_group(cols, typed, payload)
    return _with_typed(pa.table(cols, schema=KEY_GROUP_SCHEMA), typed)


class ValueRun(NamedTuple):
    """One state's entries in one namespace of a key group, as columns (for
    :func:`value_key_group_table`): a value-like state without TTL, one row per entry."""

    state: str
    kind: str
    typing: Any  # (value type, key type) of a typed state, None: untyped
    keys: pa.Array  # the keys' canonical bytes (binary), in the order the rows are written
    namespace: pa.Array | bytes  # the namespaces' canonical bytes (binary), or one for all
    values: list[Any]  # the serializer's bytes, or a typed state's normalised values


def value_key_group_table(runs: Sequence[ValueRun]) -> pa.Table:
    """The ``KEY_GROUPS`` table of one key group's full state, no timers, when every run
    of it is a value-like state without TTL: the same table :func:`table` builds from the
    dumps of those entries (``(state, kind, False, [(key, ns, (None, value)), ...],
    typing)`` per run, in order), built column by column instead of row by row."""
    total = sum(len(run.keys) for run in runs)
    cols: dict[str, Any] = {
        "row": np.zeros(total, np.int8),
        "state": [], "kind": [], "has_ttl": [False] * total, "key": [], "namespace": [],
        "map_key": pa.nulls(total, pa.binary()), "ts": pa.nulls(total, pa.float64()),
        "value": [], "entry": np.arange(total, dtype=np.int64) & 1,
        "domain": pa.nulls(total, pa.string()), "timestamp": pa.nulls(total, pa.float64()),
    }  # fmt: skip
    typed: Typed = {}
    at = 0
    for run in runs:
        count = len(run.keys)
        cols["state"] += [run.state] * count
        cols["kind"] += [run.kind] * count
        cols["key"].append(run.keys.cast(pa.binary()))
        ns = run.namespace
        cols["namespace"].append(
            pa.array([ns] * count, pa.binary()) if isinstance(ns, bytes) else ns.cast(pa.binary())
        )
        if run.typing is not None:
            slot = typed.setdefault(run.state, (run.typing, []))
            if slot[0] != run.typing:
                raise CorruptStateError(f"state {run.state!r} is written with two types")
            slot[1].append((at, run.values))
            cols["value"] += [None] * count
        else:
            cols["value"] += run.values
        at += count
    for name in ("key", "namespace"):
        parts = cols[name]
        cols[name] = pa.concat_arrays(parts) if parts else pa.array([], pa.binary())
    return _with_typed(pa.table(cols, schema=KEY_GROUP_SCHEMA), typed)


def key_groups_table(payloads: Sequence[tuple[int, KeyGroupPayload]]) -> pa.Table:
    """One table of several key groups' payloads (``(key group, payload)`` in key-group
    order): each one's rows as :func:`table` writes them, and the int32 column
    ``KEY_GROUP_FIELD`` saying whose (a SHARED section, ``_container.split_shared``)."""
    cols: dict[str, list[Any]] = {f.name: [] for f in KEY_GROUP_SCHEMA}
    typed: Typed = {}
    groups: list[int] = []
    for kg, payload in payloads:
        groups += [kg] * _append_key_group(cols, typed, payload)
    out = pa.table(cols, schema=KEY_GROUP_SCHEMA).append_column(
        pa.field(KEY_GROUP_FIELD, pa.int32(), nullable=False), pa.array(groups, pa.int32())
    )
    return _with_typed(out, typed)


def _append_key_group(cols: dict[str, list[Any]], typed: Typed, payload: KeyGroupPayload) -> int:
    """Append one key group's rows to ``cols``: its entries, its timers, then (a delta)
    the keys it replaces that neither names; returns how many rows."""
    dumps, timers, replaced = payload
    first = len(cols["key"])
    entries = _entry_columns(dumps, cols, typed)
    domains: list[str] = []
    stamps: list[float] = []
    for domain, key, namespace, ts in timers:
        cols["key"].append(_canonical(key, "key"))
        cols["namespace"].append(_canonical(namespace, "namespace"))
        domains.append(domain)
        stamps.append(float(ts))
    timer_rows = len(domains)
    if replaced:  # a delta: a key with entries or timers here is named by them alone
        named = set(cols["key"][first:])
        cols["key"] += [enc for enc in replaced if enc not in named]
    others = len(cols["key"]) - first - entries
    for name in ("state", "kind", "has_ttl", "map_key", "ts", "value", "entry"):
        cols[name] += [None] * others
    cols["namespace"] += [None] * (others - timer_rows)
    for name, values in (("domain", domains), ("timestamp", stamps)):
        cols[name] += [None] * entries + values + [None] * (others - timer_rows)
    cols["row"] += [_ENTRY] * entries + [_TIMER] * timer_rows + [_REPLACED] * (others - timer_rows)
    return len(cols["key"]) - first


def _value_entries(table: pa.Table, where: str) -> list[Any] | None:
    """The dumps of ``table``'s rows (``KEY_GROUP_SCHEMA``, entry rows only) when every
    state in it is value-like (one row per entry), read column by column; None when a
    list or map state is among them (:func:`_dumps` reads those row by row). The same
    checks as :func:`_dumps`: every value present, one kind per state, no entry twice."""
    if not table.num_rows:
        return []
    kinds = table.column("kind")
    if kinds.null_count or {_LIST, _MAP} & set(kinds.unique().to_pylist()):
        return None
    for name in ("state", "has_ttl", "namespace", "value", "entry"):
        if table.column(name).null_count:
            raise CorruptStateError(f"{where}: a state entry lacks its state, kind or value")
    entry = table.column("entry").combine_chunks()
    if len(entry) > 1 and not pc.all(pc.not_equal(entry[1:], entry[:-1])).as_py():
        raise CorruptStateError(f"{where}: a state repeats a single-value entry")
    states = table.column("state").to_pylist()
    kind_list = kinds.to_pylist()
    ttl = table.column("has_ttl").to_pylist()
    pairs = zip(table.column("ts").to_pylist(), table.column("value").to_pylist(), strict=True)
    rows = list(zip(table.column("key").to_pylist(), table.column("namespace").to_pylist(),
                    pairs, strict=True))  # fmt: skip
    dumps: dict[str, tuple[str, bool, list[Any]]] = {}
    if len(table.column("state").unique()) == 1 and len(kinds.unique()) == 1:
        return [(states[0], kind_list[0], ttl[0], rows, None)]  # one state: one run
    start = 0
    n = len(states)
    while start < n:  # runs of one state (a dump's rows are consecutive)
        name = states[start]
        end = start + 1
        while end < n and states[end] == name:
            end += 1
        dump = dumps.get(name)
        if dump is None:
            dump = dumps[name] = (kind_list[start], ttl[start], [])
        if any(k != dump[0] for k in kind_list[start:end]):
            raise CorruptStateError(f"{where}: state {name!r} has rows of two kinds")
        dump[2].extend(rows[start:end])
        start = end
    return [
        (name, kind, has_ttl, entries, None) for name, (kind, has_ttl, entries) in dumps.items()
    ]


def _read_key_group(table: pa.Table, where: str) -> KeyGroupPayload:
    if not table.schema.remove_metadata().equals(KEY_GROUP_SCHEMA):
        base, typed = _split(table, [KEY_GROUP_SCHEMA], where)
        if typed:  # typed states: row by row, their values from their columns
            return _read_key_group_rows(base, where, typed)
        _columns(KEY_GROUP_SCHEMA, table, where)  # raises, naming the columns
    # The writer puts entry rows first: read them column by column when they are all
    # of value-like states (the common case), the timers and replaced keys after.
    kinds = table.column("row").combine_chunks()
    entries_n = pc.sum(pc.equal(kinds, _ENTRY)).as_py() or 0
    if not pc.any(pc.not_equal(kinds[:entries_n], _ENTRY)).as_py():
        dumps = _value_entries(table.slice(0, entries_n), where)
        if dumps is not None:
            timers, replaced, rest = _timers_and_replaced(table.slice(entries_n), where)
            if not rest:
                return dumps, timers, replaced
    return _read_key_group_rows(table, where)


def _timers_and_replaced(
    table: pa.Table, where: str
) -> tuple[list[tuple[str, Any, Any, float]], list[bytes], bool]:
    """The timer and replaced-key rows of ``table``; True third if an entry row is
    among them (then the rows are read one by one)."""
    timers: list[tuple[str, Any, Any, float]] = []
    replaced: list[bytes] = []
    if not table.num_rows:
        return timers, replaced, False
    c = table.select(["row", "key", "namespace", "domain", "timestamp"]).to_pydict()
    for row, key, namespace, domain, ts in zip(
        c["row"], c["key"], c["namespace"], c["domain"], c["timestamp"], strict=True
    ):
        if row == _TIMER:
            if domain is None or namespace is None or ts is None:
                raise CorruptStateError(f"{where}: a timer lacks its domain, namespace or time")
            timers.append((domain, decode_canonical(key), decode_canonical(namespace), ts))
        elif row == _REPLACED:
            replaced.append(key)
        elif row == _ENTRY:
            return timers, replaced, True
        else:
            raise CorruptStateError(f"{where}: a row of unknown kind {row}")
    return timers, replaced, False


def _read_key_group_rows(
    table: pa.Table, where: str, typed: dict[str, tuple[Any, pa.ChunkedArray]] | None = None
) -> KeyGroupPayload:
    c = _columns(KEY_GROUP_SCHEMA, table, where)
    if typed:
        c["value"] = _typed_values(table, typed)
    typings = {name: typing for name, (typing, _) in (typed or {}).items()}
    entries: list[tuple[Any, ...]] = []
    timers: list[tuple[str, Any, Any, float]] = []
    replaced: list[bytes] = []
    for i, row in enumerate(c["row"]):
        key = c["key"][i]
        if row == _ENTRY:
            entries.append(
                (c["state"][i], c["kind"][i], c["has_ttl"][i], key, c["namespace"][i],
                 c["map_key"][i], c["ts"][i], c["value"][i], c["entry"][i])
            )  # fmt: skip
        elif row == _TIMER:
            domain, namespace, ts = c["domain"][i], c["namespace"][i], c["timestamp"][i]
            if domain is None or namespace is None or ts is None:
                raise CorruptStateError(f"{where}: a timer lacks its domain, namespace or time")
            timers.append((domain, decode_canonical(key), decode_canonical(namespace), ts))
        elif row == _REPLACED:
            replaced.append(key)
        else:
            raise CorruptStateError(f"{where}: a row of unknown kind {row}")
    return _dumps(entries, where, typings), timers, replaced


# -- operator state -------------------------------------------------------------------------
def _operator_state_table(payload: list[Any]) -> pa.Table:
    cols: dict[str, list[Any]] = {f.name: [] for f in OPERATOR_STATE_SCHEMA}
    for name, mode, items in payload:
        for item in list(items) or [None]:
            cols["state"].append(name)
            cols["mode"].append(mode)
            cols["item"].append(item)
    return pa.table(cols, schema=OPERATOR_STATE_SCHEMA)


def _read_operator_state(table: pa.Table, where: str) -> list[Any]:
    cols = _columns(OPERATOR_STATE_SCHEMA, table, where)
    out: dict[str, tuple[str, list[bytes]]] = {}
    for name, mode, item in zip(cols["state"], cols["mode"], cols["item"], strict=True):
        entry = out.setdefault(name, (mode, []))
        if entry[0] != mode:
            raise CorruptStateError(f"{where}: operator state {name!r} has two modes")
        if item is not None:
            entry[1].append(item)
    return [(name, mode, items) for name, (mode, items) in out.items()]


def table(kind: Kind, payload: Any) -> pa.Table:
    """The Arrow table of a payload of ``kind`` (``KEYED_STATE``, ``KEY_GROUPS``,
    ``OPERATOR_STATE``)."""
    return _TABLES[kind](payload)


def read(kind: Kind, data: pa.Table, where: str) -> Any:
    """The payload back from :func:`table`'s table; CorruptStateError naming ``where``."""
    return _READERS[kind](data, where)


_TABLES: Final[dict[Kind, Callable[[Any], pa.Table]]] = {
    Kind.KEYED_STATE: _keyed_state_table,
    Kind.KEY_GROUPS: _key_group_table,
    Kind.OPERATOR_STATE: _operator_state_table,
}
_READERS: Final[dict[Kind, Callable[[pa.Table, str], Any]]] = {
    Kind.KEYED_STATE: _read_keyed_state,
    Kind.KEY_GROUPS: _read_key_group,
    Kind.OPERATOR_STATE: _read_operator_state,
}
