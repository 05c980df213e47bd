"""``ordered_wait`` / ``unordered_wait``: the DataFrame API.

Everything is validated on the driver before a job runs; the partition work
is ``DataFrame.mapInArrow`` over :func:`asyncio_ops._runtime.run_partition`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark import SparkContext, TaskContext
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import (
    AtomicType,
    BooleanType,
    DataType,
    DateType,
    IntegerType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    _parse_datatype_string,
)

from .._checkpoint import CheckpointStorage, shown_location
from .._exceptions import ConfigurationError
from .._functions import (
    AsyncFunction,
    CoroutineFunction,
    PrefersChunks,
    SupportsInvokeArrow,
    SupportsInvokeChunk,
    as_async_function,
)
from .._queues import OutputMode
from .._retry import AsyncRetryStrategy
from .._runtime import (
    ERROR_COLUMN,
    KEY_GROUP_COLUMN,
    LATE_COLUMN,
    PartitionSpec,
    TaskInfo,
    run_partition,
)
from ..options import (
    positive_int,
)
from ._keyed import partition_by_key_group
from ._keywords import known_keywords
from ._metrics import AsyncMetrics
from ._options import CHUNK_AUTO, DEFAULT_CAPACITY, WAIT_SIGNATURE, WaitKeywords, WaitOptions
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


def batch_size_of(df: DataFrame, given: int | None) -> int:
    """``batch_size``: as given, else Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``
    (the rows of an Arrow batch ``mapInArrow`` hands the function)."""
    if given is not None:
        return given
    conf = df.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    return positive_int(int(conf or 10000), "batch_size")


def _as_struct(schema: str | StructType, what: str) -> StructType:
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
    if options.metrics is not None and not isinstance(options.metrics, AsyncMetrics):
        raise ConfigurationError(
            f"metrics must be an asyncio_ops.spark.AsyncMetrics, got {options.metrics!r}"
        )
    function = as_async_function(fn)
    batch_size = batch_size_of(df, options.batch_size)
    keep_input_columns = options.keep_input_columns

    added = _as_struct(output_schema, "output_schema")
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
        function=function,
        function_token=uuid.uuid4().hex,
        mode=mode,
        timeout=options.timeout,
        capacity=capacity,
        retry=options.retry,
        output_schema=arrow_schema,
        added_columns=tuple(f.name for f in added.fields),
        keep_input_columns=keep_input_columns,
        on_error=options.on_error,
        on_empty=options.on_empty,
        row_factory=row_of if options.rows_as == "row" else None,
        event_time=event_col,
        watermark_delay=options.watermark_delay or 0.0,
        watermark_interval=options.watermark_interval,
        late_records=options.late_records,
        key_columns=key_cols,
        batch_size=batch_size,
        operator_uid=operator_uid,
        num_partitions=parts,
        max_parallelism=options.max_parallelism,
        checkpoint=storage,
        checkpoint_version=options.checkpoint_version,
        drain_timeout=options.drain_timeout,
        retain_versions=options.retain_versions,
        chunk_size=chunk_rows,
        output_buffer=options.output_buffer_for(capacity),
        max_capacity=options.max_capacity,
        flush_rows=options.checkpoint_flush_rows,
        flush_interval=options.checkpoint_flush_interval,
        state_backend=options.state_backend,
        run_token=uuid.uuid4().hex[:16],
        run_epoch=run_epoch(df.sparkSession),
    )
    on_done = options.metrics._add if options.metrics is not None else None

    def partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from run_partition(spec, batches, _task_info(spec.num_partitions), on_done=on_done)

    if storage is not None:
        # the plan names the operator's checkpoint, so that a later operator under the
        # same location and uid finds it upstream (see _check_not_upstream)
        partition.__name__ = _plan_tag(storage.location, operator_uid)
        _DESCRIBED[partition.__name__] = _describe_operator(mode, function, spec.run_token)
    out = df.mapInArrow(partition, spark_schema)
    if key_cols and keep_input_columns:
        out = out.drop(KEY_GROUP_COLUMN)
    return out


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
                f"{function!r}.preferred_capacity() must return a positive int, got "
                f"{preferred!r}"
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


def _spark_context(spark: SparkSession) -> SparkContext | None:
    """The session's SparkContext; None on Spark Connect, whose client has none."""
    try:
        return spark.sparkContext
    except (AttributeError, NotImplementedError):
        return None


def run_epoch(spark: SparkSession) -> int:
    """Milliseconds that lead a batch run's name (see PartitionSpec): the application's
    start, so that runs of one application sort by execution id; the current time
    where the session has no SparkContext (Spark Connect)."""
    context = _spark_context(spark)
    return int(context.startTime) if context is not None else int(time.time() * 1000)


def _task_info(num_partitions: int | None) -> TaskInfo:
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
    )


# -- checkpoint identity ------------------------------------------------------------------------
_DESCRIBED: dict[str, str] = {}
"""Plan tag -> description of the operator, for the message of a uid collision."""


def _function_name(function: AsyncFunction[Any, Any]) -> str:
    target: Any = function.fn if isinstance(function, CoroutineFunction) else type(function)
    module = getattr(target, "__module__", "?")
    return f"{module}.{getattr(target, '__qualname__', repr(target))}"


def default_uid(
    mode: OutputMode,
    function: AsyncFunction[Any, Any],
    added: StructType,
    key_cols: Sequence[str],
    event_col: str | None,
    input_schema: StructType,
) -> str:
    """The operator id when ``uid`` is not given: stable across restarts of one query.

    Derived from what makes the operator itself (mode, function, output
    columns, key, event time, input columns), so that two different operators
    under one ``checkpoint_location`` get different ids, and the same operator
    rebuilt after a restart finds its checkpoint. Two identical operators in
    one query would share it: give them ``uid=`` each (an operator upstream
    of another with the same id is refused, see :func:`_check_not_upstream`).
    """
    parts = [
        mode.value, _function_name(function), added.simpleString(), ",".join(key_cols),
        event_col or "", input_schema.simpleString(),
    ]  # fmt: skip
    digest = hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()
    return f"{mode.value.replace('_', '-')}-wait-{digest}"


def _plan_tag(location: str, uid: str) -> str:
    digest = hashlib.blake2b(f"{location.rstrip('/')}|{uid}".encode(), digest_size=8).hexdigest()
    return f"asyncio_ops_{digest}"


def _describe_operator(mode: OutputMode, function: AsyncFunction[Any, Any], token: str) -> str:
    return f"{mode.value} wait of {_function_name(function)} (DataFrame {token})"


def checkpoint_storage(df: DataFrame, location: object, uid: str) -> CheckpointStorage:
    """The checkpoint storage of an operator (``uid``) under ``location``, checked on the
    driver: a path or URI string, reachable by every executor
    (:func:`_unshared_location`), writable, and not already an operator's of this plan
    or of a running query (:func:`_check_not_upstream`)."""
    if not isinstance(location, str) or not location:
        raise ConfigurationError(
            f"checkpoint_location must be a path or URI string, got {location!r}"
        )
    problem = _unshared_location(location, _master(df.sparkSession))
    if problem is not None:
        raise ConfigurationError(problem)
    storage = CheckpointStorage(location, uid)
    storage.check_writable()
    _check_not_upstream(df, location, uid)
    return storage


def _master(spark: SparkSession) -> str | None:
    """The session's master URL (None where the client cannot tell: Spark Connect)."""
    context = _spark_context(spark)
    return str(context.master) if context is not None else None


def _unshared_location(location: str, master: str | None) -> str | None:
    """Why ``location`` cannot hold checkpoints under ``master``, or None.

    A plain path (no ``scheme://``) is a directory of whichever machine reads it:
    with a master whose executors run on other machines (``spark://``, ``yarn``,
    ``k8s://``, ...) each executor would write its own disk, and the next
    micro-batch or retry, elsewhere, would find no state. Local masters
    (``local``, ``local[N]``, ``local-cluster[...]``) run on one machine, and an
    explicit ``file://`` URI is the user's word that the path is shared (a mount
    every executor has).
    """
    if "://" in location or master is None or master.startswith("local"):
        return None
    return (
        f"checkpoint_location {location!r} is a local path, but the master {master!r} "
        "runs executors on other machines, whose disks do not share it: one executor's "
        "state would be invisible to the next. Use storage every executor reaches "
        "(s3://..., gs://..., abfs://..., hdfs://...), or, if every executor mounts this "
        f"path, say so with file://{os.path.abspath(location)}"
    )


def _check_not_upstream(df: DataFrame, location: str, uid: str) -> None:
    """Refuse a second operator under one location and uid: in the same query (upstream in
    ``df``'s plan), or in another streaming query running in this session.

    Every operator that keeps a checkpoint names its mapInArrow function after
    :func:`_plan_tag` of its location and uid, so the tag in a plan is the
    ownership record. A query restarted from its own Spark checkpoint is built
    after the old run stopped, so it finds no running owner and goes on.
    """
    tag = _plan_tag(location, uid)
    try:
        plan = df._jdf.queryExecution().logical().toString()
    except Exception:  # Spark Connect: no JVM plan to read; the default ids still differ
        return
    if tag in plan:
        raise ConfigurationError(
            f"two operators write checkpoint_location {shown_location(location)!r} with uid "
            f"{uid!r}: "
            f"{_DESCRIBED.get(tag, 'an operator upstream')} is already in this DataFrame's "
            "plan; give each operator its own uid="
        )
    for query in df.sparkSession.streams.active:
        if tag in _query_plan(query):
            raise ConfigurationError(
                f"checkpoint_location {shown_location(location)!r} with uid {uid!r} is in use by "
                f"{_DESCRIBED.get(tag, 'an operator')} of the running streaming query "
                f"{query.name or '(unnamed)'!r} (id {query.id}); a query of this DataFrame "
                "would share its state and checkpoint versions: pass distinct uid= or "
                "checkpoint_location= to the operators of the two queries"
            )


def _query_plan(query: StreamingQuery) -> str:
    """The logical plan of a running streaming query, as text ('' if Spark hides it)."""
    try:
        return str(query._jsq.streamingQuery().logicalPlan().toString())
    except Exception:  # Spark Connect, or a query that stopped meanwhile
        return ""


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
    """
    return _wait(df, fn, OutputMode.UNORDERED, output_schema,
                 WaitOptions.of(timeout=timeout, **options))  # fmt: skip


# what help() and inspect show, and the keywords a call is checked against: every option
for _public in (ordered_wait, unordered_wait):
    _public.__signature__ = WAIT_SIGNATURE  # type: ignore[attr-defined]
ordered_wait = known_keywords()(ordered_wait)
unordered_wait = known_keywords()(unordered_wait)
