"""The pooled operator (the runtime's plain case) against the reference operator.

Every scenario runs through ``run_partition`` twice, with ``PartitionSpec.pool``
on (``PooledWaitOperator``) and off (``AsyncWaitOperator``), and the output,
the errors and the counters must be the same.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops import (
    AsyncFunction,
    AsyncOperatorError,
    AsyncRetryStrategy,
    OutputMode,
)
from asyncio_ops._pool import PooledWaitOperator
from asyncio_ops._runtime import (
    ERROR_COLUMN,
    ERROR_TYPE,
    PartitionSpec,
    RunMetrics,
    TaskInfo,
    run_partition,
)
from asyncio_ops.async_retry_predicates import empty_result_predicate, has_exception_predicate


class Probe(AsyncFunction[Any, Any]):
    """``behave(i)`` per row id; records calls and the largest number in flight at once."""

    def __init__(self, behave: Any) -> None:
        self.behave = behave
        self.calls: list[int] = []
        self.now = 0
        self.peak = 0

    async def async_invoke(self, row: dict[str, Any]) -> Any:
        i = row["id"]
        self.calls.append(i)
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.behave(i)
        finally:
            self.now -= 1


def spec(fn: AsyncFunction[Any, Any], pool: bool, **kw: Any) -> PartitionSpec:
    fields = [pa.field("id", pa.int64()), pa.field("out", pa.int64())]
    if kw.get("on_error") == "error_column":
        fields.append(pa.field(ERROR_COLUMN, ERROR_TYPE))
    defaults: dict[str, Any] = {
        "function": fn,
        "function_token": uuid.uuid4().hex,
        "mode": OutputMode.ORDERED,
        "timeout": 5.0,
        "capacity": 8,
        "retry": None,
        "output_schema": pa.schema(fields),
        "added_columns": ("out",),
        "batch_size": 40,
        "pool": pool,
    }
    defaults.update(kw)
    return PartitionSpec(**defaults)


def run(s: PartitionSpec, n: int) -> tuple[list[dict[str, Any]], RunMetrics]:
    batches = [
        pa.RecordBatch.from_pydict({"id": pa.array(range(a, min(n, a + 25)), pa.int64())})
        for a in range(0, n, 25)
    ]
    done: list[RunMetrics] = []
    out = list(run_partition(s, iter(batches), TaskInfo(), on_done=done.append))
    return [r for b in out for r in b.to_pylist()], done[0]


def both(make_fn: Any, n: int, **kw: Any) -> list[tuple[list[dict[str, Any]], RunMetrics, Any]]:
    results = []
    for pool in (True, False):
        fn = make_fn()
        rows, metrics = run(spec(fn, pool, **kw), n)
        results.append((rows, metrics, fn))
    return results


def counters(m: RunMetrics) -> tuple[int, ...]:
    return (m.received, m.emitted, m.completed, m.timed_out, m.retried, m.failed, m.error_rows)


def jitter(seed: int, scale: float = 0.003) -> Any:
    rng = random.Random(seed)

    async def behave(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(rng.random() * scale)
        return [{"out": i * 2}]

    return behave


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_same_rows_and_counters_with_random_latencies(mode: OutputMode) -> None:
    (pooled, pm, pfn), (reference, rm, _) = both(lambda: Probe(jitter(5)), 300, mode=mode)
    if mode is OutputMode.ORDERED:
        assert pooled == reference == [{"id": i, "out": 2 * i} for i in range(300)]
    else:
        assert sorted(r["id"] for r in pooled) == sorted(r["id"] for r in reference)
        assert sorted(r["id"] for r in pooled) == list(range(300))
    assert counters(pm) == counters(rm) == (300, 300, 300, 0, 0, 0, 0)
    assert 1 < pfn.peak <= 8 and pm.latency.count > 0


def test_ordered_capacity_bounds_what_waits_behind_a_slow_head() -> None:
    async def slow_head(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.2 if i % 50 == 0 else 0.001)
        return [{"out": i}]

    for buffer in (0, 30):
        fn = Probe(slow_head)
        rows, _ = run(spec(fn, True, capacity=8, output_buffer=buffer), 100)
        assert [r["id"] for r in rows] == list(range(100))
        # while row 0 (and 50) is slow, at most capacity + output_buffer rows were started
        assert fn.calls.index(50) <= 8 + buffer + 50


def test_fan_out_drop_and_bad_results_match() -> None:
    async def shaped(i: int) -> Any:
        await asyncio.sleep(0)
        return [{"out": i}, {"out": -i}] if i % 3 == 0 else ([] if i % 3 == 1 else [{"out": i}])

    (pooled, pm, _), (reference, rm, _) = both(lambda: Probe(shaped), 60)
    assert pooled == reference and len(pooled) == 20 * 2 + 20
    assert counters(pm) == counters(rm)

    async def not_a_list(i: int) -> Any:
        await asyncio.sleep(0)
        return {"out": i} if i == 7 else [{"out": i}]

    messages = []
    for pool in (True, False):
        with pytest.raises(AsyncOperatorError) as info:
            run(spec(Probe(not_a_list), pool), 20)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "async_invoke must return a list of results" in messages[0]


def test_timeouts_become_error_rows_or_fail_alike() -> None:
    async def hangs(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(3600 if i in (3, 11) else 0.001)
        return [{"out": i}]

    (pooled, pm, _), (reference, rm, _) = both(
        lambda: Probe(hangs), 20, timeout=0.1, on_error="error_column"
    )
    assert [r["id"] for r in pooled] == [r["id"] for r in reference] == list(range(20))
    assert [r["id"] for r in pooled if r[ERROR_COLUMN]] == [3, 11]
    assert pooled == reference
    assert counters(pm) == counters(rm) and pm.timed_out == 2 and pm.error_rows == 2

    messages = []
    for pool in (True, False):
        with pytest.raises(AsyncOperatorError) as info:
            run(spec(Probe(hangs), pool, timeout=0.1), 20)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "timed out" in messages[0]


def test_a_timeout_handler_answers_for_the_row() -> None:
    class WithFallback(Probe):
        def timeout(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"out": -1}]

    async def hangs(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(3600 if i == 4 else 0)
        return [{"out": i}]

    (pooled, pm, _), (reference, rm, _) = both(lambda: WithFallback(hangs), 10, timeout=0.05)
    assert pooled == reference and pooled[4] == {"id": 4, "out": -1}
    assert counters(pm) == counters(rm) and pm.timed_out == 1


def test_retries_of_errors_and_results_match() -> None:
    def flaky() -> Any:
        seen: dict[int, int] = {}

        async def behave(i: int) -> list[dict[str, Any]]:
            await asyncio.sleep(0)
            seen[i] = seen.get(i, 0) + 1
            if i % 4 == 0 and seen[i] < 3:
                raise ConnectionError(f"flaky {i}")
            if i % 4 == 1 and seen[i] < 2:
                return []
            return [{"out": seen[i]}]

        return Probe(behave)

    retry = AsyncRetryStrategy.fixed_delay(3, 1, empty_result_predicate, has_exception_predicate)
    (pooled, pm, pfn), (reference, rm, rfn) = both(flaky, 40, retry=retry)
    assert pooled == reference
    assert [r["out"] for r in pooled[:4]] == [3, 2, 1, 1]
    assert counters(pm) == counters(rm) and pm.retried == 10 * 2 + 10
    assert sorted(pfn.calls) == sorted(rfn.calls)


def test_a_failure_fails_the_partition_with_the_same_message() -> None:
    async def boom(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        if i == 13:
            raise ValueError("no such customer")
        return [{"out": i}]

    messages = []
    for pool in (True, False):
        with pytest.raises(AsyncOperatorError) as info:
            run(spec(Probe(boom), pool), 40)
        assert isinstance(info.value.__cause__, ValueError)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "'id': 13" in messages[0] and "ValueError: no such customer" in messages[0]

    (pooled, pm, _), (reference, rm, _) = both(lambda: Probe(boom), 40, on_error="error_column")
    assert pooled == reference
    assert pooled[13][ERROR_COLUMN]["message"] == "no such customer"
    assert counters(pm) == counters(rm)


def test_retries_left_at_end_of_input_run_at_once_as_in_the_operator() -> None:
    async def always(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        if i == 2:
            raise ConnectionError("refused")
        return [{"out": i}]

    retry = AsyncRetryStrategy.fixed_delay(100, 20, exception_predicate=has_exception_predicate)
    messages = []
    for pool in (True, False):
        with pytest.raises(AsyncOperatorError) as info:
            run(spec(Probe(always), pool, retry=retry, timeout=30), 5)
        messages.append(str(info.value))
    # 2 s of delays, but end of input fires them at once: the retries run out, not the time
    assert messages[0] == messages[1]
    assert "after 101 attempt(s): ConnectionError: refused" in messages[0]


def test_a_timeout_between_retries_names_the_last_error() -> None:
    async def refuses_row_2(i: int) -> list[dict[str, Any]]:
        if i == 2:
            await asyncio.sleep(0)
            raise ConnectionError("refused")
        await asyncio.sleep(0.02)  # the input lasts ~0.4 s: no end of input before the timeout
        return [{"out": i}]

    retry = AsyncRetryStrategy.fixed_delay(100, 20, exception_predicate=has_exception_predicate)
    for pool in (True, False):
        with pytest.raises(AsyncOperatorError) as info:
            run(spec(Probe(refuses_row_2), pool, retry=retry, timeout=0.1, capacity=2), 40)
        message = str(info.value)
        assert "timed out for input: {'id': 2}" in message, message
        assert "attempt(s) made, the last failed with ConnectionError: refused" in message


def test_finished_rows_are_not_kept_until_their_deadline() -> None:
    async def fast(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{"out": i}]

    async def main() -> tuple[int, int, int]:
        op = PooledWaitOperator(
            invoke=fast, map_results=lambda value, results: results,
            timeout_handler=lambda value: [], emit=lambda rows: None,
            timeout=60.0, capacity=16, mode=OutputMode.UNORDERED,
        )  # fmt: skip
        for start in range(0, 5000, 500):
            await op.process_elements(list(range(start, start + 500)))
        await op.end_input()
        held = (len(op._buckets), len(op._timers), len(op._live))
        await op.close()
        return held

    # a 60 s timeout: without releasing finished rows, 5,000 would still be referenced
    assert asyncio.run(main()) == (0, 0, 0)
