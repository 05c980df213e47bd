"""Warm keyed state: what a worker process keeps of a streaming partition between tasks.

Contract. When a task of ``keyed_process`` commits version ``N`` of its
partition (its manifest is written), the process keeps the partition's
operator (its backend, RocksDB's database open on local disk, and its
timers) under a key naming the operator's checkpoint (location and uid),
the plan it ran (a token drawn on the driver when the DataFrame was built,
so a changed function never finds the state of another), the partition,
the number of partitions and the backend, together with ``N``, the token of
the attempt that wrote the manifest and the chains it named.

A later task of that partition *takes* the entry (it leaves the cache: a
task that fails leaves nothing behind, its next attempt starts cold). It
uses it only after proving what it holds: the manifest of version ``M`` (the
entry's) for this partition must still be the one this process wrote (same
token: not pruned, not rewritten by another attempt). Then, per key group,
it applies only the part of the key group's chain at ``N - 1`` after the
chain it holds (nothing when ``M = N - 1``); a key group whose chain was
restarted by a full snapshot is cleared and read whole. A failed proof, or
no entry, means reading every chain from the checkpoint (cold).

Bounds: at most ``ASYNCIO_OPS_WARM_PARTITIONS`` entries per process (default
4; 0 turns warm state off); the least recently stored is closed first.
Python workers are reused between tasks (``spark.python.worker.reuse``, on
by default); a new worker starts cold (on RocksDB, from the database the last
worker parked on the machine's disk, if it proves: ``_parked``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from .._engine._keyed_operator import KeyedProcessOperator
from ._versions import Chain

WARM_PARTITIONS_ENV: Final = "ASYNCIO_OPS_WARM_PARTITIONS"
_DEFAULT_LIMIT: Final = 4


@dataclass
class Warm:
    """A committed partition's operator (see the module docstring)."""

    version: int
    writer: str
    operator: KeyedProcessOperator
    chains: dict[int, Chain]


log = logging.getLogger("asyncio_ops.runtime")
_lock = threading.Lock()
_cache: OrderedDict[tuple[Any, ...], Warm] = OrderedDict()


def limit() -> int:
    """How many partitions a process keeps warm (``ASYNCIO_OPS_WARM_PARTITIONS``)."""
    raw = os.environ.get(WARM_PARTITIONS_ENV, "")
    try:
        return max(0, int(raw)) if raw else _DEFAULT_LIMIT
    except ValueError:
        return _DEFAULT_LIMIT


def take(key: tuple[Any, ...]) -> Warm | None:
    """Remove and return the entry of ``key``, if any."""
    with _lock:
        return _cache.pop(key, None)


def put(key: tuple[Any, ...], warm: Warm) -> bool:
    """Keep ``warm`` under ``key``; False (keeping nothing) if warm state is off.
    Evicted entries' backends are closed."""
    n = limit()
    if n <= 0:
        return False
    evicted = []
    with _lock:
        old = _cache.pop(key, None)
        if old is not None:
            evicted.append(old)
        _cache[key] = warm
        while len(_cache) > n:
            evicted.append(_cache.popitem(last=False)[1])
    for entry in evicted:
        if entry.operator.backend is not warm.operator.backend:
            discard(entry)
    return True


def discard(entry: Warm) -> None:
    """Close an entry's backend; a failure (its working directory deleted under it, say)
    is logged, never raised: the copy is dropped either way, the checkpoint holds the state."""
    try:
        entry.operator.backend.close()
    except Exception as exc:  # whatever the backend raises, the copy is gone
        log.warning("closing a partition's warm state failed (dropped): %s", exc)


def clear() -> None:
    """Close and forget every entry (a worker that is told to drop its state)."""
    with _lock:
        entries = list(_cache.values())
        _cache.clear()
    for entry in entries:
        discard(entry)
