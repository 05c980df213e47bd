from __future__ import annotations

import asyncio_ops
import asyncio_ops.async_retry_predicates
import asyncio_ops.testing


def test_public_names_are_pinned() -> None:
    assert set(asyncio_ops.__all__) == {
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
        "SIGNING_KEY_ENV",
        "Scheduler",
        "SignalsOverload",
        "SnapshotEntry",
        "StateError",
        "StateTypeError",
        "StreamElement",
        "SupportsCacheStatistics",
        "SupportsInvokeArrow",
        "SupportsOutputColumns",
        "SupportsOutputSchema",
        "SupportsPreflight",
        "SupportsInvokeChunk",
        "SupportsNullKeyCount",
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
    }
    for name in asyncio_ops.__all__:
        assert hasattr(asyncio_ops, name), name


def test_helper_modules_export_what_they_promise() -> None:
    assert set(asyncio_ops.async_retry_predicates.__all__) == {
        "empty_result_predicate",
        "exception_type_predicate",
        "has_exception_predicate",
    }
    assert asyncio_ops.testing.__all__ == ["ManualClock"]


def test_spark_names_are_pinned() -> None:
    import asyncio_ops.spark

    assert set(asyncio_ops.spark.__all__) == {
        "KEY_GROUP_COLUMN",
        "AsyncDataStream",
        "AsyncMetrics",
        "Time",
        "keyed_process",
        "library_error",
        "library_errors",
        "lookup_join",
        "ordered_wait",
        "read_state",
        "register",
        "register_table",
        "route_values",
        "session",
        "unordered_wait",
    }
    for name in asyncio_ops.spark.__all__:
        assert hasattr(asyncio_ops.spark, name), name


def test_core_never_imports_pyspark() -> None:
    import subprocess
    import sys

    code = (
        "import sys, asyncio_ops, asyncio_ops.testing, asyncio_ops.async_retry_predicates;"
        "sys.exit(1 if 'pyspark' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
