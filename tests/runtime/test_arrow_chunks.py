"""The columnar chunk path without Spark: ``async_invoke_arrow`` answers slices of Arrow batches."""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from asyncio_ops import (
    ArrowResult,
    AsyncFunction,
    AsyncOperatorError,
    AsyncRetryStrategy,
    AsyncTimeoutError,
    InvalidResultError,
    OutputMode,
    OutputSchemaError,
)
from asyncio_ops._keygroups import assign_to_key_group
from asyncio_ops._runtime import (
    ERROR_COLUMN,
    ERROR_TYPE,
    KEY_GROUP_COLUMN,
    LATE_COLUMN,
    PartitionSpec,
    TaskInfo,
    run_partition,
)
from asyncio_ops.async_retry_predicates import has_exception_predicate
from tests.runtime.specs import partition_spec


class Columnar(AsyncFunction[Any, Any]):
    """Answers a chunk with ``behave(batch)``; counts calls; per-row calls are a test failure."""

    def __init__(self, behave: Any) -> None:
        self.behave = behave
        self.chunks: list[list[int]] = []

    async def async_invoke(self, row: Any) -> Any:
        raise AssertionError("the per-row path must not be used with async_invoke_arrow")

    async def async_invoke_chunk(self, rows: Any) -> Any:
        raise AssertionError("async_invoke_arrow is preferred over async_invoke_chunk")

    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> Any:
        self.chunks.append(batch.column(0).to_pylist())
        result = self.behave(batch)
        if asyncio.iscoroutine(result):
            result = await result
        return result


def spec(fn: AsyncFunction[Any, Any], **kw: Any) -> PartitionSpec:
    fields = [pa.field("id", pa.int64()), pa.field("label", pa.string())]
    if kw.get("on_error") == "error_column":
        fields.append(pa.field(ERROR_COLUMN, ERROR_TYPE))
    defaults: dict[str, Any] = {
        "function": fn,
        "function_token": uuid.uuid4().hex,
        "mode": OutputMode.ORDERED,
        "timeout": 30.0,
        "capacity": 4,
        "retry": None,
        "output_schema": pa.schema(fields),
        "added_columns": ("label",),
        "chunk_size": 7,
        "batch_size": 25,
    }
    defaults.update(kw)
    return partition_spec(**defaults)


def batches(n: int, size: int = 30) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pydict({"id": pa.array(range(s, min(n, s + size)), pa.int64())})
        for s in range(0, n, size)
    ]


def run(s: PartitionSpec, n: int) -> list[dict[str, Any]]:
    out = list(run_partition(s, iter(batches(n)), TaskInfo()))
    assert all(b.schema == s.output_schema for b in out)
    assert all(b.num_rows <= s.batch_size for b in out)
    return [r for b in out for r in b.to_pylist()]


def label_all(batch: pa.RecordBatch) -> Any:
    return None, {"label": pc.cast(batch.column(0), pa.string())}


def test_every_row_once_in_order_with_random_latencies() -> None:
    rng = random.Random(7)

    async def slow(batch: pa.RecordBatch) -> Any:
        await asyncio.sleep(rng.random() / 200)
        return label_all(batch)

    fn = Columnar(slow)
    rows = run(spec(fn), 200)
    assert rows == [{"id": i, "label": str(i)} for i in range(200)]
    # chunks of 7 rows, cut inside each input batch (30 = 7+7+7+7+2, last 20 = 7+7+6)
    assert [len(c) for c in fn.chunks] == [7, 7, 7, 7, 2] * 6 + [7, 7, 6]
    assert sum(len(c) for c in fn.chunks) == 200


def test_unordered_loses_and_duplicates_nothing() -> None:
    rng = random.Random(3)

    async def slow(batch: pa.RecordBatch) -> Any:
        await asyncio.sleep(rng.random() / 100)
        return label_all(batch)

    rows = run(spec(Columnar(slow), mode=OutputMode.UNORDERED, capacity=8), 300)
    assert sorted(r["id"] for r in rows) == list(range(300))
    assert all(r["label"] == str(r["id"]) for r in rows)


def test_fan_out_and_drop_by_row_index() -> None:
    def odd_twice(batch: pa.RecordBatch) -> Any:
        ids = batch.column(0).to_pylist()
        index = [i for i, v in enumerate(ids) if v % 2 for _ in range(2)]
        return index, {"label": [f"{ids[i]}-{k % 2}" for k, i in enumerate(index)]}

    rows = run(spec(Columnar(odd_twice)), 40)
    assert rows == [{"id": i, "label": f"{i}-{k}"} for i in range(1, 40, 2) for k in (0, 1)]


def test_on_empty_keep_puts_rows_without_results_among_the_others_by_row() -> None:
    def backwards_with_gaps(batch: pa.RecordBatch) -> Any:
        ids = batch.column(0).to_pylist()
        # answers in reverse row order, two results for ids ending in 5, none for even ids
        index = [i for i in reversed(range(len(ids))) if ids[i] % 2
                 for _ in range(2 if ids[i] % 10 == 5 else 1)]  # fmt: skip
        return index, {"label": [f"{ids[i]}" for i in index]}

    rows = run(spec(Columnar(backwards_with_gaps), on_empty="keep"), 40)
    # rows in input order; a row's own results keep the function's order
    want = [{"id": i, "label": None if i % 2 == 0 else str(i)}
            for i in range(40) for _ in range(2 if i % 10 == 5 else 1)]  # fmt: skip
    assert rows == want


def test_columns_as_a_record_batch_and_a_missing_column_is_null() -> None:
    def as_batch(batch: pa.RecordBatch) -> Any:
        return pa.array(range(batch.num_rows)), pa.RecordBatch.from_pydict({})

    rows = run(spec(Columnar(as_batch)), 10)
    assert rows == [{"id": i, "label": None} for i in range(10)]


def test_values_are_cast_to_the_declared_type() -> None:
    def ints(batch: pa.RecordBatch) -> Any:
        return None, {"n": batch.column(0)}  # int64 into a declared int32

    s = spec(
        Columnar(ints),
        output_schema=pa.schema([pa.field("id", pa.int64()), pa.field("n", pa.int32())]),
        added_columns=("n",),
    )
    assert run(s, 9) == [{"id": i, "n": i} for i in range(9)]


@pytest.mark.parametrize(
    ("result", "error", "message"),
    [
        ((1, 2, 3), InvalidResultError, r"must return \(row_index, columns\)"),
        (([0, 99], {"label": ["a", "b"]}), InvalidResultError, r"row_index values 0\.\.99"),
        (([0, None], {"label": ["a", "b"]}), InvalidResultError, "bad row_index"),
        (([0, 1], {"label": ["a"]}), InvalidResultError, "has 1 values but row_index has 2"),
        (([0], {"other": ["a"]}), OutputSchemaError, r"\['other'\] are not in output_schema"),
        (([0], {"label": [{"x": 1}]}), OutputSchemaError, r"'label' \(string\) cannot hold"),
        (([0], ["label"]), InvalidResultError, "as a RecordBatch, Table or mapping"),
    ],
)
def test_bad_results_are_errors_naming_the_chunk(result: Any, error: type, message: str) -> None:
    with pytest.raises((AsyncOperatorError, OutputSchemaError), match=message) as info:
        run(spec(Columnar(lambda batch: result)), 10)
    chunk = "for input a chunk of 7 rows starting with row {'id': 0}"
    if error is OutputSchemaError:  # the lookup worked: a schema error, under its own name
        assert type(info.value) is OutputSchemaError
        assert f"does not fit the output schema, {chunk}" in str(info.value)
        assert "lookup failed" not in str(info.value)
    else:
        assert type(info.value) is AsyncOperatorError
        assert f"failed {chunk}" in str(info.value)
    assert isinstance(info.value.__cause__, error)


@pytest.mark.parametrize("columnar", [True, False])
def test_a_decimal_too_wide_for_its_column_is_a_schema_error_naming_sparks_type(
    columnar: bool,
) -> None:
    """decimal(5,2) holds at most 999.99: 1234.5 is refused, as a schema error (not a failed
    lookup) that names the column's type as the user declared it in Spark, not Arrow's."""
    from decimal import Decimal

    class Prices(Columnar):
        async def async_invoke(self, row: Any) -> Any:
            return [{"price": Decimal("1234.5") if row["id"] == 3 else Decimal("1.25")}]

    def prices(batch: pa.RecordBatch) -> Any:
        values = [Decimal("1234.5") if i == 3 else Decimal("1.25") for i in range(batch.num_rows)]
        return None, {"price": values}

    schema = pa.schema([pa.field("id", pa.int64()), pa.field("price", pa.decimal128(5, 2))])
    s = spec(
        Prices(prices), output_schema=schema, added_columns=("price",),
        chunk_size=7 if columnar else None,
    )  # fmt: skip
    with pytest.raises(OutputSchemaError) as info:
        run(s, 10)
    message = str(info.value)
    assert type(info.value) is OutputSchemaError
    assert "output column 'price' (decimal(5,2)) cannot hold" in message, message
    assert "1234.5" in message and "decimal128" not in message, message
    assert "lookup failed" not in message, message


def test_a_timed_out_chunk_becomes_error_rows() -> None:
    async def hang_second(batch: pa.RecordBatch) -> Any:
        if batch.column(0)[0].as_py() == 7:
            await asyncio.sleep(3600)
        return label_all(batch)

    # healthy chunks finish in ms; the timeout leaves them a margin on a loaded machine
    rows = run(spec(Columnar(hang_second), timeout=2.0, on_error="error_column"), 20)
    assert [r["id"] for r in rows] == list(range(20))
    failed = [r for r in rows if r[ERROR_COLUMN] is not None]
    assert [r["id"] for r in failed] == list(range(7, 14))
    assert all(r["label"] is None for r in failed)
    # each row of the chunk timed out as itself: the function's timeout(row) answered it
    for r in failed:
        assert r[ERROR_COLUMN]["exception"] == "AsyncTimeoutError"
        assert f"timed out for input: {{'id': {r['id']}}}" in r[ERROR_COLUMN]["message"]
    assert all(
        r[ERROR_COLUMN] is None and r["label"] == str(r["id"]) for r in rows if r not in failed
    )


def test_a_timed_out_chunk_fails_the_partition_by_default() -> None:
    async def hang(batch: pa.RecordBatch) -> Any:
        await asyncio.sleep(3600)

    with pytest.raises(AsyncOperatorError, match=r"input row \{'id': 0\} failed") as info:
        run(spec(Columnar(hang), timeout=0.1), 10)
    assert "(and 6 more row(s) of its chunk)" in str(info.value)
    assert isinstance(info.value.__cause__, AsyncTimeoutError)


class AnswersTimeouts(Columnar):
    """Hangs every chunk; its own timeout() answers even rows, fails odd ones."""

    def __init__(self) -> None:
        super().__init__(self.hang)
        self.timed_out: list[int] = []

    async def hang(self, batch: pa.RecordBatch) -> Any:
        await asyncio.sleep(3600)

    def timeout(self, row: Any) -> Any:
        self.timed_out.append(row["id"])
        if row["id"] % 2:
            raise LookupError(f"no default for {row['id']}")
        return [{"label": "default"}]


def test_a_timed_out_chunk_asks_the_functions_timeout_row_by_row() -> None:
    fn = AnswersTimeouts()
    rows = run(spec(fn, timeout=0.05, on_error="error_column"), 10)
    assert sorted(fn.timed_out) == list(range(10))
    assert [r["id"] for r in rows] == list(range(10))  # in row order, each row once
    for r in rows:
        if r["id"] % 2:
            assert r["label"] is None
            assert r[ERROR_COLUMN]["exception"] == "LookupError"
            assert r[ERROR_COLUMN]["message"] == f"no default for {r['id']}"
        else:
            assert (r["label"], r[ERROR_COLUMN]) == ("default", None)

    with pytest.raises(AsyncOperatorError, match=r"input row \{'id': 1\} failed: LookupError"):
        run(spec(AnswersTimeouts(), timeout=0.05), 10)


def fails_odd_rows(batch: pa.RecordBatch) -> Any:
    """Even rows answered, odd rows failed alone (as an ambiguous key is)."""
    ids = batch.column(0).to_pylist()
    even = [i for i, v in enumerate(ids) if v % 2 == 0]
    errors = {i: KeyError(f"row {v} is odd") for i, v in enumerate(ids) if v % 2}
    return ArrowResult(even, {"label": [str(ids[i]) for i in even]}, errors)


@pytest.mark.parametrize("on_empty", ["drop", "keep"])
def test_rows_an_arrow_result_fails_are_error_rows_alone(on_empty: str) -> None:
    rows = run(spec(Columnar(fails_odd_rows), on_error="error_column", on_empty=on_empty), 16)
    assert [r["id"] for r in rows] == list(range(16))  # failed rows are not also kept
    for r in rows:
        if r["id"] % 2:
            assert r["label"] is None
            assert r[ERROR_COLUMN] == {
                "exception": "KeyError", "message": f"'row {r['id']} is odd'", "attempts": 1,
            }  # fmt: skip
        else:
            assert (r["label"], r[ERROR_COLUMN]) == (str(r["id"]), None)


def test_a_row_an_arrow_result_fails_fails_the_partition_naming_it() -> None:
    with pytest.raises(AsyncOperatorError, match=r"input row \{'id': 1\} failed: KeyError") as info:
        run(spec(Columnar(fails_odd_rows)), 16)
    assert "(and 2 more row(s) of its chunk)" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("errors", "message"),
    [
        ({7: KeyError("x")}, r"rows 0\.\.6 of the chunk to exceptions"),
        ({0: "not an exception"}, "to exceptions"),
        ({1: KeyError("x")}, "answers a row in row_index that errors fails"),
    ],
)
def test_bad_arrow_result_errors_are_errors(errors: Any, message: str) -> None:
    result = ArrowResult([0, 1], {"label": ["a", "b"]}, errors)
    with pytest.raises(AsyncOperatorError) as info:
        run(spec(Columnar(lambda b: result)), 10)
    assert isinstance(info.value.__cause__, InvalidResultError)
    assert re.search(message, str(info.value.__cause__))


def test_a_failed_chunk_is_retried_as_a_whole() -> None:
    failures = {0: 2}

    def flaky(batch: pa.RecordBatch) -> Any:
        first = batch.column(0)[0].as_py()
        if failures.get(first, 0) > 0:
            failures[first] -= 1
            raise ConnectionError(f"flaky at {first}")
        return label_all(batch)

    fn = Columnar(flaky)
    retry = AsyncRetryStrategy.fixed_delay(3, 10, exception_predicate=has_exception_predicate)
    rows = run(spec(fn, retry=retry), 14)
    assert rows == [{"id": i, "label": str(i)} for i in range(14)]
    assert sorted(c[0] for c in fn.chunks) == [0, 0, 0, 7]  # the first chunk three times


def test_with_an_error_column_a_malformed_answer_is_error_rows_a_schema_misfit_fails() -> None:
    def malformed_first(batch: pa.RecordBatch) -> Any:
        if batch.column(0)[0].as_py() == 0:
            return [0, 99], {"label": ["a", "b"]}
        return label_all(batch)

    rows = run(spec(Columnar(malformed_first), on_error="error_column"), 10)
    assert [r["id"] for r in rows] == list(range(10))
    assert [r[ERROR_COLUMN]["exception"] for r in rows[:7]] == ["InvalidResultError"] * 7
    assert all(r[ERROR_COLUMN] is None for r in rows[7:])

    # a schema misfit is no failed lookup: it fails, under its own name
    with pytest.raises(OutputSchemaError, match=r"\['other'\] are not in output_schema") as info:
        run(spec(Columnar(lambda b: ([0], {"other": ["x"]})), on_error="error_column"), 10)
    assert "does not fit the output schema, for input a chunk of 7 rows" in str(info.value)
    assert isinstance(info.value.__cause__, OutputSchemaError)


# -- checkpoints: a retried attempt replays completed chunks -------------------------------------
class Rows(AsyncFunction[Any, Any]):
    """Answers chunks of row dicts; fails once at the chunk holding ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.chunks: list[list[int]] = []

    async def async_invoke(self, row: Any) -> Any:
        raise AssertionError("the per-row path must not be used with async_invoke_chunk")

    async def async_invoke_chunk(self, rows: Any) -> Any:
        ids = [r["id"] for r in rows]
        self.chunks.append(ids)
        if self.fail_at in ids:
            self.fail_at = None
            raise RuntimeError(f"boom in the chunk of {ids[0]}")
        await asyncio.sleep(0)
        return [[{"label": f"r{i}"}, {"label": f"s{i}"}] if i % 5 == 0 else [{"label": f"r{i}"}]
                for i in ids]  # fmt: skip


def _fails_once_columnar(at: int) -> Columnar:
    state = {"failed": False}

    def behave(batch: pa.RecordBatch) -> Any:
        ids = batch.column(0).to_pylist()
        if at in ids and not state["failed"]:
            state["failed"] = True
            raise RuntimeError(f"boom in the chunk of {ids[0]}")
        keep = [i for i, v in enumerate(ids) if v % 4 != 0]  # drops some rows: a filter
        return keep, {"label": [f"c{ids[i]}" for i in keep]}

    return Columnar(behave)


@pytest.mark.parametrize("kind", ["rows", "arrow"])
def test_a_retried_attempt_replays_completed_chunks(tmp_path: Any, kind: str) -> None:
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    fn: Any = Rows(fail_at=150) if kind == "rows" else _fails_once_columnar(150)
    s = spec(fn, checkpoint=CheckpointStorage(str(tmp_path), "op"), checkpoint_version=3,
             checkpoint_flush_rows=2, capacity=2)  # fmt: skip
    with pytest.raises(AsyncOperatorError, match="boom in the chunk of 150"):
        run(s, 300)
    first = list(fn.chunks)
    fn.chunks.clear()
    out = list(run_partition(s, iter(batches(300)), TaskInfo(attempt_number=1)))
    rows = [r for b in out for r in b.to_pylist()]
    if kind == "rows":
        expected = [
            {"id": i, "label": lab}
            for i in range(300) for lab in ([f"r{i}", f"s{i}"] if i % 5 == 0 else [f"r{i}"])
        ]  # fmt: skip
    else:
        expected = [{"id": i, "label": f"c{i}"} for i in range(300) if i % 4]
    assert rows == expected  # in order, fan-out and filtered rows as the first time
    done_before = [c for c in first if 150 not in c]
    # the chunks completed by the failed attempt were logged (checkpoint_flush_rows=2, and at the
    # failure) and are not requested again; the failed one and the rest are
    assert not set(map(tuple, done_before)) & set(map(tuple, fn.chunks))
    assert fn.chunks[0][0] == 150 and fn.chunks[-1][-1] == 299


def test_a_replay_log_of_another_element_kind_is_not_served(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt retried with another element kind (rows, then columnar chunks) requests
    every lookup again instead of reading the rows' log as chunks."""
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    fn = HangsOnceAnyPath()
    fn.seen.update(range(300))  # nothing hangs
    storage = CheckpointStorage(str(tmp_path), "op")
    per_row = spec(
        fn, checkpoint=storage, checkpoint_version=2, chunk_size=None, checkpoint_flush_rows=5
    )
    assert len(run(per_row, 60)) == 60  # its replay log holds 60 rows' lookups
    fn = _fails_once_columnar(10_000)  # never fails; counts its chunks
    columnar = spec(fn, checkpoint=storage, checkpoint_version=2)
    with caplog.at_level("WARNING", logger="asyncio_ops.runtime"):
        out = list(run_partition(columnar, iter(batches(60)), TaskInfo(attempt_number=1)))
    assert [r for b in out for r in b.to_pylist()] == [
        {"id": i, "label": f"c{i}"} for i in range(60) if i % 4
    ]
    assert sum(len(c) for c in fn.chunks) == 60  # every row requested again
    assert "written for elements of another kind" in caplog.text


def test_a_chunk_whose_input_changed_is_requested_again(tmp_path: Any) -> None:
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    fn = _fails_once_columnar(10_000)  # never fails
    s = spec(fn, checkpoint=CheckpointStorage(str(tmp_path), "op"), checkpoint_version=1)
    run(s, 60)
    fn.chunks.clear()
    changed = batches(60)
    ids = [30, 31, 32, 1000, *range(34, 60)]
    changed[1] = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})
    out = list(run_partition(s, iter(changed), TaskInfo(attempt_number=1)))
    assert fn.chunks == [[30, 31, 32, 1000, 34, 35, 36]]  # the only chunk that differs
    got = [r["id"] for b in out for r in b.to_pylist()]
    assert got == [i for i in [*range(30), *ids] if i % 4]


class HangsOnceChunks(AsyncFunction[Any, Any]):
    """A chunk holding a multiple of 40 hangs on its first request; both chunk forms."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    async def async_invoke(self, row: Any) -> Any:
        raise AssertionError("chunks only")

    async def _hang_once(self, ids: list[int]) -> None:
        slow = [i for i in ids if i % 40 == 0 and i not in self.seen]
        self.seen.update(slow)
        if slow:
            await asyncio.Event().wait()
        await asyncio.sleep(0)

    async def async_invoke_chunk(self, rows: Any) -> Any:
        ids = [r["id"] for r in rows]
        await self._hang_once(ids)
        return [[{"label": f"r{i}"}] for i in ids]


class HangsOnceArrow(HangsOnceChunks):
    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> Any:
        ids = batch.column(0).to_pylist()
        await self._hang_once(ids)
        return None, {"label": [f"r{i}" for i in ids]}


@pytest.mark.parametrize("cls", [HangsOnceChunks, HangsOnceArrow], ids=["rows", "arrow"])
def test_chunks_in_flight_are_carried_to_the_next_micro_batch(
    tmp_path: Any, cls: type[HangsOnceChunks]
) -> None:
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    fn = cls()
    s = spec(
        fn,
        checkpoint=CheckpointStorage(str(tmp_path), "op"),
        drain_timeout=2.0,
        mode=OutputMode.UNORDERED,
        capacity=20,
    )  # fmt: skip (healthy chunks: a margin)
    first = [r for b in run_partition(s, iter(batches(90)), TaskInfo(batch_id=0))
             for r in b.to_pylist()]  # fmt: skip
    hung = {i for c in ([0, 7], [37, 44], [74, 81]) for i in range(*c)}  # chunks of 0, 40, 80
    assert sorted(r["id"] for r in first) == sorted(set(range(90)) - hung)
    second = [r for b in run_partition(s, iter(batches(0)), TaskInfo(batch_id=1))
              for r in b.to_pylist()]  # fmt: skip
    assert sorted(r["id"] for r in second) == sorted(hung)  # each row once, in its chunk
    assert all(r["label"] == f"r{r['id']}" for r in first + second)


class HangsOnceAnyPath(HangsOnceArrow):
    """Rows and Arrow chunks alike: a row or chunk holding row 0 hangs on its first request."""

    async def async_invoke(self, row: Any) -> Any:
        await self._hang_once([row["id"]])
        return [{"label": f"r{row['id']}"}]


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
@pytest.mark.parametrize(("before", "after"), [(None, 7), (7, None), (7, 4)])
def test_elements_carried_over_change_kind_with_the_operator(
    tmp_path: Any, mode: OutputMode, before: int | None, after: int | None
) -> None:
    """A streaming query restarted with another element kind (it became columnar, or
    chunk_size changed) restores what the last micro-batch carried over: every row
    once, the completed ones with their results, the pending ones requested again."""
    from asyncio_ops._storage._checkpoint_storage import CheckpointStorage

    storage = CheckpointStorage(str(tmp_path), "op")
    kw = {"checkpoint": storage, "drain_timeout": 2.0, "mode": mode, "capacity": 20}
    fn = HangsOnceAnyPath()
    first = [r for b in run_partition(spec(fn, chunk_size=before, **kw), iter(batches(15)),
                                      TaskInfo(batch_id=0)) for r in b.to_pylist()]  # fmt: skip
    fn.seen.clear()  # a new worker: the carried-over request is made again, and answered
    fn.seen.add(0)
    second = [r for b in run_partition(spec(fn, chunk_size=after, **kw), iter(batches(0)),
                                       TaskInfo(batch_id=1)) for r in b.to_pylist()]  # fmt: skip
    ids = [r["id"] for r in first + second]
    assert sorted(ids) == list(range(15))  # every row once
    assert all(r["label"] == f"r{r['id']}" for r in first + second)
    if mode is OutputMode.ORDERED:  # row 0 held everything behind it: all carried, in order
        assert first == [] and [r["id"] for r in second] == list(range(15))


# -- chunks with a key and with event time ----------------------------------------------------
MAXP = 8


class Tagged(AsyncFunction[Any, Any]):
    """Answers chunks (rows or Arrow) after a random pause; records each chunk's ids."""

    def __init__(self, seed: int = 3) -> None:
        self.rng = random.Random(seed)
        self.chunks: list[list[int]] = []
        self.groups: list[set[int]] = []

    async def async_invoke(self, row: Any) -> Any:
        await asyncio.sleep(self.rng.random() / 500)
        return [{"label": f"x{row['id']}"}]

    async def async_invoke_chunk(self, rows: Any) -> Any:
        self.chunks.append([r["id"] for r in rows])
        self.groups.append({r.get(KEY_GROUP_COLUMN) for r in rows})
        await asyncio.sleep(self.rng.random() / 500)
        return [[{"label": f"x{r['id']}"}] for r in rows]


class TaggedArrow(Tagged):
    async def async_invoke_chunk(self, rows: Any) -> Any:
        raise AssertionError("async_invoke_arrow is preferred")

    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> Any:
        ids = batch.column("id").to_pylist()
        self.chunks.append(ids)
        if KEY_GROUP_COLUMN in batch.schema.names:
            self.groups.append(set(batch.column(KEY_GROUP_COLUMN).to_pylist()))
        await asyncio.sleep(self.rng.random() / 500)
        return None, {"label": [f"x{i}" for i in ids]}


def keyed_spec(fn: AsyncFunction[Any, Any], **kw: Any) -> PartitionSpec:
    fields = [pa.field("id", pa.int64()), pa.field("k", pa.int64()), pa.field("ts", pa.float64())]
    if kw.get("key"):
        fields.append(pa.field(KEY_GROUP_COLUMN, pa.int32()))
    fields.append(pa.field("label", pa.string()))
    if kw.get("event_time"):
        fields.append(pa.field(LATE_COLUMN, pa.bool_()))
    defaults: dict[str, Any] = {
        "function": fn,
        "function_token": uuid.uuid4().hex,
        "mode": OutputMode.UNORDERED,
        "timeout": 30.0,
        "capacity": 6,
        "retry": None,
        "output_schema": pa.schema(fields),
        "added_columns": ("label",),
        "chunk_size": 5,
        "batch_size": 40,
        "max_parallelism": MAXP,
    }
    defaults.update(kw)
    return partition_spec(**defaults)


def keyed_batches(n: int, keyed: bool, size: int = 37) -> list[pa.RecordBatch]:
    """Rows ``id``, key ``k`` (7 keys), an event time ``ts`` running ahead with some late rows."""
    rng = random.Random(5)
    out = []
    for s in range(0, n, size):
        ids = list(range(s, min(n, s + size)))
        cols: dict[str, Any] = {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % 7 for i in ids], pa.int64()),
            # mostly increasing, every 9th row 30 s behind: late once the watermark passed it
            "ts": pa.array([float(i) - (30 if i % 9 == 0 else rng.random()) for i in ids]),
        }
        if keyed:
            cols[KEY_GROUP_COLUMN] = pa.array(
                [assign_to_key_group(i % 7, MAXP) for i in ids], pa.int32()
            )
        out.append(pa.RecordBatch.from_pydict(cols))
    return out


def run_keyed(s: PartitionSpec, n: int) -> list[dict[str, Any]]:
    out = list(run_partition(s, iter(keyed_batches(n, bool(s.key))), TaskInfo()))
    return [r for b in out for r in b.to_pylist()]


@pytest.mark.parametrize("cls", [Tagged, TaggedArrow])
def test_keyed_chunks_hold_one_key_group_and_keep_each_keys_order(cls: type[Tagged]) -> None:
    fn = cls()
    rows = run_keyed(keyed_spec(fn, key=("k",)), 200)
    assert sorted(r["id"] for r in rows) == list(range(200))  # every row once
    assert all(r["label"] == f"x{r['id']}" for r in rows)
    assert all(len(g) == 1 for g in fn.groups) and len(fn.groups) == len(fn.chunks)
    assert all(1 <= len(c) <= 5 for c in fn.chunks)
    # unordered across keys, but each key's rows leave in input order
    for k in range(7):
        ids = [r["id"] for r in rows if r["k"] == k]
        assert ids == sorted(ids), k


@pytest.mark.parametrize("cls", [Tagged, TaggedArrow])
@pytest.mark.parametrize("late_records", ["keep", "drop"])
@pytest.mark.parametrize("keyed", [False, True])
def test_event_time_chunks_mark_late_rows_as_row_mode_does(
    cls: type[Tagged], late_records: str, keyed: bool
) -> None:
    kw: dict[str, Any] = {
        "event_time": "ts", "watermark_delay": 2.0, "watermark_interval": 10,
        "late_records": late_records, "mode": OutputMode.WATERMARK_BOUNDED,
    }  # fmt: skip
    if keyed:
        kw["key"] = ("k",)
    chunked = run_keyed(keyed_spec(cls(), **kw), 300)
    per_row = run_keyed(keyed_spec(Tagged(), chunk_size=None, **kw), 300)
    # the same rows, each with the lateness it had on arrival, as the row path decides it
    assert sorted((r["id"], r[LATE_COLUMN]) for r in chunked) == sorted(
        (r["id"], r[LATE_COLUMN]) for r in per_row
    )
    late = {r["id"] for r in per_row if r[LATE_COLUMN]}
    if late_records == "drop":
        assert not late and len(chunked) < 300  # the late rows are gone in both
    else:
        assert late and len(chunked) == 300


@pytest.mark.parametrize("cls", [Tagged, TaggedArrow])
def test_event_time_chunks_never_span_a_watermark(cls: type[Tagged]) -> None:
    fn = cls()
    s = keyed_spec(fn, event_time="ts", watermark_interval=10, mode=OutputMode.WATERMARK_BOUNDED)
    run_keyed(s, 120)
    # a watermark follows every 10th row kept (none dropped here): no chunk crosses one
    kept = 0
    for chunk in fn.chunks:
        assert kept // 10 == (kept + len(chunk) - 1) // 10, (kept, chunk)
        kept += len(chunk)
    assert kept == 120
