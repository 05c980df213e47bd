"""``ordered_wait`` / ``unordered_wait``: the DataFrame API of the async operator.

Call order on the driver: the keywords become a :class:`WaitOptions` (each
option checked, ``_options``); then what needs the DataFrame and the function
(columns: ``_frame``; the checkpoint's location and owner:
``_checkpoint_location``; the element kind and the defaults the function
chooses: :func:`chunk_rows_of`, :func:`default_capacity`; the function's
preflight) is checked and resolved, and the runtime's ``PartitionSpec`` built
from them; nothing runs until an action. The partition work is
``DataFrame.mapInArrow`` over :func:`asyncio_ops._runtime.run_partition`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from .._engine._retry import AsyncRetryStrategy
from .._exceptions import ConfigurationError
from .._functions import (
    AsyncFunction,
    PrefersChunks,
    SupportsInvokeArrow,
    SupportsInvokeChunk,
    as_async_function,
)
from .._runtime import (
    CHUNK_AUTO,
    ERROR_COLUMN,
    KEY_GROUP_COLUMN,
    LATE_COLUMN,
    ON_EMPTY,
    PartitionSpec,
    run_partition,
)
from .._storage._checkpoint_storage import CheckpointStorage
from ..options import DEFAULT_CAPACITY, OutputMode
from . import _job_errors
from ._checkpoint_location import (
    DESCRIBED,
    checkpoint_storage,
    default_uid,
    describe_operator,
    plan_tag,
    run_epoch,
)
from ._frame import as_struct, batch_size_of, event_time_column, key_columns, task_info
from ._keyed import partition_by_key_group
from ._keywords import known_keywords
from ._metrics import AsyncMetrics
from ._options import WAIT_SIGNATURE, WaitKeywords, WaitOptions
from ._preflight import preflight as run_preflight

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("asyncio_ops.spark")

ERROR_STRUCT: Final = StructType(
    [
        StructField("exception", StringType(), True),
        StructField("message", StringType(), True),
        StructField("attempts", IntegerType(), True),
    ]
)


def _error_struct(df: DataFrame, keep_input_columns: bool) -> StructType:
    """``_error``'s type: :data:`ERROR_STRUCT`, and when the input columns are not kept,
    ``input``, the failed row's input columns, so that an error row names its row."""
    if keep_input_columns:
        return ERROR_STRUCT
    inputs = StructType([f for f in df.schema.fields if f.name != KEY_GROUP_COLUMN])
    return StructType([*ERROR_STRUCT.fields, StructField("input", inputs, True)])


def _wait(
    df: DataFrame,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    mode: OutputMode,
    output_schema: str | StructType,
    options: WaitOptions,
) -> DataFrame:
    """The DataFrame of ``ordered_wait`` / ``unordered_wait``: what needs the DataFrame
    and the function checked and resolved here, on the driver (the options checked
    themselves when they were built), then the runtime's spec built from them."""
    if not isinstance(df, DataFrame):
        raise ConfigurationError(f"df must be a pyspark DataFrame, got {type(df)!r}")
    _job_errors.install()
    if options.metrics is not None and not isinstance(options.metrics, AsyncMetrics):
        raise ConfigurationError(
            f"metrics must be an asyncio_ops.spark.AsyncMetrics, got {options.metrics!r}"
        )
    function = as_async_function(fn)
    batch_size = batch_size_of(df, options.batch_size)
    keep_input_columns = options.keep_input_columns

    added = as_struct(output_schema, "output_schema")
    if not added.fields:
        raise ConfigurationError(
            f"output_schema declares no columns ({output_schema!r}): name the columns the "
            "function adds, e.g. 'name string, tier string'"
        )
    # Spark resolves names case-insensitively unless spark.sql.caseSensitive is set
    case_sensitive = (
        str(df.sparkSession.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
    )

    def fold(name: str) -> str:
        return name if case_sensitive else name.lower()

    seen: dict[str, str] = {}
    for f in added.fields:
        if fold(f.name) in seen:
            raise ConfigurationError(
                f"output_schema declares the column {f.name!r} twice"
                + ("" if f.name == seen[fold(f.name)] else f" (as {seen[fold(f.name)]!r})")
                + " in "
                + repr(output_schema)
            )
        seen[fold(f.name)] = f.name
    reserved = {ERROR_COLUMN, LATE_COLUMN, KEY_GROUP_COLUMN}
    clash = [f.name for f in added.fields if f.name in reserved]
    if clash:
        raise ConfigurationError(f"output_schema uses reserved column name(s) {clash}")
    if keep_input_columns:
        inputs = {fold(c) for c in df.columns}
        clash = [f.name for f in added.fields if fold(f.name) in inputs]
        if clash:
            raise ConfigurationError(
                f"output_schema column(s) {clash} already exist in the input DataFrame; "
                "rename them, or pass keep_input_columns=False"
            )

    key_cols = key_columns(options.key, df)
    event_col = event_time_column(options.event_time, df)
    if event_col is not None and mode is OutputMode.UNORDERED:
        mode = OutputMode.WATERMARK_BOUNDED

    chunk_rows = chunk_rows_of(
        options.chunk_size, function, options.rows_as, options.retry, batch_size
    )
    capacity = options.capacity
    if capacity is None:
        capacity = default_capacity(function, options.chunk_size, chunk_rows)

    operator_uid = options.uid or default_uid(mode, function, added, key_cols, event_col,
                                              df.schema)  # fmt: skip
    storage: CheckpointStorage | None = None
    if options.checkpoint_location is not None:
        storage = checkpoint_storage(df, options.checkpoint_location, operator_uid)

    run_preflight(options.preflight, function, df, added)

    parts = options.num_partitions
    if key_cols:
        df, parts = partition_by_key_group(df, key_cols, options.max_parallelism, parts)
    else:
        if parts is None and storage is not None and df.isStreaming:
            # Carry-over needs stable subtask indices and a known count across
            # micro-batches, whatever partitioning the source gives each batch.
            parts = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
        if parts is not None:
            df = df.repartition(parts)

    in_fields = list(df.schema.fields) if keep_input_columns else []
    out_fields = in_fields + list(added.fields)
    if options.on_error == "error_column":
        out_fields.append(StructField(ERROR_COLUMN, _error_struct(df, keep_input_columns), True))
    if event_col is not None:
        out_fields.append(StructField(LATE_COLUMN, BooleanType(), True))
    spark_schema = StructType(out_fields)
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(spark_schema, timezone=timezone)
    # Results may omit a nullable column: let Arrow fill nulls for every field.
    arrow_schema = pa.schema([f.with_nullable(True) for f in arrow_schema])

    spec = PartitionSpec(
        options=options,
        function=function,
        function_token=uuid.uuid4().hex,
        mode=mode,
        output_schema=arrow_schema,
        added_columns=tuple(f.name for f in added.fields),
        capacity=capacity,
        # not given: the function's own default (a connector keeps, a plain function drops)
        on_empty=options.on_empty or _default_on_empty(function),
        output_buffer=options.output_buffer_for(capacity),
        batch_size=batch_size,
        uid=operator_uid,
        key=key_cols,
        chunk_size=chunk_rows,
        num_partitions=parts,
        checkpoint=storage,
        row_factory=row_of if options.rows_as == "row" else None,
        run_token=uuid.uuid4().hex[:16],
        run_epoch=run_epoch(df.sparkSession),
    )
    on_done = options.metrics._add if options.metrics is not None else None

    def partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from run_partition(spec, batches, task_info(spec.num_partitions), on_done=on_done)

    if storage is not None:
        # the plan names the operator's checkpoint, so that a later operator under the
        # same location and uid finds it upstream (see _checkpoint_location)
        partition.__name__ = plan_tag(storage.location, operator_uid)
        DESCRIBED[partition.__name__] = describe_operator(mode, function, spec.run_token)
    out = df.mapInArrow(partition, spark_schema)
    if key_cols and keep_input_columns:
        out = out.drop(KEY_GROUP_COLUMN)
    return out


def _default_on_empty(function: AsyncFunction[Any, Any]) -> str:
    """``on_empty`` when not given: the function's ``default_on_empty``, checked."""
    value = function.default_on_empty
    if value not in ON_EMPTY:
        raise ConfigurationError(
            f"{type(function).__name__}.default_on_empty must be one of {list(ON_EMPTY)}, "
            f"got {value!r}"
        )
    return str(value)


def row_of(values: dict[str, Any]) -> Row:
    """A row as the function receives it with rows_as="row" (key, index and attribute
    access, in the input's column order)."""
    return Row(**values)


def default_capacity(
    function: AsyncFunction[Any, Any], chunk_size: int | str | None, chunk_rows: int | None
) -> int:
    """``capacity`` when not given: the function's ``preferred_capacity()`` when it
    chose its chunks (``chunk_size="auto"``), else :data:`DEFAULT_CAPACITY`."""
    if chunk_size == CHUNK_AUTO and chunk_rows is not None and isinstance(function, PrefersChunks):
        preferred = function.preferred_capacity()
        if type(preferred) is not int or preferred < 1:
            raise ConfigurationError(
                f"{function!r}.preferred_capacity() must return a positive int, got {preferred!r}"
            )
        return preferred
    return DEFAULT_CAPACITY


def chunk_rows_of(
    chunk_size: int | str | None,
    function: AsyncFunction[Any, Any],
    rows_as: str,
    retry: AsyncRetryStrategy | None,
    batch_size: int,
) -> int | None:
    """Rows per chunk (None: one row per element) for ``chunk_size``.

    ``"auto"``: columnar when the function answers Arrow chunks
    (``async_invoke_arrow``) and nothing asks for rows one at a time: chunks of
    the function's ``preferred_chunk_rows()`` (one request's worth), or of an
    input Arrow batch (``batch_size``) if it states none. Rows one at a time
    for ``rows_as="row"``, a retry strategy that judges results (it judges a
    row's results), and a subclass that overrides ``async_invoke`` below the
    class that answers chunks (a chunk would bypass it).
    """
    if chunk_size is None:
        return None
    if chunk_size == CHUNK_AUTO:
        if not isinstance(function, SupportsInvokeArrow) or rows_as == "row":
            return None
        if retry is not None and retry.get_retry_predicate()[0] is not None:
            return None
        if _bypassed(function, "async_invoke") is not None:
            return None
        if not isinstance(function, PrefersChunks):
            return batch_size
        rows = function.preferred_chunk_rows()
        if rows is None:
            return None
        if type(rows) is not int or rows < 1:
            raise ConfigurationError(
                f"{function!r}.preferred_chunk_rows() must return a positive int or None, "
                f"got {rows!r}"
            )
        return rows
    assert isinstance(chunk_size, int)  # its form checked with the options (WaitOptions)
    if not isinstance(function, SupportsInvokeArrow | SupportsInvokeChunk):
        raise ConfigurationError(
            f"chunk_size needs a function with async_invoke_arrow(batch) -> (row_index, "
            f"columns) or async_invoke_chunk(rows) -> one result list per row (e.g. "
            f"asyncio_ops.connectors.postgres.PostgresLookup); {function!r} has neither"
        )
    if isinstance(function, PrefersChunks) and function.preferred_chunk_rows() is None:
        raise ConfigurationError(
            f"{function!r} answers rows one at a time as configured (its "
            "preferred_chunk_rows() is None): drop chunk_size"
        )
    owner = _bypassed(function, "async_invoke")
    if owner is not None:
        raise ConfigurationError(
            f"{owner.__qualname__} overrides async_invoke() but chunk_size calls "
            f"{_chunk_method(function)}() of a class above it, which would bypass it: "
            f"override {_chunk_method(function)}() too, or leave chunk_size at 'auto' (rows "
            "one at a time for this function)"
        )
    if rows_as == "row":
        raise ConfigurationError(
            "rows_as='row' hands rows to async_invoke one at a time; with chunk_size the "
            "function receives a chunk (dicts, or an Arrow batch): drop one of the two"
        )
    return chunk_size


def _chunk_method(function: AsyncFunction[Any, Any]) -> str:
    return (
        "async_invoke_arrow" if isinstance(function, SupportsInvokeArrow) else "async_invoke_chunk"
    )


def _bypassed(function: AsyncFunction[Any, Any], method: str) -> type | None:
    """The subclass that overrides ``method`` below the class answering chunks, if any:
    chunks would bypass its override silently (a subclass of a connector that answers
    misses in ``async_invoke`` gets them per row only)."""
    cls = type(function)
    chunk = _chunk_method(function)
    answers = next(c for c in cls.__mro__ if chunk in c.__dict__)
    owner = next((c for c in cls.__mro__ if method in c.__dict__), None)
    if owner is not None and owner is not answers and issubclass(owner, answers):
        return owner
    return None


def ordered_wait(
    df: DataFrame,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    *,
    timeout: float | timedelta | str,
    output_schema: str | StructType,
    **options: Unpack[WaitKeywords],
) -> DataFrame:
    """Enrich ``df`` with an async function; rows leave each partition in input order.

    ``fn`` receives each row as a dict (a ``Row`` with ``rows_as="row"``) and returns
    a list of results: dicts whose keys are columns of ``output_schema``, ``Row``s
    with field names, tuples by position, or bare values for a one-column output
    (several fan out; zero drop the row, or keep it with null outputs with
    ``on_empty="keep"``). The
    result has the input columns (unless ``keep_input_columns=False``), the
    output columns, ``_error`` with ``on_error="error_column"`` and ``_late``
    with ``event_time``. Before it returns, a function with a preflight (the
    connectors: ``asyncio_ops.SupportsPreflight``) checks on the driver what it can
    without the data, its failure raised here before any job (``preflight=False``
    skips it). Every other option is a keyword of :class:`WaitOptions` (its
    defaults: ``inspect.signature(ordered_wait)``); see docs/spark.md for each.

    Example::

        import asyncio
        from asyncio_ops.spark import AsyncMetrics, ordered_wait, session

        spark = session()
        orders = spark.range(10_000).withColumnRenamed("id", "customer_id")

        async def lookup(row):  # one row in, a list of rows out
            await asyncio.sleep(0.02)  # a call to a slow system
            return [{"name": f"customer-{row['customer_id']}", "tier": row["customer_id"] % 3}]

        metrics = AsyncMetrics(spark)
        enriched = ordered_wait(orders, lookup, timeout=2.0, capacity=200,
                                output_schema="name string, tier int", metrics=metrics)
        enriched.write.mode("overwrite").parquet("/tmp/enriched")
    """
    return _wait(df, fn, OutputMode.ORDERED, output_schema,
                 WaitOptions.of(timeout=timeout, **options))  # fmt: skip


def unordered_wait(
    df: DataFrame,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    *,
    timeout: float | timedelta | str,
    output_schema: str | StructType,
    **options: Unpack[WaitKeywords],
) -> DataFrame:
    """Like :func:`ordered_wait`, but rows leave in completion order.

    With ``event_time`` the order is bounded by watermarks (no row crosses
    one); with ``key`` rows of one key keep their input order.

    Example::

        from asyncio_ops.connectors.http import HttpLookup
        from asyncio_ops.spark import unordered_wait

        customers = HttpLookup("http://api:8080/customers/{customer_id}")
        enriched = unordered_wait(orders, customers, timeout=30.0, capacity=100,
                                  output_schema="name string, tier string")
    """
    return _wait(df, fn, OutputMode.UNORDERED, output_schema,
                 WaitOptions.of(timeout=timeout, **options))  # fmt: skip


# what help() and inspect show, and the keywords a call is checked against: every option
for _public in (ordered_wait, unordered_wait):
    _public.__signature__ = WAIT_SIGNATURE  # type: ignore[attr-defined]
ordered_wait = known_keywords()(ordered_wait)
unordered_wait = known_keywords()(unordered_wait)
