"""Row and Arrow adapters: the user's function as the operator sees it.

The operator's value for a row is a :class:`RowValue` (the row dict, its
lateness, its position in the partition for the replay log). :class:`RowFunction`
calls the user's ``async_invoke(row)`` and merges each result dict into the
row; :class:`ChunkFunction` calls ``async_invoke_chunk(rows)`` once per chunk
(value: a :class:`RowValue` whose ``row`` is the list of rows);
:class:`ArrowChunkFunction` calls ``async_invoke_arrow(batch)`` with a
zero-copy slice of an input batch and merges columnar results. Every merge
checks results against the declared output columns and names the input row
in its errors.

Per-row semantics of a chunk: its rows share one request, hence one
deadline, one outcome and one retry; on a timeout each row's own
``timeout(row)`` answers for it, and a row that fails alone (a ``timeout``
that raises, an :class:`~asyncio_ops.ArrowResult` error) fails alone:
:class:`RowErrors` carries the other rows' output, and :meth:`RowFunction.failed`
gives the element's output with an error row for each failed row
(``on_error="error_column"``).

One job in one class hierarchy (RowFunction, and ChunkFunction and ArrowChunkFunction
built on it: the user's function as the operator sees it, per row, per chunk, per
Arrow batch); the checks that name a row at fault are theirs.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from .._engine._results import one_result
from .._exceptions import AsyncOperatorError, InvalidResultError, OutputSchemaError
from .._functions import (
    ArrowResult,
    AsyncFunction,
    CoroutineFunction,
    SupportsInvokeArrow,
    SupportsInvokeChunk,
    SupportsOutputColumns,
    SupportsOutputSchema,
)
from ._coerce import coerced_array, decimals_as_floats, has_fraction, spark_type
from ._spec import ERROR_COLUMN, KEY_GROUP_COLUMN, LATE_COLUMN, PartitionSpec

if TYPE_CHECKING:
    from ._replay_log import ReplayLog


class RowValue:
    """What the operator carries for one input row (or one chunk of rows).

    ``row``: the row dict (for a chunk: the list of rows, or an Arrow batch);
    ``late``: with event time, whether the row was behind the watermark when it
    arrived (for a chunk, one flag per row; None without event time);
    ``position``: the row's position in the
    partition for the replay log (None without a checkpoint; negative for rows
    carried over from the previous micro-batch).
    """

    __slots__ = ("late", "position", "row")

    def __init__(
        self, row: Any, late: bool | list[bool] | None = None, position: int | None = None
    ) -> None:
        self.row = row
        self.late = late
        self.position = position

    def __repr__(self) -> str:
        return f"RowValue({describe_row(self.row)}, late={self.late}, position={self.position})"


def chunk_rows(value: RowValue) -> int:
    """The number of rows of a chunk (a list of rows or an Arrow batch)."""
    return len(value.row)


def chunk_key_group(value: RowValue) -> int:
    """The key group of a keyed chunk: every row of it has the same (the feeder's rule)."""
    rows = value.row
    if isinstance(rows, pa.RecordBatch):
        return int(rows.column(KEY_GROUP_COLUMN)[0].as_py())
    return int(rows[0][KEY_GROUP_COLUMN])


def describe_row(row: Any) -> str:
    text = repr(row)
    return text if len(text) <= 300 else text[:300] + "..."


@runtime_checkable
class NamedRow(Protocol):
    """A result row with field names, as ``pyspark.sql.Row`` (the runtime knows no pyspark)."""

    def asDict(self) -> dict[str, Any]: ...


class RowErrors(AsyncOperatorError):
    """Rows of a chunk that failed on their own, beside the output of the others.

    ``errors``: row of the chunk (0-based) -> its exception, in row order;
    ``output``: the other rows' output (output dicts, or one Arrow batch);
    ``rows``: the chunk row of each output row, in output order. Unhandled
    (``on_error="fail"``), it fails the partition naming the first failed row.
    """

    def __init__(
        self,
        value: RowValue,
        errors: Mapping[int, BaseException],
        output: Any,
        rows: Any,
        describe: Callable[[int], str],
    ) -> None:
        self.errors = dict(sorted(errors.items()))
        first, exc = next(iter(self.errors.items()))
        more = len(self.errors) - 1
        super().__init__(
            f"input row {describe(first)} failed: {type(exc).__name__}: {exc}"
            + (f" (and {more} more row(s) of its chunk)" if more else ""),
            value,
        )
        self.__cause__ = exc
        self.output = output
        self.rows = rows


_NO_MATCH: tuple[dict[str, Any]] = ({},)
"""The results of a row without any, with on_empty="keep": one row of null outputs."""


class RowFunction(AsyncFunction[Any, Any]):
    """Calls the user's function with a row dict; merges each result dict into the row.

    The operator's value is a :class:`RowValue`. A result is a dict whose
    keys are declared output columns, a ``pyspark.sql.Row`` with field names
    (by name), or a tuple mapped by position to the output columns; the
    message of a violation names the column and the input row. With ``log``
    set, each completed lookup is appended to it as ``(position, fingerprint,
    results)``, every result as a dict.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        self.user = user
        self.allowed = frozenset(spec.added_columns)
        self.columns = tuple(spec.added_columns)  # in output_schema order
        if isinstance(user, SupportsOutputColumns):  # e.g. a connector: project at the source
            user.bind_output_columns(self.columns)
        if isinstance(user, SupportsOutputSchema):  # e.g. a model asked for typed JSON
            user.bind_output_schema(pa.schema([spec.output_schema.field(c) for c in self.columns]))
        self.keep = spec.options.keep_input_columns
        # on_empty="keep": a row without results is emitted once, its output columns null
        self.keep_empty = spec.on_empty == "keep"
        self.log: ReplayLog | None = None
        self.error_rows = 0  # error rows made by failed() (on_error="error_column")
        self.dropped = 0  # rows answered with no result and dropped (on_empty="drop")
        user_fn = user.fn if type(user) is CoroutineFunction else user.async_invoke
        self._invoke: Callable[[Any], Any] = user_fn
        self.row_factory = factory = spec.row_factory
        if factory is not None:  # rows_as="row": the function receives what it makes

            def invoke(row: Any) -> Any:
                return user_fn(factory(row))

            self._invoke = invoke

    def merge(self, value: Any, results: Any) -> list[dict[str, Any]]:
        row = value.row
        late = value.late
        if results is None or not isinstance(results, list | tuple) or one_result(results):
            # a failed lookup (an error row with on_error="error_column"), unlike a
            # result that does not fit the schema, which is a bug and always fails
            raise InvalidResultError(
                f"the async function must return a list of results, got "
                f"{type(results).__name__}: {results!r:.200}"
                + (" (wrap a single result in a list)" if one_result(results) else "")
                + f" for input row {describe_row(row)}"
            )
        if not results:
            if not self.keep_empty:
                self.dropped += 1
                return []
            results = _NO_MATCH
        out = []
        allowed = self.allowed
        for r in results:
            if type(r) is not dict:
                r = self.as_dict(r, row)
            if not allowed.issuperset(r):
                unknown = sorted(set(r) - allowed)
                raise OutputSchemaError(
                    f"result column(s) {unknown} are not in output_schema "
                    f"(declared: {sorted(allowed)}) for input row {describe_row(row)}"
                )
            merged = {**row, **r} if self.keep else dict(r)
            if late is not None:
                merged[LATE_COLUMN] = late
            out.append(merged)
        return out

    def as_dict(self, result: Any, row: Any) -> dict[str, Any]:
        """A result that is not a dict: a ``pyspark.sql.Row`` with field names (by name),
        a tuple (a Row without names too) mapped by position to the output columns, or,
        with one output column, its bare value."""
        if isinstance(result, NamedRow) and isinstance(result, tuple):
            try:
                return dict(result.asDict())
            except (TypeError, AttributeError, ValueError):
                pass  # a Row without field names: by position, as a tuple
        if isinstance(result, tuple):
            columns = self.columns
            if len(result) != len(columns):
                raise OutputSchemaError(
                    f"a result tuple has {len(result)} value(s) for the {len(columns)} output "
                    f"column(s) {list(columns)}: {result!r:.100} for input row "
                    f"{describe_row(row)}"
                )
            return dict(zip(columns, result, strict=True))
        if len(self.columns) == 1 and not isinstance(result, dict | list):
            return {self.columns[0]: result}  # one output column: the bare value
        raise OutputSchemaError(
            f"each result must be a dict of output columns, a Row or a tuple, got "
            f"{type(result).__name__} {result!r:.100} for input row {describe_row(row)}"
        )

    def as_dicts(self, results: Any, row: Any) -> Any:
        """``results`` with every result a dict (as logged for replay)."""
        if isinstance(results, list | tuple) and any(type(r) is not dict for r in results):
            return [r if type(r) is dict else self.as_dict(r, row) for r in results]
        return results

    def record(self, value: Any, results: Any) -> list[dict[str, Any]]:
        """Merge ``results`` into the row, logging them for replay if a log is kept."""
        merged = self.merge(value, results)
        log = self.log
        if log is not None and value.position is not None:
            log.append(value.position, self.fingerprint(value), self.as_dicts(results, value.row))
        return merged

    # -- the replay log: what an element's completion is logged as, and back ----------
    def log_type(self, spec: PartitionSpec) -> pa.DataType:
        """The Arrow type of one logged completion: the function's results for a row."""
        return pa.list_(pa.struct([f for f in spec.output_schema if f.name in self.allowed]))

    def fingerprint(self, value: Any) -> bytes:
        """A digest of the element's input: a logged completion is reused only for it."""
        return fingerprint(value.row)

    def replayed(self, value: Any, logged: Any) -> Any:
        """The element's results (as the operator emits them) from its logged completion."""
        return self.merge(value, logged)

    def describe(self, value: Any) -> str:
        """The input in an error message."""
        return describe_row(value.row)

    def invoke_direct(self, value: Any) -> Any:
        """The user's coroutine for this row (the operator merges with :meth:`record`)."""
        return self._invoke(value.row)

    async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
        return self.record(value, await self._invoke(value.row))

    def timeout(self, value: Any) -> Any:
        row = value.row
        results = self.user.timeout(row if self.row_factory is None else self.row_factory(row))
        if asyncio.iscoroutine(results):
            return self._merge_later(value, results)
        return self.merge(value, results)

    async def _merge_later(self, value: Any, awaitable: Any) -> list[dict[str, Any]]:
        return self.merge(value, await awaitable)

    # -- a failed element, with on_error="error_column" --------------------------------
    def error_row(
        self, row: Mapping[str, Any], late: bool | None, exc: BaseException, attempts: int
    ) -> dict[str, Any]:
        """The output row of a failed input row: its input columns (if kept), ``_error``
        (with the input columns as ``_error.input`` when they are not kept)."""
        error = {"exception": type(exc).__name__, "message": str(exc)[:2000], "attempts": attempts}
        if self.keep:
            out = dict(row)
        else:
            out = {}
            error["input"] = {k: v for k, v in row.items() if k != KEY_GROUP_COLUMN}
        out[ERROR_COLUMN] = error
        if late is not None:
            out[LATE_COLUMN] = late
        self.error_rows += 1
        return out

    def failed(self, value: Any, exc: BaseException, attempts: int) -> list[Any]:
        """The element's output when it failed with ``exc`` after ``attempts`` attempts."""
        return [self.error_row(value.row, value.late, exc, attempts)]


class ChunkFunction(RowFunction):
    """Vectorised: one call of the user's ``async_invoke_chunk(rows)`` per chunk of rows.

    The operator's value is a :class:`RowValue` of the rows; the user returns one result
    list per row, in order, and each row is merged with its own results. A
    chunk succeeds or fails (times out, is retried) as a whole.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        super().__init__(user, spec)
        if not isinstance(user, SupportsInvokeChunk):
            raise TypeError(f"{user!r} has no async_invoke_chunk(rows)")
        self._invoke = user.async_invoke_chunk

    def record(self, value: Any, results: Any) -> list[dict[str, Any]]:
        merged = self.replayed(value, results)
        log = self.log
        if log is not None and value.position is not None:
            rows = value.row
            logged = [self.as_dicts(list(r), rows[i]) for i, r in enumerate(results)]
            log.append(value.position, self.fingerprint(value), logged)
        return merged

    def log_type(self, spec: PartitionSpec) -> pa.DataType:
        """One result list per row of the chunk."""
        return pa.list_(super().log_type(spec))

    def replayed(self, value: Any, results: Any) -> list[dict[str, Any]]:
        rows = value.row
        if not isinstance(results, list | tuple) or len(results) != len(rows):
            raise InvalidResultError(
                f"async_invoke_chunk must return one result list per row ({len(rows)}), got "
                f"{type(results).__name__}"
                + (f" of {len(results)}" if isinstance(results, list | tuple) else "")
                + f" for the chunk starting with row {describe_row(rows[0] if rows else None)}"
            )
        out: list[dict[str, Any]] = []
        merge = self.merge
        late = value.late
        if late is None:
            for row, row_results in zip(rows, results, strict=True):
                out.extend(merge(RowValue(row), row_results))
        else:
            for row, row_late, row_results in zip(rows, late, results, strict=True):
                out.extend(merge(RowValue(row, row_late), row_results))
        return out

    async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
        return self.record(value, await self._invoke(value.row))

    # -- per-row semantics of a chunk ---------------------------------------------------
    def rows_of(self, value: Any) -> list[dict[str, Any]]:
        """The chunk's rows as dicts (slow paths only: timeouts, failures)."""
        rows: list[dict[str, Any]] = value.row
        return rows

    def lateness(self, value: Any, n: int) -> list[bool | None]:
        late = value.late
        return list(late) if isinstance(late, list) else [None] * n

    def timeout(self, value: Any) -> Any:
        """The chunk ran out of time: each row's own ``timeout(row)`` answers for it."""
        rows = self.rows_of(value)
        factory = self.row_factory
        answers: list[Any] = []
        for row in rows:
            try:
                answers.append(self.user.timeout(row if factory is None else factory(row)))
            except Exception as exc:
                answers.append(exc)
        if any(asyncio.iscoroutine(a) or asyncio.isfuture(a) for a in answers):
            return self._timeouts_later(value, rows, answers)
        return self._timed_out(value, rows, answers)

    async def _timeouts_later(self, value: Any, rows: list[Any], answers: list[Any]) -> Any:
        settled = []
        for answer in answers:
            if asyncio.iscoroutine(answer) or asyncio.isfuture(answer):
                try:
                    answer = await answer
                except Exception as exc:
                    answer = exc
            settled.append(answer)
        return self._timed_out(value, rows, settled)

    def _timed_out(self, value: Any, rows: list[Any], answers: list[Any]) -> Any:
        """Each row's timeout answer merged into it; RowErrors for the rows whose raised."""
        output: list[dict[str, Any]] = []
        index: list[int] = []
        errors: dict[int, BaseException] = {}
        lateness = self.lateness(value, len(rows))
        for i, (row, answer) in enumerate(zip(rows, answers, strict=True)):
            if isinstance(answer, BaseException):
                errors[i] = answer
                continue
            if not isinstance(answer, list | tuple):
                errors[i] = InvalidResultError(
                    f"timeout() must return a list of results, got {type(answer).__name__}"
                )
                continue
            merged = self.merge(RowValue(row, lateness[i]), answer)
            output.extend(merged)
            index.extend([i] * len(merged))
        if errors:
            describe = self._describe_row(value)
            raise RowErrors(value, errors, self._as_output(output), index, describe)
        return self._as_output(output)

    def _as_output(self, rows: list[dict[str, Any]]) -> list[Any]:
        """Output dicts as this function's output (dicts here, a batch when columnar)."""
        return rows

    def _describe_row(self, value: Any) -> Callable[[int], str]:
        rows = self.rows_of(value)
        return lambda i: describe_row(rows[i])

    def failed(self, value: Any, exc: BaseException, attempts: int) -> list[Any]:
        """Every row of the chunk an error row, or (RowErrors) the failed rows only, in
        row order among the others' output."""
        rows = self.rows_of(value)
        lateness = self.lateness(value, len(rows))
        if isinstance(exc, RowErrors) and exc.element is value:
            by_row: dict[int, list[dict[str, Any]]] = {}
            for i, out_row in zip(exc.rows, self._output_dicts(exc.output), strict=True):
                by_row.setdefault(i, []).append(out_row)
            out: list[dict[str, Any]] = []
            for i, row in enumerate(rows):
                out.extend(by_row.get(i, ()))
                if i in exc.errors:
                    out.append(self.error_row(row, lateness[i], exc.errors[i], attempts))
            return self._as_output(out)
        return self._as_output(
            [self.error_row(r, late, exc, attempts) for r, late in zip(rows, lateness, strict=True)]
        )

    def _output_dicts(self, output: Any) -> list[dict[str, Any]]:
        return list(output)

    def describe(self, value: Any) -> str:
        n, first = self._chunk(value)
        return f"a chunk of {n} rows starting with row {first}"

    def _chunk(self, value: Any) -> tuple[int, str]:
        """The chunk's size and its first row, described, for messages."""
        rows = value.row
        return len(rows), describe_row(rows[0] if rows else None)


class ArrowChunkFunction(ChunkFunction):
    """Columnar: one call of the user's ``async_invoke_arrow(batch)`` per chunk of rows.

    The operator's value is a :class:`RowValue` of ``batch``, a zero-copy
    slice of an input Arrow batch. The user returns ``(row_index, columns)``:
    ``row_index`` the input row (0-based, within the chunk) of each output row,
    in output order (a row may appear several times, for fan-out, or not at
    all, to drop it), and ``columns`` the output columns, each as long as
    ``row_index`` (a ``pyarrow.RecordBatch`` / ``Table`` or a mapping of column
    name to an Arrow array or a list of values). A declared output column the
    function does not return is null. The merge is columnar: the input columns
    are ``take``n by ``row_index`` and no row is ever turned into a dict.
    """

    def __init__(self, user: AsyncFunction[Any, Any], spec: PartitionSpec) -> None:
        RowFunction.__init__(self, user, spec)
        if not isinstance(user, SupportsInvokeArrow):
            raise TypeError(f"{user!r} has no async_invoke_arrow(batch)")
        self._invoke = user.async_invoke_arrow
        self.schema = spec.output_schema

    def record(self, value: Any, results: Any) -> list[pa.RecordBatch]:
        merged = self._merge_arrow(value, results)
        log = self.log
        if log is not None and value.position is not None:
            log.append(value.position, self.fingerprint(value), merged[0])
        return merged

    def log_type(self, spec: PartitionSpec) -> pa.DataType:
        """The chunk's merged output batch, as a list of output rows."""
        return pa.list_(pa.struct(list(spec.output_schema)))

    def fingerprint(self, value: Any) -> bytes:
        data = value.row.serialize()  # the slice's rows only, as Arrow IPC
        return hashlib.blake2b(memoryview(data), digest_size=12).digest()

    def replayed(self, value: Any, logged: Any) -> list[pa.RecordBatch]:
        """``logged``: the output rows as a struct array (see ReplayLog)."""
        return [pa.RecordBatch.from_struct_array(logged).cast(self.schema)]

    def rows_of(self, value: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = value.row.to_pylist()
        return rows

    def _as_output(self, rows: list[dict[str, Any]]) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pylist(rows, schema=self.schema)]

    def _output_dicts(self, output: Any) -> list[dict[str, Any]]:
        return [row for batch in output for row in batch.to_pylist()]

    def _merge_arrow(self, value: Any, results: Any) -> list[pa.RecordBatch]:
        batch: pa.RecordBatch = value.row
        index, columns, errors = self._unpack(batch, results)
        if not self.keep_empty and index is not None:  # the rows no result stands for
            self.dropped += (
                batch.num_rows
                - len(errors)
                - (pc.count_distinct(index).as_py() if len(index) else 0)
            )
        if self.keep_empty and (index is not None or errors):
            if index is None:  # every row once, but for the failed ones
                index = pa.array(range(batch.num_rows), pa.int64())
            index, columns = self._keep_unmatched(batch.num_rows, index, columns, errors)
        if errors:
            output = self._merged(value, batch, index, columns)
            rows = range(batch.num_rows) if index is None else index.to_pylist()
            raise RowErrors(value, errors, output, rows, self._describe_row(value))
        return self._merged(value, batch, index, columns)

    def _merged(
        self, value: Any, batch: pa.RecordBatch, index: pa.Array | None, columns: Any
    ) -> list[pa.RecordBatch]:
        """The chunk's output batch: input columns taken by ``index``, output columns."""
        if index is None:
            n_out = batch.num_rows
            taken = batch
        else:
            n_out = len(index)
            if self.keep:
                if n_out == batch.num_rows and (n_out == 0 or _is_identity(index)):
                    taken = batch
                else:
                    taken = batch.take(index)
        arrays: list[pa.Array] = []
        inputs = batch.schema.names
        late = value.late
        for f in self.schema:
            name = f.name
            if name == LATE_COLUMN and late is not None:  # each row's lateness, as it arrived
                flags = pa.array(late, pa.bool_())
                arrays.append(flags if index is None else flags.take(index))
            elif name in columns:
                arrays.append(_column(name, f.type, columns[name], n_out))
            elif self.keep and name in inputs:
                arrays.append(taken.column(name))
            else:  # an output column the function left out, or _error of a good chunk
                arrays.append(pa.nulls(n_out, f.type))
        return [pa.RecordBatch.from_arrays(arrays, schema=self.schema)]

    def _keep_unmatched(
        self, rows: int, index: pa.Array, columns: Mapping[str, Any], failed: Mapping[int, Any]
    ) -> tuple[pa.Array, dict[str, pa.Array]]:
        """on_empty="keep": the rows ``index`` leaves out (but the ``failed`` ones), once
        each with null output columns, in input-row order among the others (a stable sort
        by row)."""
        covered = (
            index
            if not failed
            else pa.concat_arrays([index.cast(pa.int64()), pa.array(list(failed), pa.int64())])
        )
        missing = pc.indices_nonzero(pc.invert(pc.is_in(pa.array(range(rows)), value_set=covered)))
        if not len(missing):
            return index, dict(columns)
        n = len(index)
        index = pa.concat_arrays([index.cast(pa.int64()), missing.cast(pa.int64())])
        order = pc.sort_indices(index)  # stable: each row's own results keep their order
        out = {}
        for name, values in columns.items():
            type_ = self.schema.field(name).type
            column = _column(name, type_, values, n)
            out[name] = pa.concat_arrays([column, pa.nulls(len(missing), type_)]).take(order)
        return index.take(order), out

    def _unpack(
        self, batch: pa.RecordBatch, results: Any
    ) -> tuple[pa.Array | None, Any, Mapping[int, BaseException]]:
        errors: Mapping[int, BaseException] = {}
        if type(results) is ArrowResult:
            index, columns, errors = results.row_index, results.columns, results.errors
        elif not isinstance(results, tuple | list) or len(results) != 2:
            raise InvalidResultError(
                f"async_invoke_arrow must return (row_index, columns) or an ArrowResult, got "
                f"{type(results).__name__}"
            )
        else:
            index, columns = results
        if index is not None:  # None: every row once, in order
            index = _check_index(index, batch.num_rows)
        if errors:
            errors = _check_errors(errors, index, batch.num_rows)
            if index is None:  # every row once, in order, but for the failed ones
                index = pa.array([i for i in range(batch.num_rows) if i not in errors], pa.int64())
        if isinstance(columns, pa.RecordBatch | pa.Table):
            columns = {name: columns.column(name) for name in columns.column_names}
        elif not isinstance(columns, Mapping):
            raise InvalidResultError(
                f"async_invoke_arrow must return columns as a RecordBatch, Table or mapping, "
                f"got {type(columns).__name__}"
            )
        unknown = sorted(set(columns) - self.allowed)
        if unknown:
            raise OutputSchemaError(
                f"result column(s) {unknown} are not in output_schema "
                f"(declared: {sorted(self.allowed)})"
            )
        return index, columns, errors

    def _chunk(self, value: Any) -> tuple[int, str]:
        batch = value.row
        return batch.num_rows, describe_row(_first_row(batch))


def _column(name: str, type_: pa.DataType, values: Any, n: int) -> pa.Array:
    """One output column of the columnar path, as ``type_``, checked to have ``n`` values."""
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            if values.type == type_:
                array = values
            elif pa.types.is_decimal(values.type) and pa.types.is_floating(type_):
                array = decimals_as_floats(values, type_)  # rounded once, as per row
            else:
                array = values.cast(type_)  # safe: no truncation
        elif pa.types.is_integer(type_):
            # inferred first, then a safe cast: pa.array(values, type=int) would truncate 1.7
            array = pa.array(values)
            if array.type != type_:
                array = array.cast(type_)
        else:
            array = pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        fitted = coerced_array(values, type_)  # the conversions of the per-row path
        if fitted is None:
            raise _unfit(name, type_, values, exc) from exc
        array = fitted
    if len(array) != n:
        raise InvalidResultError(
            f"output column {name!r} has {len(array)} values but row_index has {n}"
        )
    return array


def _unfit(name: str, type_: pa.DataType, values: Any, exc: Exception) -> OutputSchemaError:
    bad = _first_unfit(values, type_)
    return OutputSchemaError(
        f"output column {name!r} ({spark_type(type_)}) cannot hold {bad}: {exc}"
    )


def _first_row(batch: pa.RecordBatch) -> Any:
    return batch.slice(0, 1).to_pylist()[0] if batch.num_rows else None


def _check_index(index: Any, rows: int) -> pa.Array:
    """``row_index`` as an Arrow integer array, every value a row of the chunk."""
    try:
        if not isinstance(index, pa.Array):
            index = pa.array(index, type=pa.int64())
        if not pa.types.is_integer(index.type) or index.null_count:
            raise TypeError(f"row_index must hold integers without nulls, got {index.type}")
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidResultError(f"async_invoke_arrow returned a bad row_index: {exc}") from exc
    if len(index):
        bounds = pc.min_max(index)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo < 0 or hi >= rows:
            raise InvalidResultError(
                f"async_invoke_arrow returned row_index values {lo}..{hi} outside the chunk's "
                f"{rows} rows"
            )
    return index


def _check_errors(
    errors: Mapping[int, BaseException], index: pa.Array | None, rows: int
) -> dict[int, BaseException]:
    """An ArrowResult's ``errors``: rows of the chunk, each failed by an exception, none
    of them also answered in ``row_index``."""
    if not isinstance(errors, Mapping):
        raise InvalidResultError(
            f"ArrowResult.errors must map a row of the chunk to an exception, got "
            f"{type(errors).__name__}"
        )
    out: dict[int, BaseException] = {}
    for row, exc in errors.items():
        if type(row) is not int or not 0 <= row < rows or not isinstance(exc, BaseException):
            raise InvalidResultError(
                f"ArrowResult.errors must map rows 0..{rows - 1} of the chunk to exceptions, "
                f"got {row!r}: {exc!r:.100}"
            )
        out[row] = exc
    if (
        index is not None
        and len(index)
        and pc.any(pc.is_in(index, value_set=pa.array(list(out), index.type))).as_py()
    ):
        raise InvalidResultError("ArrowResult answers a row in row_index that errors fails")
    return out


def _is_identity(index: pa.Array) -> bool:
    """True if ``index`` is 0, 1, ..., n-1 (every row once, in order: no take needed)."""
    n = len(index)
    if index[0].as_py() != 0 or index[n - 1].as_py() != n - 1:
        return False
    return bool(pc.all(pc.equal(index, pa.array(range(n), type=index.type))).as_py())


def _first_unfit(values: Any, type_: pa.DataType) -> str:
    """The first value of ``values`` that ``type_`` cannot hold, for an error message."""
    items = values.to_pylist() if isinstance(values, pa.Array) else values
    try:
        whole = pa.types.is_integer(type_)
        for i, v in enumerate(items):
            if whole and has_fraction(v):
                return f"{v!r} ({type(v).__name__}, not a whole number) at output row {i}"
            try:
                pa.array([v], type=type_)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                return f"{v!r:.100} ({type(v).__name__}) at output row {i}"
    except TypeError:
        pass
    return f"{type(values).__name__} values"


def is_columnar(fn: object) -> bool:
    """True if ``fn`` answers chunks as Arrow (``async_invoke_arrow``), preferred by chunk_size."""
    return isinstance(fn, SupportsInvokeArrow)


def fingerprint(row: Any) -> bytes:
    """A digest of an input row: a replayed result is used only for the same row.

    The row's ``repr``: rows come from one Arrow schema, so equal rows have
    equal reprs (dict order is the schema's; floats repr exactly).
    """
    return hashlib.blake2b(repr(row).encode("utf-8", "surrogatepass"), digest_size=12).digest()
