"""``read_state`` of the async operator's checkpoint: carried-over elements, watermarks, the
replay log (``read_state`` in ``_read_state`` chooses; this module reads).

Contract:

- Carried-over elements (a version the async operator, ``ordered_wait`` /
  ``unordered_wait``, wrote; its manifests say so): one DataFrame row per
  element each old partition carried over at that version (not yet emitted:
  in flight, or complete and held back by the queue's order), exactly as
  written: never rescaled, reordered or merged. The driver reads the
  manifests only (the element kind, the input and output schemas, the
  chains); the old partitions are spread over Spark tasks (``mapInArrow``)
  and each task reads its partitions' elements with the readers a restore
  uses (``_partition_checkpoint.carried_elements``: ``CarryOver`` on the
  partition's shared key-group section, or on its operator state's batch).
- Columns: ``partition`` (the partition that wrote it), ``seq`` (its place
  in that partition's queue, watermarks counted), ``key_group`` (keyed; null
  unkeyed), ``row`` (the input row, a struct of the input schema the manifest
  records without the internal ``__aops_key_group``; an element of a chunked
  operator, ``chunk_size``, is its chunk: an array of such structs),
  ``event_time`` (timestamp; null without event time), ``late`` (boolean, an
  array of them for a chunk; null without event time),
  ``after_watermark`` (timestamp: the last watermark before it in its queue;
  null: none), ``state`` (``in_flight`` or ``complete``), ``results`` (the
  output rows it emits, an array of structs of the output schema the manifest
  records without ``__aops_key_group``; null while in flight), ``attempts``
  (requests made) and ``deadline`` (timestamp: when it times out; null when
  complete).
- ``watermarks=True`` (either operator): one row per old partition:
  ``partition``, ``max_seen`` (the highest event time it saw) and ``current``
  (its watermark), timestamps, null for none yet; a restore starts every new
  partition from the highest of each (both operators keep it in their
  manifests; the async operator's earlier releases, as union operator state
  ``watermark``).
- ``replay_log=True``: the replay log of one version or batch run (every
  attempt's completed lookups, ``_replay_log``), one row per logged lookup:
  ``partition``, ``attempt`` (the attempt's token, from the file's name),
  ``segment`` (the file's number within the attempt), ``position`` (the
  element's position in the partition's input), ``fingerprint`` and
  ``results`` (as logged: the function's own result rows, typed by the log).
  The driver lists the files and reads the first one's schema; each file is a
  task's unit, read through ``_replay_log.read_segment``. Files of another
  ``results`` type than the first's (the element kind changed within one run,
  which a restore skips) are a CheckpointError naming both.
- Errors (:class:`~asyncio_ops.CheckpointError`) name the location, the uid and
  the version (or the file, whose path holds the three).
- Timestamps: seconds as Spark timestamps (:func:`micros`); the session's
  default parallelism (:func:`parallelism`) sizes the tasks, as for the
  keyed state.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .._exceptions import CheckpointError
from .._keygroups import UPPER_BOUND_MAX_PARALLELISM, KeyGroupRange
from .._runtime import (
    ASYNC_WAIT,
    KEY_GROUP_COLUMN,
    KEYED_PROCESS,
    ROW,
    CarriedFormat,
    VersionFiles,
    carried_elements,
    carried_format,
    lease_noted,
    micros,
    read_segment,
    required_watermark,
    segment_of,
    version_watermarks,
)
from .._storage._checkpoint_storage import CheckpointStorage, Version

__all__ = ["parallelism", "read_carried", "read_replay_log", "read_watermarks"]

_IN_FLIGHT: Final = "in_flight"
_COMPLETE: Final = "complete"
_WATERMARK_SCHEMA: Final = StructType(
    [
        StructField("partition", IntegerType(), False),
        StructField("max_seen", TimestampType(), True),
        StructField("current", TimestampType(), True),
    ]
)


def parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (2 where the client cannot tell: Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        return int(spark.conf.get("spark.default.parallelism", "2") or 2)


def _spread(spark: SparkSession, units: list[Any], ddl: str) -> DataFrame:
    """A small DataFrame of ``units`` (one task's work each), spread over the tasks."""
    df = spark.createDataFrame(units, ddl)
    if len(units) > 1:
        df = df.repartition(max(1, min(len(units), parallelism(spark) * 2)))
    return df


def _without_key_group(schema: pa.Schema | None) -> StructType:
    """The Spark struct of ``schema`` without the internal key-group column."""
    if schema is None:
        return StructType([])
    return StructType([
        StructField(f.name, from_arrow_type(f.type), f.nullable)
        for f in schema if f.name != KEY_GROUP_COLUMN
    ])  # fmt: skip


def _carried_schema(written: CarriedFormat) -> StructType:
    row: DataType = _without_key_group(written.input_schema)
    late: DataType = BooleanType()
    if written.kind != ROW:  # a chunk: its rows
        row, late = ArrayType(row, False), ArrayType(late, True)
    results = ArrayType(_without_key_group(written.output_schema), False)
    return StructType(
        [
            StructField("partition", IntegerType(), False),
            StructField("seq", LongType(), False),
            StructField("key_group", IntegerType(), True),
            StructField("row", row, True),
            StructField("event_time", TimestampType(), True),
            StructField("late", late, True),
            StructField("after_watermark", TimestampType(), True),
            StructField("state", StringType(), False),
            StructField("results", results, True),
            StructField("attempts", IntegerType(), False),
            StructField("deadline", TimestampType(), True),
        ]
    )


def read_carried(
    spark: SparkSession, found: VersionFiles, where: str, until: int | None = None
) -> DataFrame:
    """The elements the async operator carried over at ``found`` (module docstring);
    ``until``: the end of the read's lease (ms since the epoch), named by a task that
    finds a file gone after it."""
    try:  # on the driver: a task finds what the manifests promise
        found.check_operator(ASYNC_WAIT)
        written = carried_format(found)
        written.check_readable(found)
        if written.keyed:
            found.chains(KeyGroupRange(0, UPPER_BOUND_MAX_PARALLELISM - 1),
                         UPPER_BOUND_MAX_PARALLELISM)  # fmt: skip
    except CheckpointError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    schema = _carried_schema(written)
    arrow_schema = to_arrow_schema(schema, timezone=spark.conf.get("spark.sql.session.timeZone"))

    def emit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for partition in batch.column(0).to_pylist():
                with lease_noted(until):
                    elements = carried_elements(found, partition, written)
                yield _elements_batch(elements, arrow_schema)

    units = [(i,) for i in range(found.num_partitions)]
    return _spread(spark, units, "partition int").mapInArrow(emit, schema)


def _elements_batch(pairs: list[tuple[int | None, Any]], schema: pa.Schema) -> pa.RecordBatch:
    cols: dict[str, list[Any]] = {name: [] for name in schema.names}
    for kg, e in pairs:
        cols["partition"].append(e.partition)
        cols["seq"].append(e.seq)
        cols["key_group"].append(kg)
        cols["row"].append(e.row)  # dicts: the internal key-group column is not in the type
        cols["event_time"].append(micros(e.timestamp))
        cols["late"].append(e.late)
        cols["after_watermark"].append(micros(e.after_watermark))
        cols["state"].append(_IN_FLIGHT if e.results is None else _COMPLETE)
        cols["results"].append(e.results)
        cols["attempts"].append(e.attempts)
        cols["deadline"].append(micros(e.deadline) if e.results is None else None)
    return pa.RecordBatch.from_pydict(
        {n: pa.array(cols[n], schema.field(n).type) for n in schema.names}, schema=schema
    )


def read_watermarks(spark: SparkSession, found: VersionFiles, where: str) -> DataFrame:
    """Every old partition's watermark state at ``found`` (module docstring); read on the
    driver, from the manifests (the async operator's of earlier releases: one small
    operator-state file per partition)."""
    operator = found.written_by()
    try:
        found.check_operator(operator if operator in (ASYNC_WAIT, KEYED_PROCESS) else ASYNC_WAIT)
        marks = [
            version_watermarks(found, index) if operator == ASYNC_WAIT
            else required_watermark(found.manifests[index], found.paths[index])
            for index in range(found.num_partitions)
        ]  # fmt: skip
    except CheckpointError as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    rows = [
        (i, *(None if (us := micros(s)) is None else epoch + timedelta(microseconds=us)
              for s in (m.max_seen, m.current)))
        for i, m in enumerate(marks)
    ]  # fmt: skip
    return spark.createDataFrame(rows, _WATERMARK_SCHEMA)


def read_replay_log(
    spark: SparkSession, storage: CheckpointStorage, version: Version, where: str
) -> DataFrame:
    """The replay log of ``version`` (a streaming version or a batch run), module
    docstring; CheckpointError naming ``where`` if it holds none."""
    names = [n for n in storage.list_files(version, "results-p") if segment_of(n) is not None]
    if not names:
        raise CheckpointError(f"{where} holds no replay log (no results-p*.ckpt file)")
    first = read_segment(storage, version, names[0])  # its schema only: the results' type
    results_type = first.schema.field("results").type
    schema = StructType(
        [
            StructField("partition", IntegerType(), False),
            StructField("attempt", StringType(), False),
            StructField("segment", IntegerType(), False),
            StructField("position", LongType(), False),
            StructField("fingerprint", BinaryType(), True),
            StructField("results", from_arrow_type(results_type), True),
        ]
    )
    arrow_schema = to_arrow_schema(schema, timezone=spark.conf.get("spark.sql.session.timeZone"))
    first_path = storage.path(version, names[0])

    def emit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for name in batch.column(0).to_pylist():
                yield _segment_batch(storage, version, name, results_type, first_path,
                                     arrow_schema)  # fmt: skip

    return _spread(spark, [(n,) for n in names], "name string").mapInArrow(emit, schema)


def _segment_batch(
    storage: CheckpointStorage,
    version: Version,
    name: str,
    results_type: pa.DataType,
    first_path: str,
    schema: pa.Schema,
) -> pa.RecordBatch:
    table = read_segment(storage, version, name)
    got = table.schema.field("results").type
    if got != results_type:
        raise CheckpointError(
            f"checkpoint files {first_path} and {storage.path(version, name)} log results of "
            f"different types ({results_type} and {got}): the element kind changed within "
            "one run"
        )
    part = segment_of(name)
    assert part is not None  # listed by its name
    n = table.num_rows
    columns = {
        "partition": pa.array([part.partition] * n, pa.int32()),
        "attempt": pa.array([part.attempt] * n, pa.string()),
        "segment": pa.array([part.segment] * n, pa.int32()),
        "position": table.column("position").combine_chunks(),
        "fingerprint": table.column("fingerprint").combine_chunks(),
        "results": table.column("results").combine_chunks(),
    }
    return pa.RecordBatch.from_pydict(
        {k: v.cast(schema.field(k).type) for k, v in columns.items()}, schema=schema
    )
