"""One contract suite over every queue kind, then what each kind adds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncio_ops import (
    ConfigurationError,
    ElementQueue,
    OrderedElementQueue,
    Record,
    UnorderedElementQueue,
    Watermark,
    WatermarkBoundedElementQueue,
    WatermarkNotSupportedError,
)

ALL_KINDS: list[Callable[[int], ElementQueue]] = [
    OrderedElementQueue,
    UnorderedElementQueue,
    WatermarkBoundedElementQueue,
]


@pytest.fixture(params=ALL_KINDS, ids=lambda k: k.__name__)
def make(request: pytest.FixtureRequest) -> Callable[[int], ElementQueue]:
    return request.param  # type: ignore[no-any-return]


def drain(q: ElementQueue) -> list[Any]:
    out: list[Any] = []
    while q.has_completed():
        out.extend(q.pop_completed())
    return out


# -- the contract -------------------------------------------------------------------------
def test_capacity_must_be_positive(make: Callable[[int], ElementQueue]) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="capacity"):
            make(bad)  # type: ignore[arg-type]


def test_try_put_returns_none_when_full(make: Callable[[int], ElementQueue]) -> None:
    q = make(2)
    assert q.try_put(Record(1)) is not None
    assert q.try_put(Record(2)) is not None
    assert q.try_put(Record(3)) is None
    assert len(q) == 2
    assert q.values() == [Record(1), Record(2)]


def test_empty_queue(make: Callable[[int], ElementQueue]) -> None:
    q = make(3)
    assert q.is_empty() and len(q) == 0
    assert not q.has_completed()
    assert q.values() == []
    with pytest.raises(LookupError):
        q.pop_completed()


def test_results_carry_the_input_timestamp_and_fan_out(make: Callable[[int], ElementQueue]) -> None:
    q = make(3)
    h = q.try_put(Record("k", 17))
    assert h is not None
    assert not q.has_completed()
    h.complete(["a", "b"])
    assert q.has_completed()
    assert q.pop_completed() == [Record("a", 17), Record("b", 17)]
    assert q.is_empty()


def test_empty_result_emits_nothing_but_frees_the_slot(make: Callable[[int], ElementQueue]) -> None:
    q = make(1)
    h = q.try_put(Record(1))
    assert h is not None
    h.complete([])
    assert q.pop_completed() == []
    assert q.try_put(Record(2)) is not None


def test_first_completion_wins(make: Callable[[int], ElementQueue]) -> None:
    q = make(2)
    h = q.try_put(Record(1))
    assert h is not None
    assert h.complete(["timeout-result"])
    assert not h.complete(["late-real-result"])
    assert not h.complete_exceptionally(RuntimeError("late"))
    assert drain(q) == [Record("timeout-result")]


def test_exceptional_completion_raises_on_pop(make: Callable[[int], ElementQueue]) -> None:
    q = make(2)
    h = q.try_put(Record(1))
    assert h is not None
    boom = ValueError("boom")
    assert h.complete_exceptionally(boom)
    assert not h.complete([1])
    assert q.has_completed()
    with pytest.raises(ValueError, match="boom"):
        q.pop_completed()
    assert q.is_empty()


def test_values_lists_unemitted_inputs_in_arrival_order(
    make: Callable[[int], ElementQueue],
) -> None:
    q = make(5)
    hs = [q.try_put(Record(i)) for i in range(4)]
    assert all(h is not None for h in hs)
    hs[2].complete([2])  # type: ignore[union-attr]
    assert q.values() == [Record(0), Record(1), Record(2), Record(3)]
    hs[0].complete([0])  # type: ignore[union-attr]
    drain(q)
    remaining = q.values()
    assert Record(0) not in remaining
    assert remaining == [r for r in [Record(1), Record(2), Record(3)] if r in remaining]
    assert len(q) == len(remaining)


# -- ordered --------------------------------------------------------------------------------
def test_ordered_emits_only_the_completed_head() -> None:
    q = OrderedElementQueue(4)
    h1, h2, h3 = (q.try_put(Record(i)) for i in (1, 2, 3))
    assert h1 and h2 and h3
    h3.complete([3])
    h2.complete([2])
    assert not q.has_completed()
    h1.complete([1])
    assert drain(q) == [Record(1), Record(2), Record(3)]


def test_ordered_watermark_leaves_when_it_reaches_the_head() -> None:
    q = OrderedElementQueue(4)
    h1 = q.try_put(Record(1, 1))
    assert h1 is not None
    assert q.try_put(Watermark(1)) is not None  # takes a slot
    assert len(q) == 2
    assert not q.has_completed()
    h1.complete(["x"])
    assert drain(q) == [Record("x", 1), Watermark(1)]


# -- unordered, processing time ----------------------------------------------------------------
def test_unordered_emits_in_completion_order() -> None:
    q = UnorderedElementQueue(4)
    h1, h2, h3 = (q.try_put(Record(i)) for i in (1, 2, 3))
    assert h1 and h2 and h3
    h3.complete([3])
    h1.complete([1])
    assert drain(q) == [Record(3), Record(1)]
    h2.complete([2])
    assert drain(q) == [Record(2)]


def test_unordered_rejects_watermarks_naming_the_mode_to_use() -> None:
    q = UnorderedElementQueue(4)
    with pytest.raises(WatermarkNotSupportedError, match="WATERMARK_BOUNDED"):
        q.try_put(Watermark(5))
    assert q.is_empty()


# -- watermark-bounded ---------------------------------------------------------------------------
def test_bounded_records_never_cross_a_watermark() -> None:
    q = WatermarkBoundedElementQueue(10)
    h1, h2 = q.try_put(Record(1, 1)), q.try_put(Record(2, 2))
    assert q.try_put(Watermark(2)) is not None
    h3, h4 = q.try_put(Record(3, 3)), q.try_put(Record(4, 4))
    assert h1 and h2 and h3 and h4
    h4.complete([4])
    h3.complete([3])
    assert not q.has_completed()  # later records wait behind the watermark
    h2.complete([2])
    assert drain(q) == [Record(2, 2)]
    h1.complete([1])
    assert drain(q) == [Record(1, 1), Watermark(2), Record(4, 4), Record(3, 3)]
    assert q.is_empty()


def test_bounded_consecutive_watermarks_keep_their_order() -> None:
    q = WatermarkBoundedElementQueue(10)
    assert q.try_put(Watermark(1)) is not None  # first segment empty: reused
    assert q.try_put(Watermark(2)) is not None
    h = q.try_put(Record("r", 3))
    assert h is not None
    assert drain(q) == [Watermark(1), Watermark(2)]
    h.complete(["r"])
    assert drain(q) == [Record("r", 3)]


# -- properties ------------------------------------------------------------------------------------
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(0, 3)),  # number of results
        st.tuples(st.just("watermark"), st.just(0)),
        st.tuples(st.just("complete"), st.integers(0, 1000)),  # index into pending
    ),
    max_size=60,
)


def _simulate(kind: Callable[[int], ElementQueue], ops: list[tuple[str, int]]) -> None:
    q = kind(8)
    with_watermarks = kind is not UnorderedElementQueue
    pending: list[tuple[int, Any]] = []
    arrival: list[Any] = []  # inputs in arrival order (records by id, watermarks)
    completion: list[int] = []
    emitted: list[Any] = []
    n = 0
    wm = 0
    for op, arg in ops:
        if op == "record":
            rid = n
            h = q.try_put(Record((rid, arg), wm))
            if h is None:
                assert len(q) == 8
                continue
            n += 1
            pending.append((rid, h))
            arrival.append(("r", rid, arg))
        elif op == "watermark" and with_watermarks:
            if q.try_put(Watermark(wm + 1)) is not None:
                wm += 1
                arrival.append(("w", wm))
        elif op == "complete" and pending:
            rid, h = pending.pop(arg % len(pending))
            count = next(a for t, i, *rest in arrival if t == "r" and i == rid for a in rest)
            h.complete([(rid, j) for j in range(count)])
            completion.append(rid)
        emitted.extend(drain(q))
    for rid, h in pending:  # complete the rest in arrival order
        count = next(a for t, i, *rest in arrival if t == "r" and i == rid for a in rest)
        h.complete([(rid, j) for j in range(count)])
        completion.append(rid)
    emitted.extend(drain(q))
    assert q.is_empty()

    # nothing lost, nothing duplicated
    expected_records = sorted(
        (rid, j) for t, rid, *rest in (a for a in arrival if a[0] == "r") for j in range(rest[0])
    )
    got_records = sorted(e.value for e in emitted if isinstance(e, Record))
    assert got_records == expected_records
    assert [e for e in emitted if isinstance(e, Watermark)] == [
        Watermark(a[1]) for a in arrival if a[0] == "w"
    ]
    # results of one input stay together and in their own order
    order_of_inputs = []
    for e in emitted:
        if isinstance(e, Record) and (not order_of_inputs or order_of_inputs[-1] != e.value[0]):
            order_of_inputs.append(e.value[0])
    if kind is OrderedElementQueue:
        assert order_of_inputs == [a[1] for a in arrival if a[0] == "r" and a[2] > 0]
        # watermarks at their arrival position
        flat = [
            ("w", e.timestamp) if isinstance(e, Watermark) else ("r", e.value[0]) for e in emitted
        ]
        dedup = [x for i, x in enumerate(flat) if i == 0 or x != flat[i - 1]]
        assert dedup == [(a[0], a[1]) for a in arrival if a[0] == "w" or a[2] > 0]
    elif kind is UnorderedElementQueue:
        assert order_of_inputs == [rid for rid in completion if _count(arrival, rid) > 0]
    else:
        # no record crosses a watermark: each record is emitted after the
        # watermarks before it and before the watermarks after it
        for e_index, e in enumerate(emitted):
            if isinstance(e, Record):
                wms_before = [x.timestamp for x in emitted[:e_index] if isinstance(x, Watermark)]
                assert (max(wms_before) if wms_before else 0) == e.timestamp
        # between two watermarks: completion order
        segment_of = {e.value[0]: e.timestamp for e in emitted if isinstance(e, Record)}
        for seg in set(segment_of.values()):
            in_seg = [rid for rid in order_of_inputs if segment_of[rid] == seg]
            assert in_seg == [rid for rid in completion if segment_of.get(rid) == seg]


def _count(arrival: list[Any], rid: int) -> int:
    return next(a[2] for a in arrival if a[0] == "r" and a[1] == rid)


@settings(max_examples=150, deadline=None)
@given(ops=ops_strategy)
def test_ordered_property(ops: list[tuple[str, int]]) -> None:
    _simulate(OrderedElementQueue, ops)


@settings(max_examples=150, deadline=None)
@given(ops=ops_strategy)
def test_unordered_property(ops: list[tuple[str, int]]) -> None:
    _simulate(UnorderedElementQueue, ops)


@settings(max_examples=150, deadline=None)
@given(ops=ops_strategy)
def test_watermark_bounded_property(ops: list[tuple[str, int]]) -> None:
    _simulate(WatermarkBoundedElementQueue, ops)


def test_emits_on_arrival_follows_each_kinds_rule() -> None:
    o = OrderedElementQueue(4)
    assert o.emits_on_arrival()
    o.try_put(Record(1))
    assert not o.emits_on_arrival()  # a later result would wait for the head

    u = UnorderedElementQueue(4)
    h = u.try_put(Record(1))
    assert u.emits_on_arrival()  # completion order: nothing to wait for
    assert h is not None
    h.complete([1])
    assert not u.emits_on_arrival()  # a completed entry not yet emitted goes first
    drain(u)

    b = WatermarkBoundedElementQueue(4)
    b.try_put(Record(1))
    assert b.emits_on_arrival()
    b.try_put(Watermark(1))
    assert not b.emits_on_arrival()  # a new record would cross the watermark
