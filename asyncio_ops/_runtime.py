"""The partition runtime: Arrow batches in, the operator on an event loop, Arrow batches out.

This layer knows pyarrow but not pyspark: the Spark layer gives it an iterator
of ``pyarrow.RecordBatch`` and a :class:`TaskInfo`, and consumes the iterator
it returns (the shape of ``DataFrame.mapInArrow``).

Per Python worker process there is one :class:`WorkerRuntime`: one event loop
(uvloop when installed), reused by every partition the worker runs, and the
opened user functions, keyed by a token chosen on the driver. A function is
therefore opened once per worker (its pools and sessions live as long as the
worker) and closed when the worker exits.

Input is pulled lazily: one Arrow batch is turned into rows and admitted into
the operator, which blocks (while lookups go on) whenever ``capacity`` elements
are in flight; output rows collected meanwhile are handed back as batches of
at most ``batch_size`` rows before the next input batch is read. Memory is
bounded by capacity and batch sizes, not by the partition.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import hashlib
import logging
import math
import os
import pickle
import resource
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ._checkpoint import CheckpointStorage
from ._elements import Record, Watermark
from ._exceptions import (
    AsyncTimeoutError,
    CheckpointError,
    ConfigurationError,
    InvalidResultError,
    OutputSchemaError,
)
from ._functions import AsyncFunction, CoroutineFunction, RuntimeContext, maybe_await
from ._keygroups import compute_key_group_range_for_operator_index
from ._operator import (
    AsyncWaitOperator,
    LatencyHistogram,
    OperatorSnapshot,
    OutputMode,
    SnapshotEntry,
)
from ._pool import PooledWaitOperator
from ._retry import AsyncRetryStrategy

log = logging.getLogger("asyncio_ops.runtime")

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


# -- what the driver sends ---------------------------------------------------------------
@dataclass(frozen=True)
class PartitionSpec:
    """Everything a worker needs to run one async operator over a partition."""

    function: AsyncFunction[Any, Any]
    function_token: str
    mode: OutputMode
    timeout: float
    capacity: int
    retry: AsyncRetryStrategy | None
    output_schema: pa.Schema
    added_columns: tuple[str, ...]
    keep_input_columns: bool = True
    on_error: str = "fail"
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
    # the plain case on PooledWaitOperator (chosen on the driver: ASYNCIO_OPS_POOL=0 turns it off)
    pool: bool = True


@dataclass(frozen=True)
class TaskInfo:
    """Where the partition runs (from Spark's TaskContext, or defaults)."""

    partition_id: int = 0
    num_partitions: int = 1
    attempt_number: int = 0
    stage_id: int = 0
    batch_id: int | None = None


# -- metrics ------------------------------------------------------------------------------
@dataclass
class RunMetrics:
    """Counters of one or more partitions; merged across tasks on the driver."""

    partitions: int = 0
    received: int = 0
    emitted: int = 0
    completed: int = 0
    timed_out: int = 0
    retried: int = 0
    failed: int = 0
    error_rows: int = 0
    late: int = 0
    dropped_late: int = 0
    restored: int = 0
    replayed: int = 0
    carried_over: int = 0
    max_in_flight: int = 0
    max_worker_rss_mb: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    cache_expirations: int = 0
    seconds: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def merge(self, other: RunMetrics) -> RunMetrics:
        for name in (
            "partitions", "received", "emitted", "completed", "timed_out", "retried",
            "failed", "error_rows", "late", "dropped_late", "restored", "replayed",
            "carried_over", "seconds", "cache_hits", "cache_misses", "cache_evictions",
            "cache_expirations",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_in_flight = max(self.max_in_flight, other.max_in_flight)
        self.max_worker_rss_mb = max(self.max_worker_rss_mb, other.max_worker_rss_mb)
        self.latency.merge(other.latency)
        return self

    def summary(self) -> dict[str, Any]:
        """Plain numbers, for logs and for users."""
        p50, p99 = self.latency.quantile(0.5), self.latency.quantile(0.99)
        return {
            "partitions": self.partitions,
            "received": self.received,
            "emitted": self.emitted,
            "completed": self.completed,
            "timed_out": self.timed_out,
            "retried": self.retried,
            "failed": self.failed,
            "error_rows": self.error_rows,
            "late": self.late,
            "dropped_late": self.dropped_late,
            "restored": self.restored,
            "replayed": self.replayed,
            "carried_over": self.carried_over,
            "max_in_flight": self.max_in_flight,
            "max_worker_rss_mb": round(self.max_worker_rss_mb, 1),
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_evictions": self.cache_evictions,
            "cache_expirations": self.cache_expirations,
            "latency_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "latency_p99_ms": None if p99 is None else round(p99 * 1000, 3),
        }


# -- the worker-wide runtime ------------------------------------------------------------------
def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


GC_GEN0_THRESHOLD: Final = 20_000


def _tune_gc() -> None:
    """Make the cyclic garbage collector cheaper in a worker (once per process).

    Every element in flight keeps a few objects alive (its entry, handle,
    task, coroutine frames); with the default thresholds CPython's collector
    runs a young collection every 700 allocations and promotes those objects,
    so full collections walk them again and again: 15-20% of the CPU per row
    at capacity 256, more at higher capacities. ``gc.freeze()`` moves what the
    worker imported into the permanent generation and a larger first
    threshold lets short-lived objects die before a collection sees them.
    ``ASYNCIO_OPS_GC_TUNING=0`` leaves the collector as it was.
    """
    if os.environ.get("ASYNCIO_OPS_GC_TUNING", "1") == "0":
        return
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)


MAX_OPEN_FUNCTIONS: Final = 16


class WorkerRuntime:
    """One per Python worker process: the event loop and the opened functions.

    Functions stay open across the partitions a worker runs (their pools and
    sessions are reused). At most :data:`MAX_OPEN_FUNCTIONS` stay open: a
    driver that builds many ``ordered_wait`` DataFrames would otherwise pile
    up open functions in long-lived workers, so the least recently used one
    is closed when another opens. A worker runs one task at a time, so the
    one closed is never in use.
    """

    _instance: WorkerRuntime | None = None

    def __init__(self) -> None:
        self.loop = _new_loop()
        self.functions: OrderedDict[str, AsyncFunction[Any, Any]] = OrderedDict()
        atexit.register(self.shutdown)
        _tune_gc()

    @classmethod
    def get(cls) -> WorkerRuntime:
        if cls._instance is None or cls._instance.loop.is_closed():
            cls._instance = WorkerRuntime()
        return cls._instance

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def function(self, spec: PartitionSpec, task: TaskInfo) -> AsyncFunction[Any, Any]:
        """The opened instance for ``spec.function_token`` (opened on first use)."""
        fn = self.functions.get(spec.function_token)
        if fn is not None:
            self.functions.move_to_end(spec.function_token)
        else:
            while len(self.functions) >= MAX_OPEN_FUNCTIONS:
                token, old = self.functions.popitem(last=False)
                self._close(token, old)
            fn = spec.function
            context = RuntimeContext(
                task_name=spec.operator_uid,
                index_of_this_subtask=task.partition_id,
                number_of_parallel_subtasks=task.num_partitions,
                attempt_number=task.attempt_number,
            )
            self.run(maybe_await(fn.open(context)))
            self.functions[spec.function_token] = fn
        return fn

    def _close(self, token: str, fn: AsyncFunction[Any, Any]) -> None:
        try:
            self.run(maybe_await(fn.close()))
        except Exception:  # closing must go on for the others
            log.exception("closing async function %s failed", token)

    def shutdown(self) -> None:
        """Close every opened function, then the loop (at worker exit)."""
        if self.loop.is_closed():
            return
        while self.functions:
            self._close(*self.functions.popitem(last=False))
        self.run(self.loop.shutdown_asyncgens())
        self.loop.close()


# -- rows ---------------------------------------------------------------------------------------
def _describe_row(row: Any) -> str:
    text = repr(row)
    return text if len(text) <= 300 else text[:300] + "..."


class RowFunction(AsyncFunction[Any, Any]):
    """Calls the user's function with a row dict; merges each result dict into the row.

    The operator's value is ``(row, late, position)``: ``late`` is None without
    event time, ``position`` identifies the row within its partition for the
    replay log (None when there is no log). A result must be a dict whose keys
    are declared output columns; the message of a violation names the column
    and the input row. With ``log`` set, each completed lookup is appended to
    it as ``(position, fingerprint, results)``.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        self.user = user
        self.allowed = frozenset(spec.added_columns)
        self.keep = spec.keep_input_columns
        self.log: list[tuple[Any, bytes, list[dict[str, Any]]]] | None = None
        user_fn = user.fn if type(user) is CoroutineFunction else user.async_invoke
        self._invoke: Callable[[Any], Any] = user_fn

    def merge(self, value: Any, results: Any) -> list[dict[str, Any]]:
        row, late, _ = value
        if results is None or not isinstance(results, list | tuple):
            # a failed lookup (an error row with on_error="error_column"), unlike a
            # result that does not fit the schema, which is a bug and always fails
            raise InvalidResultError(
                f"the async function must return a list of dicts, got "
                f"{type(results).__name__} for input row {_describe_row(row)}"
            )
        out = []
        allowed = self.allowed
        for r in results:
            if type(r) is not dict:
                raise OutputSchemaError(
                    f"each result must be a dict of output columns, got {type(r).__name__} "
                    f"{r!r:.100} for input row {_describe_row(row)}"
                )
            if not allowed.issuperset(r):
                unknown = sorted(set(r) - allowed)
                raise OutputSchemaError(
                    f"result column(s) {unknown} are not in output_schema "
                    f"(declared: {sorted(allowed)}) for input row {_describe_row(row)}"
                )
            merged = {**row, **r} if self.keep else dict(r)
            if late is not None:
                merged[LATE_COLUMN] = late
            out.append(merged)
        return out

    def record(self, value: Any, results: Any) -> list[dict[str, Any]]:
        """Merge ``results`` into the row, logging them for replay if a log is kept."""
        merged = self.merge(value, results)
        log = self.log
        if log is not None and value[2] is not None:
            log.append((value[2], fingerprint(value[0]), list(results)))
        return merged

    def describe(self, value: Any) -> str:
        """The input in an error message."""
        return _describe_row(value[0])

    def invoke_direct(self, value: Any) -> Any:
        """The user's coroutine for this row (the operator merges with :meth:`record`)."""
        return self._invoke(value[0])

    async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
        return self.record(value, await self.user.async_invoke(value[0]))

    def timeout(self, value: Any) -> Any:
        results = self.user.timeout(value[0])
        if asyncio.iscoroutine(results):
            return self._merge_later(value, results)
        return self.merge(value, results)

    async def _merge_later(self, value: Any, awaitable: Any) -> list[dict[str, Any]]:
        return self.merge(value, await awaitable)


class ChunkFunction(RowFunction):
    """Vectorised: one call of the user's ``async_invoke_chunk(rows)`` per chunk of rows.

    The operator's value is ``(rows, None, None)``; the user returns one result
    list per row, in order, and each row is merged with its own results. A
    chunk succeeds or fails (times out, is retried) as a whole.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        super().__init__(user, spec)
        self._invoke = user.async_invoke_chunk  # type: ignore[attr-defined]

    def record(self, value: Any, results: Any) -> list[dict[str, Any]]:
        rows = value[0]
        if not isinstance(results, list | tuple) or len(results) != len(rows):
            raise InvalidResultError(
                f"async_invoke_chunk must return one result list per row ({len(rows)}), got "
                f"{type(results).__name__}"
                + (f" of {len(results)}" if isinstance(results, list | tuple) else "")
                + f" for the chunk starting with row {_describe_row(rows[0] if rows else None)}"
            )
        out: list[dict[str, Any]] = []
        merge = self.merge
        for row, row_results in zip(rows, results, strict=True):
            out.extend(merge((row, None, None), row_results))
        return out

    async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
        return self.record(value, await self._invoke(value[0]))

    def timeout(self, value: Any) -> Any:
        n, first = self._chunk(value)
        raise AsyncTimeoutError(f"a chunk of {n} rows timed out, starting with row {first}", value)

    def describe(self, value: Any) -> str:
        n, first = self._chunk(value)
        return f"a chunk of {n} rows starting with row {first}"

    def _chunk(self, value: Any) -> tuple[int, str]:
        """The chunk's size and its first row, described, for messages."""
        rows = value[0]
        return len(rows), _describe_row(rows[0] if rows else None)


class ArrowChunkFunction(ChunkFunction):
    """Columnar: one call of the user's ``async_invoke_arrow(batch)`` per chunk of rows.

    The operator's value is ``(batch, None, None)`` with ``batch`` a zero-copy
    slice of an input Arrow batch. The user returns ``(row_index, columns)``:
    ``row_index`` the input row (0-based, within the chunk) of each output row,
    in output order (a row may appear several times, for fan-out, or not at
    all, to drop it), and ``columns`` the output columns, each as long as
    ``row_index`` (a ``pyarrow.RecordBatch`` / ``Table`` or a mapping of column
    name to an Arrow array or a list of values). A declared output column the
    function does not return is null. The merge is columnar: the input columns
    are ``take``n by ``row_index`` and no row is ever turned into a dict.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        RowFunction.__init__(self, user, spec)
        self._invoke = user.async_invoke_arrow  # type: ignore[attr-defined]
        self.schema = spec.output_schema

    def record(self, value: Any, results: Any) -> list[pa.RecordBatch]:
        batch: pa.RecordBatch = value[0]
        index, columns = self._unpack(batch, results)
        if index is None:
            n_out = batch.num_rows
            taken = batch
        else:
            n_out = len(index)
            if self.keep:
                if n_out == batch.num_rows and (n_out == 0 or _is_identity(index)):
                    taken = batch
                else:
                    taken = batch.take(index)
        arrays: list[pa.Array] = []
        inputs = batch.schema.names
        for f in self.schema:
            name = f.name
            if name in columns:
                arrays.append(_column(name, f.type, columns[name], n_out))
            elif self.keep and name in inputs:
                arrays.append(taken.column(name))
            else:  # an output column the function left out, or _error of a good chunk
                arrays.append(pa.nulls(n_out, f.type))
        return [pa.RecordBatch.from_arrays(arrays, schema=self.schema)]

    def _unpack(self, batch: pa.RecordBatch, results: Any) -> tuple[pa.Array | None, Any]:
        if not isinstance(results, tuple | list) or len(results) != 2:
            raise InvalidResultError(
                f"async_invoke_arrow must return (row_index, columns), got {type(results).__name__}"
            )
        index, columns = results
        if index is not None:  # None: every row once, in order
            index = _check_index(index, batch.num_rows)
        if isinstance(columns, pa.RecordBatch | pa.Table):
            columns = {name: columns.column(name) for name in columns.column_names}
        elif not isinstance(columns, Mapping):
            raise InvalidResultError(
                f"async_invoke_arrow must return columns as a RecordBatch, Table or mapping, "
                f"got {type(columns).__name__}"
            )
        unknown = sorted(set(columns) - self.allowed)
        if unknown:
            raise OutputSchemaError(
                f"result column(s) {unknown} are not in output_schema "
                f"(declared: {sorted(self.allowed)})"
            )
        return index, columns

    def _chunk(self, value: Any) -> tuple[int, str]:
        batch = value[0]
        return batch.num_rows, _describe_row(_first_row(batch))


def _column(name: str, type_: pa.DataType, values: Any, n: int) -> pa.Array:
    """One output column of the columnar path, as ``type_``, checked to have ``n`` values."""
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            array = values if values.type == type_ else values.cast(type_)
        else:
            array = pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        bad = _first_unfit(values, type_)
        raise OutputSchemaError(
            f"output column {name!r} ({type_}) cannot hold {bad}: {exc}"
        ) from exc
    if len(array) != n:
        raise InvalidResultError(
            f"output column {name!r} has {len(array)} values but row_index has {n}"
        )
    return array


def _first_row(batch: pa.RecordBatch) -> Any:
    return batch.slice(0, 1).to_pylist()[0] if batch.num_rows else None


def _check_index(index: Any, rows: int) -> pa.Array:
    """``row_index`` as an Arrow integer array, every value a row of the chunk."""
    try:
        if not isinstance(index, pa.Array):
            index = pa.array(index, type=pa.int64())
        if not pa.types.is_integer(index.type) or index.null_count:
            raise TypeError(f"row_index must hold integers without nulls, got {index.type}")
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidResultError(f"async_invoke_arrow returned a bad row_index: {exc}") from exc
    if len(index):
        bounds = pc.min_max(index)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo < 0 or hi >= rows:
            raise InvalidResultError(
                f"async_invoke_arrow returned row_index values {lo}..{hi} outside the chunk's "
                f"{rows} rows"
            )
    return index


def _is_identity(index: pa.Array) -> bool:
    """True if ``index`` is 0, 1, ..., n-1 (every row once, in order: no take needed)."""
    n = len(index)
    if index[0].as_py() != 0 or index[n - 1].as_py() != n - 1:
        return False
    return bool(pc.all(pc.equal(index, pa.array(range(n), type=index.type))).as_py())


def _first_unfit(values: Any, type_: pa.DataType) -> str:
    """The first value of ``values`` that ``type_`` cannot hold, for an error message."""
    items = values.to_pylist() if isinstance(values, pa.Array) else values
    try:
        for i, v in enumerate(items):
            try:
                pa.array([v], type=type_)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                return f"{v!r:.100} ({type(v).__name__}) at output row {i}"
    except TypeError:
        pass
    return f"{type(values).__name__} values"


def is_columnar(fn: object) -> bool:
    """True if ``fn`` answers chunks as Arrow (``async_invoke_arrow``), preferred by chunk_size."""
    return callable(getattr(fn, "async_invoke_arrow", None))


def fingerprint(row: Any) -> bytes:
    """A digest of an input row: a replayed result is used only for the same row."""
    return hashlib.blake2b(pickle.dumps(row, protocol=5), digest_size=12).digest()


class ArrowSink:
    """Collects output rows and turns them into Arrow batches of the declared schema."""

    def __init__(self, spec: PartitionSpec) -> None:
        self.schema = spec.output_schema
        self.batch_size = spec.batch_size
        self.rows: list[dict[str, Any]] = []
        self.emitted = 0
        # columnar results (ArrowChunkFunction): Arrow batches, never rows
        self.batches: list[pa.RecordBatch] = []
        self.buffered = 0

    def add_batch(self, element: Any) -> None:
        """The output of the columnar path: each element's value is one Arrow batch."""
        if type(element) is Record:
            batch = element.value
            self.batches.append(batch)
            self.buffered += batch.num_rows

    def batch_full(self) -> bool:
        return self.buffered >= self.batch_size

    def _take_batches(self) -> Iterator[pa.RecordBatch]:
        batches, self.batches, self.buffered = self.batches, [], 0
        # one copy into batches of batch_size rows: Spark pays per batch, not per byte
        table = pa.Table.from_batches(batches, schema=self.schema).combine_chunks()
        for out in table.to_batches(max_chunksize=self.batch_size):
            self.emitted += out.num_rows
            yield out

    def __call__(self, element: Any) -> None:
        if type(element) is Record:
            self.rows.append(element.value)

    def extend(self, rows: Sequence[dict[str, Any]]) -> None:
        """Output rows without a Record around each (the pooled operator's output)."""
        self.rows.extend(rows)

    def full(self) -> bool:
        return len(self.rows) >= self.batch_size

    def take(self) -> Iterator[pa.RecordBatch]:
        if self.batches:
            yield from self._take_batches()
            return
        rows, self.rows = self.rows, []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            self.emitted += len(chunk)
            yield self._to_batch(chunk)

    def _to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        try:
            return pa.RecordBatch.from_pylist(rows, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise self._explain(rows, exc) from exc

    def _explain(self, rows: list[dict[str, Any]], exc: Exception) -> OutputSchemaError:
        """Find the first row and column that do not fit, for a message a user can act on."""
        for row in rows:
            for f in self.schema:
                value = row.get(f.name)
                try:
                    pa.array([value], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                    return OutputSchemaError(
                        f"output column {f.name!r} ({f.type}) cannot hold {value!r:.100} "
                        f"({type(value).__name__}) in output row {_describe_row(row)}"
                    )
        return OutputSchemaError(f"output rows do not fit the output schema: {exc}")


# -- watermarks ---------------------------------------------------------------------------------
def event_time_seconds(value: Any, column: str, row: Any) -> float:
    """Event time of a row in seconds: timestamp, date or number columns."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if value is None:
        raise ConfigurationError(
            f"event_time column {column!r} is null in row {_describe_row(row)}; "
            "filter or fill such rows before the async operator"
        )
    raise ConfigurationError(
        f"event_time column {column!r} holds {type(value).__name__} {value!r:.50}; "
        "use a timestamp or numeric column"
    )


class BoundedOutOfOrderness:
    """Watermark = highest event time seen - delay, emitted every ``interval`` rows."""

    def __init__(self, delay: float, interval: int) -> None:
        self.delay = delay
        self.interval = max(1, interval)
        self.max_seen = -math.inf
        self.current = -math.inf
        self._since = 0

    def observe(self, ts: float) -> float | None:
        """Record ``ts``; return a new watermark to emit, if it is time for one."""
        if ts > self.max_seen:
            self.max_seen = ts
        self._since += 1
        if self._since >= self.interval:
            self._since = 0
            candidate = self.max_seen - self.delay
            if candidate > self.current:
                self.current = candidate
                return candidate
        return None


def seconds_option(value: float | timedelta | None, name: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(f"{name} must be >= 0 seconds or a timedelta, got {value!r}")
    return float(value)


# -- running one partition ------------------------------------------------------------------------
def error_row_handler(
    spec: PartitionSpec, metrics: RunMetrics
) -> Callable[[Record[Any], BaseException, int], Sequence[Any]] | None:
    """For ``on_error="error_column"``: a failed element becomes its input row plus ``_error``."""
    if spec.on_error != "error_column":
        return None

    chunked = spec.chunk_size is not None
    columnar = chunked and is_columnar(spec.function)

    def handler(record: Record[Any], exc: BaseException, attempts: int) -> list[Any]:
        if isinstance(exc, OutputSchemaError):
            raise exc  # a bug in the function's output, not a failed lookup: fail loudly
        if columnar:  # a failed Arrow chunk: one batch with an error row per row of it
            inputs = record.value[0].to_pylist()
            rows = [r for row in inputs for r in one((row, None, None), exc, attempts)]
            return [pa.RecordBatch.from_pylist(rows, schema=spec.output_schema)]
        if chunked:  # a failed chunk: every row of it is an error row
            return [r for row in record.value[0] for r in one((row, None, None), exc, attempts)]
        return one(record.value, exc, attempts)

    def one(value: Any, exc: BaseException, attempts: int) -> list[dict[str, Any]]:
        row, late, _ = value
        out = dict(row) if spec.keep_input_columns else {}
        out[ERROR_COLUMN] = {
            "exception": type(exc).__name__,
            "message": str(exc)[:2000],
            "attempts": attempts,
        }
        if late is not None:
            out[LATE_COLUMN] = late
        metrics.error_rows += 1
        return [out]

    return handler


def run_partition(
    spec: PartitionSpec,
    batches: Iterable[pa.RecordBatch],
    task: TaskInfo,
    on_done: Callable[[RunMetrics], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run the operator over one partition's batches; yield output batches lazily.

    With checkpoint storage: carried-over elements of the previous version are
    replayed first, lookups completed by an earlier attempt of this task are
    served from its log instead of being requested again, and (streaming)
    elements still in flight when ``drain_timeout`` runs out are written to
    this version for the next micro-batch.
    """
    runtime = WorkerRuntime.get()
    user_fn = runtime.function(spec, task)
    metrics = RunMetrics(partitions=1)
    sink = ArrowSink(spec)
    columnar = spec.chunk_size is not None and is_columnar(user_fn)
    row_fn: RowFunction
    if spec.chunk_size is None:
        row_fn = RowFunction(user_fn, spec)
    elif columnar:
        row_fn = ArrowChunkFunction(user_fn, spec)
    else:
        row_fn = ChunkFunction(user_fn, spec)
    op: AsyncWaitOperator | PooledWaitOperator
    if _pooled(spec):
        op = PooledWaitOperator(
            invoke=row_fn.invoke_direct,
            map_results=row_fn.record,
            timeout_handler=row_fn.timeout,
            emit=sink.extend,
            timeout=spec.timeout,
            capacity=spec.capacity,
            mode=spec.mode,
            retry=spec.retry,
            on_failure=error_row_handler(spec, metrics),
            output_buffer=spec.output_buffer,
        )
    else:
        op = _operator(spec, row_fn, sink, columnar, metrics)
    ckpt = PartitionCheckpoint(spec, task) if spec.checkpoint is not None else None
    if ckpt is not None:
        row_fn.log = []
    started = time.perf_counter()
    cache_before = _cache_counters(user_fn)
    watermarks = (
        BoundedOutOfOrderness(spec.watermark_delay, spec.watermark_interval)
        if spec.event_time is not None
        else None
    )
    feeder = _Feeder(op, spec, watermarks, metrics, ckpt)
    try:
        restored = None
        if ckpt is not None:
            restored = ckpt.restore()
            ckpt.restore_function_state(user_fn)
        runtime.run(op.open(restored))
        for batch in batches:
            if columnar:
                runtime.run(feeder.feed_arrow(batch))
            else:
                runtime.run(feeder.feed(batch.to_pylist()))
            metrics.max_in_flight = max(metrics.max_in_flight, len(op))
            if ckpt is not None and row_fn.log:
                ckpt.write_log(row_fn.log)
                row_fn.log = []
            if sink.full() or sink.batch_full():
                yield from sink.take()
        drained = runtime.run(_drain(op, spec.drain_timeout))  # drain_timeout needs a checkpoint
        if ckpt is not None:
            if row_fn.log:
                ckpt.write_log(row_fn.log)
                row_fn.log = []
            assert isinstance(op, AsyncWaitOperator)  # checkpoints never run pooled
            remaining = op.snapshot_state() if not drained else None
            metrics.carried_over = len(remaining) if remaining is not None else 0
            ckpt.finish(remaining)
            ckpt.snapshot_function_state(user_fn)
    finally:
        runtime.run(op.close())
        stats = op.statistics()
        metrics.received = stats.received
        metrics.completed = stats.completed
        metrics.timed_out = stats.timed_out
        metrics.retried = stats.retried
        metrics.failed = stats.failed
        metrics.restored = stats.restored
        metrics.latency = op.latency
        metrics.seconds = time.perf_counter() - started
        # peak resident memory of this worker process so far (kB on Linux)
        metrics.max_worker_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        cache_after = _cache_counters(user_fn)
        if cache_before is not None and cache_after is not None:
            # the cache lives as long as the worker: count this partition's share
            (
                metrics.cache_hits,
                metrics.cache_misses,
                metrics.cache_evictions,
                metrics.cache_expirations,
            ) = (a - b for a, b in zip(cache_after, cache_before, strict=True))
    yield from sink.take()
    metrics.emitted = sink.emitted
    log.info(
        "asyncio_ops partition %s (attempt %s) done: %s",
        task.partition_id, task.attempt_number, metrics.summary(),
    )  # fmt: skip
    if on_done is not None:
        on_done(metrics)


def _pooled(spec: PartitionSpec) -> bool:
    """The plain case runs on :class:`PooledWaitOperator` (see ``_pool``)."""
    return (
        spec.pool
        and spec.chunk_size is None
        and not spec.key_columns
        and spec.event_time is None
        and spec.checkpoint is None
        and spec.mode in (OutputMode.ORDERED, OutputMode.UNORDERED)
    )


def _operator(
    spec: PartitionSpec, row_fn: RowFunction, sink: ArrowSink, columnar: bool, metrics: RunMetrics
) -> AsyncWaitOperator:
    return AsyncWaitOperator(
        row_fn,
        output=sink.add_batch if columnar else sink,
        timeout=spec.timeout,
        capacity=spec.capacity,
        mode=spec.mode,
        retry=spec.retry,
        on_failure=error_row_handler(spec, metrics),
        manage_function=False,
        key_selector=_key_selector(spec),
        # the user's coroutine is awaited directly and its results merged into
        # the row afterwards: no wrapper coroutine per row
        invoke=row_fn.invoke_direct,
        map_results=row_fn.record,
        describe=row_fn.describe if spec.chunk_size is not None else None,
        output_buffer=spec.output_buffer,
    )


def _cache_counters(fn: object) -> tuple[int, int, int, int] | None:
    """(hits, misses, evictions, expirations) of a function's cache, if it reports one.

    A function with ``statistics()`` whose result has a ``cache`` with those
    counters (the connectors' lookups) gets them into the operator metrics.
    """
    statistics = getattr(fn, "statistics", None)
    if not callable(statistics):
        return None
    try:
        cache = getattr(statistics(), "cache", None)
        if cache is None:
            return None
        return (int(cache.hits), int(cache.misses), int(cache.evictions), int(cache.expirations))
    except Exception:  # statistics are best effort: never fail a partition over them
        log.debug("cache statistics of %r unavailable", fn, exc_info=True)
        return None


async def _drain(op: AsyncWaitOperator | PooledWaitOperator, drain_timeout: float | None) -> bool:
    """``end_input``, bounded by ``drain_timeout`` if given; True if everything left."""
    if drain_timeout is None:
        await op.end_input()
        return True
    try:
        await asyncio.wait_for(op.end_input(), drain_timeout)
    except TimeoutError:
        if op.failure is not None:
            raise op.failure from None
        return False
    return True


class _Feeder:
    """Turns rows into operator input: positions, replayed results, watermarks, late rows."""

    def __init__(
        self,
        op: Any,  # AsyncWaitOperator; PooledWaitOperator in the plain case (process_elements)
        spec: PartitionSpec,
        watermarks: BoundedOutOfOrderness | None,
        metrics: RunMetrics,
        ckpt: PartitionCheckpoint | None,
    ) -> None:
        self.op = op
        self.spec = spec
        self.watermarks = watermarks
        self.metrics = metrics
        self.ckpt = ckpt
        self.position = 0

    async def feed_arrow(self, batch: pa.RecordBatch) -> None:
        """Columnar: one element per zero-copy slice of ``chunk_size`` rows."""
        n = self.spec.chunk_size
        assert n is not None
        await self.op.process_elements(
            [(batch.slice(i, n), None, None) for i in range(0, batch.num_rows, n)]
        )

    async def feed(self, rows: list[dict[str, Any]]) -> None:
        op = self.op
        if self.watermarks is None and self.ckpt is None:
            n = self.spec.chunk_size
            if n is not None:  # vectorised: one element per chunk of rows
                await op.process_elements(
                    [(rows[i : i + n], None, None) for i in range(0, len(rows), n)]
                )
                return
            # the common case, kept lean: one tuple per row, no per-row branches
            await op.process_elements([(row, None, None) for row in rows])
            return
        column = self.spec.event_time
        drop_late = self.spec.late_records == "drop"
        watermarks = self.watermarks
        replay = self.ckpt.replay if self.ckpt is not None else None
        for row in rows:
            pos = self.position
            self.position += 1
            ts: float | None = None
            late: bool | None = None
            if watermarks is not None:
                assert column is not None
                ts = event_time_seconds(row.get(column), column, row)
                late = ts < watermarks.current
                if late:
                    self.metrics.late += 1
                    if drop_late:
                        self.metrics.dropped_late += 1
                        continue
            value = (row, late, pos if replay is not None else None)
            stored = replay.get(pos) if replay else None
            if stored is not None and stored[0] == fingerprint(row):
                self.metrics.replayed += 1
                await op.process_completed_element(
                    Record(value, ts),
                    op.function.merge(value, stored[1]),
                )
            else:
                await op.process_element(Record(value, ts))
            if watermarks is not None:
                assert ts is not None
                wm = watermarks.observe(ts)
                if wm is not None:
                    await op.process_watermark(Watermark(wm))


class PartitionCheckpoint:
    """The checkpoint files one partition reads and writes (see ``_checkpoint``).

    Versions: a streaming micro-batch ``N`` (Spark's ``streaming.sql.batchId``)
    restores the elements carried over in version ``N - 1`` and writes version
    ``N``, so a re-run batch is idempotent. A batch job uses the version chosen
    on the driver. In both, logs of completed lookups written by earlier
    attempts of the same partition in the same version are replayed.
    """

    def __init__(self, spec: PartitionSpec, task: TaskInfo) -> None:
        assert spec.checkpoint is not None
        self.spec = spec
        self.task = task
        self.storage = spec.checkpoint
        self.streaming = task.batch_id is not None
        version = task.batch_id if task.batch_id is not None else spec.checkpoint_version
        self.version: int = version if version is not None else 0
        self.partition = task.partition_id
        self.token = uuid.uuid4().hex[:12]
        self.segment = 0
        self.replay: dict[Any, tuple[bytes, list[Any]]] = self._load_logs()

    # -- replay log ------------------------------------------------------------------
    def _load_logs(self) -> dict[Any, tuple[bytes, list[Any]]]:
        found: dict[Any, tuple[bytes, list[Any]]] = {}
        for name in self.storage.list_files(self.version, f"results-p{self.partition:05d}-"):
            for pos, fp, results in self.storage.read(self.version, name):
                found[pos] = (fp, results)
        return found

    def write_log(self, entries: list[tuple[Any, bytes, list[Any]]]) -> None:
        name = f"results-p{self.partition:05d}-{self.token}-{self.segment:06d}.ckpt"
        self.segment += 1
        self.storage.write(self.version, name, entries)

    # -- carry-over between micro-batches ----------------------------------------------
    def restore(self) -> OperatorSnapshot | None:
        if not self.streaming or self.version <= 0:
            return None
        previous = self.version - 1
        manifests = self.storage.list_files(previous, "subtask-")
        if not manifests:
            return None
        first = self.storage.read(previous, manifests[0])
        expected = [f"subtask-{i:05d}.ckpt" for i in range(first["num_partitions"])]
        missing = sorted(set(expected) - set(manifests))
        if missing:
            raise CheckpointError(
                f"checkpoint version {previous} of {self.storage.describe(self.storage.root)} "
                f"is incomplete: missing {[self.storage.path(previous, m) for m in missing]}"
            )
        entries: list[SnapshotEntry] = []
        p_new = self.task.num_partitions or 1
        if self.spec.key_columns:
            kg_range = compute_key_group_range_for_operator_index(
                self.spec.max_parallelism, p_new, self.partition
            )
            for name in expected:
                manifest = first if name == manifests[0] else self.storage.read(previous, name)
                for kg, file in manifest["key_group_files"]:
                    if kg in kg_range:
                        entries.extend(self.storage.read(previous, file))
        else:
            for index, name in enumerate(expected):
                if index % p_new != self.partition:
                    continue  # even split of the old subtasks' state over the new ones
                manifest = first if name == manifests[0] else self.storage.read(previous, name)
                entries.extend(manifest["operator_state"])
        if not entries:
            return None
        return OperatorSnapshot(
            tuple(_fresh_position(e, i) for i, e in enumerate(entries)), self.spec.mode
        )

    # -- state of the function itself (e.g. a lookup cache) -------------------------------
    def restore_function_state(self, fn: object) -> None:
        """Give a checkpointed function what every partition wrote in the previous version.

        A function opts in with ``initialize_function_state(entries)`` and
        ``snapshot_function_state() -> entries`` (a list of ``(key, value)``).
        Functions live per worker, across partitions, so every partition's
        entries are offered (for a cache: merged; stale ones are the
        function's to drop).
        """
        initialize = getattr(fn, "initialize_function_state", None)
        if not callable(initialize) or self.version <= 0:
            return
        previous = self.version - 1
        entries: list[tuple[Any, Any]] = []
        for name in self.storage.list_files(previous, "fnstate-"):
            entries.extend(self.storage.read(previous, name))
        initialize(entries)

    def snapshot_function_state(self, fn: object) -> None:
        snapshot = getattr(fn, "snapshot_function_state", None)
        if not callable(snapshot):
            return
        entries = list(snapshot())
        if entries:
            self.storage.write(self.version, f"fnstate-p{self.partition:05d}.ckpt", entries)

    def finish(self, remaining: OperatorSnapshot | None) -> None:
        """Write this partition's manifest (streaming) and prune old versions."""
        if not self.streaming:
            return
        entries = list(remaining.entries) if remaining is not None else []
        manifest: dict[str, Any] = {
            "num_partitions": self.task.num_partitions or 1,
            "partition": self.partition,
            "operator_state": [],
            "key_group_files": [],
        }
        if self.spec.key_columns:
            by_kg: dict[int, list[SnapshotEntry]] = {}
            for e in entries:
                if type(e.element) is Record:
                    kg = e.element.value[0][KEY_GROUP_COLUMN]
                    by_kg.setdefault(kg, []).append(e)
            for kg, group in sorted(by_kg.items()):
                name = f"kg-{kg:05d}.ckpt"
                self.storage.write(self.version, name, group)
                manifest["key_group_files"].append((kg, name))
        else:
            manifest["operator_state"] = [e for e in entries if type(e.element) is Record]
        self.storage.write(self.version, f"subtask-{self.partition:05d}.ckpt", manifest)
        if self.partition == 0:
            old = [
                v for v in self.storage.versions() if v <= self.version - self.spec.retain_versions
            ]
            self.storage.delete_versions(old)


def _fresh_position(entry: SnapshotEntry, index: int) -> SnapshotEntry:
    """A carried-over element gets a position of its own in the new batch's replay log."""
    element = entry.element
    if type(element) is not Record:
        return entry
    row, late, _ = element.value
    return SnapshotEntry(
        Record((row, late, ("carried", index)), element.timestamp), entry.results, entry.key
    )


def _key_selector(spec: PartitionSpec) -> Callable[[Any], Any] | None:
    cols = spec.key_columns
    if not cols:
        return None
    if len(cols) == 1:
        (col,) = cols
        return lambda value: value[0][col]
    return lambda value: tuple(value[0][c] for c in cols)
