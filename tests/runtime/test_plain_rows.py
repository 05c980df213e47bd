"""The runtime's plain case (no key, event time, checkpoint or chunks) through ``run_partition``.

Rows, error rows, messages and counters of ordered and unordered runs with
random latencies, fan-out, bad results, timeouts, retries and failures; and
the operator's bookkeeping of finished rows.
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
    AsyncWaitOperator,
    OutputMode,
)
from asyncio_ops._runtime import (
    ERROR_COLUMN,
    ERROR_TYPE,
    PartitionSpec,
    RunMetrics,
    TaskInfo,
    run_partition,
)
from asyncio_ops.async_retry_predicates import empty_result_predicate, has_exception_predicate
from tests.runtime.specs import partition_spec


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


def spec(fn: AsyncFunction[Any, Any], **kw: Any) -> PartitionSpec:
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
    }
    defaults.update(kw)
    return partition_spec(**defaults)


def run(s: PartitionSpec, n: int) -> tuple[list[dict[str, Any]], RunMetrics]:
    batches = [
        pa.RecordBatch.from_pydict({"id": pa.array(range(a, min(n, a + 25)), pa.int64())})
        for a in range(0, n, 25)
    ]
    done: list[RunMetrics] = []
    out = list(run_partition(s, iter(batches), TaskInfo(), on_done=done.append))
    return [r for b in out for r in b.to_pylist()], done[0]


def one(fn: Probe, n: int, **kw: Any) -> tuple[list[dict[str, Any]], RunMetrics, Probe]:
    rows, metrics = run(spec(fn, **kw), n)
    return rows, metrics, fn


def counters(m: RunMetrics) -> tuple[int, ...]:
    return (m.received, m.emitted, m.completed, m.timed_out, m.retried, m.failed, m.error_rows)


def jitter(seed: int, scale: float = 0.003) -> Any:
    rng = random.Random(seed)

    async def behave(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(rng.random() * scale)
        return [{"out": i * 2}]

    return behave


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_rows_and_counters_with_random_latencies(mode: OutputMode) -> None:
    rows, m, fn = one(Probe(jitter(5)), 300, mode=mode)
    if mode is OutputMode.ORDERED:
        assert rows == [{"id": i, "out": 2 * i} for i in range(300)]
    else:
        assert sorted(r["id"] for r in rows) == list(range(300))
        assert all(r["out"] == 2 * r["id"] for r in rows)
    assert counters(m) == (300, 300, 300, 0, 0, 0, 0)
    assert 1 < fn.peak <= 8 and m.latency.count > 0
    assert 0 < m.max_in_flight <= 8  # the queue after each input batch, bounded by capacity


def test_ordered_capacity_bounds_what_waits_behind_a_slow_head() -> None:
    async def slow_head(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.2 if i % 50 == 0 else 0.001)
        return [{"out": i}]

    for buffer in (0, 30):
        fn = Probe(slow_head)
        rows, _ = run(spec(fn, capacity=8, output_buffer=buffer), 100)
        assert [r["id"] for r in rows] == list(range(100))
        # while row 0 (and 50) is slow, at most capacity + output_buffer rows were started
        assert fn.calls.index(50) <= 8 + buffer + 50


def test_fan_out_drop_and_bad_results() -> None:
    async def shaped(i: int) -> Any:
        await asyncio.sleep(0)
        return [{"out": i}, {"out": -i}] if i % 3 == 0 else ([] if i % 3 == 1 else [{"out": i}])

    rows, m, _ = one(Probe(shaped), 60)
    expected = []
    for i in range(60):
        if i % 3 == 0:
            expected += [{"id": i, "out": i}, {"id": i, "out": -i}]
        elif i % 3 == 2:
            expected.append({"id": i, "out": i})
    assert rows == expected and len(rows) == 20 * 2 + 20
    assert counters(m) == (60, 60, 60, 0, 0, 0, 0)

    async def not_a_list(i: int) -> Any:
        await asyncio.sleep(0)
        return {"out": i} if i == 7 else [{"out": i}]

    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Probe(not_a_list)), 20)
    assert "async_invoke must return a list of results" in str(info.value)
    assert "'id': 7" in str(info.value)


def test_timeouts_become_error_rows_or_fail() -> None:
    async def hangs(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(3600 if i in (3, 11) else 0.001)
        return [{"out": i}]

    # healthy rows take 1 ms; the timeout leaves them a margin on a loaded machine
    rows, m, _ = one(Probe(hangs), 20, timeout=2.0, on_error="error_column")
    assert [r["id"] for r in rows] == list(range(20))
    assert [r["id"] for r in rows if r[ERROR_COLUMN]] == [3, 11]
    assert [r["out"] for r in rows if not r[ERROR_COLUMN]] == [
        i for i in range(20) if i not in (3, 11)
    ]
    assert m.timed_out == 2 and m.error_rows == 2 and m.emitted == 20

    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Probe(hangs), timeout=2.0), 20)
    assert "timed out" in str(info.value) and "'id': 3" in str(info.value)


def test_a_timeout_handler_answers_for_the_row() -> None:
    class WithFallback(Probe):
        def timeout(self, row: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"out": -1}]

    async def hangs(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(3600 if i == 4 else 0)
        return [{"out": i}]

    rows, m, _ = one(WithFallback(hangs), 10, timeout=2.0)
    assert rows == [{"id": i, "out": -1 if i == 4 else i} for i in range(10)]
    assert m.timed_out == 1 and m.completed == 10


def test_retries_of_errors_and_results() -> None:
    seen: dict[int, int] = {}

    async def behave(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        seen[i] = seen.get(i, 0) + 1
        if i % 4 == 0 and seen[i] < 3:
            raise ConnectionError(f"flaky {i}")
        if i % 4 == 1 and seen[i] < 2:
            return []
        return [{"out": seen[i]}]

    retry = AsyncRetryStrategy.fixed_delay(3, 1, empty_result_predicate, has_exception_predicate)
    rows, m, fn = one(Probe(behave), 40, retry=retry)
    assert [r["out"] for r in rows] == [3, 2, 1, 1] * 10
    assert m.retried == 10 * 2 + 10 and m.completed == 40
    assert sorted(fn.calls) == sorted(
        [i for i in range(40) for _ in range(3 if i % 4 == 0 else 2 if i % 4 == 1 else 1)]
    )


def test_a_failure_fails_the_partition_or_becomes_an_error_row() -> None:
    async def boom(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0.001)
        if i == 13:
            raise ValueError("no such customer")
        return [{"out": i}]

    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Probe(boom)), 40)
    assert isinstance(info.value.__cause__, ValueError)
    message = str(info.value)
    assert "'id': 13" in message and "ValueError: no such customer" in message

    rows, m, _ = one(Probe(boom), 40, on_error="error_column")
    assert [r["id"] for r in rows] == list(range(40))
    assert rows[13][ERROR_COLUMN]["message"] == "no such customer"
    assert m.failed == 1 and m.error_rows == 1


def test_retries_left_at_end_of_input_run_at_once() -> None:
    async def always(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        if i == 2:
            raise ConnectionError("refused")
        return [{"out": i}]

    retry = AsyncRetryStrategy.fixed_delay(100, 20, exception_predicate=has_exception_predicate)
    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Probe(always), retry=retry, timeout=30), 5)
    # 2 s of delays, but end of input fires them at once: the retries run out, not the time
    assert "after 101 operator attempt(s): ConnectionError: refused" in str(info.value)


def test_a_timeout_between_retries_names_the_last_error() -> None:
    async def refuses_row_2(i: int) -> list[dict[str, Any]]:
        if i == 2:
            await asyncio.sleep(0)
            raise ConnectionError("refused")
        await asyncio.sleep(0.02)  # the input lasts ~0.4 s: no end of input before the timeout
        return [{"out": i}]

    retry = AsyncRetryStrategy.fixed_delay(100, 20, exception_predicate=has_exception_predicate)
    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Probe(refuses_row_2), retry=retry, timeout=0.1, capacity=2), 40)
    message = str(info.value)
    assert "timed out for input: {'id': 2}" in message, message
    assert "operator attempt(s) made, the last failed with ConnectionError: refused" in message


def test_finished_rows_are_not_kept_until_their_deadline() -> None:
    async def fast(i: int) -> list[dict[str, Any]]:
        await asyncio.sleep(0)
        return [{"out": i}]

    async def main() -> tuple[int, int]:
        op = AsyncWaitOperator(
            fast, output=lambda element: None, timeout=60.0, capacity=16,
            mode=OutputMode.UNORDERED,
        )  # fmt: skip
        await op.open()
        for start in range(0, 5000, 500):
            await op.process_elements(list(range(start, start + 500)))
        await op.end_input()
        held = sum(len(s.elements) for s in op._timeouts.slots.values())
        buckets = len(op._timeouts.slots)
        await op.close()
        return held, buckets

    # a 60 s timeout: without releasing finished rows, 5,000 would still be referenced;
    # of the timeout slots, only the newest stays (empty) until it fires
    assert asyncio.run(main()) == (0, 1)
