"""Running one partition: Arrow batches in, the operator on the worker's loop, Arrow batches out.

Call order per partition (``run_partition``)::

    open the function (once per worker)        WorkerRuntime.function
    restore (checkpoint)                       watermark state, then carried-over elements,
                                               then the function's own state
    per input batch: feed, collect, yield      never more than capacity elements ahead
    drain                                      end_input, bounded by drain_timeout (streaming)
    snapshot (checkpoint)                      the replay log's tail; streaming: what is
                                               still in flight, by key group, and the watermark
    close the operator (always), metrics

Input is pulled lazily: one Arrow batch is turned into rows and admitted into
the operator, which blocks (while lookups go on) whenever ``capacity`` elements
are in flight; output rows collected meanwhile are handed back as batches of
at most ``batch_size`` rows before the next input batch is read. Memory is
bounded by capacity and batch sizes, not by the partition.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._elements import Record
from .._engine._limit import AdaptiveLimit
from .._engine._operator_snapshot import OperatorSnapshot
from .._engine._wait_operator import AsyncWaitOperator, OperatorHooks
from .._exceptions import CheckpointError, OutputSchemaError
from .._functions import (
    SupportsCacheStatistics,
    SupportsNullKeyCount,
    SupportsRateLimitUsage,
    SupportsServiceRetries,
    SupportsTokenUsage,
)
from ._adapters import (
    ArrowChunkFunction,
    ChunkFunction,
    RowFunction,
    chunk_key_group,
    chunk_rows,
    is_columnar,
)
from ._feed import BoundedOutOfOrderness, Feeder
from ._inflight import WatermarkState
from ._metrics import RunMetrics
from ._partition_checkpoint import PartitionCheckpoint
from ._sink import ArrowSink
from ._spec import PartitionSpec, TaskInfo
from ._worker import WorkerRuntime

log = logging.getLogger("asyncio_ops.runtime")

FailureHandler = Callable[[Record[Any], BaseException, int], Sequence[Any]]


def error_row_handler(spec: PartitionSpec, row_fn: RowFunction) -> FailureHandler | None:
    """For ``on_error="error_column"``: a failed element becomes its input row plus ``_error``
    (a chunk: each of its rows, or only the rows that failed alone; see RowFunction.failed).

    A result that does not fit the output schema and a checkpoint that cannot
    be written are not failed lookups: they fail the partition loudly.
    """
    if spec.options.on_error != "error_column":
        return None

    def handler(record: Record[Any], exc: BaseException, attempts: int) -> list[Any]:
        if isinstance(exc, OutputSchemaError | CheckpointError):
            raise exc
        return row_fn.failed(record.value, exc, attempts)

    return handler


def _key_selector(spec: PartitionSpec) -> Callable[[Any], Any] | None:
    """The operator's key of an element: the key columns of a row; for a chunk (all
    its rows of one key group, see the feeder) the key group that the JVM computed."""
    cols = spec.key
    if not cols:
        return None
    if spec.chunk_size is not None:
        return chunk_key_group
    if len(cols) == 1:
        (col,) = cols
        return lambda value: value.row[col]
    return lambda value: tuple(value.row[c] for c in cols)


def _operator(
    spec: PartitionSpec,
    row_fn: RowFunction,
    sink: ArrowSink,
    columnar: bool,
    limiter: AdaptiveLimit | None,
) -> AsyncWaitOperator:
    return AsyncWaitOperator(
        row_fn,
        output=sink,
        timeout=spec.options.timeout,
        capacity=spec.capacity if limiter is None else limiter,
        mode=spec.mode,
        retry=spec.options.retry,
        on_failure=error_row_handler(spec, row_fn),
        manage_function=False,
        key_selector=_key_selector(spec),
        hooks=OperatorHooks(
            # the user's coroutine is awaited directly and its results merged into
            # the row afterwards: no wrapper coroutine per row
            invoke=row_fn.invoke_direct,
            map_results=row_fn.record,
            # results go to the sink as they are: no Record per output row
            emit_results=sink.extend_batches if columnar else sink.extend,
            describe=row_fn.describe,
            # a chunk counts its rows in the statistics (received, completed, ...)
            weight=chunk_rows if spec.chunk_size is not None else None,
        ),
        output_buffer=spec.output_buffer,
        max_capacity=spec.options.max_capacity,
    )


def _function_counters(fn: object) -> dict[str, float]:
    """What a function counts of itself so far (monotonic over its life, which is the
    worker's), by metric name: its cache's hits, misses, evictions and expirations, a
    model's bill, a rate limit's toll, its own retries, rows skipped for NULL keys;
    only what it reports. A partition's share is the difference of two readings."""
    out: dict[str, float] = {}
    if isinstance(fn, SupportsCacheStatistics):
        cache = fn.cache_statistics()
        if cache is not None:
            out.update(cache_hits=cache.hits, cache_misses=cache.misses,
                       cache_evictions=cache.evictions,
                       cache_expirations=cache.expirations)  # fmt: skip
    if isinstance(fn, SupportsTokenUsage):
        prompt, completion, cost = fn.token_usage()
        out.update(prompt_tokens=prompt, completion_tokens=completion, cost=cost or 0.0)
    if isinstance(fn, SupportsRateLimitUsage):
        permits, tokens, waited = fn.rate_limit_usage()
        out.update(rate_limit_permits=permits, rate_limit_tokens=tokens,
                   rate_limit_wait_seconds=waited)  # fmt: skip
    if isinstance(fn, SupportsServiceRetries):
        retried, throttled, waited = fn.service_retries()
        out.update(connector_retried=retried, throttled=throttled,
                   throttle_wait_seconds=waited)  # fmt: skip
    if isinstance(fn, SupportsNullKeyCount):
        out["skipped_null_keys"] = fn.null_key_count()
    return out


async def _drain(op: AsyncWaitOperator, drain_timeout: float | None) -> bool:
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


def _flush_after_failure(ckpt: PartitionCheckpoint) -> None:
    """Keep what a failing attempt completed, for its retry (the failure itself goes on)."""
    try:
        ckpt.log.flush()
    except Exception:  # the attempt's own failure is the one to report
        log.warning("could not write the replay log after a failure", exc_info=True)


def _row_function(spec: PartitionSpec, user_fn: Any, columnar: bool) -> RowFunction:
    if spec.chunk_size is None:
        return RowFunction(user_fn, spec)
    if columnar:
        return ArrowChunkFunction(user_fn, spec)
    return ChunkFunction(user_fn, spec)


def run_partition(
    spec: PartitionSpec,
    batches: Iterable[pa.RecordBatch],
    task: TaskInfo,
    on_done: Callable[[RunMetrics], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Run the operator over one partition's batches; yield output batches lazily.

    With checkpoint storage: the watermark and the elements the previous
    micro-batch carried over are restored first (each keeping its deadline and
    attempts), lookups completed by an earlier attempt of this task are served
    from its replay log instead of being requested again, and (streaming)
    elements still in flight when ``drain_timeout`` runs out are written to
    this version for the next micro-batch.
    """
    runtime = WorkerRuntime.get()
    user_fn = runtime.function(spec, task)
    metrics = RunMetrics(partitions=1)
    sink = ArrowSink(spec.output_schema, spec.added_columns, spec.batch_size)
    columnar = spec.chunk_size is not None and is_columnar(user_fn)
    row_fn = _row_function(spec, user_fn, columnar)
    ckpt = (
        PartitionCheckpoint(spec, task, row_fn.log_type(spec), columnar)
        if spec.checkpoint is not None
        else None
    )
    # capacity="auto" starts where this partition's operator ended the previous
    # micro-batch (checkpointed: on any worker), else where this worker's last one did
    start = ckpt.previous_limit() if ckpt is not None and spec.capacity == "auto" else None
    op = _operator(spec, row_fn, sink, columnar, runtime.limiter(spec, start))
    if op.limiter is not None:  # its log lines name the operator and the partition
        op.limiter.name = f"capacity of {spec.uid}, partition {task.partition_id}"
    started = time.perf_counter()
    counted_before = _function_counters(user_fn)
    watermarks = (
        BoundedOutOfOrderness(
            spec.options.watermark_delay or 0.0, spec.options.watermark_interval
        )
        if spec.options.event_time is not None
        else None
    )
    replay = None
    input_schema: pa.Schema | None = None
    try:
        restored = None
        if ckpt is not None:
            row_fn.log = ckpt.log
            replay, carried, function_state = ckpt.open_state(user_fn)
            if carried is not None:
                input_schema = carried.input_schema
                if watermarks is not None:
                    watermarks.restore(carried.watermarks.max_seen, carried.watermarks.current)
                if carried.entries:
                    restored = carried.entries
            ckpt.offer_function_state(user_fn, function_state)
            ckpt.start_retention()  # partition 0, streaming: beside the task on a remote store
        feeder = Feeder(op, spec, row_fn, watermarks, metrics, replay)
        if restored is not None:
            runtime.run(op.open(OperatorSnapshot(restored, spec.mode)))
        else:
            runtime.run(op.open())
        first = True
        for batch in batches:
            if first:  # the input's own schema wins over one restored from a checkpoint
                input_schema, first = batch.schema, False
            if columnar:
                runtime.run(feeder.feed_arrow(batch))
            else:
                runtime.run(feeder.feed(batch.to_pylist()))
            metrics.max_in_flight = max(metrics.max_in_flight, len(op))
            if sink.full() or sink.batch_full():
                yield from sink.take()
        # drain_timeout needs a checkpoint
        drained = runtime.run(_drain(op, spec.options.drain_timeout))
        if ckpt is not None:
            remaining = op.snapshot_state().entries if not drained else ()
            metrics.carried_over = sum(
                chunk_rows(e.element.value) if spec.chunk_size is not None else 1
                for e in remaining
                if type(e.element) is Record
            )
            state = (
                WatermarkState(watermarks.max_seen, watermarks.current)
                if watermarks is not None
                else WatermarkState()
            )
            limit = op.limiter.limit if op.limiter is not None else None
            ckpt.finish(remaining, state, input_schema, limit)
            ckpt.snapshot_function_state(user_fn)
    except BaseException:
        if ckpt is not None:
            ckpt.end_retention()
            _flush_after_failure(ckpt)
        raise
    finally:
        runtime.run(op.close())
        stats = op.statistics()
        metrics.received = stats.received
        metrics.chunks = stats.elements if spec.chunk_size is not None else 0
        metrics.completed = stats.completed
        metrics.timed_out = stats.timed_out
        metrics.retried = stats.retried
        metrics.failed = stats.failed
        metrics.restored = stats.restored
        metrics.error_rows = row_fn.error_rows
        metrics.dropped = row_fn.dropped
        metrics.latency = op.latency
        if op.limiter is not None:  # capacity="auto": where this partition's limit ended
            metrics.capacity_limits = [op.limiter.limit]
            metrics.capacity_low, metrics.capacity_high = op.limiter.low, op.limiter.high
            metrics.capacity_cuts = op.limiter.cuts
            runtime.remember(spec, op.limiter)
        metrics.seconds = time.perf_counter() - started
        # peak resident memory of this worker process so far (kB on Linux)
        metrics.max_worker_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for name, value in _function_counters(user_fn).items():
            if name in counted_before:  # this partition's share
                setattr(metrics, name, value - counted_before[name])
    yield from sink.take()
    metrics.emitted = sink.emitted
    log.info(
        "asyncio_ops partition %s (attempt %s) done: %s",
        task.partition_id, task.attempt_number, metrics.summary(),
    )  # fmt: skip
    if on_done is not None:
        on_done(metrics)
