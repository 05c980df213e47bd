"""Specs for tests that run the partition runtime without Spark.

The Spark layer resolves a spec's fields from the DataFrame and the function;
a test gives them directly, with these fallbacks, and the options by keyword
(checked and defaulted by the options objects, as the Spark API's are).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from asyncio_ops._functions import AsyncFunction
from asyncio_ops._runtime import KeyedOptions, KeyedProcessSpec, PartitionSpec, WaitOptions
from asyncio_ops._storage._checkpoint_storage import CheckpointStorage
from asyncio_ops.options import DEFAULT_CAPACITY, OutputMode
from asyncio_ops.state import KeyedProcessFunction

BATCH_SIZE = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch default


def partition_spec(
    function: AsyncFunction[Any, Any],
    *,
    output_schema: pa.Schema,
    added_columns: tuple[str, ...],
    mode: OutputMode = OutputMode.ORDERED,
    capacity: int | str = DEFAULT_CAPACITY,
    on_empty: str = "drop",
    output_buffer: int = 0,
    batch_size: int = BATCH_SIZE,
    uid: str = "async-wait",
    key: tuple[str, ...] = (),
    chunk_size: int | None = None,
    num_partitions: int | None = None,
    checkpoint: CheckpointStorage | None = None,
    row_factory: Any = None,
    function_token: str = "test",
    run_token: str = "",
    run_epoch: int = 0,
    **options: Any,
) -> PartitionSpec:
    """A :class:`PartitionSpec`; ``options`` are :class:`WaitOptions`'s (``timeout``
    30 s unless given; ``checkpoint_location`` the storage's)."""
    options.setdefault("timeout", 30.0)
    if checkpoint is not None:
        options.setdefault("checkpoint_location", checkpoint.location)
    return PartitionSpec(
        options=WaitOptions.of(**options), function=function, function_token=function_token,
        mode=mode, output_schema=output_schema, added_columns=added_columns,
        capacity=capacity, on_empty=on_empty, output_buffer=output_buffer,
        batch_size=batch_size, uid=uid, key=key, chunk_size=chunk_size,
        num_partitions=num_partitions, checkpoint=checkpoint, row_factory=row_factory,
        run_token=run_token, run_epoch=run_epoch,
    )  # fmt: skip


def keyed_process_spec(
    function: KeyedProcessFunction[Any, Any, Any],
    *,
    key: tuple[str, ...],
    output_schema: pa.Schema,
    batch_size: int = BATCH_SIZE,
    num_partitions: int | None = None,
    checkpoint: CheckpointStorage | None = None,
    key_schema: str = "",
    seeded: bool = False,
    plan_token: str | None = None,
    **options: Any,
) -> KeyedProcessSpec:
    """A :class:`KeyedProcessSpec`; ``options`` are :class:`KeyedOptions`'s
    (``checkpoint_location`` the storage's)."""
    if checkpoint is not None:
        options.setdefault("checkpoint_location", checkpoint.location)
    extra = {"plan_token": plan_token} if plan_token is not None else {}
    return KeyedProcessSpec(
        options=KeyedOptions.of(**options), function=function, key=key,
        output_schema=output_schema, batch_size=batch_size, num_partitions=num_partitions,
        checkpoint=checkpoint, key_schema=key_schema, seeded=seeded, **extra,
    )  # fmt: skip
