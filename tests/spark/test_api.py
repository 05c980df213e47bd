"""ordered_wait / unordered_wait on a real local SparkSession."""

from __future__ import annotations

import asyncio
import os
import random
from collections import defaultdict
from typing import Any

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from asyncio_ops import (
    AsyncFunction,
    AsyncOperatorError,
    AsyncRetryStrategy,
    ConfigurationError,
    OutputSchemaError,
)
from asyncio_ops.async_retry_predicates import exception_type_predicate
from asyncio_ops.spark import AsyncMetrics, ordered_wait, unordered_wait

pytestmark = pytest.mark.spark


async def jittery(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(random.random() * 0.005)
    return [{"name": f"customer-{row['id']}", "tier": int(row["id"] % 3)}]


def test_ordered_output_equals_input_order(spark: SparkSession) -> None:
    df = spark.range(0, 3000, numPartitions=3)
    metrics = AsyncMetrics(spark)
    out = ordered_wait(
        df, jittery, timeout=10, capacity=50, output_schema="name string, tier int",
        metrics=metrics,
    )  # fmt: skip
    assert out.columns == ["id", "name", "tier"]
    rows = out.collect()
    assert [r.id for r in rows] == list(range(3000))
    assert all(r.name == f"customer-{r.id}" and r.tier == r.id % 3 for r in rows)
    summary = metrics.summary()
    assert summary["received"] == 3000 and summary["emitted"] == 3000
    assert summary["partitions"] == 3 and summary["failed"] == 0
    assert 0 < summary["max_in_flight"] <= 50 + 4 * 50  # capacity + the default output_buffer
    assert summary["latency_p99_ms"] is not None


async def flaky_jittery(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(random.random() * 0.004)
    if row["id"] % 97 == 5:
        raise LookupError(f"no customer {row['id']}")
    return [{"name": f"customer-{row['id']}", "tier": int(row["id"] % 3)}]


@pytest.mark.parametrize(
    "config",
    ["ordered", "unordered", "keyed", "event_time", "checkpointed", "error_rows"],
)
def test_the_default_output_buffer_gives_the_output_of_flinks_capacity(
    spark: SparkSession, config: str, tmp_path: Any
) -> None:
    df = spark.range(0, 1500, numPartitions=2).withColumn(
        "ts", F.timestamp_seconds(F.col("id") - (F.col("id") % 7) * 3)
    )
    wait = unordered_wait if config in ("unordered", "keyed") else ordered_wait
    opts: dict[str, Any] = {"timeout": 10, "capacity": 16, "output_schema": "name string, tier int"}
    fn: Any = jittery
    if config == "keyed":
        opts["key"] = "tier_key"
        df = df.withColumn("tier_key", F.col("id") % 11)
    elif config == "event_time":
        opts.update(event_time="ts", watermark_interval=50)
    elif config == "error_rows":
        fn = flaky_jittery
        opts["on_error"] = "error_column"

    def run(**extra: Any) -> list[Any]:
        more = dict(opts, **extra)
        if config == "checkpointed":
            more["checkpoint_location"] = str(tmp_path / ("flink" if extra else "default"))
        return [tuple(r) for r in wait(df, fn, **more).collect()]

    defaults, flinks = run(), run(output_buffer=0)
    if wait is ordered_wait:
        assert defaults == flinks  # the same rows in the same order
    else:
        assert sorted(defaults) == sorted(flinks)
    assert len(defaults) == 1500


def test_ordered_with_an_output_buffer_keeps_input_order(spark: SparkSession) -> None:
    df = spark.range(0, 3000, numPartitions=2)
    metrics = AsyncMetrics(spark)
    out = ordered_wait(
        df, jittery, timeout=10, capacity=20, output_buffer=80,
        output_schema="name string, tier int", metrics=metrics,
    )  # fmt: skip
    rows = out.collect()
    assert [r.id for r in rows] == list(range(3000))
    assert all(r.name == f"customer-{r.id}" for r in rows)
    assert 0 < metrics.summary()["max_in_flight"] <= 100  # queue: capacity + output_buffer
    with pytest.raises(ConfigurationError, match="output_buffer must be an int >= 0"):
        ordered_wait(df, jittery, timeout=1, output_buffer=-1, output_schema="name string")


def test_unordered_loses_and_duplicates_nothing(spark: SparkSession) -> None:
    df = spark.range(0, 3000, numPartitions=2)
    out = unordered_wait(
        df, jittery, timeout=10, capacity=64, output_schema="name string, tier int"
    )
    ids = [r.id for r in out.collect()]
    assert sorted(ids) == list(range(3000))
    assert ids != sorted(ids)  # completion order really differs from input order


def test_fan_out_and_drop(spark: SparkSession) -> None:
    async def explode(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{"copy": i} for i in range(row["id"] % 3)]

    rows = ordered_wait(
        spark.range(0, 30, numPartitions=2), explode, timeout=5, output_schema="copy int"
    ).collect()
    assert [(r.id, r.copy) for r in rows] == [(i, c) for i in range(30) for c in range(i % 3)]


def test_without_input_columns(spark: SparkSession) -> None:
    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"double": row["id"] * 2}]

    out = ordered_wait(
        spark.range(5), f, timeout=5, output_schema="double long", keep_input_columns=False
    )
    assert [tuple(r) for r in out.collect()] == [(0,), (2,), (4,), (6,), (8,)]


def test_result_with_an_undeclared_column_names_it_and_the_row(spark: SparkSession) -> None:
    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": "x", "surprise": 1}]

    out = ordered_wait(spark.range(3, numPartitions=1), f, timeout=5, output_schema="name string")
    with pytest.raises(OutputSchemaError) as info:
        out.collect()
    text = str(info.value)
    assert "surprise" in text and "'id': 0" in text
    assert isinstance(info.value.__cause__, PythonException)


def test_value_that_does_not_fit_names_column_value_and_row(spark: SparkSession) -> None:
    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"tier": "gold" if row["id"] == 7 else 1}]

    out = ordered_wait(spark.range(10), f, timeout=5, output_schema="tier int")
    with pytest.raises(OutputSchemaError) as info:
        out.collect()
    text = str(info.value)
    assert "'tier'" in text and "'gold'" in text and "'id': 7" in text


def test_error_column_keeps_failed_and_timed_out_rows(spark: SparkSession) -> None:
    class Flaky(AsyncFunction[dict[str, Any], dict[str, Any]]):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            if row["id"] % 10 == 3:
                raise LookupError(f"no customer {row['id']}")
            if row["id"] % 10 == 7:
                await asyncio.sleep(30)  # times out
            return [{"name": f"c{row['id']}"}]

    out = unordered_wait(
        spark.range(0, 40, numPartitions=2), Flaky(), timeout=2.0, capacity=50,
        output_schema="name string", on_error="error_column",
    )  # fmt: skip
    rows = {r.id: r for r in out.collect()}
    assert sorted(rows) == list(range(40))
    for i, r in rows.items():
        if i % 10 == 3:
            assert r.name is None
            assert r._error.exception == "AsyncOperatorError" or r._error.exception == "LookupError"
            assert f"no customer {i}" in r._error.message and r._error.attempts == 1
        elif i % 10 == 7:
            assert r.name is None and r._error.exception == "AsyncTimeoutError"
        else:
            assert r.name == f"c{i}" and r._error is None


def test_failure_fails_the_job_with_the_input_named(spark: SparkSession) -> None:
    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        if row["id"] == 5:
            raise ConnectionRefusedError("lookup service down")
        return [{"name": "ok"}]

    out = ordered_wait(spark.range(10), f, timeout=5, output_schema="name string")
    with pytest.raises(AsyncOperatorError) as info:
        out.collect()
    text = str(info.value)
    assert "'id': 5" in text and "ConnectionRefusedError: lookup service down" in text


def test_retry_recovers_transient_errors(spark: SparkSession) -> None:
    class Transient(AsyncFunction[dict[str, Any], dict[str, Any]]):
        def open(self, runtime_context: Any) -> None:
            self.seen: set[int] = set()

        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            await asyncio.sleep(0)
            if row["id"] % 4 == 0 and row["id"] not in self.seen:
                self.seen.add(row["id"])
                raise ConnectionResetError("reset by peer")
            return [{"ok": True}]

    retry = AsyncRetryStrategy.fixed_delay(
        3, 10, exception_predicate=exception_type_predicate(ConnectionError)
    )
    metrics = AsyncMetrics(spark)
    out = ordered_wait(
        spark.range(0, 200, numPartitions=2), Transient(), timeout=5, output_schema="ok boolean",
        retry=retry, metrics=metrics,
    )  # fmt: skip
    assert [r.id for r in out.collect()] == list(range(200))
    assert metrics.summary()["retried"] == 50


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"on_error": "ignore"}, "on_error"),
        ({"key": "nope"}, "key column"),
        ({"event_time": "nope"}, "event_time column"),
        ({"event_time": "name"}, "timestamp, date or numeric"),
        ({"output_schema": "id long"}, "already exist"),
        ({"output_schema": "not a schema ("}, "DDL"),
        ({"output_schema": "_error string"}, "reserved"),
        ({"watermark_delay": 5}, "event_time"),
        ({"late_records": "hide"}, "late_records"),
        ({"state_backend": "lmdb"}, r"state_backend.*'lmdb'"),
        ({"max_parallelism": 0}, "max_parallelism"),
    ],
)
def test_options_are_validated_on_the_driver(
    spark: SparkSession, kwargs: dict[str, Any], match: str
) -> None:
    df = spark.range(3).withColumn("name", F.lit("x"))
    options: dict[str, Any] = {"timeout": 1, "output_schema": "out string"}
    options.update(kwargs)
    with pytest.raises(ConfigurationError, match=match):
        ordered_wait(df, jittery, **options)


def test_keyed_mode_keeps_per_key_order_and_key_group_ranges(spark: SparkSession) -> None:
    n, keys, parts, maxp = 6000, 1000, 3, 128
    df = spark.range(0, n, numPartitions=2).select(
        (F.col("id") % keys).alias("customer"), F.col("id").alias("seq")
    )

    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(random.random() * 0.004)
        return [{"seen": row["seq"]}]

    out = unordered_wait(
        df, f, timeout=10, capacity=100, output_schema="seen long", key="customer",
        num_partitions=parts, max_parallelism=maxp,
    ).withColumn("pid", F.spark_partition_id()).withColumn(
        "kg", F.pmod(F.hash("customer"), F.lit(maxp))
    )  # fmt: skip
    rows = out.collect()
    assert sorted(r.seq for r in rows) == list(range(n))
    by_key: dict[int, list[int]] = defaultdict(list)
    for r in rows:
        by_key[r.customer].append(r.seq)
        assert r.kg * parts // maxp == r.pid  # the partition owns the key group
    assert len(by_key) == keys
    for seqs in by_key.values():
        assert seqs == sorted(seqs)  # per-key input order, even unordered
    assert "__aops_key_group" not in out.columns


def test_watermark_bounded_order_on_event_time(spark: SparkSession) -> None:
    df = spark.range(0, 400, numPartitions=1).select(
        F.col("id"), F.timestamp_seconds(F.col("id")).alias("ts")
    )

    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(random.random() * 0.004)
        return [{"v": row["id"]}]

    out = unordered_wait(
        df, f, timeout=10, capacity=40, output_schema="v long", event_time="ts",
        watermark_delay=0, watermark_interval=10,
    )  # fmt: skip
    rows = out.collect()
    ids = [r.id for r in rows]
    assert sorted(ids) == list(range(400))
    blocks = [i // 10 for i in ids]
    assert blocks == sorted(blocks)  # no row crosses a watermark
    assert ids != sorted(ids)  # but within a block: completion order
    assert not any(r._late for r in rows)


def test_late_records_are_flagged_or_dropped(spark: SparkSession) -> None:
    times = [10, 11, 12, 13, 2, 14, 15, 3, 16]
    df = spark.createDataFrame([(i, float(t)) for i, t in enumerate(times)], "id long, t double")

    async def f(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"v": 1}]

    opts: dict[str, Any] = {
        "timeout": 5, "output_schema": "v int", "event_time": "t", "watermark_delay": 1.0,
        "watermark_interval": 1,
    }  # fmt: skip
    kept = ordered_wait(df.coalesce(1), f, **opts).collect()
    assert [r.id for r in kept if r._late] == [4, 7]
    assert len(kept) == len(times)
    metrics = AsyncMetrics(spark)
    dropped = ordered_wait(df.coalesce(1), f, late_records="drop", metrics=metrics, **opts)
    assert [r.id for r in dropped.collect()] == [0, 1, 2, 3, 5, 6, 8]
    assert metrics.summary()["dropped_late"] == 2


def test_worker_killed_on_first_attempt_job_still_exact(spark: SparkSession) -> None:
    class Killer(AsyncFunction[dict[str, Any], dict[str, Any]]):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            first_attempt = ctx is not None and ctx.attemptNumber() == 0
            if first_attempt and row["id"] == 1500:
                os._exit(17)  # the Python worker dies mid-partition
            await asyncio.sleep(0)
            return [{"ok": row["id"] * 2}]

    out = ordered_wait(
        spark.range(0, 2000, numPartitions=2), Killer(), timeout=5, output_schema="ok long"
    )
    rows = out.collect()
    assert [(r.id, r.ok) for r in rows] == [(i, i * 2) for i in range(2000)]


def test_a_partly_consumed_partition_stops_cleanly(spark: SparkSession) -> None:
    async def slowish(row: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(0.01)
        return [{"name": str(row["id"])}]

    out = ordered_wait(
        spark.range(0, 200_000, numPartitions=1), slowish, timeout=5, capacity=64,
        output_schema="name string", batch_size=100,
    )  # fmt: skip
    rows = out.limit(3).collect()
    assert [r.id for r in rows] == [0, 1, 2]
    # the worker closed its operator (in-flight lookups cancelled): the next job runs
    assert (
        ordered_wait(
            spark.range(5, numPartitions=1), slowish, timeout=5, output_schema="name string"
        ).count()
        == 5
    )


async def as_tuples_and_rows(row: dict[str, Any]) -> list[Any]:
    from pyspark.sql import Row

    i = row["id"]
    # a tuple by position, a Row by name (fields in another order), a Row by position
    return [(i * 10, "t"), Row(tag="r", out=i * 20), Row(i * 30, "p")]


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpointed"])
def test_results_may_be_rows_or_tuples(
    spark: SparkSession, tmp_path: Any, checkpoint: bool
) -> None:
    opts: dict[str, Any] = {"checkpoint_location": str(tmp_path)} if checkpoint else {}
    out = ordered_wait(spark.range(4, numPartitions=2), as_tuples_and_rows, timeout=10,
                       output_schema="out long, tag string", **opts)  # fmt: skip
    got = sorted((r.id, r.out, r.tag) for r in out.collect())
    assert got == sorted(
        (i, v, t) for i in range(4) for v, t in ((i * 10, "t"), (i * 20, "r"), (i * 30, "p"))
    )


async def too_short(row: dict[str, Any]) -> list[Any]:
    return [(1,)]


def test_a_tuple_of_the_wrong_length_names_the_columns_and_the_row(spark: SparkSession) -> None:
    out = ordered_wait(spark.range(1), too_short, timeout=10, output_schema="out long, tag string")
    with pytest.raises(Exception, match=r"a result tuple has 1 value\(s\) for the 2 output"):
        out.collect()


@pytest.mark.parametrize("where", ["ordered_wait", "unordered_wait", "keyed_process", "datastream"])
def test_a_misspelled_option_is_named_with_the_option_meant(
    spark: SparkSession, where: str
) -> None:
    """Not Python's bare TypeError: a ConfigurationError naming the keyword, its value and
    the closest real option; nothing runs (no Spark job)."""
    from asyncio_ops.spark import AsyncDataStream, keyed_process

    df = spark.range(0, 3)
    if where == "keyed_process":
        call: Any = lambda: keyed_process(  # noqa: E731
            df,
            object(),
            key="id",
            output_schema="n long",
            watermark_dleay=5,  # type: ignore[call-arg, arg-type]
        )
        typo, meant = "watermark_dleay", "watermark_delay"
    elif where == "datastream":
        call = lambda: AsyncDataStream.unordered_wait(  # noqa: E731
            df, jittery, 5, 10, "name string", on_emtpy="keep"
        )
        typo, meant = "on_emtpy", "on_empty"
    else:
        wait = ordered_wait if where == "ordered_wait" else unordered_wait
        call = lambda: wait(  # noqa: E731
            df,
            jittery,
            timeout=5,
            output_schema="name string",
            on_emtpy="keep",  # type: ignore[call-arg]
        )
        typo, meant = "on_emtpy", "on_empty"
    with pytest.raises(ConfigurationError) as info:
        call()
    message = str(info.value)
    assert f"has no option {typo!r}" in message, message
    assert f"did you mean {meant!r}" in message, message
    value = "5" if where == "keyed_process" else "'keep'"
    assert f"(given {typo}={value})" in message, message


def test_an_option_nothing_resembles_lists_the_options(spark: SparkSession) -> None:
    with pytest.raises(ConfigurationError, match=r"no option 'zzz'.*its options are .*on_empty"):
        ordered_wait(spark.range(1), jittery, timeout=5, output_schema="name string", zzz=1)  # type: ignore[call-arg]
