"""The partition runtime: Arrow batches in, the operator on an event loop, Arrow batches out.

This layer knows pyarrow but not pyspark: the Spark layer gives
:func:`run_partition` an iterator of ``pyarrow.RecordBatch`` and a
:class:`TaskInfo`, and consumes the iterator it returns (the shape of
``DataFrame.mapInArrow``). One job per module:

- ``_spec``: what the driver sends (:class:`PartitionSpec`) and what a task is (:class:`TaskInfo`);
- ``_worker``: the worker process (one event loop, the opened functions);
- ``_adapters``: the user's function as the operator sees it (rows, chunks, Arrow);
- ``_feed``: rows into operator elements, event time and watermarks, replay;
- ``_sink``: output rows and batches into Arrow batches of the output schema;
- ``_versions``: one streaming version's files (key-group chains, manifests) and retention;
- ``_replay_log``: the lookups a task attempt completed, for its retry;
- ``_checkpointing``: what a partition of the async operator writes and restores;
- ``_inflight``: what a micro-batch carries over, as keyed and operator state;
- ``_warm``: the keyed state a worker keeps between micro-batches;
- ``_metrics``: counters per partition, merged on the driver;
- ``_partition``: the glue, :func:`run_partition`;
- ``_keyed_partition``: a ``KeyedProcessFunction`` over a partition (``keyed_process``);
- ``_seed``: initial state written before a ``keyed_process`` job's first version.

The Spark layer imports what this face exports, not the modules behind it.
"""

from __future__ import annotations

from ._keyed_partition import run_keyed_process
from ._metrics import RunMetrics
from ._partition import run_partition
from ._seed import InitialStateFn, clear_seed, write_seed
from ._spec import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FLUSH_ROWS,
    ERROR_COLUMN,
    ERROR_TYPE,
    KEY_GROUP_COLUMN,
    LATE_COLUMN,
    STATE_BACKENDS,
    KeyedProcessSpec,
    PartitionSpec,
    TaskInfo,
)
from ._versions import read_version
from ._worker import MAX_OPEN_FUNCTIONS, WorkerRuntime

__all__ = [
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_FLUSH_ROWS",
    "ERROR_COLUMN",
    "ERROR_TYPE",
    "KEY_GROUP_COLUMN",
    "LATE_COLUMN",
    "MAX_OPEN_FUNCTIONS",
    "STATE_BACKENDS",
    "InitialStateFn",
    "KeyedProcessSpec",
    "PartitionSpec",
    "RunMetrics",
    "TaskInfo",
    "WorkerRuntime",
    "clear_seed",
    "read_version",
    "run_keyed_process",
    "run_partition",
    "write_seed",
]
