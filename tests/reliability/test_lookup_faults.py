"""Faults of the lookup itself: raises, hangs, wrong results, answers too late.

What must hold (docs/guarantees.md): with retry every row is emitted exactly
once; without retry the job fails fast with the original error and the input
named; with ``on_error="error_column"`` every failed row is present with its
error; and nothing hangs: each case ends within its timeout plus a small bound.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession

from asyncio_ops import (
    AsyncFunction,
    AsyncOperatorError,
    AsyncRetryStrategy,
    AsyncTimeoutError,
    InvalidResultError,
    OutputMode,
    Record,
    run_async_wait,
)
from asyncio_ops.async_retry_predicates import exception_type_predicate
from asyncio_ops.spark import AsyncMetrics, unordered_wait


class TransientError(ConnectionError):
    pass


class Faulty(AsyncFunction[Any, Any]):
    """A lookup with injected faults, chosen per (value, attempt) by a seeded RNG."""

    def __init__(self, transient: float = 0.0, seed: int = 7) -> None:
        self.transient = transient
        self.seed = seed
        self.attempts: Counter[Any] = Counter()

    async def async_invoke(self, value: Any) -> list[Any]:
        self.attempts[value] += 1
        rng = random.Random(hash((self.seed, value, self.attempts[value])))
        await asyncio.sleep(rng.random() * 0.002)
        if rng.random() < self.transient:
            raise TransientError(f"transient failure for {value!r}")
        return [value]


RETRY = AsyncRetryStrategy.fixed_delay(
    20, 1, exception_predicate=exception_type_predicate(TransientError)
)


@pytest.mark.parametrize("mode", list(OutputMode))
def test_transient_failures_with_retry_emit_every_row_exactly_once(mode: OutputMode) -> None:
    fn = Faulty(transient=0.3)
    out = asyncio.run(
        run_async_wait(fn, range(2000), timeout=10, capacity=64, mode=mode, retry=RETRY)
    )
    assert Counter(r.value for r in out if isinstance(r, Record)) == Counter(range(2000))
    assert sum(fn.attempts.values()) > 2000  # faults were really injected


def test_permanent_failure_without_retry_fails_fast_naming_the_input() -> None:
    class Permanent(Faulty):
        async def async_invoke(self, value: Any) -> list[Any]:
            self.attempts[value] += 1
            await asyncio.sleep(0.001)
            if value == 137:
                raise PermissionError("denied for customer 137")
            return [value]

    fn = Permanent()
    with pytest.raises(AsyncOperatorError) as info:
        asyncio.run(run_async_wait(fn, range(10_000), timeout=10, capacity=32))
    # fails at row 137, not after the input: at most capacity requests beyond it were made
    assert sum(fn.attempts.values()) <= 137 + 1 + 32
    assert "137" in str(info.value) and isinstance(info.value.__cause__, PermissionError)


@pytest.mark.parametrize("bad", [None, "a string", 3.5, {"k": 1}])
def test_none_or_wrong_type_fails_naming_the_input(bad: Any) -> None:
    async def wrong(value: Any) -> Any:
        await asyncio.sleep(0)
        return bad if value == 3 else [value]

    with pytest.raises(AsyncOperatorError, match=r"input 3\b") as info:
        asyncio.run(run_async_wait(wrong, range(10), timeout=5))
    assert isinstance(info.value.__cause__, InvalidResultError)


def test_a_hanging_lookup_ends_within_its_timeout() -> None:
    async def hangs(value: Any) -> list[Any]:
        if value == 5:
            await asyncio.Event().wait()  # never set
        return [value]

    started = time.monotonic()
    with pytest.raises(AsyncTimeoutError, match="5"):
        asyncio.run(run_async_wait(hangs, range(10), timeout=0.5))
    assert time.monotonic() - started < 0.5 + 10  # its timeout, not a hang (loaded-machine margin)


def test_a_result_after_the_timeout_is_dropped_not_duplicated() -> None:
    class LateThenFallback(AsyncFunction[int, int]):
        async def async_invoke(self, value: int) -> list[int]:
            try:
                await asyncio.sleep(0.3 if value % 2 else 0)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # a client that answers anyway, late
                return [value]
            return [value]

        def timeout(self, value: int) -> list[int]:
            return [-value]

    out = asyncio.run(
        run_async_wait(LateThenFallback(), range(20), timeout=0.1, mode=OutputMode.UNORDERED)
    )
    values = [r.value for r in out if isinstance(r, Record)]
    assert sorted(values) == sorted(v if v % 2 == 0 else -v for v in range(20))


# -- the same faults through Spark ------------------------------------------------------------
class MixedFaults(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Row i: i%10==1 raises, ==2 hangs, ==3 returns None, ==4 returns a str, else answers."""

    async def async_invoke(self, row: dict[str, Any]) -> Any:
        i = row["id"]
        kind = i % 10
        if kind == 1:
            raise LookupError(f"no such customer {i}")
        if kind == 2:
            await asyncio.sleep(3600)
        if kind == 3:
            return None
        if kind == 4:
            return "not a list"
        await asyncio.sleep(0.001)
        return [{"v": i}]


@pytest.mark.spark
def test_error_column_keeps_every_failed_row_with_its_error(spark: SparkSession) -> None:
    metrics = AsyncMetrics(spark)
    started = time.monotonic()
    rows = unordered_wait(
        spark.range(0, 200, numPartitions=2), MixedFaults(), timeout=2.0, capacity=100,
        output_schema="v long", on_error="error_column", metrics=metrics,
    ).collect()  # fmt: skip
    assert time.monotonic() - started < 30
    assert Counter(r.id for r in rows) == Counter(range(200))
    expected = {1: "LookupError", 2: "AsyncTimeoutError", 3: "InvalidResultError",
                4: "InvalidResultError"}  # fmt: skip
    for r in rows:
        want = expected.get(r.id % 10)
        if want is None:
            assert r.v == r.id and r._error is None
        else:
            assert r.v is None and r._error is not None, r
            assert want in (r._error.exception, r._error.message), r._error
    assert metrics.summary()["error_rows"] == 80


@pytest.mark.spark
def test_transient_failures_through_spark_with_retry_exactly_once(spark: SparkSession) -> None:
    class Flaky(AsyncFunction[dict[str, Any], dict[str, Any]]):
        def open(self, runtime_context: Any) -> None:
            self.inner = Faulty(transient=0.2)

        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            (value,) = await self.inner.async_invoke(row["id"])
            return [{"v": value}]

    rows = unordered_wait(
        spark.range(0, 5000, numPartitions=2), Flaky(), timeout=10, capacity=64,
        output_schema="v long", retry=RETRY,
    ).collect()  # fmt: skip
    assert Counter(r.v for r in rows) == Counter(range(5000))


@pytest.mark.spark
def test_without_retry_the_job_fails_with_the_original_error_and_row(
    spark: SparkSession,
) -> None:
    class Once(AsyncFunction[dict[str, Any], dict[str, Any]]):
        async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            if row["id"] == 42:
                raise TransientError("connection reset while looking up 42")
            return [{"v": row["id"]}]

    started = time.monotonic()
    with pytest.raises(AsyncOperatorError) as info:
        unordered_wait(
            spark.range(0, 100, numPartitions=1), Once(), timeout=5, output_schema="v long"
        ).collect()
    assert str(info.value) == (
        "async lookup failed for input {'id': 42} after 1 operator attempt(s): "
        "TransientError: connection reset while looking up 42"
    )
    assert isinstance(info.value.__cause__, PythonException)
    assert time.monotonic() - started < 60
