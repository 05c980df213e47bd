"""``read_state``: a ``keyed_process`` checkpoint's keyed state (or timers) as a DataFrame;
the async operator's checkpoint through ``_read_async_state``.

Contract:

- Which: the version's manifests name the operator that wrote it. A version
  of the async operator (``ordered_wait`` / ``unordered_wait``) gives the
  elements it carried over; ``watermarks=True`` (either operator) every old
  partition's watermark state; ``replay_log=True`` the replay log of a
  version or batch run (``version`` an int or a run's name; default: the
  newest run, else the newest version); the columns are in
  ``_read_async_state``. One mode at a time (ConfigurationError naming both);
  ``state=``, ``timers=True`` or ``changes=True`` on an async operator's
  version is a CheckpointError naming the location, uid and version.

- The driver lists the operator's versions under ``checkpoint_location/uid``,
  picks ``version`` (default: the newest complete one, every partition's
  manifest present) and reads its manifests: per key group its chain (last
  full section, then the deltas after it). Nothing else is read on the driver.
- The key groups are spread over Spark tasks (one DataFrame row per key group,
  ``mapInArrow``); each task reads its key groups' chains with the readers a
  restoring partition uses (``_versions.read_chains``, adjacent sections in one
  read), applies them in order (a full section replaces the key group, a delta
  replaces its keys whole) and emits rows. Both backends write the same
  sections, so one reader serves both.
- Rows of state: the key column(s) as the job keyed them (names and Spark
  types from the manifest, written by ``keyed_process``; a version written
  before that holds them gives one ``key`` string column, the key's JSON),
  ``key_group``, ``state``, ``kind`` (``value``, ``list``, ``map``, ...),
  ``map_key`` (JSON of the map key, map state), ``list_index`` (list state, from 0), ``value``
  (JSON text of the value, see below), ``value_bytes`` (the bytes the state's
  serializer wrote) and ``ttl_timestamp`` (the entry's TTL timestamp, the last
  write or read the TTL counts from; null without TTL). One row per value,
  per list element, per map entry.
- Values: a ``keyed_process`` stores what the state descriptor's serializer
  wrote, pickle by default. ``value`` is the JSON text of the unpickled value
  (``json.dumps``, anything JSON cannot hold as its ``str``); null when the
  bytes are not a pickle (a custom serializer: read ``value_bytes``). Map
  keys are stored in the key encoding, never pickled. Unpickling runs code
  the checkpoint names: read only checkpoints you would let the job itself
  restore (the same trust boundary).
- Typed state (a descriptor with a type; the version's manifests record
  each state's type): ``state=`` naming one gives ``value`` as a column of
  its Spark type (and, map state, ``map_key`` of its key type), no
  ``value_bytes``; nothing is unpickled. Among all states (no ``state=``), a
  typed state's ``value`` is its JSON and ``value_bytes`` null. Values a
  chain holds in an older type (written before a compatible change of the
  descriptor) are converted into the recorded one, as a restore does.
- ``timers=True``: one row per timer instead: key column(s), ``key_group``,
  ``domain`` (``event`` / ``processing``) and ``timestamp`` (Spark
  timestamp; the timer's time in seconds as ``timestamp_seconds``).
- ``changes=True``: the rows (identified by state, key, map key or list
  index) that differ between ``from_version`` and ``to_version``, each with
  ``change_type``: ``put`` (new or changed, its value at ``to_version``) or
  ``delete`` (gone, its value at ``from_version``). Only key groups whose
  chain changed are read; a chain that extends the older one (the usual case
  between full snapshots) is read once.
- Errors (:class:`~asyncio_ops.CheckpointError`): a location or uid with no
  version, a version not present (naming the versions that are), an
  incomplete version, a version another operator wrote; each names the
  location, uid and version.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    _parse_datatype_string,
)

from .._checkpoint import CheckpointStorage, Version, check_run_id
from .._container import DELTA, Kind
from .._exceptions import CheckpointError, ConfigurationError
from .._keygroups import UPPER_BOUND_MAX_PARALLELISM, KeyGroupRange, canonical_bytes
from .._runtime._keyed_partition import KEY_SCHEMA, OPERATOR
from .._runtime._versions import ASYNC_WAIT, Chain, VersionFiles, read_chains, read_version
from ..options import path_segment
from ..state._keycodec import decode_canonical
from ..state._keyed_snapshot import delta_keys
from ..state._payloads import read
from ..state._schema import StateTypes
from ..state._serializers import PICKLE_SERIALIZER
from ..state._types import evolution
from ._read_async_state import (
    micros,
    parallelism,
    read_carried,
    read_replay_log,
    read_watermarks,
)
from ._state_check import recorded_types

__all__ = ["read_state"]

_STATE_COLUMNS: Final = [
    StructField("key_group", IntegerType(), False),
    StructField("state", StringType(), False),
    StructField("kind", StringType(), False),
    StructField("map_key", StringType(), True),
    StructField("list_index", LongType(), True),
    StructField("value", StringType(), True),
    StructField("value_bytes", BinaryType(), True),
    StructField("ttl_timestamp", TimestampType(), True),
]
_TIMER_COLUMNS: Final = [
    StructField("key_group", IntegerType(), False),
    StructField("domain", StringType(), False),
    StructField("timestamp", TimestampType(), True),
    StructField("timestamp_seconds", DoubleType(), False),
]
_PICKLE_START: Final = b"\x80"
_BATCH_ROWS: Final = 10_000


def read_state(
    spark: SparkSession,
    checkpoint_location: str,
    *,
    uid: str,
    state: str | None = None,
    version: int | str | None = None,
    timers: bool = False,
    changes: bool = False,
    from_version: int | None = None,
    to_version: int | None = None,
    watermarks: bool = False,
    replay_log: bool = False,
) -> DataFrame:
    """The keyed state (or, with ``timers=True``, the timers) of the ``keyed_process``
    operator ``uid`` under ``checkpoint_location`` at ``version`` (default: the newest
    complete one), one row per value, list element or map entry; ``state`` keeps one
    state's rows. With ``changes=True``, the rows that differ between ``from_version``
    and ``to_version`` (default: the newest), each with ``change_type`` ``put`` (its
    value at ``to_version``) or ``delete`` (its value at ``from_version``). Read in
    parallel by key group; see the module docstring for the columns.

    A version the async operator (``ordered_wait`` / ``unordered_wait``) wrote gives
    the elements it carried over, one row each; ``watermarks=True`` every old
    partition's watermark state (either operator); ``replay_log=True`` the replay log
    of ``version`` (an int, or a batch run's name; default: the newest run). See
    ``_read_async_state``."""
    if not isinstance(spark, SparkSession):
        raise ConfigurationError(f"spark must be a SparkSession, got {type(spark).__name__}")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise ConfigurationError(
            f"checkpoint_location must be a path or URI string, got {checkpoint_location!r}"
        )
    path_segment(uid, "uid")
    flags = {"timers": timers, "changes": changes, "watermarks": watermarks,
             "replay_log": replay_log}  # fmt: skip
    modes = [name for name, on in flags.items() if on]
    if len(modes) > 1:
        raise ConfigurationError(
            f"read_state reads one thing at a time: {' and '.join(m + '=True' for m in modes)}"
        )
    if (watermarks or replay_log) and state is not None:
        raise ConfigurationError(f"state= reads keyed state, not {modes[0]}=True")
    if replay_log and isinstance(version, str):
        check_run_id(version)
    elif isinstance(version, str):
        raise ConfigurationError(
            f"version={version!r}: a batch run's name is read with replay_log=True only"
        )
    for name, given in (("version", version), ("from_version", from_version),
                        ("to_version", to_version)):  # fmt: skip
        if given is not None and not isinstance(given, str) and (
            isinstance(given, bool) or not isinstance(given, int) or given < 0
        ):
            raise ConfigurationError(f"{name} must be an int >= 0 or None, got {given!r}")
    if changes:
        if timers or version is not None:
            raise ConfigurationError(
                "changes=True takes from_version= and to_version=, not version= or timers=True"
            )
        if from_version is None:
            raise ConfigurationError("changes=True needs from_version= (an int)")
        if to_version is not None and to_version < from_version:
            raise ConfigurationError(
                f"to_version ({to_version}) is before from_version ({from_version})"
            )
    elif from_version is not None or to_version is not None:
        raise ConfigurationError("from_version= and to_version= need changes=True")
    if state is not None and not isinstance(state, str):
        raise ConfigurationError(f"state must be a state name (str) or None, got {state!r}")
    storage = CheckpointStorage(checkpoint_location, uid)
    if replay_log:
        run = _run(storage, version)
        return read_replay_log(spark, storage, run, _where(storage, run))
    assert not isinstance(version, str)
    found = _version(storage, to_version if changes else version)
    where = _where(storage, found.version)
    if watermarks:
        return read_watermarks(spark, found, where)
    if found.written_by() == ASYNC_WAIT:
        if state is not None or timers or changes:
            given = "state=" if state is not None else "timers=True" if timers else "changes=True"
            raise CheckpointError(
                f"{where} was written by the async operator (ordered_wait / unordered_wait), "
                f"which keeps no keyed state: {given} reads keyed_process's; without it, "
                "read_state gives the elements it carried over"
            )
        return read_carried(spark, found, where)
    found.check_operator(OPERATOR)
    chains = _all_chains(found)
    before: dict[int, Chain] = {}
    if changes:
        assert from_version is not None
        if from_version > found.version:  # type: ignore[operator]
            raise ConfigurationError(
                f"from_version ({from_version}) is after the newest version ({found.version})"
            )
        old = _version(storage, from_version)
        old.check_operator(OPERATOR)
        before = _all_chains(old)
    key_fields = _key_fields(found)
    typed = KEY_SCHEMA in (found.manifests[0].schema.metadata or {})
    types: StateTypes = recorded_types(found) or {}
    fixed = _TIMER_COLUMNS if timers else _STATE_COLUMNS
    one = types.get(state) if state is not None and not timers else None
    if one is not None and one[1] is not None:  # one typed state: its own Spark types
        fixed = _typed_columns(one[0], one[1].ddl, None if one[2] is None else one[2].ddl)
    if changes:
        fixed = [StructField("change_type", StringType(), False), *fixed]
    clash = {f.name for f in key_fields} & {f.name for f in fixed}
    if clash:
        raise CheckpointError(
            f"keyed_process uid {uid!r} under {checkpoint_location}: its key column(s) "
            f"{sorted(clash)} have the names of read_state's own columns"
        )
    schema = StructType(key_fields + fixed)
    timezone = spark.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(schema, timezone=timezone)
    key_names = [f.name for f in key_fields]
    rows = [
        (kg, json.dumps(chains.get(kg, ())), json.dumps(before.get(kg, ())))
        for kg in sorted(chains.keys() | before.keys())
        if not changes or chains.get(kg) != before.get(kg)  # an unchanged chain: no change
    ]
    slices = max(1, min(len(rows), parallelism(spark) * 2))
    groups = spark.createDataFrame(rows, "key_group int, chain string, before string")
    if len(rows) > 1:
        groups = groups.repartition(slices)

    def emit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            kgs = batch.column(0).to_pylist()
            mine, old = (
                {kg: tuple(tuple(link) for link in json.loads(c)) for kg, c in zip(
                    kgs, batch.column(i).to_pylist(), strict=True)}
                for i in (1, 2)
            )  # fmt: skip
            yield from _rows(
                storage, mine, old if changes else None, key_names, typed, arrow_schema, state,
                timers, types,
            )  # fmt: skip

    return groups.mapInArrow(emit, schema)


def _typed_columns(kind: str, value: str, key: str | None) -> list[StructField]:
    """The state columns of one typed state: ``value`` (and ``map_key``) of its types."""
    out = []
    for f in _STATE_COLUMNS:
        if f.name == "value":
            out.append(StructField("value", _parse_datatype_string(value), True))
        elif f.name == "map_key" and key is not None:
            out.append(StructField("map_key", _parse_datatype_string(key), kind != "map"))
        elif f.name != "value_bytes":
            out.append(f)
    return out


def _all_chains(found: VersionFiles) -> dict[int, Chain]:
    return found.chains(
        KeyGroupRange(0, UPPER_BOUND_MAX_PARALLELISM - 1), UPPER_BOUND_MAX_PARALLELISM
    )


def _where(storage: CheckpointStorage, version: Version) -> str:
    """A version named for errors: location, uid and version."""
    return f"checkpoint_location {storage.location} (uid {storage.uid!r}, version {version!r})"


def _run(storage: CheckpointStorage, version: int | str | None) -> Version:
    """The version or batch run whose replay log ``replay_log=True`` reads: ``version``,
    else the newest run, else the newest version; CheckpointError naming the location
    and uid if there is none, or ``version`` is not there."""
    where = f"{storage.location} (uid {storage.uid!r}, {storage.describe(storage.root)})"
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


def _version(storage: CheckpointStorage, version: int | None) -> VersionFiles:
    where = f"{storage.location} (uid {storage.uid!r}, {storage.describe(storage.root)})"
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
                "incomplete or being written"
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


def _key_fields(found: VersionFiles) -> list[StructField]:
    raw = (found.manifests[0].schema.metadata or {}).get(KEY_SCHEMA)
    if not raw:
        return [StructField("key", StringType(), False)]
    try:
        parsed = StructType.fromJson(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint file {found.paths[0]}: unreadable key schema {raw[:100]!r}"
        ) from exc
    return list(parsed.fields)


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


def _rows(
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
    chains = {kg: chain for kg, chain in chains.items() if chain}
    as_column = "value_bytes" not in schema.names and not timers  # one typed state
    key_type = types[only][2] if as_column and only is not None else None
    found = read_chains(storage, chains)
    old_found: dict[int, list[tuple[str, Any]]] = {}
    if before is not None:  # a chain that extends the old one holds it: no second read
        rest = {kg: c for kg, c in before.items() if c and chains.get(kg, ())[: len(c)] != c}
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


def _rebuild(
    kg: int, sections: list[tuple[str, Any]], types: StateTypes
) -> tuple[Entries, Timers]:
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
