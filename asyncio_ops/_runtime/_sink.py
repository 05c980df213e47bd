"""The output side of a partition: rows or Arrow batches in, Arrow batches of the schema out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa

from .._elements import Record
from .._exceptions import OutputSchemaError
from ._adapters import describe_row
from ._coerce import coerced_rows, has_fraction, spark_type

# the types of an integer column's values that never truncate (has_fraction is False)
_WHOLE = frozenset({int, bool, type(None)})
_UNFIT = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


class ArrowSink:
    """Collects output rows and turns them into Arrow batches of the declared schema.

    ``filled``: the columns the user's function fills (the others come from
    the input, already typed), ``batch_size``: rows per output batch.
    """

    def __init__(self, schema: pa.Schema, filled: Sequence[str], batch_size: int) -> None:
        self.schema = schema
        # integer columns the function fills: Arrow would truncate a float put in one
        # (1.7 -> 1) without a word, so their values are checked (see _no_truncation)
        added = set(filled)
        self.int_columns = [
            f for f in self.schema if f.name in added and pa.types.is_integer(f.type)
        ]
        self.batch_size = batch_size
        # one list for the sink's life: ``collect`` (one output row as it is, a keyed
        # operator's ``collect``) is its append, a C call per row
        self.rows: list[dict[str, Any]] = []
        self.collect = self.rows.append
        self.emitted = 0
        # columnar results (ArrowChunkFunction): Arrow batches, never rows
        self.batches: list[pa.RecordBatch] = []
        self.buffered = 0

    def extend_batches(self, batches: Sequence[pa.RecordBatch]) -> None:
        """The output of the columnar path: one element's results, Arrow batches."""
        for batch in batches:
            self.batches.append(batch)
            self.buffered += batch.num_rows

    def batch_full(self) -> bool:
        return self.buffered >= self.batch_size

    def _take_batches(self) -> Iterator[pa.RecordBatch]:
        batches, self.batches, self.buffered = self.batches, [], 0
        # one copy into batches of batch_size rows: Spark pays per batch, not per byte
        table = pa.Table.from_batches(batches, schema=self.schema).combine_chunks()
        for out in table.to_batches(max_chunksize=self.batch_size):
            self.emitted += out.num_rows
            yield out

    def __call__(self, element: Any) -> None:
        """The operator's ``output``: only watermarks reach it (results go to :meth:`extend`)."""
        if type(element) is Record:
            self.rows.append(element.value)

    def extend(self, rows: Sequence[dict[str, Any]]) -> None:
        """One element's output rows (the operator's ``emit_results``)."""
        self.rows.extend(rows)

    def full(self) -> bool:
        return len(self.rows) >= self.batch_size

    def take(self) -> Iterator[pa.RecordBatch]:
        if self.batches:
            yield from self._take_batches()
            return
        rows = self.rows.copy()
        self.rows.clear()
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            self.emitted += len(chunk)
            yield self._to_batch(chunk)

    def _to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        try:
            batch = pa.RecordBatch.from_pylist(rows, schema=self.schema)
        except _UNFIT:
            # a Decimal for a double, a UUID for a string...: the conversions Spark makes
            rows = coerced_rows(rows, self.schema)
            try:
                batch = pa.RecordBatch.from_pylist(rows, schema=self.schema)
            except _UNFIT as exc:
                raise self._explain(rows, exc) from exc
        for f in self.int_columns:
            self._no_truncation(rows, f)
        return batch

    def _no_truncation(self, rows: list[dict[str, Any]], f: pa.Field) -> None:
        """Refuse a float or Decimal that is not a whole number in an integer column
        (Arrow would truncate it); whole ones (2.0) are taken, as Arrow's safe cast
        takes them."""
        name = f.name
        try:  # one pass in C over the column's types: only a float or Decimal can truncate
            types = set(map(type, map(dict.get, rows, repeat(name))))
        except TypeError:  # a row that is not a dict: row by row
            types = {float}
        if types <= _WHOLE:
            return
        for row in rows:
            value = row.get(name)
            if has_fraction(value):
                raise OutputSchemaError(
                    f"output column {name!r} ({spark_type(f.type)}) cannot hold {value!r} "
                    f"({type(value).__name__}) without truncating it, in output row "
                    f"{describe_row(row)}"
                )

    def _explain(self, rows: list[dict[str, Any]], exc: Exception) -> OutputSchemaError:
        """Find the first row and column that do not fit, for a message a user can act on."""
        for row in rows:
            for f in self.schema:
                value = row.get(f.name)
                try:
                    pa.array([value], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                    return OutputSchemaError(
                        f"output column {f.name!r} ({spark_type(f.type)}) cannot hold "
                        f"{value!r:.100} ({type(value).__name__}) in output row "
                        f"{describe_row(row)}"
                    )
        return OutputSchemaError(f"output rows do not fit the output schema: {exc}")
