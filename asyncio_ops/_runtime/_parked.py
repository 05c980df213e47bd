"""Parked RocksDB databases: a committed partition's working database, left on the
machine's disk for whichever Python worker runs the partition next.

Contract. Warm state (``_warm``) lives in one Python worker's memory; Spark
hands a partition's next task to any idle worker of the executor. So when a
``keyed_process`` task on RocksDB commits version ``N`` of its partition (its
manifest is written), it also *parks* a copy of its database: a RocksDB
checkpoint (hard links of the immutable table files: milliseconds, and
little disk until compaction rewrites them) with the partition's timers (one
typed Arrow container, never pickle) and the chains it holds, published
atomically under ``<dir>/<hash of the warm key>/v<N>-<token>`` (the warm key
names the checkpoint location and uid, the plan, the partition, the number of
partitions, the backend and max parallelism). Publishing deletes that key's
older parked copies. The worker keeps its own database open and warm. It
parks when the partition has no parked copy, or its copy is ``PARK_EVERY``
versions old: a checkpoint flushes the database's memtable, and a flush per
micro-batch leaves many small files for every read to search and compaction
to merge, while a copy some versions old is caught up with the deltas written
since (a key group whose full snapshot came in between is read whole).

A task of that partition in a worker that holds nothing warm *claims* the
newest parked copy (an atomic rename: of two claimants one gets it), proves
it as warm state is proven (the manifest of its version for this partition
must still be the one its token wrote; otherwise it is deleted and the next
one tried), opens it as its working database and applies only the chains'
parts written since: no key-group file is read when it is the version just
before. No proof, no copy, or anything unreadable: the restore is cold, as
before, and a copy that fails is deleted. A claimed copy belongs to the
claimant's backend, which deletes it when it closes.

Not parked: the heap backend (its dicts live in memory; a cold restore reads
the chains, from local copies when the checkpoint is remote), a partition
holding restored state no descriptor claimed, and one with more than
``MAX_TIMERS`` timers (written whole each micro-batch, they would make a
micro-batch cost what is stored). ``<dir>`` is ``ASYNCIO_OPS_PARKED`` if set
(``0`` or ``off`` turns parking off, as does warm state off), else
``asyncio_ops-parked-<uid>`` in the system's temporary directory (where the
working databases are: hard links need one filesystem), readable by this
user only. Spark deletes an executor's temporary files with the machine's
cleanup, not with the executor: a query's last parked copies stay until
then (about one copy of each partition's database, shared with nothing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .._storage._container import Kind, Section, decode, encode
from .._storage._local_copies import private_directory
from ..state import KeyedStateBackend
from ..state._payloads import read, table
from ..state._rocksdb import RocksDBKeyedStateBackend
from . import _warm
from ._versions import Chain

PARKED_ENV: Final = "ASYNCIO_OPS_PARKED"
MAX_TIMERS: Final = 100_000
PARK_EVERY: Final = 10
_OFF: Final = frozenset({"0", "off", "false", "no"})
_TIMERS: Final = "timers.ckpt"
_META: Final = "parked.json"

log = logging.getLogger("asyncio_ops.runtime")
_checked: dict[Path, bool] = {}


@dataclass
class Parked:
    """A claimed, proven parked copy: its backend (the database opened), the timers to
    restore (``InternalTimerService.restore``'s form), its version, token and chains."""

    backend: KeyedStateBackend
    timers: dict[int, list[tuple[str, Any, Any, float]]]
    version: int
    writer: str
    chains: dict[int, Chain]


def _root() -> Path | None:
    raw = os.environ.get(PARKED_ENV, "").strip()
    if raw.lower() in _OFF or _warm.limit() <= 0:
        return None
    base = Path(raw) if raw else Path(tempfile.gettempdir()) / f"asyncio_ops-parked-{os.getuid()}"
    if base not in _checked:
        _checked[base] = private_directory(base, "parked databases", PARKED_ENV)
    return base if _checked[base] else None


def _slot(key: tuple[Any, ...]) -> Path | None:
    root = _root()
    return None if root is None else root / hashlib.sha256(repr(key).encode()).hexdigest()[:24]


def park(
    key: tuple[Any, ...],
    version: int,
    writer: str,
    backend: KeyedStateBackend,
    timers: Callable[[], Mapping[int, list[tuple[str, Any, Any, float]]]],
    chains: Mapping[int, Chain],
) -> bool:
    """Park ``backend``'s database as ``version`` (committed by ``writer``) with the
    timers ``timers()`` gives (asked only when a copy is due) and ``chains`` (module
    docstring); False if not parked. A failure is logged, never raised: the version is
    committed to the checkpoint."""
    slot = _slot(key)
    if slot is None or not isinstance(backend, RocksDBKeyedStateBackend):
        return False
    newest = max((p.name for p in slot.glob("v*")), default=None) if slot.is_dir() else None
    if newest is not None and version - int(newest[1:11]) < PARK_EVERY:
        return False  # a copy some versions old is caught up with their deltas
    held = timers()
    if sum(len(t) for t in held.values()) > MAX_TIMERS:
        return False
    tmp = slot / f".tmp-{uuid.uuid4().hex}"
    try:
        slot.mkdir(exist_ok=True)
        seq = backend.park(tmp)
        sections = [
            Section(kg, table(Kind.KEY_GROUPS, ([], ts, None))) for kg, ts in sorted(held.items())
        ]
        (tmp / _TIMERS).write_bytes(encode(Kind.KEY_GROUPS, sections)[0])
        links = {str(kg): [list(link) for link in c] for kg, c in chains.items()}
        meta = {"version": version, "writer": writer, "seq": seq, "chains": links}
        (tmp / _META).write_text(json.dumps(meta))
        name = f"v{version:010d}-{writer}"
        tmp.rename(slot / name)
    except Exception as exc:  # a full disk, a checkpoint RocksDB refused: not parked
        log.warning("asyncio_ops: partition not parked in %s (%s)", slot, exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    for old in slot.glob("v*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return True


def claim(
    key: tuple[Any, ...],
    backend_of: Callable[[Path, int], KeyedStateBackend],
    proven: Callable[[int, str], bool],
) -> Parked | None:
    """The newest parked copy of ``key`` that ``proven(version, writer)`` accepts, opened
    with ``backend_of(path, seq)``; None (cold) if there is none. Copies claimed and not
    proven, or unreadable, are deleted."""
    slot = _slot(key)
    if slot is None or not slot.is_dir():
        return None
    for candidate in sorted(slot.glob("v*"), reverse=True):
        mine = slot / f".claimed-{uuid.uuid4().hex}"
        try:
            candidate.rename(mine)
        except OSError:  # another worker claimed it first
            continue
        try:
            meta = json.loads((mine / _META).read_text())
            version, writer, seq = int(meta["version"]), str(meta["writer"]), int(meta["seq"])
            if not proven(version, writer):
                log.info("asyncio_ops: a parked copy of version %d is not the checkpoint's "
                         "(dropped)", version)  # fmt: skip
                shutil.rmtree(mine, ignore_errors=True)
                continue
            timers: dict[int, list[tuple[str, Any, Any, float]]] = {}
            where = str(mine / _TIMERS)
            for s in decode((mine / _TIMERS).read_bytes(), Kind.KEY_GROUPS, where):
                timers[s.tag] = read(Kind.KEY_GROUPS, s.table, where)[1]
            chains = {
                int(kg): tuple((int(v), str(f), int(o), int(n), int(z)) for v, f, o, n, z in c)
                for kg, c in meta["chains"].items()
            }
            return Parked(backend_of(mine, seq), timers, version, writer, chains)
        except Exception as exc:  # torn, foreign or unreadable: cold, and gone
            log.warning("asyncio_ops: a parked copy in %s is unusable (dropped): %s", mine, exc)
            shutil.rmtree(mine, ignore_errors=True)
    return None
