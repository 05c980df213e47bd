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
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import pyarrow as pa

from ._elements import Record, Watermark
from ._exceptions import AsyncOpsError, ConfigurationError, OutputSchemaError
from ._functions import AsyncFunction, RuntimeContext, maybe_await
from ._operator import AsyncWaitOperator, LatencyHistogram, OperatorSnapshot, OutputMode
from ._retry import AsyncRetryStrategy

log = logging.getLogger("asyncio_ops.runtime")

ERROR_COLUMN: Final = "_error"
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
    max_in_flight: int = 0
    seconds: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def merge(self, other: RunMetrics) -> RunMetrics:
        for name in (
            "partitions", "received", "emitted", "completed", "timed_out", "retried",
            "failed", "error_rows", "late", "dropped_late", "restored", "seconds",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_in_flight = max(self.max_in_flight, other.max_in_flight)
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
            "max_in_flight": self.max_in_flight,
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


class WorkerRuntime:
    """One per Python worker process: the event loop and the opened functions."""

    _instance: WorkerRuntime | None = None

    def __init__(self) -> None:
        self.loop = _new_loop()
        self.functions: dict[str, AsyncFunction[Any, Any]] = {}
        atexit.register(self.shutdown)

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
        if fn is None:
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

    def shutdown(self) -> None:
        """Close every opened function, then the loop (at worker exit)."""
        if self.loop.is_closed():
            return
        for token, fn in list(self.functions.items()):
            try:
                self.run(maybe_await(fn.close()))
            except Exception:  # closing must go on for the others
                log.exception("closing async function %s failed", token)
        self.functions.clear()
        self.run(self.loop.shutdown_asyncgens())
        self.loop.close()


# -- rows ---------------------------------------------------------------------------------------
def _describe_row(row: Any) -> str:
    text = repr(row)
    return text if len(text) <= 300 else text[:300] + "..."


class RowFunction(AsyncFunction[Any, Any]):
    """Calls the user's function with a row dict; merges each result dict into the row.

    The value is the row dict, or ``(row, late)`` in event-time mode. A result
    must be a dict whose keys are declared output columns; the message of a
    violation names the column and the input row.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        self.user = user
        self.allowed = frozenset(spec.added_columns)
        self.keep = spec.keep_input_columns
        self.event_time = spec.event_time is not None

    def _merge(self, value: Any, results: Any) -> list[dict[str, Any]]:
        if self.event_time:
            row, late = value
        else:
            row, late = value, None
        if results is None or not isinstance(results, list | tuple):
            raise OutputSchemaError(
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

    async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
        row = value[0] if self.event_time else value
        return self._merge(value, await self.user.async_invoke(row))

    def timeout(self, value: Any) -> Any:
        row = value[0] if self.event_time else value
        results = self.user.timeout(row)
        if asyncio.iscoroutine(results):
            return self._merge_later(value, results)
        return self._merge(value, results)

    async def _merge_later(self, value: Any, awaitable: Any) -> list[dict[str, Any]]:
        return self._merge(value, await awaitable)


class ArrowSink:
    """Collects output rows and turns them into Arrow batches of the declared schema."""

    def __init__(self, spec: PartitionSpec) -> None:
        self.schema = spec.output_schema
        self.batch_size = spec.batch_size
        self.rows: list[dict[str, Any]] = []
        self.emitted = 0

    def __call__(self, element: Any) -> None:
        if type(element) is Record:
            self.rows.append(element.value)

    def full(self) -> bool:
        return len(self.rows) >= self.batch_size

    def take(self) -> Iterator[pa.RecordBatch]:
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
    event_time = spec.event_time is not None

    def handler(record: Record[Any], exc: BaseException, attempts: int) -> list[dict[str, Any]]:
        if isinstance(exc, OutputSchemaError):
            raise exc  # a bug in the function's output, not a failed lookup: fail loudly
        row, late = record.value if event_time else (record.value, None)
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
    restored: OperatorSnapshot | None = None,
    on_done: Callable[[RunMetrics], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run the operator over one partition's batches; yield output batches lazily."""
    runtime = WorkerRuntime.get()
    user_fn = runtime.function(spec, task)
    metrics = RunMetrics(partitions=1)
    sink = ArrowSink(spec)
    row_fn = RowFunction(user_fn, spec)
    op = AsyncWaitOperator(
        row_fn,
        output=sink,
        timeout=spec.timeout,
        capacity=spec.capacity,
        mode=spec.mode,
        retry=spec.retry,
        on_failure=error_row_handler(spec, metrics),
        manage_function=False,
        key_selector=_key_selector(spec),
    )
    started = time.perf_counter()
    watermarks = (
        BoundedOutOfOrderness(spec.watermark_delay, spec.watermark_interval)
        if spec.event_time is not None
        else None
    )
    try:
        runtime.run(op.open(restored))
        for batch in batches:
            rows = batch.to_pylist()
            if watermarks is None:
                runtime.run(op.process_elements(rows))
            else:
                runtime.run(_process_event_time(op, rows, spec, watermarks, metrics))
            metrics.max_in_flight = max(metrics.max_in_flight, len(op))
            if sink.full():
                yield from sink.take()
        runtime.run(op.end_input())
    except AsyncOpsError:
        raise
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
    yield from sink.take()
    metrics.emitted = sink.emitted
    log.info(
        "asyncio_ops partition %s (attempt %s) done: %s",
        task.partition_id, task.attempt_number, metrics.summary(),
    )  # fmt: skip
    if on_done is not None:
        on_done(metrics)


def _key_selector(spec: PartitionSpec) -> Callable[[Any], Any] | None:
    cols = spec.key_columns
    if not cols:
        return None
    event_time = spec.event_time is not None
    if len(cols) == 1:
        (col,) = cols
        if event_time:
            return lambda value: value[0][col]
        return lambda row: row[col]
    if event_time:
        return lambda value: tuple(value[0][c] for c in cols)
    return lambda row: tuple(row[c] for c in cols)


async def _process_event_time(
    op: AsyncWaitOperator,
    rows: list[dict[str, Any]],
    spec: PartitionSpec,
    watermarks: BoundedOutOfOrderness,
    metrics: RunMetrics,
) -> None:
    column = spec.event_time
    assert column is not None
    drop_late = spec.late_records == "drop"
    for row in rows:
        ts = event_time_seconds(row.get(column), column, row)
        late = ts < watermarks.current
        if late:
            metrics.late += 1
            if drop_late:
                metrics.dropped_late += 1
                continue
        await op.process_element(Record((row, late), ts))
        wm = watermarks.observe(ts)
        if wm is not None:
            await op.process_watermark(Watermark(wm))
