"""Every option of the operators over partitions, defined once, with its default.

:class:`PartitionOptions` holds what every operator shares (partitioning, event
time, checkpoints); :class:`WaitOptions` adds the async operator's
(``ordered_wait`` / ``unordered_wait``, the SQL functions) and
:class:`KeyedOptions` ``keyed_process``'s. One field per option: its type, its
default, and (``metadata``) the default as docs/spark.md's option table shows
it, its unit and its allowed values. Building one checks every value on its own
(:mod:`asyncio_ops.options`'s validators: the error names the option and the
value) and the rules that tie options together, and keeps each value in its
canonical form (durations as seconds).

The runtime's specs (:class:`~asyncio_ops._runtime.PartitionSpec`,
:class:`~asyncio_ops._runtime.KeyedProcessSpec`) carry the options object as
it is, plus only what the Spark layer resolves from the DataFrame, the function
or Spark's configuration (the key columns, ``batch_size``, ``capacity``,
``chunk_size``, ``output_buffer``, ``on_empty``, ``uid``, ``num_partitions``,
the checkpoint storage); a resolved value keeps its option's name. Adding an
option: a field here (for the async operator also its line in the Spark
layer's ``WaitKeywords`` and its row in docs/spark.md, held equal to the fields
by ``tests/spark/test_options_object.py``), the code that uses it, and its test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self

from .._engine._retry import AsyncRetryStrategy
from .._exceptions import ConfigurationError, KeyGroupError
from .._keygroups import check_parallelism
from ..options import (
    DEFAULT_MAX_CAPACITY,
    at_least,
    capacity_or_auto,
    choice,
    int_between,
    non_negative_int,
    path_segment,
    positive_int,
    positive_seconds,
    seconds_or_zero,
)
from ._metrics import MetricsSink

__all__ = [
    "CHUNK_AUTO",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_FLUSH_ROWS",
    "ON_EMPTY",
    "STATE_BACKENDS",
    "KeyedOptions",
    "PartitionOptions",
    "WaitOptions",
]

STATE_BACKENDS: Final = ("heap", "rocksdb")
"""Where keyed state and a micro-batch's carry-over are built: Python dicts, or RocksDB."""
DEFAULT_FLUSH_ROWS: Final = 1000
"""Completed lookups logged in memory before the replay log is written (checkpoints)."""
DEFAULT_FLUSH_INTERVAL: Final = 1.0
"""Seconds after which logged lookups are written even if fewer than the flush count."""

ON_ERROR: Final = ("fail", "error_column")
ON_EMPTY: Final = ("drop", "keep")
ROWS_AS: Final = ("dict", "row")
LATE_RECORDS: Final = ("keep", "drop")
CHUNK_AUTO: Final = "auto"
DEFAULT_OUTPUT_BUFFER_FACTOR: Final = 4
"""``output_buffer`` defaults to this many times ``capacity`` (0 is Flink's meaning)."""

def _doc(*, shown: str, unit: str = "", allowed: str = "") -> dict[str, str]:
    """A field's metadata: its default as docs/spark.md shows it, its unit, its values."""
    return {"shown": shown, "unit": unit, "allowed": allowed}


def _put(options: object, name: str, value: Any) -> None:
    object.__setattr__(options, name, value)  # a frozen field, made canonical once


@dataclass(frozen=True, kw_only=True)
class PartitionOptions:
    """The options every operator over DataFrames shares (``ordered_wait``,
    ``unordered_wait``, ``keyed_process``): partitioning, event time, checkpoints.

    Frozen. A duration (``unit`` seconds) is given as seconds, a ``timedelta`` or an
    interval string (``"2 seconds"``) and held as seconds (float), the type its field
    declares; every value has passed its check, and the rules that tie options
    together, when the object exists; ConfigurationError names the option and the
    value otherwise. Built from keywords by :meth:`of`.
    """

    event_time: str | None = field(
        default=None, metadata=_doc(shown="None", allowed="a column name")
    )
    watermark_delay: float | None = field(
        default=None, metadata=_doc(shown="0", unit="seconds", allowed=">= 0")
    )
    watermark_interval: int = field(
        default=1000, metadata=_doc(shown="1000", unit="rows", allowed="> 0")
    )
    max_parallelism: int = field(
        default=128, metadata=_doc(shown="128", unit="key groups", allowed="1 .. 32768")
    )
    num_partitions: int | None = field(
        default=None,
        metadata=_doc(shown="None", unit="partitions", allowed="1 .. max_parallelism"),
    )
    batch_size: int | None = field(
        default=None,
        metadata=_doc(
            shown="`spark.sql.execution.arrow.maxRecordsPerBatch`", unit="rows", allowed="> 0"
        ),
    )
    checkpoint_location: str | None = field(
        default=None, metadata=_doc(shown="None", allowed="a path or URI")
    )
    state_backend: str = field(
        default="heap",
        metadata=_doc(shown='`"heap"`', allowed=" | ".join(STATE_BACKENDS)),
    )
    retain_versions: int = field(
        default=10, metadata=_doc(shown="10", unit="versions", allowed=">= 2")
    )
    preflight: bool = field(default=True, metadata=_doc(shown="`True`"))
    uid: str | None = field(
        default=None, metadata=_doc(shown="derived", allowed="one path segment")
    )

    @classmethod
    def of(cls, **options: Any) -> Self:
        """The options given by keyword (durations in any of their forms), checked."""
        return cls(**options)

    def __post_init__(self) -> None:
        choice(self.state_backend, "state_backend", STATE_BACKENDS)
        try:
            check_parallelism(self.max_parallelism)
        except KeyGroupError as exc:
            raise ConfigurationError(str(exc)) from exc
        if self.num_partitions is not None:
            int_between(self.num_partitions, "num_partitions", 1, self.max_parallelism)
        if self.batch_size is not None:
            positive_int(self.batch_size, "batch_size")
        positive_int(self.watermark_interval, "watermark_interval")
        if self.event_time is None and self.watermark_delay is not None:
            raise ConfigurationError("watermark_delay needs event_time= (the event-time column)")
        if self.watermark_delay is not None:
            _put(self, "watermark_delay", seconds_or_zero(self.watermark_delay, "watermark_delay"))
        if self.uid is not None:
            path_segment(self.uid, "uid")
        at_least(self.retain_versions, "retain_versions", 2)


@dataclass(frozen=True, kw_only=True)
class WaitOptions(PartitionOptions):
    """The options of one ``ordered_wait`` / ``unordered_wait`` (see the module docstring
    and :class:`PartitionOptions`)."""

    timeout: float = field(
        metadata=_doc(shown="required", unit="seconds", allowed="> 0, inf: none")
    )
    capacity: int | str | None = field(
        default=None,
        metadata=_doc(
            shown="100, or a columnar connector's own", unit="elements", allowed="> 0 or 'auto'"
        ),
    )
    max_capacity: int = field(
        default=DEFAULT_MAX_CAPACITY, metadata=_doc(shown="1024", unit="elements", allowed="> 0")
    )
    output_buffer: int | None = field(
        default=None, metadata=_doc(shown="4 × `capacity`", unit="elements", allowed=">= 0")
    )
    retry: AsyncRetryStrategy | None = field(default=None, metadata=_doc(shown="None"))
    on_error: str = field(
        default="fail", metadata=_doc(shown='`"fail"`', allowed=" | ".join(ON_ERROR))
    )
    on_empty: str | None = field(
        default=None,
        metadata=_doc(shown='`"keep"` for a lookup connector, else `"drop"`',
                      allowed=" | ".join(ON_EMPTY)),
    )  # fmt: skip
    rows_as: str = field(
        default="dict", metadata=_doc(shown='`"dict"`', allowed=" | ".join(ROWS_AS))
    )
    key: str | Sequence[str] | None = field(
        default=None, metadata=_doc(shown="None", allowed="column name(s)")
    )
    late_records: str = field(
        default="keep", metadata=_doc(shown='`"keep"`', allowed=" | ".join(LATE_RECORDS))
    )
    checkpoint_version: int | None = field(
        default=None, metadata=_doc(shown="None", allowed=">= 0")
    )
    checkpoint_flush_rows: int = field(
        default=DEFAULT_FLUSH_ROWS, metadata=_doc(shown="1000", unit="lookups", allowed="> 0")
    )
    checkpoint_flush_interval: float = field(
        default=DEFAULT_FLUSH_INTERVAL,
        metadata=_doc(shown="1 s", unit="seconds", allowed="> 0"),
    )
    drain_timeout: float | None = field(
        default=None, metadata=_doc(shown="None", unit="seconds", allowed="> 0")
    )
    chunk_size: int | str | None = field(
        default=CHUNK_AUTO,
        metadata=_doc(shown='`"auto"`', unit="rows", allowed="> 0, 'auto' or None"),
    )
    metrics: MetricsSink | None = field(
        default=None, metadata=_doc(shown="None", allowed="an AsyncMetrics")
    )
    keep_input_columns: bool = field(default=True, metadata=_doc(shown="`True`"))

    def __post_init__(self) -> None:
        super().__post_init__()
        _put(self, "timeout", positive_seconds(self.timeout, "timeout"))
        positive_int(self.max_capacity, "max_capacity")
        if self.capacity is not None:
            capacity_or_auto(self.capacity)
        if self.output_buffer is not None:
            non_negative_int(self.output_buffer, "output_buffer")
        if self.retry is not None and not isinstance(self.retry, AsyncRetryStrategy):
            raise ConfigurationError(f"retry must be an AsyncRetryStrategy, got {self.retry!r}")
        choice(self.on_error, "on_error", ON_ERROR)
        if self.on_empty is not None:  # None: the function's default_on_empty
            choice(self.on_empty, "on_empty", ON_EMPTY)
        choice(self.rows_as, "rows_as", ROWS_AS)
        choice(self.late_records, "late_records", LATE_RECORDS)
        positive_int(self.checkpoint_flush_rows, "checkpoint_flush_rows")
        interval = positive_seconds(self.checkpoint_flush_interval, "checkpoint_flush_interval")
        _put(self, "checkpoint_flush_interval", interval)
        if self.checkpoint_location is not None:
            if self.checkpoint_version is not None:
                non_negative_int(self.checkpoint_version, "checkpoint_version")
            if self.drain_timeout is not None:
                _put(self, "drain_timeout", positive_seconds(self.drain_timeout, "drain_timeout"))
        elif self.checkpoint_version is not None or self.drain_timeout is not None:
            raise ConfigurationError(
                "checkpoint_version and drain_timeout need checkpoint_location="
            )
        if isinstance(self.chunk_size, str) and self.chunk_size != CHUNK_AUTO:
            raise ConfigurationError(
                f"chunk_size must be 'auto', a positive int or None, got {self.chunk_size!r}"
            )
        if self.chunk_size is not None and not isinstance(self.chunk_size, str):
            positive_int(self.chunk_size, "chunk_size")

    def output_buffer_for(self, capacity: int | str) -> int:
        """``output_buffer``, or its default for ``capacity`` (the resolved one): finished
        rows may wait behind a slower one beyond capacity, which then bounds the lookups
        in flight (``"auto"``: 4x ``max_capacity``)."""
        if self.output_buffer is not None:
            return self.output_buffer
        bound = capacity if isinstance(capacity, int) else self.max_capacity
        return DEFAULT_OUTPUT_BUFFER_FACTOR * bound


@dataclass(frozen=True, kw_only=True)
class KeyedOptions(PartitionOptions):
    """The options of one ``keyed_process`` beyond :class:`PartitionOptions` (its key,
    output schema, initial state and function are arguments of their own)."""

    full_snapshot_interval: int = field(
        default=50, metadata=_doc(shown="50", unit="versions", allowed="> 0")
    )
    allow_non_restored_state: bool = field(default=False, metadata=_doc(shown="`False`"))

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int(self.full_snapshot_interval, "full_snapshot_interval")
        if not isinstance(self.allow_non_restored_state, bool):
            raise ConfigurationError(
                f"allow_non_restored_state must be True or False, got "
                f"{self.allow_non_restored_state!r}"
            )


