"""The driver's check of a restart's state against the checkpoint it restores.

Contract: before ``keyed_process`` on a streaming DataFrame builds its plan,
:func:`check_state_schema` takes the newest complete version under its
checkpoint (:func:`newest_complete`, manifests only, read once by the caller,
which also decides from it whether ``initial_state`` applies) and refuses, with
:class:`~asyncio_ops.IncompatibleStateError` and before any Spark job:

- key columns of other types than the checkpoint's (their keys would hash
  into other key groups), naming the columns, both types and what to do;
- a state whose declared kind or type cannot take a type the checkpoint
  holds it in (``state._types.evolution``: a narrowed or changed type, typed
  against untyped, another map key type, another kind), naming the version
  holding it, the state, both types, why and what to do. The types held are
  those the newest version's manifests record, then those of every older
  version its key-group chains still name (a key group the query did not
  touch since restores from sections written with the types of then): what
  the newest manifests carry for them (``HELD_TYPES``, carried forward by each
  partition from the manifests it restored), else their own manifests
  (:func:`held_types`, each read once; no data file): each section restores
  into the declared type directly, so each type is checked against it. Only
  a checkpoint of an earlier release whose older manifests retention deleted
  (not on an object store: ``_runtime._retention``) hides a type from here;
  the workers still refuse it when they restore.

The declared states are what ``fn.open`` obtains (:func:`declared_states`: run
once on a copy of ``fn`` with a throwaway heap backend of one key group and no
key, so the driver's ``fn`` is not opened; Spark runs a ``StatefulProcessor``'s
``init`` on the driver for the same purpose; states obtained later than
``open`` are not seen): with
``preflight=False``, or a checkpoint written before versions recorded their
states, only the key columns are checked, and the workers still refuse an
incompatible state when its descriptor registers, before touching it.
:func:`recorded_types` is the union of a version's manifests' records (also
what ``read_state`` types its columns by).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from copy import deepcopy
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from .._exceptions import CheckpointError, IncompatibleStateError
from .._runtime import (
    KEY_SCHEMA,
    STATE_TYPES,
    StateTypes,
    VersionFiles,
    all_chains,
    carried_types,
    chain_manifests,
    check_restore,
    declared_states,
    read_version,
    types_of_json,
)
from .._storage._checkpoint_storage import CheckpointStorage
from ..state import KeyedProcessFunction

__all__ = [
    "check_state_schema",
    "held_types",
    "newest_complete",
    "recorded_types",
]


def newest_complete(storage: CheckpointStorage) -> VersionFiles | None:
    """The newest version every partition finished writing (None: no state yet)."""
    for version in reversed(storage.versions()):
        try:
            found = read_version(storage, version)
        except CheckpointError:
            continue  # incomplete: a micro-batch that failed while writing it
        if found is not None:
            return found
    return None


def recorded_types(found: VersionFiles) -> StateTypes | None:
    """The states the version's manifests record (None: written before they did)."""
    return _recorded(zip(found.manifests, found.paths, strict=True))


def held_types(found: VersionFiles) -> list[tuple[int, StateTypes]]:
    """The states the versions older than ``found`` that its key-group chains name were
    written with, newest version first: the types the sections those chains restore
    hold. From what ``found``'s manifests carry for them (``HELD_TYPES``), and for a
    version they do not cover (written before manifests carried them) from its own
    manifests (:func:`chain_manifests`); a version whose manifests are gone, or that
    recorded no states, is left out."""
    held: dict[int, StateTypes] = {}
    for manifest, path in zip(found.manifests, found.paths, strict=True):
        try:
            for v, raw in carried_types(manifest).items():
                held.setdefault(v, {}).update(types_of_json(raw))
        except Exception as exc:
            raise CheckpointError(f"checkpoint file {path}: unreadable held state types") from exc
    rest = [tuple(link for link in chain if link[0] not in held)
            for chain in all_chains(found).values()]  # fmt: skip
    by_version: dict[int, list[tuple[pa.Table, str]]] = {}
    for version, path, manifest in chain_manifests(found, rest):
        if manifest is not None:
            by_version.setdefault(version, []).append((manifest, path))
    for v, manifests in by_version.items():
        if (recorded := _recorded(manifests)) is not None:
            held[v] = recorded
    return [(v, held[v]) for v in sorted(held, reverse=True)]


def _recorded(manifests: Iterable[tuple[pa.Table, str]]) -> StateTypes | None:
    """The union of the states ``(manifest, path)`` record (None: none records any)."""
    out: StateTypes = {}
    seen = False
    for manifest, path in manifests:
        raw = (manifest.schema.metadata or {}).get(STATE_TYPES)
        if raw is None:
            continue
        seen = True
        try:
            out.update(types_of_json(raw.decode()))
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint file {path}: unreadable state types {raw[:100]!r}"
            ) from exc
    return out if seen else None


def check_state_schema(
    fn: KeyedProcessFunction[Any, Any, Any],
    storage: CheckpointStorage,
    found: VersionFiles,
    key_cols: Sequence[str],
    df: DataFrame,
    declare: bool,
) -> None:
    """See the module docstring; ``found``: the newest complete version
    (:func:`newest_complete`); ``declare``: run ``fn.open`` on a copy (``preflight``)."""
    where = (
        f"checkpoint version {found.version} of keyed_process uid {storage.uid!r} under "
        f"{storage.location}"
    )
    raw_keys = (found.manifests[0].schema.metadata or {}).get(KEY_SCHEMA)
    if raw_keys:
        old = StructType.fromJson(json.loads(raw_keys))
        new = StructType([df.schema[c] for c in key_cols])
        before = [(f.name, f.dataType.simpleString()) for f in old.fields]
        now = [(f.name, f.dataType.simpleString()) for f in new.fields]
        if before != now:
            raise IncompatibleStateError(
                f"{where}: the key columns were {_cols(before)}, the query now keys by "
                f"{_cols(now)}: keys of other types hash into other key groups, so the state "
                "cannot be found. Cast the key columns back to the old types, or start from a "
                "new uid or checkpoint_location"
            )
    recorded = recorded_types(found)
    if recorded is None or not declare:
        return
    copy = deepcopy(fn)  # open() stores its state handles on the function: not the user's
    try:
        declared = declared_states(copy)
    except Exception as exc:
        exc.add_note(
            f"raised by {type(fn).__qualname__}.open on the driver, run there to check its "
            f"state descriptors against {where} before any Spark job (preflight=False skips "
            "it; the workers still check)"
        )
        raise
    try:
        check_restore(recorded, declared)
    except IncompatibleStateError as exc:
        raise IncompatibleStateError(f"{where}: {exc}") from None
    for version, held in held_types(found):
        try:
            check_restore(held, declared)
        except IncompatibleStateError as exc:
            raise IncompatibleStateError(
                f"checkpoint version {version} of keyed_process uid {storage.uid!r} under "
                f"{storage.location}, whose sections the key-group chains of version "
                f"{found.version} still restore (key groups not written since): {exc}"
            ) from None


def _cols(cols: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in cols)
