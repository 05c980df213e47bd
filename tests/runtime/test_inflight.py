"""The carry-over of a micro-batch as state: elements in keyed list state or operator list
state, timeouts as key-scoped timers, watermarks as union state; typed, never pickled."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from asyncio_ops import CheckpointError, OutputSchemaError
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
    got = only.restore_keyed([(f"kg-{kg}", kg, blob) for kg, blob in blobs.items()
                              if kg == spark_kg])  # fmt: skip
    assert sorted(got, key=lambda e: e.seq) == [element(1, deadline=50.0), done]


def test_a_corrupt_key_group_file_is_named() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    ((kg, blob),) = carry.snapshot_keyed([(1, 5, element(1))]).items()
    middle = len(blob) // 2
    bad = blob[:middle] + bytes([blob[middle] ^ 0xFF]) + blob[middle + 1 :]
    with pytest.raises(CheckpointError, match=r"checkpoint file /ck/kg-00005: key group 5"):
        carry.restore_keyed([("/ck/kg-00005", kg, bad)])


def test_unkeyed_elements_split_evenly_and_watermarks_are_the_maximum() -> None:
    carry = CarryOver(ElementSerializer(ROW, OUT, IN), max_parallelism=128, key_groups=ALL)
    olds = [
        carry.snapshot_operator(0, 2, WatermarkState(10.0, 5.0), [element(1), element(2)]),
        carry.snapshot_operator(1, 2, WatermarkState(30.0, 20.0), [element(3, partition=1)]),
    ]
    parts = [carry.restore_operator(i, 3, olds, "/ck") for i in range(3)]
    assert {p[0] for p in parts} == {WatermarkState(30.0, 20.0)}
    assert [[e.seq for e in p[1]] for p in parts] == [[1], [2], [3]]
    assert parts[0][1][0].deadline == 100.0  # unkeyed: the deadline travels in the element
