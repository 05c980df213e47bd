"""The partition runtime: Arrow batches in, the operator on an event loop, Arrow batches out.

This layer knows pyarrow but not pyspark: the Spark layer gives
:func:`run_partition` an iterator of ``pyarrow.RecordBatch`` and a
:class:`TaskInfo`, and consumes the iterator it returns (the shape of
``DataFrame.mapInArrow``). One job per module:

- ``_options``: every option of the operators over partitions, once, with its default;
- ``_spec``: what the driver sends (:class:`PartitionSpec`) and what a task is (:class:`TaskInfo`);
- ``_worker``: the worker process (one event loop, the opened functions);
- ``_adapters``: the user's function as the operator sees it (rows, chunks, Arrow);
- ``_feed``: rows into operator elements, event time and watermarks, replay;
- ``_sink``: output rows and batches into Arrow batches of the output schema;
- ``_versions``: one streaming version's files (key-group chains, manifests);
- ``_retention``: which versions partition 0 deletes once it has written one;
- ``_leases``: what keeps the versions a reader reads from retention;
- ``_claim``: whose state a version is (the query that wrote it, the uid that claims it);
- ``_replay_log``: the lookups a task attempt completed, for its retry;
- ``_partition_checkpoint``: what a partition of the async operator writes and restores;
- ``_inflight``: what a micro-batch carries over, where, and how it moves on rescale;
- ``_stored``: a carried-over element as stored (Arrow schema, queue entries <-> elements);
- ``_warm``: the keyed state a worker keeps between micro-batches;
- ``_metrics``: counters per partition, merged on the driver;
- ``_partition``: the glue, :func:`run_partition`;
- ``_keyed_partition``: a ``KeyedProcessFunction`` over a partition (``keyed_process``);
- ``_seed``: initial state written before a ``keyed_process`` job's first version;
- ``_declared``: the states a ``KeyedProcessFunction`` declares (its ``open``, run once);
- ``_state_reader``: what ``read_state`` reads from a checkpoint (rows, no Spark).

The Spark layer imports what this face exports, not the modules behind it, nor
the state layer's private modules: what it needs of those (the state types a
manifest records and their check) comes through here too.
"""

from __future__ import annotations

from ..state._schema import StateTypes, check_restore, types_of_json
from ._declared import declared_states
from ._keyed_partition import (
    KEY_SCHEMA,
    STATE_TYPES,
    carried_types,
    required_watermark,
    run_keyed_process,
)
from ._keyed_partition import OPERATOR as KEYED_PROCESS
from ._leases import hold_versions, lease_noted
from ._metrics import RunMetrics
from ._options import (
    CHUNK_AUTO,
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FLUSH_ROWS,
    ON_EMPTY,
    STATE_BACKENDS,
    KeyedOptions,
    PartitionOptions,
    WaitOptions,
)
from ._partition import run_partition
from ._partition_checkpoint import (
    CarriedFormat,
    carried_elements,
    carried_format,
    version_watermarks,
)
from ._replay_log import read_segment, segment_of
from ._seed import InitialStateFn, clear_seed, write_seed
from ._spec import (
    ERROR_COLUMN,
    ERROR_TYPE,
    KEY_GROUP_COLUMN,
    LATE_COLUMN,
    KeyedProcessSpec,
    PartitionSpec,
    TaskInfo,
)
from ._state_reader import (
    all_chains,
    micros,
    named_version,
    open_run,
    open_version,
    recorded_key_schema,
    state_rows,
)
from ._stored import ROW
from ._versions import ASYNC_WAIT, Chain, VersionFiles, chain_manifests, read_version
from ._worker import MAX_OPEN_FUNCTIONS, WorkerRuntime

__all__ = [
    "ASYNC_WAIT",
    "CHUNK_AUTO",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_FLUSH_ROWS",
    "ERROR_COLUMN",
    "ERROR_TYPE",
    "KEYED_PROCESS",
    "KEY_GROUP_COLUMN",
    "KEY_SCHEMA",
    "LATE_COLUMN",
    "MAX_OPEN_FUNCTIONS",
    "ON_EMPTY",
    "ROW",
    "STATE_BACKENDS",
    "STATE_TYPES",
    "CarriedFormat",
    "Chain",
    "InitialStateFn",
    "KeyedOptions",
    "KeyedProcessSpec",
    "PartitionOptions",
    "PartitionSpec",
    "RunMetrics",
    "StateTypes",
    "TaskInfo",
    "VersionFiles",
    "WaitOptions",
    "WorkerRuntime",
    "all_chains",
    "carried_elements",
    "carried_format",
    "carried_types",
    "chain_manifests",
    "check_restore",
    "clear_seed",
    "declared_states",
    "hold_versions",
    "lease_noted",
    "micros",
    "named_version",
    "open_run",
    "open_version",
    "read_segment",
    "read_version",
    "recorded_key_schema",
    "required_watermark",
    "run_keyed_process",
    "run_partition",
    "segment_of",
    "state_rows",
    "types_of_json",
    "version_watermarks",
    "write_seed",
]
