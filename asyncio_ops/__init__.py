"""asyncio_ops: Apache Flink's Async I/O for PySpark, on asyncio.

The engine-independent core lives here: stream elements, the three element
queues, the timer service, retry strategies and :class:`AsyncWaitOperator`.
The Spark DataFrame API is in :mod:`asyncio_ops.spark` (the only module that
imports pyspark), state in :mod:`asyncio_ops.state`, test helpers in
:mod:`asyncio_ops.testing`. :data:`SIGNING_KEY_ENV`, :func:`signing_key`,
:func:`mac` and :func:`verifies` are how asyncio_ops signs what it writes
(checkpoints, state blobs, a connector's shared cache entries): one key from
the environment, HMAC-SHA256.
"""

from __future__ import annotations

from ._clock import Clock, Scheduler, SystemClock
from ._elements import Record, StreamElement, Watermark
from ._engine._keyed_operator import KeyedProcessOperator
from ._engine._limit import AdaptiveLimit, CallsService, SignalsOverload
from ._engine._operator_snapshot import OperatorSnapshot, SnapshotEntry
from ._engine._queues import (
    ElementQueue,
    OrderedElementQueue,
    ResultHandle,
    UnorderedElementQueue,
    WatermarkBoundedElementQueue,
)
from ._engine._retry import AsyncRetryStrategy
from ._engine._runner import run_async_wait
from ._engine._statistics import OperatorStatistics
from ._engine._wait_operator import AsyncWaitOperator, OperatorHooks, OutputMode, RuntimeHooks
from ._exceptions import (
    AsyncOperatorError,
    AsyncOpsError,
    AsyncTimeoutError,
    CheckpointError,
    ConfigurationError,
    CorruptCheckpointError,
    CorruptStateError,
    IncompatibleStateError,
    InvalidResultError,
    KeyGroupError,
    OutputSchemaError,
    StateError,
    StateTypeError,
    UnsupportedKeyError,
    WatermarkNotSupportedError,
)
from ._functions import (
    ArrowResult,
    AsyncFunction,
    CacheCounters,
    CheckpointedFunction,
    PrefersChunks,
    PreflightContext,
    RuntimeContext,
    SupportsCacheStatistics,
    SupportsInvokeArrow,
    SupportsInvokeChunk,
    SupportsNullKeyCount,
    SupportsOutputColumns,
    SupportsOutputSchema,
    SupportsPreflight,
    SupportsRateLimitUsage,
    SupportsServiceRetries,
    SupportsTokenUsage,
)
from ._keygroups import canonical_bytes
from ._storage._signing import SIGNING_KEY_ENV, mac, signing_key, verifies
from ._timers import InternalTimerService, Timer, TimerHeap
from .state import decode_canonical

__version__ = "0.1.0"

__all__ = [
    "SIGNING_KEY_ENV",
    "AdaptiveLimit",
    "ArrowResult",
    "AsyncFunction",
    "AsyncOperatorError",
    "AsyncOpsError",
    "AsyncRetryStrategy",
    "AsyncTimeoutError",
    "AsyncWaitOperator",
    "CacheCounters",
    "CallsService",
    "CheckpointError",
    "CheckpointedFunction",
    "Clock",
    "ConfigurationError",
    "CorruptCheckpointError",
    "CorruptStateError",
    "ElementQueue",
    "IncompatibleStateError",
    "InternalTimerService",
    "InvalidResultError",
    "KeyGroupError",
    "KeyedProcessOperator",
    "OperatorHooks",
    "OperatorSnapshot",
    "OperatorStatistics",
    "OrderedElementQueue",
    "OutputMode",
    "OutputSchemaError",
    "PrefersChunks",
    "PreflightContext",
    "Record",
    "ResultHandle",
    "RuntimeContext",
    "RuntimeHooks",
    "Scheduler",
    "SignalsOverload",
    "SnapshotEntry",
    "StateError",
    "StateTypeError",
    "StreamElement",
    "SupportsCacheStatistics",
    "SupportsInvokeArrow",
    "SupportsInvokeChunk",
    "SupportsNullKeyCount",
    "SupportsOutputColumns",
    "SupportsOutputSchema",
    "SupportsPreflight",
    "SupportsRateLimitUsage",
    "SupportsServiceRetries",
    "SupportsTokenUsage",
    "SystemClock",
    "Timer",
    "TimerHeap",
    "UnorderedElementQueue",
    "UnsupportedKeyError",
    "Watermark",
    "WatermarkBoundedElementQueue",
    "WatermarkNotSupportedError",
    "__version__",
    "canonical_bytes",
    "decode_canonical",
    "mac",
    "run_async_wait",
    "signing_key",
    "verifies",
]
