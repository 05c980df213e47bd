"""The carry-over of a micro-batch: keyed, a table of elements per key group (deadlines
inside); unkeyed, operator list state; watermarks as union state; typed, never pickled.
Key groups written as keyed state and timers by earlier releases still restore."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncio_ops import CheckpointError, CorruptCheckpointError, OutputSchemaError
from asyncio_ops._runtime._inflight import CarryOver, WatermarkState, snapshot_operator_state
from asyncio_ops._runtime._stored import (
    ARROW,
    ROW,
    ROWS,
    ElementBatchSerializer,
    ElementSerializer,
    StoredElement,
)
from asyncio_ops._runtime._versions import split_shared
from asyncio_ops._storage._container import DELTA, FULL, SHARED, Section
from asyncio_ops.state import KeyGroupRange, assign_to_key_group

from .earlier_releases import keyed_carry_over_as_earlier_releases_wrote

IN = pa.schema([("id", pa.int64()), ("name", pa.string())])
OUT = pa.schema([("score", pa.float64())])
ALL = KeyGroupRange(0, 127)


def element(
    seq: int, *, kind: str = ROW, deadline: float | None = 100.0, **kw: Any
) -> StoredElement:
    row: Any = {"id": seq, "name": f"n{seq}"}
    late: Any = False
    if kind != ROW:
        row, late = [row, {"id": seq + 1000, "name": None}], [False, True]
    fields = dict(
        partition=0, seq=seq, after_watermark=-math.inf, row=row, timestamp=float(seq),
        late=late, results=None, attempts=1, deadline=deadline,
    )  # fmt: skip
    fields.update(kw)
    return StoredElement(**fields)


@pytest.mark.parametrize("kind", [ROW, ROWS, ARROW])
def test_elements_round_trip_typed(kind: str) -> None:
    """Elements of every kind are one typed record batch (an Arrow message without its
    schema) and come back equal."""
    ser = ElementSerializer(kind, OUT, IN)
    batches = ElementBatchSerializer(ser)
    todo = [element(3, kind=kind, results=[{"score": 1.5}, {"score": None}], deadline=None),
            element(4, kind=kind, deadline=12.5)]  # fmt: skip
    data = batches.dumps(batches.to_batch(todo, deadlines=True))
    batch = pa.ipc.read_record_batch(pa.py_buffer(data), ser.schema)  # an Arrow message
    assert batch.num_rows == 2 and batch.schema.field("row").type == ser.schema.field("row").type
    assert batches.elements(batches.table([batches.loads(data)])) == todo


def test_bytes_that_are_not_elements_are_refused() -> None:
    batches = ElementBatchSerializer(ElementSerializer(ROW, OUT, IN))
    with pytest.raises(CheckpointError, match=r"in-flight elements are not a record batch of"):
        batches.loads(b"\x80\x05not arrow at all")
    chunks = ElementBatchSerializer(ElementSerializer(ROWS, OUT, IN))
    other = chunks.dumps(chunks.to_batch([element(1, kind=ROWS)], deadlines=True))
    with pytest.raises(CheckpointError, match=r"in-flight elements are not a record batch of"):
        batches.loads(other)


def test_an_output_that_the_schema_cannot_hold_names_the_value() -> None:
    ser = ElementSerializer(ROW, OUT, IN)
    with pytest.raises(OutputSchemaError, match=r"carried-over result .*'not a number'"):
        ser.check(element(1, results=[{"score": "not a number"}]))
    batches = ElementBatchSerializer(ser)
    with pytest.raises(OutputSchemaError, match=r"carried-over result .*'not a number'"):
        batches.to_batch([element(0), element(1, results=[{"score": "not a number"}])],
                         deadlines=True)  # fmt: skip


def _split(
    sections: dict[int, Section], name: str = "/ck/kg-p00000-a.ckpt"
) -> list[tuple[str, Section]]:
    """``(file, section)`` per key group, as earlier releases wrote them (a section per
    key group), from the one section: its rows grouped by key group (a stable sort)."""
    (shared,) = {id(s): s for s in sections.values()}.values()
    table = shared.table
    grouped = table.take(pc.sort_indices(table.column("key_group")))
    return [(name, one) for one in split_shared(Section(SHARED, grouped), name)]


def snapshot(carry: CarryOver, pairs: list[tuple[int, StoredElement]]) -> dict[int, Section]:
    """``carry``'s keyed sections of ``(key group, element)`` pairs."""
    return carry.snapshot_keyed([e for _, e in pairs], [kg for kg, _ in pairs])


def test_keyed_elements_and_deadlines_follow_the_spark_key_group() -> None:
    """Each element is filed under the key group Spark computed (not the core hash),
    its deadline travels with it, and a partition owning only that group gets exactly
    its elements and deadlines back."""
    spark_kg = (assign_to_key_group(7, 128) + 3) % 128
    other_kg = (spark_kg + 1) % 128
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    done = element(2, results=[{"score": 2.0}], deadline=None)
    sections = snapshot(
        carry,
        [(spark_kg, element(1, deadline=50.0)), (spark_kg, done), (other_kg, element(3))],
    )
    assert sorted(sections) == sorted([spark_kg, other_kg])
    mine = KeyGroupRange(spark_kg, spark_kg)
    only = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=mine)
    got = only.batches.elements(only.restore_keyed(_split(sections)))
    assert got == [element(1, deadline=50.0), done]


def test_a_partitions_elements_are_one_shared_section() -> None:
    """All key groups of a partition share one section (tag SHARED), the elements in
    their given (queue) order with their key group as a column; grouped by key group
    and split, each key group's rows in order."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    todo = [((i * 7) % 128, element(i)) for i in range(20)]
    sections = snapshot(carry, todo)
    assert len({id(s) for s in sections.values()}) == 1
    (section,) = {id(s): s for s in sections.values()}.values()
    assert section.tag == SHARED and section.part == FULL
    assert section.table.column("key_group").to_pylist() == [kg for kg, _ in todo]
    assert section.table.column("seq").to_pylist() == list(range(20))
    split = _split(sections)
    assert [s.tag for _, s in split] == sorted(sections)
    assert all(s.table.schema.equals(carry.batches.schema) for _, s in split)


def test_a_key_group_section_that_is_not_a_table_of_elements_is_named() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    ((_, sec),) = _split(snapshot(carry, [(5, element(1))]))
    chunks = CarryOver(ElementSerializer(ROWS, OUT, IN), max_parallelism=128, key_groups=ALL)
    batch = chunks.batches.to_batch([element(1, kind=ROWS)], deadlines=True)
    named = r"checkpoint file /ck/kg-p00000-a\.ckpt: key group 5"
    for bad in (Section(5, pa.Table.from_batches([batch])), Section(5, sec.table, DELTA)):
        with pytest.raises(CheckpointError, match=named):
            carry.restore_keyed([("/ck/kg-p00000-a.ckpt", bad)])
    rows = pa.Table.from_batches([batch])
    shared = r"checkpoint file /ck/kg-p00000-a\.ckpt: in-flight elements of several key groups"
    with pytest.raises(CheckpointError, match=shared + " without"):
        carry.restore_keyed([("/ck/kg-p00000-a.ckpt", Section(SHARED, rows))])
    kgs = pa.array([5], pa.int32())
    as_chunks = rows.append_column("key_group", kgs)
    whole = r"checkpoint file /ck/kg-p00000-a\.ckpt: the section of several key groups is not"
    with pytest.raises(CheckpointError, match=whole + " a table of in-flight"):
        carry.restore_keyed([("/ck/kg-p00000-a.ckpt", Section(SHARED, as_chunks))])


def test_a_shared_section_without_sorted_key_groups_is_named() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    sections = snapshot(carry, [(5, element(1)), (6, element(2))])
    table = sections[5].table
    where = "/ck/kg-p00001-b.ckpt"
    unsorted = table.take([1, 0])
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00001-b\.ckpt: .* not sorted"):
        split_shared(Section(SHARED, unsorted), where)
    without = table.drop_columns(["key_group"])
    with pytest.raises(CorruptCheckpointError, match=r"kg-p00001-b\.ckpt: .* without an int32"):
        split_shared(Section(SHARED, without), where)


def test_unkeyed_elements_split_evenly_and_earlier_files_watermarks_are_the_maximum() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    olds = [
        carry.snapshot_operator(0, 2, [element(1), element(2)]),
        carry.snapshot_operator(1, 2, [element(3, partition=1)]),
    ]
    parts = [_restored(carry, i, 3, _named(olds)) for i in range(3)]
    assert {p[0] for p in parts} == {WatermarkState()}  # the watermarks: in the manifests
    assert [[e.seq for e in p[1]] for p in parts] == [[1], [2], [3]]
    assert parts[0][1][0].deadline == 100.0  # unkeyed: the deadline travels in the element

    def batch(elements: list[StoredElement]) -> bytes:
        return carry.batches.dumps(carry.batches.to_batch(elements, deadlines=True))

    # an earlier release's files: the watermark state (union) beside the elements
    earlier = [
        snapshot_operator_state(0, 2, WatermarkState(10.0, 5.0), batch([element(1), element(2)])),
        snapshot_operator_state(1, 2, WatermarkState(30.0, 20.0), batch([element(3, partition=1)])),
    ]
    parts = [_restored(carry, i, 3, _named(earlier)) for i in range(3)]
    assert {p[0] for p in parts} == {WatermarkState(30.0, 20.0)}
    assert [[e.seq for e in p[1]] for p in parts] == [[1], [2], [3]]


def test_a_key_group_of_many_elements_is_one_table() -> None:
    """300 elements of one key group are 300 rows of the section, with their deadlines
    as a column, and come back as written."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    todo = [element(i, deadline=1000.0 + i if i % 3 else None) for i in range(300)]
    sections = snapshot(carry, [(9, e) for e in todo])
    assert list(sections) == [9]
    ((_, one),) = _split(sections)
    assert one.table.num_rows == 300 and one.table.schema.equals(carry.batches.schema)
    assert one.table.column("deadline").null_count == 100
    assert carry.batches.elements(carry.restore_keyed(_split(sections))) == todo


def test_rescale_moves_the_elements_by_key_group() -> None:
    """Written by one partition owning 0..127, read by two owning 0..63 and 64..127:
    each gets exactly the elements of its key groups, from the section whole (as a
    restore reads it) or split by key group (as ``read_state`` does)."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    todo = [((i * 7) % 128, element(i, deadline=50.0 + i)) for i in range(256)]
    sections = snapshot(carry, todo)
    (whole,) = {id(s): s for s in sections.values()}.values()
    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
    for half in halves:
        part = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=half)
        want = [e for kg, e in todo if kg in half]
        for read in (_split(sections, "f"), [("f", whole)]):
            got = part.batches.elements(part.restore_keyed(read))
            assert sorted(got, key=lambda e: e.seq) == want


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_key_groups_written_as_keyed_state_by_earlier_releases_still_restore(
    backend: str,
) -> None:
    """Earlier releases wrote a key group's elements as one value of keyed state under
    the key group's own key and their deadlines as timers (kind KEY_GROUPS): read back
    with their deadlines, in both backends; a damaged value names the file."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL,
                      state_backend=backend)  # fmt: skip
    todo = [((i * 7) % 128, element(i, deadline=1000.0 + i if i % 3 else None))
            for i in range(200)]  # fmt: skip
    sections = keyed_carry_over_as_earlier_releases_wrote(carry, todo)
    table = carry.restore_keyed_state([("f", sec) for sec in sections.values()])
    got = carry.batches.elements(table)
    assert sorted(got, key=lambda e: e.seq) == [e for _, e in todo]
    kg, sec = next(iter(sections.items()))
    rows = sec.table.to_pylist()
    rows[0]["value"] = b"not a record batch"
    bad = Section(kg, pa.Table.from_pylist(rows, schema=sec.table.schema))
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/kg-p00000-a\.ckpt: "):
        carry.restore_keyed_state([("/ck/kg-p00000-a.ckpt", bad)])


def test_a_corrupt_element_batch_is_an_error_naming_the_file() -> None:
    """A batch whose structure reads but whose strings are not UTF-8 (only a full
    validation sees it) is refused, naming the operator-state file."""
    ser = ElementSerializer(ROW, OUT, IN)
    carry = CarryOver(ser, max_parallelism=128, key_groups=ALL)
    batch = carry.batches.to_batch([element(1), element(2)], deadlines=True)
    name = batch.column("row").field("name")
    offsets = pa.py_buffer(pa.array([0, 2, 4], pa.int32()).buffers()[1])
    broken = pa.StringArray.from_buffers(2, offsets, pa.py_buffer(b"\xff\xfe\xfd\xfc"))
    assert name.type == broken.type
    row = pa.StructArray.from_arrays([batch.column("row").field("id"), broken],
                                     fields=list(IN))  # fmt: skip
    arrays = [row if f.name == "row" else batch.column(f.name) for f in batch.schema]
    data = pa.RecordBatch.from_arrays(arrays, schema=batch.schema).serialize().to_pybytes()
    with pytest.raises(CheckpointError, match=r"not a record batch of"):
        carry.batches.loads(data)
    state = snapshot_operator_state(0, 1, WatermarkState(), data)
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/ops-00000\.ckpt: in-flight"):
        carry.restore_operator(0, 1, [("/ck/ops-00000.ckpt", state)], "/ck/")


def test_unkeyed_batches_keep_their_partition_or_split_evenly() -> None:
    carry = CarryOver(ElementSerializer(ROWS, OUT, IN), max_parallelism=128, key_groups=ALL)
    a = [element(i, kind=ROWS) for i in range(5)]
    b = [element(i, kind=ROWS, partition=1) for i in range(2)]
    olds = [carry.snapshot_operator(0, 2, a), carry.snapshot_operator(1, 2, b)]
    named = _named(olds)
    assert [_restored(carry, i, 2, named)[1] for i in range(2)] == [a, b]
    parts = [_restored(carry, i, 3, named)[1] for i in range(3)]
    assert [len(p) for p in parts] == [3, 2, 2] and [e for p in parts for e in p] == a + b
    assert _restored(carry, 0, 1, named)[1] == a + b


def _restored(
    carry: CarryOver, index: int, parallelism: int, named: list[tuple[str, Any]]
) -> tuple[WatermarkState, list[StoredElement]]:
    """Partition ``index``'s watermark state and elements, as :meth:`restore_operator`
    reads them."""
    marks, table = carry.restore_operator(index, parallelism, named, "/ck")
    return marks, [] if table is None else carry.batches.elements(table)


def _named(states: list[Any]) -> list[tuple[str, Any]]:
    """Operator states as the checkpoint hands them over: with their files."""
    return [(f"/ck/ops-{i:05d}.ckpt", state) for i, state in enumerate(states)]


@pytest.mark.parametrize("kind", [ROW, ROWS])
def test_a_keyed_carry_over_takes_each_elements_key_group_from_its_row(kind: str) -> None:
    """Keyed, an element's key group is its row's (a chunk's first row's) key-group
    column; a row without one is refused, naming the column."""
    from asyncio_ops._runtime._partition_checkpoint import _key_groups
    from asyncio_ops._runtime._spec import KEY_GROUP_COLUMN

    def of(seq: int, kg: int | None) -> StoredElement:
        e = element(seq, kind=kind)
        rows = [e.row] if kind == ROW else e.row
        for r in rows:
            r[KEY_GROUP_COLUMN] = kg
        return e

    assert _key_groups([of(1, 7), of(2, 3), of(3, 7)], kind) == [7, 3, 7]
    assert _key_groups([], kind) == []
    with pytest.raises(CheckpointError, match=f"no {KEY_GROUP_COLUMN} in keyed mode"):
        _key_groups([of(1, 7), of(2, None)], kind)


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_restored_elements_become_queue_entries_in_order(
    pure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of elements becomes queue entries in (after_watermark, partition, seq)
    order, each a record of its row value (position -1, -2, ... in that order) with its
    event time, results as a tuple, attempts and deadline: without event time a column
    at a time (objects built by ``asyncio_ops._construct``'s constructors, in C or
    not), with event time one element at a time, a watermark before each group; the
    same entries either way."""
    from asyncio_ops._elements import Record, Watermark
    from asyncio_ops._runtime._stored import in_order

    if pure:
        monkeypatch.setenv("ASYNCIO_OPS_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("ASYNCIO_OPS_PURE_PYTHON", raising=False)
    serializer = ElementBatchSerializer(ElementSerializer(ROW, OUT, IN))
    written = [
        element(seq, partition=part, after_watermark=after, attempts=seq % 3,
                results=[{"score": seq / 2}] if seq % 2 else None,
                deadline=None if seq % 2 else 100.0 + seq)
        for part, seq, after in [
            (1, 4, 5.0), (0, 9, -math.inf), (1, 2, -math.inf), (0, 3, 5.0), (0, 1, -math.inf),
        ]
    ]  # fmt: skip
    table = pa.Table.from_batches([serializer.to_batch(written, deadlines=True)])
    want = sorted(written, key=lambda e: (e.after_watermark, e.partition, e.seq))
    for event_time in (False, True):
        entries = in_order(table, ROW, IN, OUT, event_time)
        if event_time:  # the elements that came after watermark 5.0 follow it
            assert entries[3].element == Watermark(5.0)
            entries = entries[:3] + entries[4:]
        assert len(entries) == len(want)
        for i, (entry, e) in enumerate(zip(entries, want, strict=True)):
            record = entry.element
            assert type(entry).__name__ == "SnapshotEntry" and type(record) is Record
            assert record.timestamp == e.timestamp
            value = record.value
            assert (value.row, value.late, value.position) == (e.row, e.late, -(i + 1))
            assert entry.results == (None if e.results is None else tuple(e.results))
            assert (entry.key, entry.attempts, entry.deadline) == (None, e.attempts, e.deadline)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([-math.inf, 1.0, 5.0]), st.integers(0, 2), st.integers(0, 4)),
        min_size=1,
        max_size=12,
    )
)
def test_elements_in_queue_order_are_found_without_a_sort(
    keys: list[tuple[float, int, int]],
) -> None:
    """The restore skips its sort exactly when the elements are in (after_watermark,
    partition, seq) order already, ties included (a stable sort leaves them in place):
    the same entries as the sort, whatever the order."""
    from asyncio_ops._runtime._stored import _ORDER, _ordered, in_order

    serializer = ElementBatchSerializer(ElementSerializer(ROW, OUT, IN))
    written = [element(seq, partition=part, after_watermark=after) for after, part, seq in keys]
    table = pa.Table.from_batches([serializer.to_batch(written, deadlines=True)])
    order = pc.sort_indices(table, sort_keys=_ORDER).to_pylist()
    assert _ordered(table) == (order == list(range(len(keys))))
    rows = [e.element.value.row for e in in_order(table, ROW, IN, OUT, False)]
    assert rows == [written[i].row for i in order]
