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
from typing import Final, NamedTuple

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

from .._exceptions import CheckpointError, ConfigurationError
from .._runtime import (
    ASYNC_WAIT,
    KEYED_PROCESS,
    Chain,
    StateTypes,
    VersionFiles,
    all_chains,
    hold_versions,
    lease_noted,
    named_version,
    open_run,
    open_version,
    recorded_key_schema,
    state_rows,
)
from .._storage._checkpoint_storage import CheckpointStorage, check_run_id
from ..options import path_segment
from . import _job_errors
from ._read_async_state import parallelism, read_carried, read_replay_log, read_watermarks
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
    lease: float = 3600.0,
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
    ``_read_async_state``.

    ``lease``: for how many seconds a running query's retention keeps the versions
    this DataFrame reads (0: no lease); see the module docstring.

    Example::

        from asyncio_ops.spark import read_state

        counts = read_state(spark, "s3://bucket/checkpoints/counts", uid="counts", state="count")
        counts.selectExpr("user_id", "CAST(value AS BIGINT) AS n").show()
        timers = read_state(spark, "s3://bucket/checkpoints/counts", uid="counts", timers=True)
        carried = read_state(spark, "s3://bucket/checkpoints/lookups", uid="enrich")  # in flight
    """
    if not isinstance(spark, SparkSession):
        raise ConfigurationError(f"spark must be a SparkSession, got {type(spark).__name__}")
    _job_errors.install()
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
        if (
            given is not None
            and not isinstance(given, str)
            and (isinstance(given, bool) or not isinstance(given, int) or given < 0)
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
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease >= 0:
        raise ConfigurationError(f"lease must be seconds >= 0 (0: none), got {lease!r}")
    storage = CheckpointStorage(checkpoint_location, uid)
    if replay_log:
        run = open_run(storage, version)
        return read_replay_log(spark, storage, run, named_version(storage, run))
    assert not isinstance(version, str)
    wanted = to_version if changes else version

    def pin() -> _Pinned:
        found = open_version(storage, wanted)
        old = None
        if changes:
            assert from_version is not None and isinstance(found.version, int)
            if from_version > found.version:
                raise ConfigurationError(
                    f"from_version ({from_version}) is after the newest version ({found.version})"
                )
            old = open_version(storage, from_version)
        return _Pinned(found, old, _chains(found), _chains(old))

    pinned, until = hold_versions(storage, lease, pin, _Pinned.needs, newest=wanted is None)
    found, old, chains, before = pinned
    where = named_version(storage, found.version)
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
        return read_carried(spark, found, where, until)
    found.check_operator(KEYED_PROCESS)
    if changes:
        assert old is not None
        old.check_operator(KEYED_PROCESS)
    key_fields = _key_fields(found)
    typed = recorded_key_schema(found) is not None
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
            with lease_noted(until):
                yield from state_rows(
                    storage, mine, old if changes else None, key_names, typed, arrow_schema,
                    state, timers, types,
                )  # fmt: skip

    return groups.mapInArrow(emit, schema)


class _Pinned(NamedTuple):
    """The version(s) a read reads, their manifests read: ``found`` (and, ``changes``,
    ``old``) and every key group's chain in each (``keyed_process``'s; {} otherwise)."""

    found: VersionFiles
    old: VersionFiles | None
    chains: dict[int, Chain]
    before: dict[int, Chain]

    def needs(self) -> set[int]:
        """The versions whose files the read reads: each one's own, and those its key
        groups' chains name."""
        out = {
            v.version for v in (self.found, self.old) if v is not None and type(v.version) is int
        }
        for chains in (self.chains, self.before):
            out.update(link[0] for chain in chains.values() for link in chain)
        return out


def _chains(found: VersionFiles | None) -> dict[int, Chain]:
    """Every key group's chain in ``found`` if ``keyed_process`` wrote it, else {}."""
    if found is None or found.written_by() != KEYED_PROCESS:
        return {}
    return all_chains(found)


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


def _key_fields(found: VersionFiles) -> list[StructField]:
    raw = recorded_key_schema(found)
    if raw is None:
        return [StructField("key", StringType(), False)]
    try:
        parsed = StructType.fromJson(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint file {found.paths[0]}: unreadable key schema {raw[:100]!r}"
        ) from exc
    return list(parsed.fields)
