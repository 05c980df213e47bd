"""What the operators read from the DataFrame and from Spark: schemas, columns, sizes, tasks.

Checked on the driver, each a ConfigurationError naming the option and what
the DataFrame has: a DDL string or StructType (:func:`as_struct`), the key
columns (atomic types, :func:`key_columns`), the event-time column (a time,
date or number, :func:`event_time_column`), ``batch_size``'s default (Spark's
``spark.sql.execution.arrow.maxRecordsPerBatch``, :func:`batch_size_of`); and
inside a task, where it runs (:func:`task_info`, from Spark's ``TaskContext``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.types import (
    AtomicType,
    DataType,
    DateType,
    NumericType,
    StructType,
    TimestampNTZType,
    TimestampType,
    _parse_datatype_string,
)

from .._exceptions import ConfigurationError
from .._runtime import TaskInfo
from ..options import positive_int


def batch_size_of(df: DataFrame, given: int | None) -> int:
    """``batch_size``: as given, else Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``
    (the rows of an Arrow batch ``mapInArrow`` hands the function)."""
    if given is not None:
        return given
    conf = df.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    return positive_int(int(conf or 10000), "batch_size")


def as_struct(schema: str | StructType, what: str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            parsed = _parse_datatype_string(schema)
        except Exception as exc:
            raise ConfigurationError(f"{what} {schema!r} is not a valid DDL schema: {exc}") from exc
        if not isinstance(parsed, StructType):
            raise ConfigurationError(f"{what} must describe columns, got {parsed!r}")
        return parsed
    raise ConfigurationError(f"{what} must be a DDL string or a StructType, got {schema!r}")


def key_columns(key: str | Sequence[str] | None, df: DataFrame) -> tuple[str, ...]:
    """The key columns (none without ``key``); ConfigurationError for a non-atomic type."""
    cols = _columns(key, "key", df)
    for c in cols:
        ktype = df.schema[c].dataType
        if not isinstance(ktype, AtomicType):
            raise ConfigurationError(
                f"key column {c!r} has type {ktype.simpleString()}; keys must be atomic "
                "(numbers, strings, binary, booleans, dates, timestamps, decimals)"
            )
    return cols


def event_time_column(event_time: str | None, df: DataFrame) -> str | None:
    """The event-time column, if any; ConfigurationError for a type without a time."""
    (column,) = _columns(event_time, "event_time", df) or (None,)
    if column is not None:
        dtype: DataType = df.schema[column].dataType
        if not isinstance(dtype, TimestampType | TimestampNTZType | DateType | NumericType):
            raise ConfigurationError(
                f"event_time column {column!r} has type {dtype.simpleString()}; "
                "use a timestamp, date or numeric column"
            )
    return column


def _columns(value: str | Sequence[str] | None, name: str, df: DataFrame) -> tuple[str, ...]:
    if value is None:
        return ()
    cols = (value,) if isinstance(value, str) else tuple(value)
    if not cols or not all(isinstance(c, str) for c in cols):
        raise ConfigurationError(f"{name} must be a column name or a list of names, got {value!r}")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ConfigurationError(
            f"{name} column(s) {missing} not in the DataFrame (columns: {df.columns})"
        )
    return cols


def task_info(num_partitions: int | None) -> TaskInfo:
    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only outside a Spark task
        return TaskInfo()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return TaskInfo(
        partition_id=ctx.partitionId(),
        num_partitions=num_partitions or 0,
        attempt_number=ctx.attemptNumber(),
        stage_id=ctx.stageId(),
        batch_id=int(batch) if batch is not None else None,
        execution_id=ctx.getLocalProperty("spark.sql.execution.id"),
        query_id=ctx.getLocalProperty("sql.streaming.queryId"),
    )
