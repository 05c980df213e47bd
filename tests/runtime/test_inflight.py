"""The carry-over of a micro-batch as state: elements in keyed list state or operator list
state, timeouts as key-scoped timers, watermarks as union state; typed, never pickled."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops import CheckpointError, OutputSchemaError
from asyncio_ops._container import Section
from asyncio_ops._runtime._inflight import (
    ARROW,
    ROW,
    ROWS,
    CarryOver,
    ElementSerializer,
    StoredElement,
    WatermarkState,
)
from asyncio_ops.state import KeyGroupRange, assign_to_key_group

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
def test_an_element_round_trips_typed(kind: str) -> None:
    ser = ElementSerializer(kind, OUT, IN)
    e = element(3, kind=kind, results=[{"score": 1.5}, {"score": None}], deadline=None)
    data = ser.dumps(e)
    batch = pa.ipc.read_record_batch(pa.py_buffer(data), ser.schema)  # an Arrow message
    assert batch.num_rows == 1 and batch.schema.field("row").type == ser.schema.field("row").type
    assert ElementSerializer(kind, OUT, IN).loads(data) == e


def test_bytes_that_are_not_an_element_are_refused() -> None:
    ser = ElementSerializer(ROW, OUT, IN)
    with pytest.raises(CheckpointError, match=r"an in-flight element is not a row of"):
        ser.loads(b"\x80\x05not arrow at all")
    other = ElementSerializer(ROWS, OUT, IN).dumps(element(1, kind=ROWS))
    with pytest.raises(CheckpointError, match=r"an in-flight element is not a row of"):
        ser.loads(other)


def test_an_output_that_the_schema_cannot_hold_names_the_value() -> None:
    ser = ElementSerializer(ROW, OUT, IN)
    with pytest.raises(OutputSchemaError, match=r"carried-over result .*'not a number'"):
        ser.dumps(element(1, results=[{"score": "not a number"}]))


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_keyed_elements_and_deadlines_follow_the_spark_key_group(backend: str) -> None:
    """Each element is filed under the key group Spark computed (not the core hash),
    its deadline is a timer of its key, and a partition owning only that group gets
    exactly its elements and deadlines back."""
    spark_kg = (assign_to_key_group(7, 128) + 3) % 128
    other_kg = (spark_kg + 1) % 128
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL,
                      state_backend=backend)  # fmt: skip
    done = element(2, results=[{"score": 2.0}], deadline=None)
    blobs = carry.snapshot_keyed(
        [(7, spark_kg, element(1, deadline=50.0)), (7, spark_kg, done),
         (8, other_kg, element(3, deadline=60.0))]
    )  # fmt: skip
    assert sorted(blobs) == sorted([spark_kg, other_kg])
    mine = KeyGroupRange(spark_kg, spark_kg)
    only = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=mine,
                     state_backend=backend)  # fmt: skip
    got = only.restore_keyed([(f"kg-{kg}", sec) for kg, sec in blobs.items()
                              if kg == spark_kg])  # fmt: skip
    assert sorted(got, key=lambda e: e.seq) == [element(1, deadline=50.0), done]


def test_a_corrupt_key_group_file_is_named() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    ((kg, sec),) = carry.snapshot_keyed([(1, 5, element(1))]).items()
    rows = sec.table.to_pylist()
    rows[0]["value"] = b"not a record batch"
    bad = Section(kg, pa.Table.from_pylist(rows, schema=sec.table.schema))
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/kg-p00000-a\.ckpt: "):
        carry.restore_keyed([("/ck/kg-p00000-a.ckpt", bad)])


def test_unkeyed_elements_split_evenly_and_watermarks_are_the_maximum() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    olds = [
        carry.snapshot_operator(0, 2, WatermarkState(10.0, 5.0), [element(1), element(2)]),
        carry.snapshot_operator(1, 2, WatermarkState(30.0, 20.0), [element(3, partition=1)]),
    ]
    parts = [carry.restore_operator(i, 3, _named(olds), "/ck") for i in range(3)]
    assert {p[0] for p in parts} == {WatermarkState(30.0, 20.0)}
    assert [[e.seq for e in p[1]] for p in parts] == [[1], [2], [3]]
    assert parts[0][1][0].deadline == 100.0  # unkeyed: the deadline travels in the element


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_key_group_of_many_elements_is_one_record_batch(backend: str) -> None:
    """300 elements of one key group (100 keys) are one value of one batch in its
    section, and come back with their deadlines; heap and RocksDB write the same rows."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL,
                      state_backend=backend)  # fmt: skip
    todo = [element(i, deadline=1000.0 + i if i % 3 else None) for i in range(300)]
    blobs = carry.snapshot_keyed([(e.seq % 100, 9, e) for e in todo])
    assert list(blobs) == [9]
    from asyncio_ops._container import Kind
    from asyncio_ops.state._payloads import read

    ((name, kind, _ttl, entries),), timers, _ = read(Kind.KEY_GROUPS, blobs[9].table, "kg 9")
    assert (name, kind, len(entries)) == ("in-flight-batch", "value", 1)
    (_key, _ns, (_ts, value)) = entries[0]
    assert carry.batches.loads(value).num_rows == 300
    assert len(timers) == 200
    got = carry.restore_keyed([("/ck/kg-p00000.ckpt", blobs[9])])
    assert got == todo
    heap = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    assert heap.restore_keyed([("f", blobs[9])]) == todo


def test_rescale_moves_the_elements_by_key_group() -> None:
    """Written by one partition owning 0..127, read by two owning 0..63 and 64..127:
    each gets exactly the elements of its key groups."""
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    todo = [(i, (i * 7) % 128, element(i, deadline=50.0 + i)) for i in range(256)]
    blobs = carry.snapshot_keyed(todo)
    halves = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]
    for half in halves:
        part = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=half)
        got = part.restore_keyed([("f", b) for kg, b in blobs.items() if kg in half])
        want = [e for _, kg, e in todo if kg in half]
        assert sorted(got, key=lambda e: e.seq) == want


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
    from asyncio_ops._runtime._inflight import snapshot_operator_state

    state = snapshot_operator_state(0, 1, WatermarkState(), data)
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/ops-00000\.ckpt: in-flight"):
        carry.restore_operator(0, 1, [("/ck/ops-00000.ckpt", state)], "/ck/")


def test_unkeyed_batches_keep_their_partition_or_split_evenly() -> None:
    carry = CarryOver(ElementSerializer(ROWS, OUT, IN), max_parallelism=128, key_groups=ALL)
    a = [element(i, kind=ROWS) for i in range(5)]
    b = [element(i, kind=ROWS, partition=1) for i in range(2)]
    olds = [carry.snapshot_operator(0, 2, WatermarkState(), a),
            carry.snapshot_operator(1, 2, WatermarkState(), b)]  # fmt: skip
    named = _named(olds)
    assert [carry.restore_operator(i, 2, named, "/ck")[1] for i in range(2)] == [a, b]
    parts = [carry.restore_operator(i, 3, named, "/ck")[1] for i in range(3)]
    assert [len(p) for p in parts] == [3, 2, 2] and [e for p in parts for e in p] == a + b
    assert carry.restore_operator(0, 1, named, "/ck")[1] == a + b


def _named(states: list[Any]) -> list[tuple[str, Any]]:
    """Operator states as the checkpoint hands them over: with their files."""
    return [(f"/ck/ops-{i:05d}.ckpt", state) for i, state in enumerate(states)]
