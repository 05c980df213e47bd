"""State time-to-live (Flink's ``StateTtlConfig``).

A TTL state stores, next to each value (each element of a list, each entry of
a map), the timestamp of its last access. An entry is *expired* when
``last_access + ttl <= now``.

Decisions, following Flink where it has one:

- ``update_type``: ``ON_CREATE_AND_WRITE`` refreshes the timestamp on writes
  (``update``, ``add``, ``put``); ``ON_READ_AND_WRITE`` also on reads that
  return the entry.
- ``visibility``: ``NEVER_RETURN_EXPIRED`` hides expired entries;
  ``RETURN_EXPIRED_IF_NOT_CLEANED_UP`` returns an expired entry that is still
  stored. Either way the read that meets an expired entry removes it (lazy
  cleanup), so it is returned at most once.
- Cleanup: always lazily on access; plus the strategies in ``cleanup``:
  :func:`cleanup_full_snapshot` (expired entries are not written into a
  snapshot), :func:`cleanup_incrementally` (each access of the state, and with
  ``run_for_every_record`` each record, checks ``cleanup_size`` more entries)
  and :func:`cleanup_in_rocksdb_compaction` (the RocksDB backend sweeps a batch
  of entries after every ``query_time_after_num_entries`` writes, the stand-in
  for Flink's compaction filter). ``cleanup=None`` means Flink's defaults:
  incremental (5 entries, on access) for the heap backend, the compaction sweep
  (every 1000 writes) for RocksDB. ``cleanup=()`` disables background cleanup.
- Time: processing time from the backend's clock by default. With
  ``time_characteristic=EVENT_TIME`` the current watermark is the time
  (``backend.advance_watermark``); entries written before the first watermark
  count as written at the first watermark, and nothing expires before it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from .._exceptions import ConfigurationError
from ..options import seconds

__all__ = [
    "CleanupStrategy",
    "FullSnapshotCleanup",
    "IncrementalCleanup",
    "RocksDBCompactionCleanup",
    "StateTtlConfig",
    "StateVisibility",
    "TtlTimeCharacteristic",
    "UpdateType",
    "cleanup_full_snapshot",
    "cleanup_in_rocksdb_compaction",
    "cleanup_incrementally",
]


class UpdateType(enum.Enum):
    """When the last-access timestamp is refreshed.

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, StateTtlConfig, UpdateType,
    ...     ValueStateDescriptor)
    >>> from asyncio_ops.testing import ManualClock
    >>> clock = ManualClock()
    >>> backend = HeapKeyedStateBackend(
    ...     max_parallelism=128, key_group_range=KeyGroupRange(0, 127), clock=clock)
    >>> ttl = StateTtlConfig(60, update_type=UpdateType.ON_READ_AND_WRITE)
    >>> seen = backend.get_state(ValueStateDescriptor("seen", ttl=ttl))
    >>> backend.set_current_key("user-1")
    >>> seen.update(True)
    >>> clock.advance(50)
    >>> seen.value()  # a read refreshes the entry: 60 more seconds from now
    True
    >>> clock.advance(50)
    >>> seen.value()
    True
    """

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class StateVisibility(enum.Enum):
    """Whether an expired entry that is still stored may be returned.

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, StateTtlConfig, StateVisibility,
    ...     ValueStateDescriptor)
    >>> from asyncio_ops.testing import ManualClock
    >>> clock = ManualClock()
    >>> backend = HeapKeyedStateBackend(
    ...     max_parallelism=128, key_group_range=KeyGroupRange(0, 127), clock=clock)
    >>> ttl = StateTtlConfig(60, visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
    ...                      cleanup=())
    >>> seen = backend.get_state(ValueStateDescriptor("seen", ttl=ttl))
    >>> backend.set_current_key("user-1")
    >>> seen.update(True)
    >>> clock.advance(60)
    >>> seen.value(), seen.value()  # expired, still stored: returned once, then removed
    (True, None)
    """

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


class TtlTimeCharacteristic(enum.Enum):
    """Which time TTL is measured in.

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, StateTtlConfig, TtlTimeCharacteristic,
    ...     ValueStateDescriptor)
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 127))
    >>> ttl = StateTtlConfig(60, time_characteristic=TtlTimeCharacteristic.EVENT_TIME)
    >>> seen = backend.get_state(ValueStateDescriptor("seen", ttl=ttl))
    >>> backend.advance_watermark(0.0)
    >>> backend.set_current_key("user-1")
    >>> seen.update(True)
    >>> seen.value()  # the clock is not the time: the watermark is
    True
    >>> backend.advance_watermark(60.0)
    >>> seen.value() is None
    True
    """

    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


@dataclass(frozen=True, slots=True)
class FullSnapshotCleanup:
    """Expired entries are left out of full snapshots."""


@dataclass(frozen=True, slots=True)
class IncrementalCleanup:
    """Check ``cleanup_size`` entries per state access (and per record if asked)."""

    cleanup_size: int = 5
    run_for_every_record: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cleanup_size, int) or self.cleanup_size <= 0:
            raise ConfigurationError(
                f"cleanup_incrementally: cleanup_size must be a positive int, "
                f"got {self.cleanup_size!r}"
            )


@dataclass(frozen=True, slots=True)
class RocksDBCompactionCleanup:
    """RocksDB only: sweep a batch of entries after every N writes to the state."""

    query_time_after_num_entries: int = 1000

    def __post_init__(self) -> None:
        if (
            not isinstance(self.query_time_after_num_entries, int)
            or self.query_time_after_num_entries <= 0
        ):
            raise ConfigurationError(
                "cleanup_in_rocksdb_compaction: query_time_after_num_entries must be a "
                f"positive int, got {self.query_time_after_num_entries!r}"
            )


CleanupStrategy = FullSnapshotCleanup | IncrementalCleanup | RocksDBCompactionCleanup


def cleanup_full_snapshot() -> FullSnapshotCleanup:
    """Leave expired entries out of full snapshots.

    Example:

    >>> from asyncio_ops.state import StateTtlConfig, cleanup_full_snapshot
    >>> StateTtlConfig("1 day", cleanup=(cleanup_full_snapshot(),)).full_snapshot_cleanup()
    True
    """
    return FullSnapshotCleanup()


def cleanup_incrementally(
    cleanup_size: int, run_for_every_record: bool = False
) -> IncrementalCleanup:
    """Check ``cleanup_size`` entries on each state access (and each record if asked).

    Example:

    >>> from asyncio_ops.state import StateTtlConfig, cleanup_incrementally
    >>> ttl = StateTtlConfig(60, cleanup=(cleanup_incrementally(10, run_for_every_record=True),))
    >>> ttl.incremental(rocksdb=False)
    IncrementalCleanup(cleanup_size=10, run_for_every_record=True)
    """
    return IncrementalCleanup(cleanup_size, run_for_every_record)


def cleanup_in_rocksdb_compaction(
    query_time_after_num_entries: int = 1000,
) -> RocksDBCompactionCleanup:
    """Sweep expired entries in the RocksDB backend every N writes to the state.

    Example:

    >>> from asyncio_ops.state import StateTtlConfig, cleanup_in_rocksdb_compaction
    >>> ttl = StateTtlConfig(60, cleanup=(cleanup_in_rocksdb_compaction(500),))
    >>> ttl.compaction(rocksdb=True)
    RocksDBCompactionCleanup(query_time_after_num_entries=500)
    """
    return RocksDBCompactionCleanup(query_time_after_num_entries)


_DEFAULT_HEAP_CLEANUP: Final = (IncrementalCleanup(5, False),)
_DEFAULT_ROCKSDB_CLEANUP: Final = (RocksDBCompactionCleanup(1000),)


@dataclass(frozen=True, slots=True)
class StateTtlConfig:
    """Time-to-live of one state (see the module docstring for the semantics).

    ``ttl`` is in seconds, a :class:`datetime.timedelta` or an interval string
    as Spark's (``"10 minutes"``, ``"500 milliseconds"``), finite and > 0.

    Example:

    >>> from asyncio_ops.state import (
    ...     HeapKeyedStateBackend, KeyGroupRange, StateTtlConfig, ValueStateDescriptor)
    >>> from asyncio_ops.testing import ManualClock
    >>> StateTtlConfig("10 minutes").ttl
    600.0
    >>> clock = ManualClock()  # the processing time of TTL
    >>> backend = HeapKeyedStateBackend(
    ...     max_parallelism=128, key_group_range=KeyGroupRange(0, 127), clock=clock)
    >>> seen = backend.get_state(ValueStateDescriptor("seen", ttl=StateTtlConfig(60)))
    >>> backend.set_current_key("user-1")
    >>> seen.update(True)
    >>> clock.advance(59)
    >>> seen.value()
    True
    >>> clock.advance(1)  # 60 seconds after the write
    >>> seen.value() is None
    True
    """

    ttl: float
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    time_characteristic: TtlTimeCharacteristic = TtlTimeCharacteristic.PROCESSING_TIME
    cleanup: tuple[CleanupStrategy, ...] | None = None

    def __post_init__(self) -> None:
        # seconds, a timedelta or a Spark interval string ("10 minutes"), finite and > 0
        object.__setattr__(self, "ttl", seconds(self.ttl, "StateTtlConfig: ttl"))
        if not isinstance(self.update_type, UpdateType):
            raise ConfigurationError(
                f"StateTtlConfig: update_type must be an UpdateType, got {self.update_type!r}"
            )
        if not isinstance(self.visibility, StateVisibility):
            raise ConfigurationError(
                f"StateTtlConfig: visibility must be a StateVisibility, got {self.visibility!r}"
            )
        if not isinstance(self.time_characteristic, TtlTimeCharacteristic):
            raise ConfigurationError(
                "StateTtlConfig: time_characteristic must be a TtlTimeCharacteristic, "
                f"got {self.time_characteristic!r}"
            )
        if self.cleanup is not None:
            cleanup = tuple(self.cleanup)
            for c in cleanup:
                if not isinstance(
                    c, FullSnapshotCleanup | IncrementalCleanup | RocksDBCompactionCleanup
                ):
                    raise ConfigurationError(
                        f"StateTtlConfig: unknown cleanup strategy {c!r}; use "
                        "cleanup_full_snapshot(), cleanup_incrementally(n) or "
                        "cleanup_in_rocksdb_compaction(n)"
                    )
            object.__setattr__(self, "cleanup", cleanup)

    @property
    def update_on_read(self) -> bool:
        return self.update_type is UpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        return self.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP

    @property
    def event_time(self) -> bool:
        return self.time_characteristic is TtlTimeCharacteristic.EVENT_TIME

    def strategies(self, *, rocksdb: bool) -> tuple[CleanupStrategy, ...]:
        """The cleanup strategies in force for a backend kind (defaults filled in)."""
        if self.cleanup is not None:
            return self.cleanup
        return _DEFAULT_ROCKSDB_CLEANUP if rocksdb else _DEFAULT_HEAP_CLEANUP

    def full_snapshot_cleanup(self) -> bool:
        return any(isinstance(c, FullSnapshotCleanup) for c in self.cleanup or ())

    def incremental(self, *, rocksdb: bool) -> IncrementalCleanup | None:
        for c in self.strategies(rocksdb=rocksdb):
            if isinstance(c, IncrementalCleanup):
                return c
        return None

    def compaction(self, *, rocksdb: bool) -> RocksDBCompactionCleanup | None:
        if not rocksdb:
            return None
        for c in self.strategies(rocksdb=rocksdb):
            if isinstance(c, RocksDBCompactionCleanup):
                return c
        return None
