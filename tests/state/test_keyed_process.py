"""KeyedProcessOperator: state and timers per key, watermark order, snapshot with rescale."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from asyncio_ops import AsyncWaitOperator, KeyedProcessOperator, Record, Watermark
from asyncio_ops._elements import StreamElement
from asyncio_ops.state import (
    Collector,
    ConfigurationError,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    KeyedStateBackend,
    StateError,
    TimeDomain,
    ValueStateDescriptor,
    assign_to_key_group,
    compute_key_group_range_for_operator_index,
)
from asyncio_ops.testing import ManualClock

from .conftest import BackendFactory

COUNT = ValueStateDescriptor[int]("count")


class CountWithTimeout(KeyedProcessFunction[str, tuple[str, int], Any]):
    """Counts per key; 10 time units after a key's last record, emits (key, count, domain)."""

    def __init__(self, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self.domain = domain
        self.closed = False

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(COUNT)
        self.last = runtime_context.get_state(ValueStateDescriptor[float]("last"))

    def process_element(
        self, value: tuple[str, int], ctx: KeyedProcessContext, out: Collector[Any]
    ) -> None:
        assert ctx.current_key == value[0]
        self.count.update((self.count.value() or 0) + 1)
        ts = self.domain_time(ctx) + 10
        old = self.last.value()
        timers = ctx.timer_service()
        if old is not None:  # only the latest deadline counts
            if self.domain is TimeDomain.EVENT_TIME:
                timers.delete_event_time_timer(old)
            else:
                timers.delete_processing_time_timer(old)
        self.last.update(ts)
        if self.domain is TimeDomain.EVENT_TIME:
            timers.register_event_time_timer(ts)
        else:
            timers.register_processing_time_timer(ts)
        out.collect(("seen", value))

    def domain_time(self, ctx: KeyedProcessContext) -> float:
        if self.domain is TimeDomain.EVENT_TIME:
            ts = ctx.timestamp()
            assert ts is not None
            return ts
        return ctx.timer_service().current_processing_time()

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Any]) -> None:
        assert ctx.time_domain() is self.domain
        assert self.last.value() == timestamp  # state of the timer's key
        out.collect((ctx.current_key, self.count.value(), timestamp))
        self.count.clear()
        self.last.clear()

    def close(self) -> None:
        self.closed = True


def make_op(
    backend: KeyedStateBackend, clock: ManualClock, fn: CountWithTimeout | None = None
) -> tuple[KeyedProcessOperator, list[StreamElement]]:
    out: list[StreamElement] = []
    op = KeyedProcessOperator(
        fn or CountWithTimeout(), lambda v: v[0], backend=backend, output=out.append, clock=clock
    )
    return op, out


def test_event_time_timers_fire_before_the_watermark(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    op, out = make_op(backend, clock)
    op.open()
    for element in [
        Record(("a", 1), 1.0),
        Record(("b", 2), 2.0),
        Record(("a", 3), 5.0),  # moves a's deadline from 11 to 15
        Watermark(12.0),
        Record(("b", 4), 13.0),
        Watermark(30.0),
    ]:
        op(element)
    assert out == [
        Record(("seen", ("a", 1)), 1.0),
        Record(("seen", ("b", 2)), 2.0),
        Record(("seen", ("a", 3)), 5.0),
        Record(("b", 1, 12.0), 12.0),
        Watermark(12.0),
        Record(("seen", ("b", 4)), 13.0),
        Record(("a", 2, 15.0), 15.0),
        Record(("b", 1, 23.0), 23.0),
        Watermark(30.0),
    ]
    assert list(backend.keys("count")) == []
    op.close()
    assert op.function.closed  # type: ignore[attr-defined]


def test_processing_time_timers_fire_from_the_clock(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    op, out = make_op(backend, clock, CountWithTimeout(TimeDomain.PROCESSING_TIME))
    op.open()
    op(Record(("a", 1)))
    clock.advance(4)
    op(Record(("a", 2)))
    op(Record(("b", 3)))
    clock.advance(9)
    assert out[-1:] == [Record(("seen", ("b", 3)))]
    clock.advance(1)
    now = clock.now()
    assert out[3:] == [Record(("a", 2, now)), Record(("b", 1, now))]  # no timestamp
    op.close()
    clock.advance(100)
    assert len(out) == 5


def test_snapshot_and_rescale_moves_state_and_timers(
    make_backend: BackendFactory, clock: ManualClock
) -> None:
    maxp = 32
    keys = [f"k{i}" for i in range(40)]

    def ops(p: int) -> list[tuple[KeyedProcessOperator, list[StreamElement]]]:
        return [
            make_op(
                make_backend(
                    max_parallelism=maxp,
                    key_group_range=compute_key_group_range_for_operator_index(maxp, p, i),
                    clock=clock,
                ),
                clock,
            )
            for i in range(p)
        ]

    def owner(
        group: list[tuple[KeyedProcessOperator, list[StreamElement]]], key: str
    ) -> KeyedProcessOperator:
        kg = assign_to_key_group(key, maxp)
        return next(op for op, _ in group if kg in op.backend.key_group_range)

    old = ops(2)
    for op, _ in old:
        op.open()
    for i, k in enumerate(keys):
        owner(old, k)(Record((k, i), float(i)))
        owner(old, k)(Record((k, i), float(i)))
    snaps = [op.snapshot() for op, _ in old]
    for op, _ in old:
        op.close()

    new = ops(3)
    for op, _ in new:
        for s in snaps:
            op.restore(s)
        op.open()
    fired: list[Any] = []
    for op, out in new:
        op(Watermark(1000.0))
        fired += [e.value for e in out if isinstance(e, Record)]
        assert out[-1] == Watermark(1000.0)
    assert sorted(fired) == sorted((k, 2, float(i) + 10) for i, k in enumerate(keys))


def test_restore_after_the_first_record_is_an_error(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    """A restore comes before any input, after open or before it (after it, entries go
    straight into the states open obtained)."""
    op, _ = make_op(backend, clock)
    op.open()
    assert op.restore({}) == 0
    op.clear_key_group(0)
    op(Record(("a", 1), 1.0))
    for late in (lambda: op.restore({}), lambda: op.clear_key_group(0)):
        with pytest.raises(StateError, match="before the first record, watermark or timer"):
            late()
    with pytest.raises(StateError, match="twice"):
        op.open()
    with pytest.raises(TypeError, match="Record or a Watermark"):
        op.process("raw")  # type: ignore[arg-type]
    op.close()
    with pytest.raises(StateError, match="closed"):
        op(Record(("a", 1), 1.0))


def test_bad_arguments(backend: KeyedStateBackend) -> None:
    with pytest.raises(ConfigurationError, match="KeyedProcessFunction"):
        KeyedProcessOperator(object(), len, backend=backend, output=print)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="output"):
        KeyedProcessOperator(CountWithTimeout(), len, backend=backend, output=None)  # type: ignore[arg-type]


class Echo(KeyedProcessFunction[str, tuple[str, int], Any]):
    """Counts per key, emits through ``out`` and by returning; refuses a 7."""

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        self.count = runtime_context.get_state(COUNT)

    def process_element(
        self, value: tuple[str, int], ctx: KeyedProcessContext, out: Collector[Any]
    ) -> Any:
        if value[1] == 7:
            raise ValueError("no sevens")
        assert ctx.current_key == value[0] and ctx.timestamp() is None
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        ctx.timer_service().register_processing_time_timer(1_000.0 + value[1])
        out.collect((value[0], n))
        return [("again", value[1])] if value[1] % 2 else None


def test_a_batch_of_values_is_their_records_one_by_one(
    make_backend: BackendFactory, clock: ManualClock
) -> None:
    """``process_values`` makes the calls ``process_element`` of their records makes (state,
    timers, outputs in order); ``collect`` takes the values without their Records."""
    values = [(k, i) for i, k in enumerate("abcabdaabca") if i != 7]
    records: list[StreamElement] = []
    by_record = KeyedProcessOperator(Echo(), lambda v: v[0], backend=make_backend(),
                                     output=records.append, clock=clock)  # fmt: skip
    collected: list[Any] = []
    batched = KeyedProcessOperator(Echo(), lambda v: v[0], backend=make_backend(),
                                   output=records.append, clock=clock,
                                   collect=collected.append)  # fmt: skip
    for op in (by_record, batched):
        op.open()
    for v in values:
        by_record.process_element(Record(v))
    batched.process_values(values, [k for k, _ in values])
    assert collected == [r.value for r in records if isinstance(r, Record)]
    assert batched.snapshot() == by_record.snapshot()
    with pytest.raises(ConfigurationError, match="collect"):
        KeyedProcessOperator(Echo(), len, backend=make_backend(), output=print, collect=3)  # type: ignore[arg-type]


def test_a_batch_stops_at_the_value_that_fails_and_names_it(make_backend: BackendFactory) -> None:
    collected: list[Any] = []
    op = KeyedProcessOperator(Echo(), lambda v: v[0], backend=make_backend(), output=print,
                              collect=collected.append, schedule_timers=False)  # fmt: skip
    op.open()
    seen: list[tuple[Any, Any]] = []
    with pytest.raises(ValueError, match="no sevens"):
        op.process_values([("a", 1), ("b", 7), ("c", 3)], ["a", "b", "c"],
                          lambda exc, key, value: seen.append((key, value)))  # fmt: skip
    assert seen == [("b", ("b", 7))]
    assert collected == [("a", 1), ("again", 1)]


def test_chains_after_the_async_operator(backend: KeyedStateBackend) -> None:
    """AsyncWaitOperator(output=keyed.process): one partition, one loop, no glue."""

    async def enrich(value: tuple[str, int]) -> list[tuple[str, int]]:
        await asyncio.sleep(0)
        return [(value[0], value[1] * 10)]

    async def main() -> list[StreamElement]:
        out: list[StreamElement] = []
        keyed = KeyedProcessOperator(
            CountWithTimeout(), lambda v: v[0], backend=backend, output=out.append
        )
        keyed.open()
        op = AsyncWaitOperator(enrich, output=keyed.process, timeout=5.0)
        async with op:
            for i, k in enumerate(["a", "b", "a"]):
                await op.process_element(Record((k, i), float(i)))
            await op.process_watermark(Watermark(100.0))
            await op.end_input()
        keyed.close()
        return out

    out = asyncio.run(main())
    assert out == [
        Record(("seen", ("a", 0)), 0.0),
        Record(("seen", ("b", 10)), 1.0),
        Record(("seen", ("a", 20)), 2.0),
        Record(("b", 1, 11.0), 11.0),
        Record(("a", 2, 12.0), 12.0),
        Watermark(100.0),
    ]


class Heartbeat(KeyedProcessFunction[str, tuple[str, float], Any]):
    """A timer per record at the record's time; each firing emits (key, timestamp) and
    registers the next beat: 10 later (event time) or now again (processing time), so it
    re-registers itself for ever."""

    def __init__(self, domain: TimeDomain) -> None:
        self.domain = domain

    def process_element(
        self, value: tuple[str, float], ctx: KeyedProcessContext, out: Collector[Any]
    ) -> None:
        timers = ctx.timer_service()
        if self.domain is TimeDomain.EVENT_TIME:
            timers.register_event_time_timer(value[1])
        else:
            timers.register_processing_time_timer(timers.current_processing_time())

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Any]) -> None:
        assert ctx.time_domain() is self.domain
        out.collect((ctx.current_key, timestamp))
        timers = ctx.timer_service()
        if self.domain is TimeDomain.EVENT_TIME:
            timers.register_event_time_timer(timestamp + 10)
        else:
            timers.register_processing_time_timer(timers.current_processing_time())


@pytest.mark.timeout(20)
def test_end_of_input_fires_the_event_time_timers_registered_then_and_drops_new_ones(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    out: list[StreamElement] = []
    fn = Heartbeat(TimeDomain.EVENT_TIME)
    op = KeyedProcessOperator(fn, lambda v: v[0], backend=backend, output=out.append, clock=clock)
    op.open()
    op(Record(("a", 1.0), 1.0))
    op(Record(("b", 2.0), 2.0))
    op(Watermark(15.0))  # a stream: a beats at 1 and 11, b at 2 and 12; the next ones stay
    assert out[-1] == Watermark(15.0)
    assert sorted(t.timestamp for t in op.timer_service.event_time_timers()) == [21.0, 22.0]
    op.end_input()  # the final watermark fires 21 and 22; the beats they register never fire
    assert out[5:] == [Record(("a", 21.0), 21.0), Record(("b", 22.0), 22.0), Watermark(math.inf)]
    assert op.timer_service.num_event_time_timers() == 0
    op.close()


@pytest.mark.timeout(20)
def test_end_of_input_fires_the_processing_time_timers_due_then_and_drops_new_ones(
    backend: KeyedStateBackend, clock: ManualClock
) -> None:
    out: list[StreamElement] = []
    fn = Heartbeat(TimeDomain.PROCESSING_TIME)
    op = KeyedProcessOperator(fn, lambda v: v[0], backend=backend, output=out.append, clock=clock)
    op.open()
    op(Record(("a", 0.0)))
    op(Record(("b", 0.0)))
    now = clock.now()
    op.end_input()  # due now: each fires once; the beat each registers (due now) never fires
    assert out == [Watermark(math.inf), Record(("a", now)), Record(("b", now))]
    assert op.timer_service.num_processing_time_timers() == 0
    op.close()


class FailsOnTimer(KeyedProcessFunction[str, tuple[str, float], Any]):
    def process_element(
        self, value: tuple[str, float], ctx: KeyedProcessContext, out: Collector[Any]
    ) -> None:
        ctx.timer_service().register_event_time_timer(value[1])
        ctx.timer_service().register_processing_time_timer(value[1])

    def on_timer(self, timestamp: float, ctx: KeyedProcessContext, out: Collector[Any]) -> None:
        raise ValueError(f"no timer for {ctx.current_key}")


@pytest.mark.parametrize("domain", list(TimeDomain))
def test_an_error_in_on_timer_names_the_key_the_timestamp_and_the_domain(
    backend: KeyedStateBackend, clock: ManualClock, domain: TimeDomain
) -> None:
    op, _ = make_op(backend, clock, FailsOnTimer())  # type: ignore[arg-type]
    op.open()
    op(Record(("k1", 7.0), 7.0))
    with pytest.raises(ValueError, match="no timer for k1") as info:
        if domain is TimeDomain.EVENT_TIME:
            op(Watermark(8.0))
        else:
            clock.advance(8)
    assert info.value.__notes__ == [
        f"keyed_process: key 'k1', on_timer of the {domain.value} timer at 7.0"
    ]
    op.close()
