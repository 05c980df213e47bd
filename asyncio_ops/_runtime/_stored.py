"""A carried-over element as stored: its Python form, its Arrow schema, and the
conversions between the operator's queue entries and stored elements.

Contract:

- :class:`StoredElement`: one element as written, Python values only, a row of
  :func:`element_schema` (its fields are the schema's columns, in order): its old
  partition and place in that partition's queue (``partition``, ``seq``), the
  last watermark before it there (``after_watermark``), its ``row`` (a row, or a
  chunk's rows), ``timestamp``, ``late``, ``results`` (if it completed),
  ``attempts`` and ``deadline`` (while in flight).
- :class:`ElementBatchSerializer`: many elements as one record batch (one
  conversion per column), its bytes one Arrow IPC record-batch message without
  the schema; reading validates the batch fully (CheckpointError otherwise).
  :class:`ElementSerializer` is the schema and the check that names the field a
  misfit element cannot hold.
- :func:`to_stored` (queue entries, watermarks dropped, to elements),
  :func:`in_order` (a table of elements, as a restore reads it, back to queue
  entries in (after_watermark, partition, seq) order, a watermark before each
  group, so no row crosses a watermark across a micro-batch boundary and each
  key keeps its order) and
  :func:`as_kind` (elements written as one kind, for an operator whose element
  changed).

Where elements are written and how they move between partitions is
``_inflight``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._construct import constructor
from .._elements import Record, Watermark
from .._engine._operator_snapshot import SnapshotEntry
from .._exceptions import CheckpointError, OutputSchemaError
from ._adapters import RowValue

__all__ = [
    "ARROW",
    "ROW",
    "ROWS",
    "ElementBatchSerializer",
    "ElementSerializer",
    "StoredElement",
    "as_kind",
    "element_schema",
    "in_order",
    "to_stored",
]

ROW: Final = "row"
ROWS: Final = "rows"
ARROW: Final = "arrow"
"""What an element is: a row, a chunk of row dicts, or a chunk as an Arrow batch."""


class StoredElement(NamedTuple):
    """One element as written (see the module docstring); Python values, no Arrow.

    A named tuple: its fields are the columns of :func:`element_schema`, in order,
    so a batch's columns zip into elements and elements transpose into columns
    without a step per field."""

    partition: int
    seq: int
    after_watermark: float
    row: Any
    timestamp: float | None
    late: Any
    results: list[Any] | None
    attempts: int
    deadline: float | None


_element: Final[Callable[[Iterable[Any]], StoredElement]] = partial(tuple.__new__, StoredElement)
"""A :class:`StoredElement` of its nine fields, without the named tuple's Python ``__new__``."""


def _struct(schema: pa.Schema) -> pa.StructType:
    return pa.struct(list(schema))


def element_schema(
    kind: str, input_schema: pa.Schema | None, output_schema: pa.Schema
) -> pa.Schema:
    """The Arrow schema of one stored element (see the module docstring)."""
    row = _struct(input_schema if input_schema is not None else pa.schema([]))
    one = kind == ROW
    return pa.schema(
        [
            pa.field("partition", pa.int32()),
            pa.field("seq", pa.int64()),
            pa.field("after_watermark", pa.float64()),
            pa.field("row", row if one else pa.list_(row)),
            pa.field("timestamp", pa.float64()),
            pa.field("late", pa.bool_() if one else pa.list_(pa.bool_())),
            pa.field("results", pa.list_(_struct(output_schema))),
            pa.field("attempts", pa.int32()),
            pa.field("deadline", pa.float64()),
        ]
    )


class ElementSerializer:
    """The Arrow schema of a :class:`StoredElement` (:func:`element_schema`) and the
    check of one element against it, which names what does not fit.

    Elements are written many at a time (:class:`ElementBatchSerializer`: one
    conversion per column); when a batch does not convert, :meth:`check` finds the
    element and the field at fault for the error.
    """

    def __init__(self, kind: str, output_schema: pa.Schema, input_schema: pa.Schema | None) -> None:
        self.kind = kind
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.schema = element_schema(kind, input_schema, output_schema)
        self._struct = pa.struct(list(self.schema))

    def check(self, e: StoredElement, /) -> None:
        """OutputSchemaError naming the first field of ``e`` its type cannot hold."""
        fields = e._asdict()
        try:  # one conversion of the whole element
            pa.array([fields], type=self._struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise self._explain(fields) from exc

    def _explain(self, fields: dict[str, Any]) -> Exception:
        """The error naming the first field its type cannot hold."""
        for field in self.schema:
            value = fields[field.name]
            try:
                pa.array([value], type=field.type)
            except (
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                TypeError,
                ValueError,
                OverflowError,
            ) as exc:
                what = {"row": "input", "results": "result"}.get(field.name, field.name)
                return OutputSchemaError(
                    f"a carried-over {what} cannot be written as {field.type}: "
                    f"{value!r:.300} ({exc})"
                )
        return OutputSchemaError(f"a carried-over element cannot be written as {self.schema}")


class ElementBatchSerializer:
    """Many :class:`StoredElement` as one Arrow record batch of :func:`element_schema`.

    The carry-over's state serializer (see the module docstring): a value is a
    ``pa.RecordBatch`` of many elements, its bytes one Arrow IPC record-batch
    message without the schema (the manifest stores it once). ``loads`` validates
    the batch fully (``validate(full=True)``) and raises :class:`CheckpointError`
    for anything else; the caller names the file.
    """

    def __init__(self, one: ElementSerializer) -> None:
        self.one = one
        self.schema = one.schema

    def to_batch(self, elements: Sequence[StoredElement], *, deadlines: bool) -> pa.RecordBatch:
        """``elements`` in order as one batch (``deadlines=False``: the column is null, the
        deadlines travel as timers). OutputSchemaError names a value its type cannot hold."""
        cols: list[Any] = list(zip(*elements, strict=True)) if elements else [()] * 9
        if not deadlines:
            cols[8] = [None] * len(elements)
        try:  # one conversion per column: the cost of the floor's single table
            arrays = [pa.array(c, type=f.type) for c, f in zip(cols, self.schema, strict=True)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            for e in elements:  # the first element that fails alone names its field
                self.one.check(e)
            raise OutputSchemaError(  # pragma: no cover - one element always fails alone
                f"carried-over elements cannot be written as {self.schema}: {exc}"
            ) from exc
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def dumps(self, batch: pa.RecordBatch, /) -> bytes:
        data: bytes = batch.serialize().to_pybytes()
        return data

    def loads(self, data: bytes | memoryview, /) -> pa.RecordBatch:
        try:
            batch = pa.ipc.read_record_batch(pa.py_buffer(data), self.schema)
            batch.validate(full=True)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise CheckpointError(
                f"in-flight elements are not a record batch of {self.schema}: {exc}"
            ) from exc
        return batch

    def table(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """Validated batches as one table of elements, in order (a restore turns it into
        queue entries whole: :func:`in_order`)."""
        return pa.Table.from_batches(batches, schema=self.schema).combine_chunks()

    def elements(self, table: pa.Table) -> list[StoredElement]:
        """The elements of a table of them, in order: one conversion per column."""
        if not table.num_rows:
            return []
        cols = [c.to_pylist() for c in _attempts_filled(table).columns]
        return list(map(_element, zip(*cols, strict=True)))


def _attempts_filled(table: pa.Table) -> pa.Table:
    """``table`` with null attempts as 0 (a writer that left them out made none)."""
    attempts = table.column("attempts")
    if not attempts.null_count:
        return table
    index = table.schema.get_field_index("attempts")
    return table.set_column(index, table.schema.field(index), pc.fill_null(attempts, 0))


# -- queue entries <-> stored elements ------------------------------------------------------
def to_stored(entries: Sequence[SnapshotEntry], partition: int, kind: str) -> list[StoredElement]:
    """The element of every record of ``entries`` (queue order; watermarks dropped)."""
    out: list[StoredElement] = []
    append = out.append
    last_watermark = -math.inf
    arrow = kind == ARROW
    for seq, entry in enumerate(entries):
        element = entry.element
        if isinstance(element, Watermark):
            last_watermark = element.timestamp
            continue
        value: RowValue = element.value
        done = entry.results
        if done is None:
            results = None
            deadline = entry.deadline
        elif arrow:  # output batches
            results, deadline = [r for batch in done for r in batch.to_pylist()], None
        else:
            results, deadline = list(done), None
        append(_element((
            partition, seq, last_watermark, value.row.to_pylist() if arrow else value.row,
            element.timestamp, value.late, results, entry.attempts, deadline,
        )))  # fmt: skip
    return out


def as_kind(elements: Sequence[StoredElement], old: str, new: str) -> list[StoredElement]:
    """Elements written as ``old`` kind, as ``new`` kind (an operator whose element
    changed: ``chunk_size``, or a function that became columnar).

    A row becomes a chunk of one row. A chunk becomes its rows, each with the chunk's
    place, event time, attempts and deadline; a completed chunk's output stays in one
    piece, with its first row (the others complete with no output of their own), so
    every output row leaves once, where the chunk's would have.
    """
    if old == new or {old, new} == {ROWS, ARROW}:  # both store a chunk as a list of rows
        return list(elements)
    if old == ROW:
        return [
            e._replace(row=[e.row], late=None if e.late is None else [e.late]) for e in elements
        ]
    out: list[StoredElement] = []
    for e in elements:
        late = e.late if isinstance(e.late, list) else [None] * len(e.row)
        for j, (row, row_late) in enumerate(zip(e.row, late, strict=True)):
            results = e.results if e.results is None or j == 0 else []
            out.append(e._replace(row=row, late=row_late, results=results))
    return out


def in_order(
    elements: pa.Table,
    kind: str,
    input_schema: pa.Schema | None,
    output_schema: pa.Schema,
    event_time: bool,
) -> list[SnapshotEntry]:
    """Queue entries of a table of elements, in (after_watermark, partition, seq) order
    (a stable sort), watermarks between groups.

    Each gets a position of its own in this version's replay log: negative,
    apart from the positions of input rows. Columns become Python values one
    column at a time, and each element its entry directly (no element tuple).
    """
    if not elements.num_rows:
        return []
    # one old partition's elements (a restore at the same parallelism) come in queue
    # order, keyed or not: no sort and no copy of their rows then
    if not _ordered(elements):
        elements = elements.take(pc.sort_indices(elements, sort_keys=_ORDER))
    table = _attempts_filled(elements)
    rows, timestamps, lates, done, attempts, deadlines = (
        _values(table.column(name))
        for name in ("row", "timestamp", "late", "results", "attempts", "deadline")
    )
    afters = _values(table.column("after_watermark")) if event_time else None
    if kind == ARROW:  # a chunk and its output as Arrow batches
        rows = [pa.RecordBatch.from_pylist(r, schema=input_schema) for r in rows]
        done = [
            None if r is None else [pa.RecordBatch.from_pylist(r, schema=output_schema)]
            for r in done
        ]
    n = len(rows)
    # a column at a time, each object built without its __init__ (asyncio_ops._construct)
    values = map(constructor(RowValue, _VALUE_FIELDS), rows, lates, range(-1, -n - 1, -1))
    entries = list(map(
        constructor(SnapshotEntry, _ENTRY_FIELDS),
        map(constructor(Record, _RECORD_FIELDS), values, timestamps),
        [None if r is None else tuple(r) for r in done], repeat(None, n), attempts, deadlines,
    ))  # fmt: skip
    if afters is None:
        return entries
    out: list[SnapshotEntry] = []
    last = -math.inf
    for after, entry in zip(afters, entries, strict=True):
        if after > last:  # the watermark the elements after it came behind
            last = after
            out.append(SnapshotEntry(Watermark(last)))
        out.append(entry)
    return out


def _ordered(elements: pa.Table) -> bool:
    """Whether ``elements`` are in (after_watermark, partition, seq) order already: one
    comparison of each row with the next, no sort (the columns hold no nulls: every
    writer fills them)."""
    after, partition, seq = (
        elements.column(name).to_numpy() for name in ("after_watermark", "partition", "seq")
    )
    a0, a1, p0, p1 = after[:-1], after[1:], partition[:-1], partition[1:]
    later = (p0 < p1) | ((p0 == p1) & (seq[:-1] <= seq[1:]))
    return bool(np.all((a0 < a1) | ((a0 == a1) & later)))


def _values(column: pa.ChunkedArray) -> list[Any]:
    """``column.to_pylist()``; a column of nulls alone (the timestamps without event time,
    the late flags without a lateness bound) without converting each."""
    if column.null_count == len(column):
        return [None] * len(column)
    values: list[Any] = column.to_pylist()
    return values


# the fields of a restored element's three objects, in their __init__'s order
_ENTRY_FIELDS: Final = ("element", "results", "key", "attempts", "deadline")
_RECORD_FIELDS: Final = ("value", "timestamp")
_VALUE_FIELDS: Final = ("row", "late", "position")


_ORDER: Final = [("after_watermark", "ascending"), ("partition", "ascending"), ("seq", "ascending")]
