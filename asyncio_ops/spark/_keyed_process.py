"""``keyed_process``: a :class:`KeyedProcessFunction` over a DataFrame, keyed state and timers.

Rows are routed by key group (Spark's ``hash`` in the JVM, as keyed
``unordered_wait`` does), so each key's rows reach one partition, in input
order. Inside each partition the function runs with a keyed state backend
over the partition's key groups (see ``asyncio_ops._runtime._keyed_partition``
for the call order, timers and the checkpoint). On a streaming DataFrame the
state and timers live under ``checkpoint_location`` between micro-batches and
follow their key groups when the number of partitions changes. One
``checkpoint_location`` and ``uid`` belong to one operator of one query: a
second one upstream in the plan, or in another streaming query running in the
session, is refused on the driver (as for the async operators); a query
restarted from its own Spark checkpoint takes its state back, after the
driver has checked its key columns and state descriptors against the
checkpoint (``_state_check``: an incompatible change fails before any job).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    StructType,
)

from .._exceptions import ConfigurationError
from .._runtime import (
    InitialStateFn,
    KeyedProcessSpec,
    clear_seed,
    run_keyed_process,
    write_seed,
)
from .._storage._checkpoint_storage import CheckpointStorage
from ..state import KeyedProcessFunction
from . import _job_errors
from ._checkpoint_location import DESCRIBED, checkpoint_storage, plan_tag
from ._frame import as_struct, batch_size_of, event_time_column, key_columns, task_info
from ._keyed import partition_by_key_group
from ._keywords import known_keywords
from ._options import KEYED_SIGNATURE, KeyedKeywords, KeyedOptions
from ._preflight import preflight as run_preflight
from ._state_check import check_state_schema, newest_complete

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("asyncio_ops.spark")


def keyed_process(
    df: DataFrame,
    fn: KeyedProcessFunction[Any, Any, Any],
    *,
    key: str | Sequence[str],
    output_schema: str | StructType,
    initial_state: DataFrame | None = None,
    initial_state_fn: InitialStateFn | None = None,
    **options: Unpack[KeyedKeywords],
) -> DataFrame:
    """Run ``fn`` per key of ``df``, with keyed state and timers; returns its output rows.

    ``fn.process_element(row, ctx, out)`` sees each row as a dict, in input
    order per key; ``fn.on_timer(timestamp, ctx, out)`` runs when a timer of
    the key fires. Both emit dicts of ``output_schema`` with ``out.collect``,
    or return or yield them. With ``event_time`` the watermark (highest event
    time seen minus ``watermark_delay``) drives event-time timers and
    event-time TTL. A batch job ends with the watermark at +inf (every
    event-time timer fires); a streaming one keeps state and timers under
    ``checkpoint_location`` between micro-batches: each version holds what the
    micro-batch changed, and each key group's full state every
    ``full_snapshot_interval`` versions.

    ``initial_state`` (a batch DataFrame with the key columns, of the input's
    types) seeds state before a batch job or the first micro-batch of a query
    with no checkpoint version yet (ignored, with a log line, when the query
    restores from a version): per key, ``initial_state_fn(key, rows, ctx)``
    (default: ``fn.handle_initial_state``) runs with the key current, after
    ``fn.open``, so ``fn``'s state handles and ``ctx.timer_service()`` act on
    it; ``rows`` are the key's initial rows as dicts. It needs
    ``checkpoint_location`` (the seed is written there, by a Spark job that
    runs when ``keyed_process`` is called). See docs/keyed-state.md and docs/read-state.md.

    State belongs to the operator's ``uid`` (derived from the function's class name and
    the key columns with their types, unless given) and to the streaming query that
    wrote it: another query's state is refused, and a query that restores but finds no
    state for its uid while the location holds its state under other uids is refused
    naming them, unless ``allow_non_restored_state=True`` (it then starts empty).

    Example::

        from asyncio_ops.spark import keyed_process
        from asyncio_ops.state import KeyedProcessFunction, StateTtlConfig, ValueStateDescriptor

        class CountPerUser(KeyedProcessFunction):
            def open(self, ctx):
                self.count = ctx.get_state(ValueStateDescriptor("count", ttl=StateTtlConfig(600)))

            def process_element(self, row, ctx, out):
                n = (self.count.value() or 0) + 1
                self.count.update(n)
                yield {"user_id": ctx.get_current_key(), "n": n}

        counts = keyed_process(events, CountPerUser(), key="user_id",
                               output_schema="user_id long, n long",
                               checkpoint_location="s3://bucket/checkpoints/counts")
    """
    if not isinstance(df, DataFrame):
        raise ConfigurationError(f"df must be a pyspark DataFrame, got {type(df)!r}")
    _job_errors.install()
    if not isinstance(fn, KeyedProcessFunction):
        raise ConfigurationError(
            f"fn must be an asyncio_ops.state.KeyedProcessFunction, got {type(fn).__name__}"
        )
    opts = KeyedOptions.of(**options)
    key_cols = key_columns(key, df)
    if not key_cols:
        raise ConfigurationError("keyed_process needs key= (a column name or a list of names)")
    event_time_column(opts.event_time, df)  # checked: it exists, with a usable type
    out_struct = as_struct(output_schema, "output_schema")
    if not out_struct.fields:
        raise ConfigurationError(f"output_schema declares no columns ({output_schema!r})")
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    arrow_schema = to_arrow_schema(out_struct, timezone=timezone)
    arrow_schema = pa.schema([f.with_nullable(True) for f in arrow_schema])

    storage: CheckpointStorage | None = None
    if opts.checkpoint_location is not None:
        operator_uid = opts.uid or _default_uid(fn, key_cols, df)
        storage = checkpoint_storage(df, opts.checkpoint_location, operator_uid)
    elif df.isStreaming:
        raise ConfigurationError(
            "keyed_process on a streaming DataFrame needs checkpoint_location=: state and "
            "timers live there between micro-batches"
        )

    seed_fn = _initial_state_fn(fn, initial_state, initial_state_fn, key_cols, df, storage)
    # the version a streaming query restores from (read once: the state check and the
    # seed's decision both need it)
    found = newest_complete(storage) if storage is not None and df.isStreaming else None
    if found is not None:
        assert storage is not None
        check_state_schema(fn, storage, found, key_cols, df, opts.preflight)
    run_preflight(opts.preflight, fn, df, out_struct)

    df, parts = partition_by_key_group(df, key_cols, opts.max_parallelism, opts.num_partitions)
    spec = KeyedProcessSpec(
        options=opts,
        function=fn,
        key=key_cols,
        output_schema=arrow_schema,
        batch_size=batch_size_of(df, opts.batch_size),
        num_partitions=parts,
        checkpoint=storage,
        key_schema=StructType([df.schema[c] for c in key_cols]).json(),
    )
    if seed_fn is not None:
        assert initial_state is not None and storage is not None
        restores = found.version if found is not None else None
        if restores is not None:
            log.info(
                "keyed_process uid %r: initial_state ignored, the query restores from "
                "checkpoint version %d of %s", storage.uid, restores, opts.checkpoint_location,
            )  # fmt: skip
        else:
            spec = replace(spec, seeded=True)
            _write_seed(spec, seed_fn, initial_state, parts)

    def partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from run_keyed_process(spec, batches, task_info(parts))

    if storage is not None:
        # the plan names the operator's checkpoint (see _checkpoint_location)
        partition.__name__ = plan_tag(storage.location, storage.uid)
        kind = type(fn)
        DESCRIBED[partition.__name__] = f"keyed_process of {kind.__module__}.{kind.__qualname__}"
    return df.mapInArrow(partition, out_struct)


def _initial_state_fn(
    fn: KeyedProcessFunction[Any, Any, Any],
    initial_state: DataFrame | None,
    initial_state_fn: InitialStateFn | None,
    key_cols: Sequence[str],
    df: DataFrame,
    storage: CheckpointStorage | None,
) -> InitialStateFn | None:
    """The seeding function, the options checked (None without ``initial_state``)."""
    if initial_state is None:
        if initial_state_fn is not None:
            raise ConfigurationError("initial_state_fn needs initial_state= (a DataFrame)")
        return None
    if not isinstance(initial_state, DataFrame):
        raise ConfigurationError(
            f"initial_state must be a pyspark DataFrame, got {type(initial_state).__name__}"
        )
    if initial_state.isStreaming:
        raise ConfigurationError("initial_state must be a batch DataFrame, not a streaming one")
    if storage is None:
        raise ConfigurationError(
            "initial_state needs checkpoint_location=: the seed is written there before the "
            "first micro-batch (or the batch job) reads it"
        )
    for column in key_cols:
        have = {f.name: f.dataType for f in initial_state.schema.fields}
        if column not in have:
            raise ConfigurationError(
                f"initial_state lacks the key column {column!r} (its columns: "
                f"{initial_state.columns})"
            )
        if have[column] != df.schema[column].dataType:
            raise ConfigurationError(
                f"initial_state's key column {column!r} is {have[column].simpleString()}, the "
                f"input's {df.schema[column].dataType.simpleString()}: cast it, or its keys "
                "land in other key groups"
            )
    chosen = initial_state_fn
    if chosen is None:
        chosen = getattr(fn, "handle_initial_state", None)
        if chosen is None:
            raise ConfigurationError(
                f"initial_state needs initial_state_fn=, or a handle_initial_state(key, rows, "
                f"ctx) method on {type(fn).__qualname__}"
            )
    if not callable(chosen):
        raise ConfigurationError(f"initial_state_fn must be callable, got {chosen!r}")
    return chosen


def _write_seed(
    spec: KeyedProcessSpec,
    seed_fn: InitialStateFn,
    initial_state: DataFrame,
    parts: int,
) -> None:
    """Run the Spark job that writes the seed (see ``asyncio_ops._runtime._seed``)."""
    assert spec.checkpoint is not None
    clear_seed(spec.checkpoint)
    routed, _ = partition_by_key_group(
        initial_state, spec.key, spec.options.max_parallelism, parts
    )

    def seed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from write_seed(spec, seed_fn, batches, task_info(parts))

    keys = sum(r[0] for r in routed.mapInArrow(seed, "keys long").collect())
    log.info("keyed_process uid %r: initial state of %d key(s) seeded", spec.checkpoint.uid, keys)


def _default_uid(
    fn: KeyedProcessFunction[Any, Any, Any], key_cols: Sequence[str], df: DataFrame
) -> str:
    """Stable across what restarts of one query commonly change: the function's class
    name (not its module) and the key columns with their types (not the other input
    columns)."""
    keys = [f"{c}:{df.schema[c].dataType.simpleString()}" for c in key_cols]
    parts = [type(fn).__qualname__, ",".join(keys)]
    digest = hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()
    return f"keyed-process-{digest}"


# what help() and inspect show, and the keywords a call is checked against: every option
keyed_process.__signature__ = KEYED_SIGNATURE  # type: ignore[attr-defined]
keyed_process = known_keywords()(keyed_process)
