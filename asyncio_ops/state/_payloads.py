"""What a sealed blob carries, as one typed Arrow table per blob kind (never a pickle).

:func:`encode` turns a blob kind's payload into Arrow IPC bytes; :func:`decode`
reads them back, checking the schema and every value, and raises
:class:`CorruptStateError` (naming the key group) for anything else. Loading
a blob runs no code: the bytes are parsed as Arrow, validated, and turned into
tuples of str, bytes, float and bool. User values stay the bytes their
descriptor's serializer wrote (pickle by default: that serializer, not the
blob, is where user code could be trusted or not; see ``_serializers``).

Payloads, one row per item:

- keyed state (a list of ``(state, kind, has_ttl, entries)``): ``state``,
  ``kind``, ``has_ttl``, ``key`` and ``namespace`` (canonical bytes), ``map_key``
  (map state only), ``ts`` (the TTL timestamp, or null) and ``value`` (the
  serializer's bytes). A value-like entry is one row; a list entry one row per
  element and a map entry one row per map entry, consecutive and in order.
- keyed operator (``(state blob or None, timers)``): one row per timer,
  ``domain``, ``key`` and ``namespace`` (canonical bytes: a timer's key and
  namespace must be canonically encodable, see ``_keygroups.canonical_bytes``)
  and ``timestamp``, each with the key group's keyed-state blob in ``state``
  (one row with null timer fields when there are no timers).
- operator state (a list of ``(state, mode, items)``): ``state``, ``mode`` and
  ``item`` (the serializer's bytes), one row per item, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import pyarrow as pa

from .._exceptions import CorruptStateError
from .._keygroups import canonical_bytes
from ._keycodec import decode_canonical

__all__ = ["decode", "encode"]

KEYED_STATE_SCHEMA: Final = pa.schema(
    [
        pa.field("state", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("has_ttl", pa.bool_(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("namespace", pa.binary(), nullable=False),
        pa.field("map_key", pa.binary()),
        pa.field("ts", pa.float64()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("entry", pa.int64(), nullable=False),  # which entry of its state a row is of
    ]
)
KEYED_OPERATOR_SCHEMA: Final = pa.schema(
    [
        pa.field("state", pa.binary()),
        pa.field("domain", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("namespace", pa.binary()),
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

_LIST: Final = "list"
_MAP: Final = "map"


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _read(data: memoryview, schema: pa.Schema, where: str) -> dict[str, list[Any]]:
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise CorruptStateError(
            f"{where}: snapshot payload is not a valid Arrow table: {exc}"
        ) from exc
    if not table.schema.equals(schema):
        raise CorruptStateError(
            f"{where}: snapshot payload has the columns {table.schema.names} "
            f"({table.schema.types}), expected {schema.names}"
        )
    columns: dict[str, list[Any]] = table.to_pydict()
    return columns


# -- keyed state ---------------------------------------------------------------------------
def _encode_keyed_state(dumps: list[Any]) -> bytes:
    cols: dict[str, list[Any]] = {f.name: [] for f in KEYED_STATE_SCHEMA}
    n = 0
    for name, kind, has_ttl, entries in dumps:
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
                cols["entry"].append(n)
            n += 1
    return _ipc(pa.table(cols, schema=KEYED_STATE_SCHEMA))


def _decode_keyed_state(data: memoryview, where: str) -> list[Any]:
    cols = _read(data, KEYED_STATE_SCHEMA, where)
    dumps: dict[str, tuple[str, bool, list[Any]]] = {}
    last_entry = -1
    current: list[Any] | None = None
    for state, kind, has_ttl, key, ns, map_key, ts, value, entry in zip(
        cols["state"], cols["kind"], cols["has_ttl"], cols["key"], cols["namespace"],
        cols["map_key"], cols["ts"], cols["value"], cols["entry"], strict=True,
    ):  # fmt: skip
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
    return [(name, kind, has_ttl, entries) for name, (kind, has_ttl, entries) in dumps.items()]


# -- keyed operator (keyed state and timers of one key group) --------------------------------
def _canonical(value: Any, what: str) -> bytes:
    try:
        return canonical_bytes(value)
    except Exception as exc:
        raise CorruptStateError(
            f"a timer's {what} {value!r:.100} cannot be written: {exc}"
        ) from exc


def _encode_keyed_operator(payload: Any) -> bytes:
    state_blob, timers = payload
    cols: dict[str, list[Any]] = {f.name: [] for f in KEYED_OPERATOR_SCHEMA}
    rows = list(timers) or [None]
    for timer in rows:
        cols["state"].append(state_blob)
        if timer is None:  # no timers: one row for the state blob
            for name in ("domain", "key", "namespace", "timestamp"):
                cols[name].append(None)
            continue
        domain, key, namespace, ts = timer
        cols["domain"].append(domain)
        cols["key"].append(_canonical(key, "key"))
        cols["namespace"].append(_canonical(namespace, "namespace"))
        cols["timestamp"].append(float(ts))
    return _ipc(pa.table(cols, schema=KEYED_OPERATOR_SCHEMA))


def _decode_keyed_operator(data: memoryview, where: str) -> Any:
    cols = _read(data, KEYED_OPERATOR_SCHEMA, where)
    states = set(cols["state"])
    if len(states) != 1:
        raise CorruptStateError(f"{where}: keyed operator payload holds {len(states)} state blobs")
    timers = []
    for domain, key, namespace, ts in zip(
        cols["domain"], cols["key"], cols["namespace"], cols["timestamp"], strict=True
    ):
        if domain is None:
            continue
        if key is None or namespace is None or ts is None:
            raise CorruptStateError(f"{where}: a timer lacks its key, namespace or timestamp")
        timers.append((domain, decode_canonical(key), decode_canonical(namespace), ts))
    return (states.pop(), timers)


# -- operator state -------------------------------------------------------------------------
def _encode_operator_state(payload: list[Any]) -> bytes:
    cols: dict[str, list[Any]] = {f.name: [] for f in OPERATOR_STATE_SCHEMA}
    for name, mode, items in payload:
        for item in list(items) or [None]:
            cols["state"].append(name)
            cols["mode"].append(mode)
            cols["item"].append(item)
    return _ipc(pa.table(cols, schema=OPERATOR_STATE_SCHEMA))


def _decode_operator_state(data: memoryview, where: str) -> list[Any]:
    cols = _read(data, OPERATOR_STATE_SCHEMA, where)
    out: dict[str, tuple[str, list[bytes]]] = {}
    for name, mode, item in zip(cols["state"], cols["mode"], cols["item"], strict=True):
        entry = out.setdefault(name, (mode, []))
        if entry[0] != mode:
            raise CorruptStateError(f"{where}: operator state {name!r} has two modes")
        if item is not None:
            entry[1].append(item)
    return [(name, mode, items) for name, (mode, items) in out.items()]


def encode(kind: str, payload: Any) -> bytes:
    """The payload of a blob of ``kind`` (``"keyed state"``, ``"keyed operator"``,
    ``"operator state"``) as Arrow IPC bytes."""
    return _ENCODERS[kind](payload)


def decode(kind: str, data: memoryview, where: str) -> Any:
    """The payload back from :func:`encode`'s bytes; CorruptStateError naming ``where``."""
    return _DECODERS[kind](data, where)


_ENCODERS: Final[dict[str, Callable[[Any], bytes]]] = {
    "keyed state": _encode_keyed_state,
    "keyed operator": _encode_keyed_operator,
    "operator state": _encode_operator_state,
}
_DECODERS: Final[dict[str, Callable[[memoryview, str], Any]]] = {
    "keyed state": _decode_keyed_state,
    "keyed operator": _decode_keyed_operator,
    "operator state": _decode_operator_state,
}
