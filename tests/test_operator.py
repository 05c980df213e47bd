"""AsyncWaitOperator: Flink's AsyncWaitOperatorTest scenarios, on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import pickle
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncio_ops import (
    AsyncFunction,
    AsyncOperatorError,
    AsyncRetryStrategy,
    AsyncTimeoutError,
    AsyncWaitOperator,
    ConfigurationError,
    InvalidResultError,
    OperatorHooks,
    OperatorSnapshot,
    OutputMode,
    Record,
    RuntimeContext,
    StreamElement,
    Watermark,
    WatermarkNotSupportedError,
    run_async_wait,
)
from asyncio_ops.async_retry_predicates import (
    empty_result_predicate,
    exception_type_predicate,
)
from asyncio_ops.testing import ManualClock
from tests.conftest import Runner
from tests.helpers import Controlled, settle


def make_op(
    fn: Any, clock: ManualClock | None = None, **kw: Any
) -> tuple[AsyncWaitOperator, list[StreamElement]]:
    out: list[StreamElement] = []
    kw.setdefault("timeout", 10.0)
    kw.setdefault("capacity", 10)
    op = AsyncWaitOperator(fn, output=out.append, clock=clock or ManualClock(), **kw)
    return op, out


# -- event time ---------------------------------------------------------------------------
def test_event_time_ordered(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, mode=OutputMode.ORDERED)
        await op.open()
        await op.process_element(Record(1, 1))
        await op.process_element(Record(2, 2))
        await op.process_watermark(Watermark(2))
        await op.process_element(Record(3, 3))
        fn.complete(3, ["c"])
        fn.complete(2, ["b"])
        await settle()
        assert out == []
        fn.complete(1, ["a"])
        await settle()
        assert out == [Record("a", 1), Record("b", 2), Watermark(2), Record("c", 3)]
        await op.end_input()
        await op.close()

    run(main())


def test_event_time_watermark_bounded(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, mode=OutputMode.WATERMARK_BOUNDED)
        await op.open()
        for r in (Record(1, 1), Record(2, 2)):
            await op.process_element(r)
        await op.process_watermark(Watermark(2))
        for r in (Record(3, 3), Record(4, 4)):
            await op.process_element(r)
        fn.complete(4, ["d"])
        fn.complete(2, ["b"])
        await settle()
        assert out == [Record("b", 2)]
        fn.complete(3, ["c"])
        fn.complete(1, ["a"])
        await settle()
        assert out == [Record("b", 2), Record("a", 1), Watermark(2), Record("d", 4), Record("c", 3)]
        await op.end_input()
        await op.close()

    run(main())


# -- processing time -------------------------------------------------------------------
def test_processing_time_ordered_and_unordered(run: Runner[Any]) -> None:
    async def main(mode: OutputMode) -> list[Any]:
        fn = Controlled()
        op, out = make_op(fn, mode=mode)
        await op.open()
        for i in range(5):
            await op.process_element(i)
        for i in (3, 1, 4, 0, 2):
            fn.complete(i)
            await settle()
        await op.end_input()
        await op.close()
        assert fn.closed and isinstance(fn.opened, RuntimeContext)
        return [r.value for r in out if isinstance(r, Record)]

    assert run(main(OutputMode.ORDERED)) == [0, 1, 2, 3, 4]
    assert run(main(OutputMode.UNORDERED)) == [3, 1, 4, 0, 2]


def test_unordered_mode_rejects_watermarks(run: Runner[Any]) -> None:
    async def main() -> None:
        op, _ = make_op(Controlled(), mode=OutputMode.UNORDERED)
        await op.open()
        with pytest.raises(WatermarkNotSupportedError, match="WATERMARK_BOUNDED"):
            await op.process_watermark(Watermark(1))
        await op.close()

    run(main())


def test_random_latencies_ordered_output_equals_input_order(run: Runner[Any]) -> None:
    async def lookup(v: int) -> list[int]:
        await asyncio.sleep(random.random() * 0.003)
        return [v * 10]

    out = run(run_async_wait(lookup, range(300), timeout=5, capacity=32))
    assert [r.value for r in out] == [v * 10 for v in range(300)]  # type: ignore[union-attr]


# -- timeouts ----------------------------------------------------------------------------
def test_default_timeout_fails_naming_the_input(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        fn = Controlled()
        op, out = make_op(fn, clock, timeout=2.0)
        await op.open()
        await op.process_element(Record("slow-key", 5))
        clock.advance(1.9)
        await settle()
        assert op.failure is None
        clock.advance(0.2)
        await settle()
        assert isinstance(op.failure, AsyncTimeoutError)
        assert isinstance(op.failure, TimeoutError)
        assert "slow-key" in str(op.failure)
        assert fn.cancelled == ["slow-key"]  # the attempt in flight was cancelled
        with pytest.raises(AsyncTimeoutError, match="slow-key"):
            await op.process_element(Record("next"))
        with pytest.raises(AsyncTimeoutError):
            await op.end_input()
        await op.close()
        assert out == []
        assert op.statistics().timed_out == 1

    run(main())


class WithFallback(Controlled):
    def timeout(self, value: Any) -> list[Any]:
        return [f"fallback-{value}"]


class AsyncFallback(Controlled):
    async def timeout(self, value: Any) -> list[Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        return [f"async-fallback-{value}"]


@pytest.mark.parametrize("cls", [WithFallback, AsyncFallback])
def test_overridden_timeout_supplies_the_result(run: Runner[Any], cls: type[Controlled]) -> None:
    async def main() -> None:
        clock = ManualClock()
        fn = cls()
        op, out = make_op(fn, clock, timeout=1.0)
        await op.open()
        await op.process_element(Record("a", 1))
        await op.process_element(Record("b", 2))
        fn.complete("b", ["B"])
        await settle()
        clock.advance(1.0)
        await settle()
        assert next(r.value for r in out if isinstance(r, Record)).endswith("fallback-a")
        assert out[1] == Record("B", 2)
        assert out[0].timestamp == 1  # type: ignore[union-attr]
        await op.end_input()
        await op.close()

    run(main())


def test_late_result_after_timeout_is_dropped(run: Runner[Any]) -> None:
    class Stubborn(AsyncFunction[str, str]):
        """Ignores cancellation and answers late anyway."""

        def __init__(self) -> None:
            self.release = asyncio.Event()

        async def async_invoke(self, value: str) -> list[str]:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                # deliberately swallowed: this double models a client that
                # cannot be cancelled and answers late
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            return ["late-" + value]

        def timeout(self, value: str) -> list[str]:
            return ["timeout-" + value]

    async def main() -> None:
        clock = ManualClock()
        fn = Stubborn()
        op, out = make_op(fn, clock, timeout=1.0)
        await op.open()
        await op.process_element("x")
        clock.advance(1.5)
        fn.release.set()
        await settle(10)
        await op.end_input()
        await op.close()
        assert out == [Record("timeout-x")]

    run(main())


def test_timeout_budget_covers_retries(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        calls: list[float] = []

        async def always_empty(v: Any) -> list[Any]:
            calls.append(clock.now())
            await asyncio.sleep(0)
            return []

        class F(AsyncFunction[Any, Any]):
            async def async_invoke(self, value: Any) -> list[Any]:
                return await always_empty(value)

            def timeout(self, value: Any) -> list[Any]:
                return ["gave-up"]

        retry = AsyncRetryStrategy.fixed_delay(100, 400, empty_result_predicate)
        op, out = make_op(F(), clock, timeout=1.0, retry=retry)
        await op.open()
        await op.process_element("v")
        for _ in range(6):
            await settle()
            clock.advance(0.4)
        await settle()
        assert calls == [0.0, 0.4, 0.8]  # the retry at 1.2 is past the 1.0 budget
        assert out == [Record("gave-up")]
        await op.end_input()
        await op.close()

    run(main())


# -- failures ------------------------------------------------------------------------------
def test_user_exception_fails_the_operator_with_cause_and_input(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn)
        await op.open()
        await op.process_element({"id": 41})
        await op.process_element({"id": 42})
        fn.fail({"id": 42}, KeyError("no such customer"))  # type: ignore[arg-type]
        await settle()
        err = op.failure
        assert isinstance(err, AsyncOperatorError)
        assert "'id': 42" in str(err) and "KeyError" in str(err)
        assert isinstance(err.__cause__, KeyError)
        with pytest.raises(AsyncOperatorError):
            await op.end_input()
        await op.close()  # nothing hangs; the other call is cancelled
        assert {"id": 41} in fn.cancelled  # type: ignore[comparison-overlap]
        assert out == []

    run(main())


@pytest.mark.parametrize("bad", [None, "text", 42, {"a": 1}])
def test_invalid_results_fail_clearly(run: Runner[Any], bad: Any) -> None:
    async def returns_bad(v: Any) -> Any:
        return bad

    async def main() -> None:
        with pytest.raises(AsyncOperatorError, match="must return a list") as info:
            await run_async_wait(returns_bad, ["row-1"], timeout=1)
        assert "row-1" in str(info.value)
        assert isinstance(info.value.__cause__, InvalidResultError)

    run(main())


def test_failure_handler_turns_errors_into_results(run: Runner[Any]) -> None:
    async def flaky(v: int) -> list[int]:
        await asyncio.sleep(0)
        if v % 3 == 0:
            raise ValueError(f"bad {v}")
        return [v]

    async def main() -> list[StreamElement]:
        out: list[StreamElement] = []
        op = AsyncWaitOperator(
            flaky,
            output=out.append,
            timeout=5,
            on_failure=lambda rec, exc, attempts: [("error", type(exc).__name__, attempts)],
        )
        await op.open()
        for i in range(7):
            await op.process_element(i)
        await op.end_input()
        await op.close()
        return out

    out = run(main())
    values = [r.value for r in out]  # type: ignore[union-attr]
    assert values == [
        ("error", "ValueError", 1),
        1,
        2,
        ("error", "ValueError", 1),
        4,
        5,
        ("error", "ValueError", 1),
    ]


def test_output_errors_fail_the_operator(run: Runner[Any]) -> None:
    def broken_sink(element: StreamElement) -> None:
        raise OSError("sink full")

    async def ok(v: int) -> list[int]:
        return [v]

    async def main() -> None:
        op = AsyncWaitOperator(ok, output=broken_sink, timeout=1)
        await op.open()
        with pytest.raises(OSError, match="sink full"):
            await op.process_element(1)
        await op.close()

    run(main())


# -- capacity -------------------------------------------------------------------------------
def test_capacity_applies_backpressure(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, capacity=2)
        await op.open()
        await op.process_element(0)
        await op.process_element(1)
        third = asyncio.ensure_future(op.process_element(2))
        await settle()
        assert not third.done() and fn.calls == [0, 1]
        fn.complete(1)
        await settle()
        assert not third.done()  # ordered: the head is still in flight
        fn.complete(0)
        await settle()
        assert third.done() and fn.calls == [0, 1, 2]
        fn.complete(2)
        await op.end_input()
        await op.close()
        assert [r.value for r in out] == [0, 1, 2]  # type: ignore[union-attr]

    run(main())


def test_output_buffer_bounds_requests_in_flight_not_finished_rows(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, capacity=2, output_buffer=3)
        await op.open()
        await op.process_element(0)
        await op.process_element(1)
        third = asyncio.ensure_future(op.process_element(2))
        await settle()
        assert not third.done() and fn.calls == [0, 1]  # two requests in flight: full
        fn.complete(1)
        await settle()
        # the head (0) is still in flight, but a request slot is free: 2 starts
        assert third.done() and fn.calls == [0, 1, 2] and out == []
        fn.complete(2)
        await op.process_element(3)
        fn.complete(3)
        await op.process_element(4)  # queue: 0 in flight, 1 2 3 done, 4 in flight = 5
        sixth = asyncio.ensure_future(op.process_element(5))
        await settle()
        assert not sixth.done() and len(op) == 5  # capacity + output_buffer elements
        fn.complete(4)
        await settle()
        assert not sixth.done()  # one in flight, but the queue (2 + 3) is full
        fn.complete(0)
        await settle()
        assert sixth.done() and [r.value for r in out] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
        fn.complete(5)
        await op.end_input()
        await op.close()
        assert [r.value for r in out] == [0, 1, 2, 3, 4, 5]  # type: ignore[union-attr]

    run(main())


@pytest.mark.parametrize("mode", list(OutputMode))
def test_output_buffer_keeps_every_mode_exact(run: Runner[Any], mode: OutputMode) -> None:
    async def main() -> None:
        rng = random.Random(11)

        async def f(v: int) -> list[Any]:
            await asyncio.sleep(rng.random() / 500)
            return [v]

        elements: list[Any] = []
        for i in range(300):
            elements.append(Record(i, i))
            if mode is not OutputMode.UNORDERED and i % 50 == 49:
                elements.append(Watermark(i))
        out = await run_async_wait(f, elements, timeout=5, capacity=8, mode=mode, output_buffer=40)
        values = [e.value for e in out if type(e) is Record]
        if mode is OutputMode.ORDERED:
            assert values == list(range(300))
        else:
            assert sorted(values) == list(range(300))
        if mode is OutputMode.WATERMARK_BOUNDED:  # no record crosses a watermark
            marks = [i for i, e in enumerate(out) if type(e) is Watermark]
            for m in marks:
                wm = out[m].timestamp  # type: ignore[union-attr]
                assert all(e.timestamp <= wm for e in out[:m] if type(e) is Record)  # type: ignore[operator]
                assert all(e.timestamp > wm for e in out[m:] if type(e) is Record)  # type: ignore[operator]

    run(main())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_output_buffer_is_validated(bad: Any) -> None:
    async def f(v: Any) -> list[Any]:
        return [v]

    with pytest.raises(ConfigurationError, match="output_buffer must be an int >= 0"):
        AsyncWaitOperator(f, output=print, timeout=1, output_buffer=bad)


@pytest.mark.parametrize(("capacity", "timeout"), [(0, 1), (-3, 1), (1, 0), (1, -1), (1, "soon")])
def test_bad_options_are_named(capacity: Any, timeout: Any) -> None:
    async def f(v: Any) -> list[Any]:
        return [v]

    with pytest.raises(ConfigurationError, match="capacity" if capacity <= 0 else "timeout"):
        AsyncWaitOperator(f, output=print, timeout=timeout, capacity=capacity)


def test_a_plain_function_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="async def"):
        AsyncWaitOperator(lambda v: [v], output=print, timeout=1)


# -- retries ------------------------------------------------------------------------------
def test_retry_on_empty_result_with_fixed_delay(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        attempts: dict[str, list[float]] = {}

        async def lookup(v: str) -> list[str]:
            attempts.setdefault(v, []).append(clock.now())
            await asyncio.sleep(0)
            return [] if len(attempts[v]) < 3 else [v.upper()]

        retry = AsyncRetryStrategy.fixed_delay(5, 100, empty_result_predicate)
        op, out = make_op(lookup, clock, retry=retry)
        await op.open()
        await op.process_element("a")
        for _ in range(5):
            await settle()
            clock.advance(0.1)
        await settle()
        assert attempts == {"a": [0.0, pytest.approx(0.1), pytest.approx(0.2)]}
        assert out == [Record("A")]
        assert op.statistics().retried == 2
        await op.end_input()
        await op.close()

    run(main())


def test_retry_on_exception_then_exhausted(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        calls: list[Any] = []

        async def lookup(v: Any) -> list[Any]:
            calls.append(v)
            await asyncio.sleep(0)
            if v == "transient" and calls.count(v) < 2:
                raise ConnectionResetError("reset")
            if v == "permanent":
                raise ConnectionRefusedError("refused")
            return [v]

        retry = AsyncRetryStrategy.fixed_delay(
            2, 10, exception_predicate=exception_type_predicate(ConnectionError)
        )
        op, out = make_op(lookup, clock, retry=retry)
        await op.open()
        await op.process_element("transient")
        for _ in range(3):
            await settle()
            clock.advance(0.01)
        await settle()
        assert out == [Record("transient")]
        await op.process_element("permanent")
        for _ in range(4):
            await settle()
            clock.advance(0.01)
        await settle()
        assert calls.count("permanent") == 3  # first attempt + 2 retries
        assert isinstance(op.failure, AsyncOperatorError)
        assert "3 operator attempt(s)" in str(op.failure)
        assert isinstance(op.failure.__cause__, ConnectionRefusedError)
        await op.close()

    run(main())


def test_non_matching_exception_is_not_retried(run: Runner[Any]) -> None:
    async def lookup(v: Any) -> list[Any]:
        raise ValueError("bug")

    retry = AsyncRetryStrategy.fixed_delay(
        5, 1, exception_predicate=exception_type_predicate(OSError)
    )

    async def main() -> None:
        with pytest.raises(AsyncOperatorError, match="1 operator attempt"):
            await run_async_wait(lookup, [1], timeout=1, retry=retry)

    run(main())


def test_exponential_schedule_per_element(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        seen: dict[str, list[float]] = {}

        async def lookup(v: str) -> list[str]:
            seen.setdefault(v, []).append(round(clock.now(), 6))
            await asyncio.sleep(0)
            return []

        class F(AsyncFunction[str, str]):
            async def async_invoke(self, value: str) -> list[str]:
                return await lookup(value)

            def timeout(self, value: str) -> list[str]:
                return ["done-" + value]

        retry = AsyncRetryStrategy.exponential_backoff(4, 100, 500, 2.0, empty_result_predicate)
        op, out = make_op(F(), clock, timeout=100.0, retry=retry)
        await op.open()
        await op.process_element("a")
        for _ in range(3):  # let "a" retry a few times before "b" starts
            await settle()
            clock.advance(0.1)
        await op.process_element("b")
        for _ in range(40):
            await settle()
            clock.advance(0.05)
        await settle()
        # a: 0, +0.1, +0.2, +0.4, +0.5 (capped); b's delays start again at 0.1
        assert seen["a"] == [0.0, 0.1, 0.3, 0.7, 1.2]
        b0 = seen["b"][0]
        assert [round(t - b0, 6) for t in seen["b"]] == [0.0, 0.1, 0.3, 0.7, 1.2]
        await settle()
        assert op.statistics().retried == 8
        await op.end_input()  # exhausted retries complete with the last (empty) result
        await op.close()
        assert out == []

    run(main())


def test_end_input_fires_pending_retries_at_once(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        calls: list[float] = []

        async def lookup(v: Any) -> list[Any]:
            calls.append(clock.now())
            await asyncio.sleep(0)
            return [] if len(calls) < 3 else [v]

        retry = AsyncRetryStrategy.fixed_delay(5, 60_000, empty_result_predicate)
        op, out = make_op(lookup, clock, timeout=600.0, retry=retry)
        await op.open()
        await op.process_element("x")
        await settle()
        assert calls == [0.0]
        await asyncio.wait_for(op.end_input(), 5)  # no minute-long wait
        assert calls == [0.0, 0.0, 0.0]
        assert out == [Record("x")]
        await op.close()

    run(main())


# -- close ----------------------------------------------------------------------------------
def test_close_cancels_and_awaits_in_flight_calls(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, _ = make_op(fn)
        await op.open()
        for i in range(5):
            await op.process_element(i)
        await op.close()
        assert sorted(fn.cancelled) == [0, 1, 2, 3, 4]
        assert fn.closed
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await op.close()  # idempotent

    run(main())


def test_async_open_and_close_are_awaited(run: Runner[Any]) -> None:
    class Pooled(AsyncFunction[int, int]):
        def __init__(self) -> None:
            self.events: list[str] = []

        async def open(self, runtime_context: RuntimeContext) -> None:  # type: ignore[override]
            await asyncio.sleep(0)
            self.events.append(f"open:{runtime_context.get_index_of_this_subtask()}")

        async def async_invoke(self, value: int) -> list[int]:
            return [value]

        async def close(self) -> None:  # type: ignore[override]
            await asyncio.sleep(0)
            self.events.append("close")

    async def main() -> None:
        fn = Pooled()
        out: list[StreamElement] = []
        op = AsyncWaitOperator(
            fn,
            output=out.append,
            timeout=1,
            runtime_context=RuntimeContext(index_of_this_subtask=3),
        )
        async with op:
            await op.process_element(1)
            await op.end_input()
        assert fn.events == ["open:3", "close"]
        assert out == [Record(1)]

    run(main())


# -- snapshot and restore -------------------------------------------------------------------
def test_restore_of_a_full_queue(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, capacity=4, mode=OutputMode.ORDERED)
        await op.open()
        await op.process_element(Record("a", 1))
        await op.process_element(Record("b", 2))
        await op.process_watermark(Watermark(2))
        await op.process_element(Record("c", 3))
        fn.complete("b", ["B"])
        await settle()
        assert out == [] and len(op) == 4
        snap = op.snapshot_state()
        await op.close()

        snap = pickle.loads(pickle.dumps(snap))
        assert isinstance(snap, OperatorSnapshot)
        assert [e.element for e in snap.entries] == [
            Record("a", 1),
            Record("b", 2),
            Watermark(2),
            Record("c", 3),
        ]
        assert [e.results for e in snap.entries] == [None, ("B",), None, None]

        fn2 = Controlled()
        op2, out2 = make_op(fn2, capacity=4)
        await op2.open(snap)
        assert fn2.calls == ["a", "c"]  # "b" is not requested again
        fn2.complete("c", ["C"])
        fn2.complete("a", ["A"])
        await op2.end_input()
        await op2.close()
        assert out2 == [Record("A", 1), Record("B", 2), Watermark(2), Record("C", 3)]

    run(main())


def test_a_restored_element_keeps_its_deadline_and_attempts(run: Runner[Any]) -> None:
    """A restore never grants a fresh budget: the timeout fires at the first deadline."""

    async def main() -> None:
        clock = ManualClock()
        fn = WithFallback()
        op, _ = make_op(fn, clock, timeout=10.0)
        await op.open()
        await op.process_element(Record("slow", 1))
        clock.advance(6.0)
        snap = op.snapshot_state()
        await op.close()
        (entry,) = snap.entries
        assert entry.attempts == 1 and entry.deadline == pytest.approx(10.0)

        fn2 = WithFallback()
        op2, out2 = make_op(fn2, clock, timeout=10.0)  # a fresh budget would end at 16
        await op2.open(snap)
        assert fn2.calls == ["slow"]  # requested again, as its second attempt
        clock.advance(3.9)
        await settle()
        assert out2 == []
        clock.advance(0.2)  # 10.1: past the first deadline
        await settle()
        assert out2 == [Record("fallback-slow", 1)]
        assert fn2.cancelled == ["slow"]
        assert op2.statistics().timed_out == 1
        await op2.end_input()
        await op2.close()

    run(main())


def test_an_element_whose_deadline_passed_while_stored_times_out_at_once(
    run: Runner[Any],
) -> None:
    async def main() -> None:
        clock = ManualClock()
        op, _ = make_op(Controlled(), clock, timeout=2.0)
        await op.open()
        await op.process_element(Record("stale", 7))
        snap = op.snapshot_state()
        await op.close()
        clock.advance(5.0)  # stored longer than its budget

        fn2 = Controlled()
        op2, _ = make_op(fn2, clock, timeout=2.0)
        with pytest.raises(AsyncTimeoutError, match="stale"):
            await op2.open(snap)
        assert fn2.calls == []  # not requested again: its time was up
        await op2.close()

    run(main())


def test_restore_with_larger_capacity_then_new_input(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, _ = make_op(fn, capacity=2, mode=OutputMode.UNORDERED)
        await op.open()
        await op.process_element(1)
        await op.process_element(2)
        snap = op.snapshot_state()
        await op.close()

        async def instant(v: int) -> list[int]:
            return [v * 100]

        op2, out2 = make_op(instant, capacity=10, mode=OutputMode.UNORDERED)
        await op2.open(snap)
        for v in (3, 4):
            await op2.process_element(v)
        await op2.end_input()
        await op2.close()
        assert [r.value for r in out2] == [100, 200, 300, 400]  # type: ignore[union-attr]
        assert op2.statistics().restored == 2

    run(main())


def test_snapshot_excludes_emitted_elements(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, mode=OutputMode.UNORDERED)
        await op.open()
        for i in range(4):
            await op.process_element(i)
        await settle()
        fn.complete(2)
        await settle()
        fn.complete(0)
        await settle()
        assert [r.value for r in out] == [2, 0]  # type: ignore[union-attr]
        assert [e.element.value for e in op.snapshot_state().entries] == [1, 3]  # type: ignore[union-attr]
        await op.close()

    run(main())


# -- properties ---------------------------------------------------------------------------------
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mode=st.sampled_from(list(OutputMode)),
    n=st.integers(1, 40),
    capacity=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_completion_orders_keep_each_modes_rule(
    run: Runner[Any], mode: OutputMode, n: int, capacity: int, seed: int
) -> None:
    rng = random.Random(seed)

    async def main() -> tuple[list[StreamElement], list[Any], list[Any]]:
        fn = Controlled()
        op, out = make_op(fn, mode=mode, capacity=capacity)
        await op.open()
        arrival: list[Any] = []
        completion: list[Any] = []

        async def completer() -> None:
            while True:
                await asyncio.sleep(0)
                pending = fn.pending()
                if pending and rng.random() < 0.5:
                    v = rng.choice(pending)
                    fn.complete(v, [v] * (v[0] % 3))
                    completion.append(v)

        task = asyncio.ensure_future(completer())
        wm = 0
        for i in range(n):
            if mode is not OutputMode.UNORDERED and rng.random() < 0.2:
                wm += 1
                await op.process_watermark(Watermark(wm))
                arrival.append(Watermark(wm))
            v = (i, wm)
            await op.process_element(Record(v, wm))
            arrival.append(v)
        await op.end_input()
        task.cancel()
        await op.close()
        return out, arrival, completion

    out, arrival, completion = run(main())
    records = [e.value for e in out if isinstance(e, Record)]
    expected = [v for v in arrival if not isinstance(v, Watermark) for _ in range(v[0] % 3)]
    assert sorted(records) == sorted(expected)  # nothing lost, nothing duplicated
    assert [e for e in out if isinstance(e, Watermark)] == [
        a for a in arrival if isinstance(a, Watermark)
    ]
    firsts = [v for i, v in enumerate(records) if i == 0 or records[i - 1] != v]
    if mode is OutputMode.ORDERED:
        assert out == [
            a if isinstance(a, Watermark) else Record(a, a[1])
            for a in arrival
            for _ in range(1 if isinstance(a, Watermark) else a[0] % 3)
        ]
    elif mode is OutputMode.UNORDERED:
        assert firsts == [v for v in completion if v[0] % 3]
    else:
        current = 0
        for e in out:
            if isinstance(e, Watermark):
                current = int(e.timestamp)
            else:
                assert e.timestamp == current  # never crosses a watermark
        for seg in {v[1] for v in firsts}:
            assert [v for v in firsts if v[1] == seg] == [
                v for v in completion if v[1] == seg and v[0] % 3
            ]


def test_results_are_sequences_of_any_kind(run: Runner[Any]) -> None:
    async def as_tuple(v: int) -> Sequence[int]:
        return (v, v)

    out = run(run_async_wait(as_tuple, [1, 2], timeout=1))
    assert [r.value for r in out] == [1, 1, 2, 2]  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_instant_results_behind_a_slow_head_keep_the_modes_order(
    run: Runner[Any], mode: OutputMode
) -> None:
    async def main() -> list[Any]:
        release = asyncio.Event()

        async def f(v: int) -> list[int]:
            if v == 0:
                await release.wait()
            return [v]

        out: list[StreamElement] = []
        op = AsyncWaitOperator(f, output=out.append, timeout=5, capacity=10, mode=mode)
        await op.open()
        await op.process_elements(range(5))
        release.set()
        await op.end_input()
        await op.close()
        assert op.statistics().completed == 5
        return [r.value for r in out]  # type: ignore[union-attr]

    expected = [0, 1, 2, 3, 4] if mode is OutputMode.ORDERED else [1, 2, 3, 4, 0]
    assert run(main()) == expected


def test_process_elements_applies_backpressure_and_raises_failures(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, capacity=3)
        await op.open()
        feeding = asyncio.ensure_future(op.process_elements(range(6)))
        await settle()
        assert fn.calls == [0, 1, 2] and not feeding.done()
        for v in (0, 1, 2):
            fn.complete(v)
        await settle()
        assert fn.calls == [0, 1, 2, 3, 4, 5]
        fn.fail(4, RuntimeError("down"))
        await settle()
        await feeding  # all admitted before the failure
        with pytest.raises(AsyncOperatorError, match="down"):
            await op.process_elements([6])
        await op.close()
        assert [r.value for r in out] == [0, 1, 2]  # type: ignore[union-attr]

    run(main())


def test_timeout_between_retries_names_the_last_error(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()

        async def down(v: Any) -> list[Any]:
            await asyncio.sleep(0)
            raise ConnectionRefusedError("db-host:5432 refused")

        retry = AsyncRetryStrategy.fixed_delay(
            100, 300, exception_predicate=exception_type_predicate(ConnectionError)
        )
        op, _ = make_op(down, clock, timeout=1.0, retry=retry)
        await op.open()
        await op.process_element("row-9")
        for _ in range(5):
            await settle()
            clock.advance(0.3)
        await settle()
        err = op.failure
        assert isinstance(err, AsyncTimeoutError)
        assert "row-9" in str(err) and "db-host:5432 refused" in str(err)
        assert isinstance(err.__cause__, ConnectionRefusedError)
        await op.close()

    run(main())


def test_a_lookup_cancelled_by_someone_else_fails_instead_of_hanging(run: Runner[Any]) -> None:
    async def main() -> None:
        async def cancelled_inside(v: Any) -> list[Any]:
            await asyncio.sleep(0)
            raise asyncio.CancelledError()  # e.g. a client whose own task was cancelled

        with pytest.raises(AsyncOperatorError, match="cancelled") as info:
            await asyncio.wait_for(run_async_wait(cancelled_inside, ["x"], timeout=60), 5)
        assert isinstance(info.value.__cause__, asyncio.CancelledError)

    run(main())


def test_invoke_and_map_results_adapt_values(run: Runner[Any]) -> None:
    async def lookup(key: int) -> list[int]:
        await asyncio.sleep(0)
        return [] if key == 3 else [key * 10]

    def merge(value: tuple[int, str], results: Sequence[Any]) -> list[Any]:
        if value[1] == "bad":
            raise ValueError(f"cannot merge {value}")
        return [(value[1], r) for r in results]

    async def main(values: list[tuple[int, str]]) -> list[Any]:
        out: list[StreamElement] = []
        op = AsyncWaitOperator(
            lookup, output=out.append, timeout=5,
            hooks=OperatorHooks(invoke=lambda v: lookup(v[0]), map_results=merge),
        )  # fmt: skip
        await op.open()
        try:
            await op.process_elements(values)
            await op.end_input()
        finally:
            await op.close()
        return [r.value for r in out]  # type: ignore[union-attr]

    assert run(main([(1, "a"), (3, "b"), (2, "c")])) == [("a", 10), ("c", 20)]
    with pytest.raises(AsyncOperatorError, match="cannot merge") as info:
        run(main([(1, "a"), (2, "bad")]))
    assert isinstance(info.value.__cause__, ValueError)


# -- the workers ------------------------------------------------------------------------
def test_a_timed_out_attempt_frees_its_worker_for_the_next_element(run: Runner[Any]) -> None:
    async def main() -> None:
        clock = ManualClock()
        fn = Controlled()
        op, out = make_op(fn, clock=clock, capacity=1, timeout=1.0, mode=OutputMode.UNORDERED)
        op.function.timeout = lambda value: [f"late {value}"]  # type: ignore[method-assign]
        await op.open()
        await op.process_element("slow")
        second = asyncio.ensure_future(op.process_element("next"))
        await settle()
        assert not second.done() and fn.calls == ["slow"]  # one worker, one slot
        clock.advance(1.0)
        await settle()
        # the timeout answered for "slow", cancelled its attempt, and the worker took "next"
        assert second.done() and fn.cancelled == ["slow"] and fn.calls == ["slow", "next"]
        fn.complete("next")
        await op.end_input()
        await op.close()
        assert [r.value for r in out] == ["late slow", "next"]  # type: ignore[union-attr]

    run(main())


def test_watermarks_among_process_elements_keep_their_place(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, out = make_op(fn, mode=OutputMode.WATERMARK_BOUNDED, capacity=3)
        await op.open()
        feed = asyncio.ensure_future(
            op.process_elements([Record(1, 1), Watermark(1), Record(2, 2), Record(3, 3)])
        )
        await settle()
        assert not feed.done() and fn.calls == [1, 2]  # 1, the watermark, 2: the queue is full
        fn.complete(2)  # completion order, but not across the watermark
        await settle()
        assert out == []
        fn.complete(1)
        await settle()
        assert feed.done() and out == [Record(1, 1), Watermark(1), Record(2, 2)]
        fn.complete(3)
        await op.end_input()
        await op.close()
        assert out[-1] == Record(3, 3)

    run(main())


def test_a_snapshot_holds_input_still_waiting_for_room(run: Runner[Any]) -> None:
    async def main() -> None:
        fn = Controlled()
        op, _ = make_op(fn, capacity=2)
        await op.open()
        feed = asyncio.ensure_future(op.process_elements([0, 1, 2, 3]))
        await settle()
        assert not feed.done() and fn.calls == [0, 1]
        snap = op.snapshot_state()
        # 0 and 1 in flight (attempt 1 each, with deadlines); 2 and 3 not started yet
        assert [e.element for e in snap.entries] == [Record(i) for i in range(4)]
        assert [(e.attempts, e.deadline is not None) for e in snap.entries] == [
            (1, True), (1, True), (0, False), (0, False),
        ]  # fmt: skip
        feed.cancel()
        await op.close()

        fn2 = Controlled()
        op2, out2 = make_op(fn2, capacity=2)
        opening = asyncio.ensure_future(op2.open(snap))  # returns once all 4 are in the queue
        for i in range(4):
            await settle()
            fn2.complete(i)
        await opening
        await op2.end_input()
        await op2.close()
        assert [r.value for r in out2] == [0, 1, 2, 3]  # type: ignore[union-attr]

    run(main())


def test_workers_end_when_the_loop_shuts_down_without_close(run: Runner[Any]) -> None:
    fn = Controlled()

    async def main() -> int:
        op, _ = make_op(fn, capacity=4)
        await op.open()
        await op.process_elements([1, 2, 3])
        return len(op)  # no end_input, no close: the loop's shutdown cancels the workers

    assert run(main()) == 3  # returns: no worker swallowed its cancellation
    assert sorted(fn.cancelled) == [1, 2, 3]


def test_an_error_in_output_fails_the_operator_from_a_worker(run: Runner[Any]) -> None:
    async def main() -> None:
        async def instant(v: int) -> list[int]:
            return [v]

        def output(element: StreamElement) -> None:
            raise RuntimeError("sink is gone")

        op = AsyncWaitOperator(instant, output=output, timeout=5.0, capacity=2)
        await op.open()
        with pytest.raises(RuntimeError, match="sink is gone"):
            await op.process_elements(range(10))
            await op.end_input()
        await op.close()

    run(main())


def test_workers_grow_with_the_work_not_with_capacity(run: Runner[Any]) -> None:
    async def main() -> int:
        fn = Controlled()
        op, _ = make_op(fn, capacity=10_000_000)
        await op.open()
        await op.process_elements(range(100))
        tasks = len(asyncio.all_tasks())
        for i in range(100):
            fn.complete(i)
        await op.end_input()
        await op.close()
        return tasks

    assert run(main()) <= 100 + 1  # a worker per element in flight, and main itself


def test_an_infinite_timeout_never_times_out(run: Runner[Any]) -> None:
    async def main() -> list[Any]:
        clock = ManualClock()
        fn = Controlled()
        op, out = make_op(fn, clock=clock, timeout=float("inf"))
        await op.open()
        await op.process_elements([1, 2])
        clock.advance(10**9)
        await settle()
        fn.complete(2)
        fn.complete(1)
        await op.end_input()
        await op.close()
        return [r.value for r in out]  # type: ignore[union-attr]

    assert run(main()) == [1, 2]


def test_a_lookup_that_swallows_its_cancellation_does_not_hold_the_end(
    run: Runner[Any], caplog: pytest.LogCaptureFixture
) -> None:
    class Stubborn(AsyncFunction[int, int]):
        released = False

        async def async_invoke(self, value: int) -> list[int]:
            while True:  # ignores every cancellation until the test releases it
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if self.released:
                        raise

        def timeout(self, value: int) -> list[int]:
            return [-value]

    async def main() -> list[Any]:
        clock = ManualClock()
        fn = Stubborn()
        op, out = make_op(fn, clock=clock, timeout=1.0, close_grace=0.05)
        await op.open()
        await op.process_elements([7])
        clock.advance(1.0)
        await op.end_input()  # the timeout decided the row: output proceeds
        await op.close()  # the stubborn attempt is abandoned after the grace period
        fn.released = True  # let the loop's shutdown end the abandoned task
        return [r.value for r in out]  # type: ignore[union-attr]

    with caplog.at_level("WARNING", logger="asyncio_ops.operator"):
        assert run(main()) == [-7]
    assert "ignored cancellation" in caplog.text and "7" in caplog.text


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_in_a_lookup_fails_naming_the_row(
    run: Runner[Any], exc_type: type[BaseException]
) -> None:
    async def bad(value: int) -> list[int]:
        if value == 3:
            raise exc_type("stop")
        await asyncio.sleep(0)
        return [value]

    async def main() -> None:
        op, _ = make_op(bad, on_failure=lambda record, exc, attempts: [])
        await op.open()
        try:
            failed = "for input 3 after 1 operator attempt"
            with pytest.raises(AsyncOperatorError, match=failed) as info:
                await op.process_elements(range(5))
                await op.end_input()
            assert isinstance(info.value.__cause__, exc_type)  # not an error row
        finally:
            await op.close()

    run(main())


def test_one_element_is_enough_for_a_latency(run: Runner[Any]) -> None:
    async def main() -> Any:
        clock = ManualClock()
        fn = Controlled()
        op, _ = make_op(fn, clock=clock)
        await op.open()
        await op.process_element(1)
        clock.advance(0.25)
        fn.complete(1)
        await op.end_input()
        await op.close()
        return op.statistics()

    stats = run(main())
    assert stats.latency_p50 is not None and abs(stats.latency_p50 - 0.25) <= 0.25 * 0.05


def test_a_weight_makes_the_counters_count_rows(run: Runner[Any]) -> None:
    """Elements that stand for several rows (the Spark runtime's chunks) are counted by
    their weight; ``elements`` counts the elements themselves."""

    async def main() -> tuple[Any, Any]:
        async def f(chunk: list[int]) -> list[int]:
            await asyncio.sleep(0)
            if 13 in chunk:
                raise LookupError("no 13")
            if 99 in chunk:
                await asyncio.sleep(3600)  # times out
            return chunk

        stats = []
        for weight in (len, None):
            op = AsyncWaitOperator(
                f, output=lambda e: None, timeout=0.2, capacity=10,
                hooks=OperatorHooks(weight=weight), on_failure=lambda record, exc, attempts: [],
            )  # fmt: skip
            await op.open()
            await op.process_elements([[1, 2, 3], [13, 14], [99, 98, 97, 96], [5]])
            await op.end_input()
            await op.close()
            stats.append(op.statistics())
        return stats[0], stats[1]

    rows, plain = run(main())
    assert (rows.elements, rows.received, rows.completed) == (4, 10, 10)
    assert (rows.timed_out, rows.failed) == (4, 6)  # 4 rows timed out, 2 + 4 failed
    assert (plain.elements, plain.received, plain.completed) == (4, 4, 4)
    assert (plain.timed_out, plain.failed) == (1, 2)
