"""What ``read_state`` reads from a checkpoint, in Python and Arrow (no Spark).

Contract (the Spark layer's ``read_state`` spreads the work over tasks and
gives the rows their Spark schema; everything it reads goes through here):

- :func:`open_version` / :func:`open_run`: the version (newest complete by
  default) or batch run to read, CheckpointError naming the location, uid and
  what is present otherwise; :func:`named_version` names one for errors.
- :func:`all_chains`: every key group's chain a version's manifests name (any
  max_parallelism); :func:`recorded_key_schema`: the key columns' schema a
  ``keyed_process`` manifest records (JSON of a Spark struct), if any.
- :func:`state_rows`: the rows of some key groups' chains as record batches of
  a given Arrow schema: applies each chain as a restore does (a full section
  replaces the key group, a delta the keys it names), converts a typed state's
  values of an older type into the recorded one, and renders the rest:
  untyped values as the JSON of the unpickled value (through the state
  layer's serializer, the trust boundary of a restore) beside their bytes,
  keys as their columns (or the key's JSON), timestamps as microseconds. With
  ``before`` (the chains of an older version): the rows that differ, each
  with its ``change_type``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa

from .._exceptions import CheckpointError
from .._keygroups import UPPER_BOUND_MAX_PARALLELISM, KeyGroupRange, canonical_bytes
from .._storage._checkpoint_storage import CheckpointStorage, Version
from .._storage._container import DELTA, Kind
from ..state._keycodec import decode_canonical
from ..state._keyed_snapshot import delta_keys
from ..state._payloads import read
from ..state._schema import StateTypes
from ..state._serializers import PICKLE_SERIALIZER
from ..state._types import evolution
from ._keyed_partition import KEY_SCHEMA
from ._versions import Chain, VersionFiles, extends, read_chains, read_version

__all__ = [
    "all_chains",
    "micros",
    "named_version",
    "open_run",
    "open_version",
    "recorded_key_schema",
    "state_rows",
]

_PICKLE_START: Final = b"\x80"
_BATCH_ROWS: Final = 10_000


def micros(ts: float | None) -> int | None:
    """Seconds as a Spark timestamp's microseconds; None for none (or not finite)."""
    if ts is None or not math.isfinite(ts):
        return None
    return round(ts * 1_000_000)


def recorded_key_schema(found: VersionFiles) -> bytes | None:
    """The key columns' schema (JSON of a Spark struct) the version's first manifest
    records; None for a version written before manifests held it."""
    raw = (found.manifests[0].schema.metadata or {}).get(KEY_SCHEMA)
    return raw or None


def all_chains(found: VersionFiles) -> dict[int, Chain]:
    """Every key group's chain ``found``'s manifests name."""
    return found.chains(
        KeyGroupRange(0, UPPER_BOUND_MAX_PARALLELISM - 1), UPPER_BOUND_MAX_PARALLELISM
    )


def _root(storage: CheckpointStorage) -> str:
    """The operator's checkpoint root named for errors: location, uid and what is there."""
    return f"{storage.location} (uid {storage.uid!r}, {storage.describe(storage.root)})"


def named_version(storage: CheckpointStorage, version: Version) -> str:
    """A version named for errors: location, uid and version."""
    return f"checkpoint_location {storage.location} (uid {storage.uid!r}, version {version!r})"


def open_run(storage: CheckpointStorage, version: int | str | None) -> Version:
    """The version or batch run whose replay log ``replay_log=True`` reads: ``version``,
    else the newest run, else the newest version; CheckpointError naming the location
    and uid if there is none, or ``version`` is not there."""
    where = _root(storage)
    runs, versions = storage.runs(), storage.versions()
    if version is None:
        if not runs and not versions:
            raise CheckpointError(f"no batch run or checkpoint version under {where}")
        return runs[-1] if runs else versions[-1]
    if version not in (runs if isinstance(version, str) else versions):
        raise CheckpointError(
            f"checkpoint {'run' if isinstance(version, str) else 'version'} {version!r} does "
            f"not exist under {where}; runs present: {runs[-3:] or 'none'}"
            + (f", versions {versions[0]}..{versions[-1]}" if versions else "")
        )
    return version


def open_version(storage: CheckpointStorage, version: int | None) -> VersionFiles:
    """Version ``version``'s files, or the newest complete version's (None);
    CheckpointError naming the location and uid if there is none, it is not there,
    or it is incomplete."""
    where = _root(storage)
    present = storage.versions()
    if not present:
        raise CheckpointError(f"no checkpoint version under {where}: nothing to read")
    if version is not None:
        if version not in present:
            raise CheckpointError(
                f"checkpoint version {version} does not exist under {where}; versions "
                f"present: {present[0]}..{present[-1]} ({len(present)} of them)"
            )
        found = read_version(storage, version)
        if found is None:
            raise CheckpointError(
                f"checkpoint version {version} under {where} holds no manifest: it is "
                "incomplete, being written, or older than the versions retained "
                "(retain_versions: their manifests are deleted, their files stay while later "
                "versions name them)"
            )
        return found
    for v in reversed(present):
        try:
            found = read_version(storage, v)
        except CheckpointError:
            continue  # incomplete (being written, or a failed attempt): an older one
        if found is not None:
            return found
    raise CheckpointError(f"no complete checkpoint version under {where} (of {present})")


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _decoded(data: bytes | None) -> str | None:
    if data is None or not data.startswith(_PICKLE_START):
        return None
    try:
        # the user-state layer's own serializer: the trust boundary of a restore
        return _json(PICKLE_SERIALIZER.loads(data))
    except Exception:
        return None


def state_rows(
    storage: CheckpointStorage,
    chains: dict[int, Chain],
    before: dict[int, Chain] | None,
    key_names: list[str],
    typed: bool,
    schema: pa.Schema,
    only: str | None,
    timers: bool,
    types: StateTypes,
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``schema`` (see the module docstring): the state (``only``: of
    that state) or, ``timers``, the timers of ``chains``' key groups; with ``before``,
    the rows that differ from those chains'. ``key_names``: the key columns
    (``typed``: from the recorded key schema; else one ``key`` column of JSON);
    ``types``: the recorded state types."""
    chains = {kg: chain for kg, chain in chains.items() if chain}
    as_column = "value_bytes" not in schema.names and not timers  # one typed state
    key_type = types[only][2] if as_column and only is not None else None
    found = read_chains(storage, chains)
    old_found: dict[int, list[tuple[str, Any]]] = {}
    if before is not None:  # a chain that extends the old one holds it: no second read
        rest = {kg: c for kg, c in before.items() if c and not extends(chains.get(kg, ()), c)}
        old_found = read_chains(storage, rest)
        for kg, c in before.items():
            if c and kg not in rest:
                old_found[kg] = found[kg][: len(c)]
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}

    def key_cells(enc: bytes) -> None:
        key = decode_canonical(enc)
        if not typed:
            cols["key"].append(_json(key))
        elif len(key_names) == 1:
            cols[key_names[0]].append(key)
        else:
            for name, part in zip(key_names, key, strict=True):
                cols[name].append(part)

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(
            {n: pa.array(cols[n], schema.field(n).type) for n in schema.names}, schema=schema
        )
        for column in cols.values():
            column.clear()
        return batch

    def state_cells(kg: int, ident: Identity, item: Item) -> None:
        name, key_enc, _ns, map_key, index = ident
        kind, ts, value = item
        key_cells(key_enc)
        cols["key_group"].append(kg)
        cols["state"].append(name)
        cols["kind"].append(kind)
        if map_key is None:
            cols["map_key"].append(None)
        elif key_type is not None:
            cols["map_key"].append(key_type.decode(map_key))
        else:
            cols["map_key"].append(_json(decode_canonical(map_key)))
        cols["list_index"].append(index)
        if as_column:
            cols["value"].append(value)
        elif isinstance(value, bytes):
            cols["value"].append(_decoded(value))
            cols["value_bytes"].append(value)
        else:  # a typed state's value, among all states
            cols["value"].append(_json(value))
            cols["value_bytes"].append(None)
        cols["ttl_timestamp"].append(micros(ts))

    for kg in sorted(found.keys() | old_found.keys()):
        entries, kg_timers = _rebuild(kg, found.get(kg, []), types)
        if before is not None:
            now = _flat(entries, only)
            then = _flat(_rebuild(kg, old_found.get(kg, []), types)[0], only)
            for ident, item in sorted(now.items()):
                if then.get(ident) != item:
                    cols["change_type"].append("put")
                    state_cells(kg, ident, item)
            for ident, item in sorted(then.items()):
                if ident not in now:
                    cols["change_type"].append("delete")
                    state_cells(kg, ident, item)
        elif timers:
            for (domain, key_enc, _ns), stamps in sorted(kg_timers.items()):
                for stamp in sorted(stamps):
                    key_cells(key_enc)
                    cols["key_group"].append(kg)
                    cols["domain"].append(domain)
                    cols["timestamp"].append(micros(stamp))
                    cols["timestamp_seconds"].append(stamp)
        else:
            for ident, item in sorted(_flat(entries, only).items()):
                state_cells(kg, ident, item)
        if len(cols["key_group"]) >= _BATCH_ROWS:
            yield flush()
    if cols["key_group"]:
        yield flush()


def _converter(
    name: str, kind: str, typing: Any, recorded: tuple[str, Any, Any] | None, path: str
) -> Any:
    """The converter of ``name``'s values as a section holds them (``typing``) into the
    recorded type (None: as they are)."""
    if typing is None or recorded is None or recorded[1] is None:
        return None
    if (typing[0], typing[1]) == (recorded[1], recorded[2]):
        return None
    try:
        return evolution(name, typing[0], recorded[1], old_kind=kind, new_kind=recorded[0],
                         old_key=typing[1], new_key=recorded[2])  # fmt: skip
    except Exception as exc:
        raise CheckpointError(f"checkpoint file {path}: {exc}") from exc


def _convert(kind: str, data: Any, convert: Any) -> Any:
    if kind == "list":
        return [(ts, convert(v)) for ts, v in data]
    if kind == "map":
        return [(mk, ts, None if v is None else convert(v)) for mk, ts, v in data]
    return (data[0], convert(data[1]))


Entries = dict[tuple[str, bytes, bytes], tuple[str, Any]]
Identity = tuple[str, bytes, bytes, bytes | None, int | None]
"""One row's identity: state, key, namespace, map key (map state), index (list state)."""
Item = tuple[str, float | None, Any]
"""One row's kind, TTL timestamp and value bytes (a typed state's value)."""


def _flat(entries: Entries, only: str | None) -> dict[Identity, Item]:
    """Every value, list element and map entry of ``entries`` (of state ``only``, if given)."""
    out: dict[Identity, Item] = {}
    for (name, key_enc, ns), (kind, data) in entries.items():
        if only is not None and name != only:
            continue
        if kind == "list":
            for i, (ts, v) in enumerate(data):
                out[(name, key_enc, ns, None, i)] = (kind, ts, v)
        elif kind == "map":
            for mk, ts, v in data:
                out[(name, key_enc, ns, mk, None)] = (kind, ts, v)
        else:
            out[(name, key_enc, ns, None, None)] = (kind, data[0], data[1])
    return out


Timers = dict[tuple[str, bytes, bytes], set[float]]


def _rebuild(kg: int, sections: list[tuple[str, Any]], types: StateTypes) -> tuple[Entries, Timers]:
    """Apply one key group's chain (full section, then deltas): its entries by
    ``(state, key, namespace)`` and its timers by ``(domain, key, namespace)``; a typed
    state's values of an older type converted into the one ``types`` records."""
    entries: Entries = {}
    kg_timers: Timers = {}
    for path, section in sections:
        dumps, section_timers, replaced = read(
            Kind.KEY_GROUPS, section.table, f"checkpoint file {path}, key group {kg}"
        )
        if section.part == DELTA:  # every key it names is replaced whole
            gone = set(delta_keys((dumps, section_timers, replaced)))
            entries = {k: v for k, v in entries.items() if k[1] not in gone}
            kg_timers = {k: v for k, v in kg_timers.items() if k[1] not in gone}
        else:
            entries, kg_timers = {}, {}
        for name, kind, _has_ttl, state_entries, typing in dumps:
            convert = _converter(name, kind, typing, types.get(name), path)
            for key, ns, data in state_entries:
                if convert is not None:
                    data = _convert(kind, data, convert)
                entries[(name, key, ns)] = (kind, data)
        for domain, key, namespace, ts in section_timers:
            kg_timers.setdefault(
                (domain, canonical_bytes(key), canonical_bytes(namespace)), set()
            ).add(ts)
    return entries, kg_timers
