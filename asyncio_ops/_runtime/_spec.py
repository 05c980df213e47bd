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

from .._functions import AsyncFunction
from .._storage._checkpoint_storage import CheckpointStorage
from ..options import OutputMode
from ..state import KeyedProcessFunction
from ._options import KeyedOptions, WaitOptions

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



@dataclass(frozen=True)
class PartitionSpec:
    """Everything a worker needs to run one async operator over a partition.

    ``options`` are the operator's options as given (checked, canonical); the
    other fields are what the Spark layer resolved from them, the DataFrame and
    the function, each under its option's name where it has one: ``key`` (the
    key columns, none without ``key=``), ``capacity``, ``on_empty``,
    ``batch_size``, ``chunk_size`` (rows per chunk, None: one element per row),
    ``output_buffer``, ``uid``, ``num_partitions`` and ``checkpoint`` (the
    storage at ``checkpoint_location``, None without one).

    ``run_token`` identifies the DataFrame this spec was built for (random,
    chosen on the driver): with the task's SQL execution id it names a batch
    job's checkpoint run, so two DataFrames, or two actions on one, never
    share one (see :class:`TaskInfo`). ``run_epoch`` (milliseconds: the Spark
    application's start, or the time the DataFrame was built where that is not
    known) leads the run's name, so that runs sort in the order they ran.
    """

    options: WaitOptions
    function: AsyncFunction[Any, Any]
    function_token: str
    mode: OutputMode
    output_schema: pa.Schema
    added_columns: tuple[str, ...]
    capacity: int | str  # or "auto": an adaptive limit up to options.max_capacity
    on_empty: str
    output_buffer: int
    batch_size: int
    uid: str
    key: tuple[str, ...] = ()
    chunk_size: int | None = None
    num_partitions: int | None = None
    checkpoint: CheckpointStorage | None = None
    # what the function receives for a row, made from the row dict (None: the dict);
    # the Spark layer passes pyspark's Row for rows_as="row"
    row_factory: Callable[..., Any] | None = None
    run_token: str = ""
    run_epoch: int = 0


@dataclass(frozen=True)
class KeyedProcessSpec:
    """Everything a worker needs to run a :class:`KeyedProcessFunction` over a partition.

    ``options`` are ``keyed_process``'s options as given; ``key`` (the key
    columns), ``batch_size``, ``num_partitions`` and ``checkpoint`` (the storage
    at ``checkpoint_location``) are resolved from them. ``output_schema`` is the
    schema of the rows the function emits (nothing else is output);
    ``checkpoint`` holds the state between micro-batches.
    """

    options: KeyedOptions
    function: KeyedProcessFunction[Any, Any, Any]
    key: tuple[str, ...]
    output_schema: pa.Schema
    batch_size: int
    num_partitions: int | None = None
    checkpoint: CheckpointStorage | None = None
    # the key columns' names and Spark types (a StructType's JSON), written into each
    # manifest so read_state gives the keys back as columns; "" writes none
    key_schema: str = ""
    # initial state: the checkpoint holds a seed (``_seed``) that micro-batch 0 or the
    # batch job applies before ``open``
    seeded: bool = False
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
