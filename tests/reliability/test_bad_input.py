"""Bad input gets a clear error naming the row, column, option or path, before or
during the job; never a crash without context, never a silently dropped row."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops import AsyncOperatorError, AsyncWaitOperator, ConfigurationError
from asyncio_ops.spark import ordered_wait, unordered_wait

pytestmark = pytest.mark.spark


async def echo(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0)
    return [{"seen": str(row.get("customer"))}]


def test_null_keys_are_a_key_like_any_other(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [(i, None if i % 3 == 0 else i % 5) for i in range(60)], "id long, customer long"
    )
    rows = unordered_wait(
        df, echo, timeout=5, output_schema="seen string", key="customer", num_partitions=2
    ).collect()
    assert Counter(r.id for r in rows) == Counter(range(60))
    nulls = [r.id for r in rows if r.customer is None]
    assert nulls == sorted(nulls)  # the null key keeps its order too


@pytest.mark.parametrize(
    ("expr", "kind"),
    [("array(id, id)", "array<bigint>"), ("map('k', id)", "map<string,bigint>"),
     ("named_struct('a', id)", "struct<a:bigint>")],
)  # fmt: skip
def test_key_of_an_unsupported_type_is_named(spark: SparkSession, expr: str, kind: str) -> None:
    df = spark.range(3).withColumn("k", F.expr(expr))
    with pytest.raises(ConfigurationError, match=rf"key column 'k' has type {kind}"):
        ordered_wait(df, echo, timeout=1, output_schema="seen string", key="k")


def test_rows_without_the_field_the_function_expects(spark: SparkSession) -> None:
    async def needs_email(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"seen": row["email"]}]

    df = spark.range(5).withColumn("customer", F.col("id"))
    rows = ordered_wait(
        df, needs_email, timeout=5, output_schema="seen string", on_error="error_column"
    ).collect()
    assert [r.id for r in rows] == list(range(5))
    assert all(r._error.exception == "KeyError" and "email" in r._error.message for r in rows)
    with pytest.raises(AsyncOperatorError, match=r"KeyError: 'email'") as info:
        ordered_wait(df, needs_email, timeout=5, output_schema="seen string").collect()
    assert isinstance(info.value.__cause__, PythonException)  # Spark's, with the trace


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"capacity": 0}, "capacity"), ({"capacity": -4}, "capacity"),
     ({"timeout": 0}, "timeout"), ({"timeout": -0.5}, "timeout"),
     ({"on_error": "skip"}, "on_error"), ({"batch_size": 0}, "batch_size"),
     ({"drain_timeout": 1}, "checkpoint_location"),
     ({"output_schema": "v long, v long"}, r"declares the column 'v' twice"),
     ({"output_schema": "v long, V string"}, r"declares the column 'V' twice \(as 'v'\)"),
     ({"output_schema": ""}, "output_schema declares no columns"),
     ({"output_schema": "ID long"}, r"\['ID'\] already exist in the input"),
     ({"event_time": "id", "watermark_delay": float("nan")}, "watermark_delay must be")],
)  # fmt: skip
def test_bad_options_are_named_before_any_job(
    spark: SparkSession, kwargs: dict[str, Any], match: str
) -> None:
    options: dict[str, Any] = {"timeout": 1, "output_schema": "seen string"}
    options.update(kwargs)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    with pytest.raises(ConfigurationError, match=match):
        ordered_wait(spark.range(3), echo, **options)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs_before


def test_operator_options_are_named() -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        AsyncWaitOperator(echo, output=print, timeout=1, capacity=0)
    with pytest.raises(ConfigurationError, match="timeout"):
        AsyncWaitOperator(echo, output=print, timeout=float("nan"))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_non_serialisable_state_value_names_the_state(backend: str, tmp_path: Any) -> None:
    import threading

    from asyncio_ops.state import (
        HeapKeyedStateBackend,
        KeyGroupRange,
        RocksDBKeyedStateBackend,
        StateError,
        ValueStateDescriptor,
    )

    kgr = KeyGroupRange(0, 7)
    b = (
        HeapKeyedStateBackend(max_parallelism=8, key_group_range=kgr)
        if backend == "heap"
        else RocksDBKeyedStateBackend(path=str(tmp_path / "db"), max_parallelism=8,
                                      key_group_range=kgr)
    )  # fmt: skip
    try:
        b.set_current_key("customer-1")
        state = b.get_state(ValueStateDescriptor("last_seen"))
        with pytest.raises(StateError, match=r"state 'last_seen'.*_thread\.lock"):
            state.update(threading.Lock())  # RocksDB serialises on write
            b.snapshot()  # the heap serialises on snapshot
    finally:
        b.close()
