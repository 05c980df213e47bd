"""What the driver sends to every task, and what a task knows about itself.

:class:`PartitionSpec` is built and validated once on the driver (the Spark
layer) and pickled to every task; :class:`TaskInfo` is read from Spark's
``TaskContext`` inside the task. Neither is ever written to a checkpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from .._checkpoint import CheckpointStorage
from .._functions import AsyncFunction
from .._limit import DEFAULT_MAX_CAPACITY
from .._retry import AsyncRetryStrategy
from ..options import OutputMode
from ..state import KeyedProcessFunction

ERROR_COLUMN: Final = "_error"
KEY_GROUP_COLUMN: Final = "__aops_key_group"
LATE_COLUMN: Final = "_late"
ERROR_TYPE: Final = pa.struct(
    [
        pa.field("exception", pa.string()),
        pa.field("message", pa.string()),
        pa.field("attempts", pa.int32()),
    ]
)

STATE_BACKENDS: Final = ("heap", "rocksdb")
"""Where a streaming micro-batch's carry-over state is built: Python dicts, or RocksDB."""
DEFAULT_FLUSH_ROWS: Final = 1000
"""Completed lookups logged in memory before the replay log is written (checkpoints)."""
DEFAULT_FLUSH_INTERVAL: Final = 1.0
"""Seconds after which logged lookups are written even if fewer than the flush count."""


@dataclass(frozen=True)
class PartitionSpec:
    """Everything a worker needs to run one async operator over a partition.

    ``run_token`` identifies the DataFrame this spec was built for (random,
    chosen on the driver): with the task's SQL execution id it names a batch
    job's checkpoint run, so two DataFrames, or two actions on one, never
    share one (see :class:`TaskInfo`). ``run_epoch`` (milliseconds: the Spark
    application's start, or the time the DataFrame was built where that is not
    known) leads the run's name, so that runs sort in the order they ran.
    """

    function: AsyncFunction[Any, Any]
    function_token: str
    mode: OutputMode
    timeout: float
    capacity: int | str  # or "auto": an adaptive limit up to max_capacity
    retry: AsyncRetryStrategy | None
    output_schema: pa.Schema
    added_columns: tuple[str, ...]
    keep_input_columns: bool = True
    on_error: str = "fail"
    on_empty: str = "drop"
    # what the function receives for a row, made from the row dict (None: the dict);
    # the Spark layer passes pyspark's Row for rows_as="row"
    row_factory: Callable[..., Any] | None = None
    event_time: str | None = None
    watermark_delay: float = 0.0
    watermark_interval: int = 1000
    late_records: str = "keep"
    key_columns: tuple[str, ...] = ()
    batch_size: int = 10_000
    operator_uid: str = "async-wait"
    num_partitions: int | None = None
    max_parallelism: int = 128
    checkpoint: CheckpointStorage | None = None
    checkpoint_version: int | None = None
    drain_timeout: float | None = None
    retain_versions: int = 10
    chunk_size: int | None = None
    output_buffer: int = 0
    max_capacity: int = DEFAULT_MAX_CAPACITY
    flush_rows: int = DEFAULT_FLUSH_ROWS
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    state_backend: str = "heap"
    run_token: str = ""
    run_epoch: int = 0


@dataclass(frozen=True)
class KeyedProcessSpec:
    """Everything a worker needs to run a :class:`KeyedProcessFunction` over a partition.

    ``output_schema`` is the schema of the rows the function emits (nothing
    else is output); ``checkpoint`` holds the state between micro-batches.
    """

    function: KeyedProcessFunction[Any, Any, Any]
    key_columns: tuple[str, ...]
    output_schema: pa.Schema
    event_time: str | None = None
    watermark_delay: float = 0.0
    watermark_interval: int = 1000
    max_parallelism: int = 128
    num_partitions: int | None = None
    checkpoint: CheckpointStorage | None = None
    state_backend: str = "heap"
    retain_versions: int = 10
    batch_size: int = 10_000
    # incremental checkpoints: a key group's full state every this many versions
    full_snapshot_interval: int = 50
    # the key columns' names and Spark types (a StructType's JSON), written into each
    # manifest so read_state gives the keys back as columns; "" writes none
    key_schema: str = ""
    # initial state: the checkpoint holds a seed (``_seed``) that micro-batch 0 or the
    # batch job applies before ``open``
    seeded: bool = False
    # a query that restores may start this operator empty although the location holds
    # state of its other uids (Flink's allowNonRestoredState; see _versions.claim)
    allow_non_restored_state: bool = False
    # drawn once per spec (on the driver, per DataFrame built; workers get copies):
    # keys the state a worker keeps warm, so another function never finds it
    plan_token: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class TaskInfo:
    """Where the partition runs (from Spark's TaskContext, or defaults).

    ``batch_id`` is the streaming micro-batch (``streaming.sql.batchId``),
    ``execution_id`` the SQL execution of a batch job (``spark.sql.execution.id``):
    every attempt of every task of one action shares it, and another action
    gets another. ``query_id``: the streaming query's (``sql.streaming.queryId``).
    """

    partition_id: int = 0
    num_partitions: int = 1
    attempt_number: int = 0
    stage_id: int = 0
    batch_id: int | None = None
    execution_id: str | None = None
    # the streaming query's id (``sql.streaming.queryId``): the same across restarts of
    # one query from its Spark checkpoint, another for another query
    query_id: str | None = None


def key_selector(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    """A row's key: its one key column's value, or a tuple of the columns' values."""
    if len(columns) == 1:
        (column,) = columns
        return lambda row: row[column]
    return lambda row: tuple(row[c] for c in columns)
