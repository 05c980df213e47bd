"""``register``: an async lookup as a scalar function of Spark SQL.

Contract. ``register(spark, name, fn, timeout=..., output_schema=...,
input_schema=..., **options)`` registers ``name`` in ``spark``'s session (the
classic one or a Spark Connect client's) so that SQL calls it with one
argument per ``input_schema`` field, in order: ``SELECT *, name(customer_id)
AS c FROM orders``. The function is a scalar Arrow UDF in its iterator form
(``SQL_SCALAR_ARROW_ITER_UDF``): Spark runs one generator per partition, and
that generator runs :func:`asyncio_ops._runtime.run_partition`, the same
partition runner as ``ordered_wait`` (ordered mode, the worker's one event
loop, ``capacity`` lookups in flight across Arrow batches, the function opened
once per worker). Output may trail input; every input row gets exactly one
value, in input order, by the end of the partition.

- Keys. ``input_schema`` (a DDL string or a ``StructType``) names and types the
  arguments: argument i is the row field ``input_schema[i]``, cast (safely) to
  its declared type, so a connector sees the row it would see from
  ``ordered_wait`` over a DataFrame of those columns. The function receives
  those fields (and a private position column, ``__aops_row``, which carries
  the row's place in the partition through the operator).
- Options. The keywords are :class:`~asyncio_ops.spark._options.WaitOptions`'s,
  checked by it; :data:`SQL_OPTIONS` are those that mean something per row of a
  SQL call. The others (``key``, ``event_time``, checkpoints, partitioning,
  ``on_empty``, ``keep_input_columns``, ``uid``...) raise ConfigurationError
  naming the option. ``capacity``, ``chunk_size`` and their defaults are
  resolved as ``ordered_wait`` resolves them (columnar for a connector with
  ``async_invoke_arrow``).
- Value. A struct of ``output_schema``'s columns; NULL when the lookup answered
  nothing for the row (no match, a NULL key: the connectors never send one) or
  only NULLs. With ``on_error="error_column"`` a struct ``<result, error>``,
  ``error`` being ``_error``'s struct (exception, message, attempts), NULL for a
  row that did not fail; with ``"fail"`` a failed lookup fails the query with
  the library's exception naming the row. A lookup that answers more than one
  result for a row raises OutputSchemaError naming it: one-to-many lookups are
  a table function's (``register_table``, :mod:`._sql_table`).
- Driver. ``register`` checks the options, resolves the defaults and runs the
  function's preflight against ``input_schema`` and ``output_schema`` (unless
  ``preflight=False``) before it registers anything (:func:`prepare`, shared
  with ``register_table``); the function is marked non-deterministic, so Spark
  neither reorders nor deduplicates its calls.
- Not available: checkpoints, hence no replay log and no carried-over rows
  (a retried task or micro-batch looks its rows up again), event time and
  watermarks, keys (per-key order), ``unordered`` output (a scalar function
  answers in input order).
"""

from __future__ import annotations

import inspect
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type
from pyspark.sql.types import LongType, StructField, StructType

from .._exceptions import AsyncOperatorError, ConfigurationError, OutputSchemaError
from .._functions import AsyncFunction, as_async_function
from .._runtime import ERROR_COLUMN, KEY_GROUP_COLUMN, LATE_COLUMN, PartitionSpec, run_partition
from ..options import OutputMode
from . import _job_errors
from ._api import ERROR_STRUCT, chunk_rows_of, default_capacity, row_of
from ._checkpoint_location import run_epoch
from ._frame import as_struct, batch_size_of, task_info
from ._keywords import unknown_keyword
from ._metrics import AsyncMetrics
from ._options import WaitOptions
from ._preflight import preflight as run_preflight

__all__ = [
    "POSITION_COLUMN",
    "SQL_OPTIONS",
    "Prepared",
    "cast_argument",
    "prepare",
    "register",
    "signature_of",
]

POSITION_COLUMN: Final = "__aops_row"
"""The row's position in its partition, added to the function's input (and output)."""

SQL_OPTIONS: Final = frozenset(
    {"capacity", "max_capacity", "output_buffer", "retry", "on_error", "rows_as",
     "batch_size", "chunk_size", "metrics", "preflight"}
)  # fmt: skip
"""The options of ``ordered_wait`` that a SQL function takes (per row, no state)."""

_RESERVED: Final = (ERROR_COLUMN, LATE_COLUMN, KEY_GROUP_COLUMN, POSITION_COLUMN)


def register(
    spark: SparkSession,
    name: str,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    *,
    timeout: Any,
    output_schema: str | StructType,
    input_schema: str | StructType | None = None,
    **options: Any,
) -> Any:
    """Register ``fn`` as the SQL function ``name`` of ``spark`` and return it (a
    ``UserDefinedFunction``, callable from the DataFrame API too). See the module
    docstring; every option as ``ordered_wait``'s (docs/sql.md).

    Example::

        from asyncio_ops.spark import register, session

        async def customer(row):  # the arguments, by input_schema's names
            return [{"name": f"customer-{row['customer_id']}", "tier": "gold"}]

        spark = session()
        register(spark, "lookup_customer", customer, timeout=5.0,
                 input_schema="customer_id long", output_schema="name string, tier string")
        spark.sql("SELECT id, lookup_customer(id).name FROM range(10)").show()
    """
    sql = prepare("register", spark, name, fn, timeout, output_schema, input_schema, options,
                  SQL_OPTIONS)  # fmt: skip
    opts = sql.options
    strip = _without_position if opts.rows_as == "dict" else _row_without_position
    spec = sql.spec(
        OutputMode.ORDERED,
        [*sql.inputs.fields, StructField(POSITION_COLUMN, LongType(), False), *sql.added.fields],
        on_empty="keep",  # one value per row: a row without results gets NULL
        row_factory=strip if sql.chunk_rows is None else None,
    )
    value_type = (
        StructType([StructField("result", sql.added, True),
                    StructField("error", ERROR_STRUCT, True)])
        if opts.on_error == "error_column"
        else sql.added
    )  # fmt: skip
    evaluate = _Evaluate(
        spec,
        sql.call_of(),
        to_arrow_schema(sql.inputs, timezone=sql.timezone),
        to_arrow_type(value_type, timezone=sql.timezone),
        options=opts,
    )

    def lookup(args: Iterator[Any]) -> Iterator[pa.Array]:
        return evaluate(args)

    lookup.__name__ = lookup.__qualname__ = name
    with warnings.catch_warnings():  # "prefer type hints": the type is given explicitly
        warnings.simplefilter("ignore", UserWarning)
        udf = arrow_udf(lookup, value_type.simpleString(), ArrowUDFType.SCALAR_ITER)
    udf = udf.asNondeterministic()
    return spark.udf.register(name, udf)


@dataclass(frozen=True)
class Prepared:
    """What ``register`` and ``register_table`` resolve on the driver before they register
    anything: the options checked, the arguments' and the results' columns, the defaults
    (``batch_size``, chunks, ``capacity``) chosen as ``ordered_wait`` chooses them."""

    name: str
    options: WaitOptions
    function: AsyncFunction[Any, Any]
    inputs: StructType
    added: StructType
    batch_size: int
    chunk_rows: int | None
    capacity: int | str
    timezone: str
    epoch: int

    def call_of(self, table: bool = False) -> str:
        """How error messages name the function: ``f(customer_id int)``, or for a table
        function ``f(TABLE(order_id bigint, customer_id int))``."""
        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in self.inputs.fields)
        return f"{self.name}(TABLE({columns}))" if table else f"{self.name}({columns})"

    def spec(
        self,
        mode: OutputMode,
        columns: list[StructField],
        *,
        on_empty: str,
        row_factory: Callable[..., Any] | None,
    ) -> PartitionSpec:
        """The runtime's spec: rows of ``columns`` (then ``_error`` with
        ``on_error="error_column"``) out, the lookup's columns added."""
        opts = self.options
        if opts.on_error == "error_column":
            columns = [*columns, StructField(ERROR_COLUMN, ERROR_STRUCT, True)]
        arrow_schema = to_arrow_schema(StructType(columns), timezone=self.timezone)
        return PartitionSpec(
            options=opts,
            function=self.function,
            function_token=uuid.uuid4().hex,
            mode=mode,
            output_schema=pa.schema([f.with_nullable(True) for f in arrow_schema]),
            added_columns=tuple(f.name for f in self.added.fields),
            capacity=self.capacity,
            on_empty=on_empty,
            output_buffer=opts.output_buffer_for(self.capacity),
            batch_size=self.batch_size,
            uid=f"sql-{self.name}",
            chunk_size=self.chunk_rows,
            row_factory=row_factory,
            run_token=uuid.uuid4().hex[:16],
            run_epoch=self.epoch,
        )


def prepare(
    api: str,
    spark: SparkSession,
    name: str,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    timeout: Any,
    output_schema: str | StructType,
    input_schema: str | StructType | None,
    options: dict[str, Any],
    allowed: frozenset[str],
) -> Prepared:
    """Check ``api``'s call (its options among ``allowed``, the name, the schemas), resolve
    the defaults and run the function's preflight: all on the driver, before anything is
    registered."""
    for keyword, value in options.items():
        if keyword not in allowed:
            known = {f.name for f in fields(WaitOptions)}
            if keyword in known:
                why = _NOT_IN_SQL.get(keyword, "a SQL function has no checkpoints, event "
                                               "time, keys or partitioning")  # fmt: skip
                raise ConfigurationError(
                    f"{api}() has no option {keyword!r} (given {keyword}={value!r:.100}): "
                    f"it is an option of ordered_wait over a DataFrame, and {why}; its "
                    f"options are {', '.join(sorted(allowed))}"
                )
            raise unknown_keyword(api, keyword, value, allowed | _OWN_KEYWORDS)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigurationError(f"name must be a SQL function name (an identifier), got {name!r}")
    opts = WaitOptions.of(timeout=timeout, **options)
    function = as_async_function(fn)
    if opts.metrics is not None and not isinstance(opts.metrics, AsyncMetrics):
        raise ConfigurationError(
            f"metrics must be an asyncio_ops.spark.AsyncMetrics, got {opts.metrics!r}"
        )
    inputs = _input_struct(input_schema, function)
    added = _output_struct(output_schema, inputs)
    _job_errors.install()

    # a DataFrame of the arguments' shape (no job): the preflight and Spark's settings
    shape = spark.createDataFrame([], inputs)
    batch_size = batch_size_of(shape, opts.batch_size)
    chunk_rows = chunk_rows_of(opts.chunk_size, function, opts.rows_as, opts.retry, batch_size)
    capacity = opts.capacity
    if capacity is None:
        capacity = default_capacity(function, opts.chunk_size, chunk_rows)
    run_preflight(opts.preflight, function, shape, added)
    return Prepared(
        name=name,
        options=opts,
        function=function,
        inputs=inputs,
        added=added,
        batch_size=batch_size,
        chunk_rows=chunk_rows,
        capacity=capacity,
        timezone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
        epoch=run_epoch(spark),
    )


def cast_argument(array: pa.Array, field: pa.Field, call: str) -> pa.Array:
    """``array`` as the declared type of the argument ``field`` (a safe cast), else a
    ConfigurationError naming the argument and the call."""
    if array.type == field.type:
        return array
    try:
        return array.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ConfigurationError(
            f"the argument {field.name!r} of the SQL function {call} is {array.type}, "
            f"which does not cast to {field.type}: {exc}"
        ) from exc


_OWN_KEYWORDS: Final = frozenset({"timeout", "output_schema", "input_schema"})
_NOT_IN_SQL: Final = {
    "output_buffer": "a table function's rows leave as they complete",
    "on_empty": "a scalar function answers every row (NULL for no result)",
    "keep_input_columns": "the query chooses its columns",
}


def _input_struct(schema: str | StructType | None, function: AsyncFunction[Any, Any]) -> StructType:
    """``input_schema`` parsed: the arguments' names and types (required, named in the error
    by the function's own request fields when it declares them)."""
    if schema is None:
        target = getattr(function, "fn", function)
        declared = getattr(target, "request_fields", None)
        hint = ""
        if callable(declared):
            names = list(declared())
            hint = (
                f" ({target!r} reads the field(s) {names}: e.g. input_schema="
                + repr(", ".join(f"{n} <type>" for n in names))
                + ")"
            )
        raise ConfigurationError(
            "input_schema is required: it names and types the SQL function's arguments, in "
            "order, e.g. input_schema='customer_id int'" + hint
        )
    inputs = as_struct(schema, "input_schema")
    if not inputs.fields:
        raise ConfigurationError(f"input_schema declares no argument ({schema!r})")
    _distinct_names(inputs, "input_schema", schema)
    return inputs


def _distinct_names(struct: StructType, option: str, schema: str | StructType) -> list[str]:
    """The struct's field names, each once and none reserved (else named errors)."""
    names = [f.name for f in struct.fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"{option} names the column(s) {twice} twice in {schema!r}")
    clash = [n for n in names if n in _RESERVED]
    if clash:
        raise ConfigurationError(f"{option} uses reserved column name(s) {clash}")
    return names


def _output_struct(schema: str | StructType, inputs: StructType) -> StructType:
    added = as_struct(schema, "output_schema")
    if not added.fields:
        raise ConfigurationError(
            f"output_schema declares no columns ({schema!r}): name the columns the "
            "function adds, e.g. 'name string, tier string'"
        )
    names = _distinct_names(added, "output_schema", schema)
    both = sorted(set(names) & {f.name for f in inputs.fields})
    if both:
        raise ConfigurationError(
            f"output_schema column(s) {both} are also arguments in input_schema: rename one"
        )
    return added


def _without_position(row: dict[str, Any]) -> dict[str, Any]:
    """The row the function receives (rows one at a time): its arguments only."""
    out = dict(row)
    del out[POSITION_COLUMN]
    return out


def _row_without_position(row: dict[str, Any]) -> Any:
    return row_of(_without_position(row))


class _Evaluate:
    """One partition of the SQL function: arguments in, ``run_partition``, one value per
    row out, in input order (pickled to the workers)."""

    def __init__(
        self,
        spec: PartitionSpec,
        call: str,
        input_arrow: pa.Schema,
        value_type: pa.DataType,
        *,
        options: WaitOptions,
    ) -> None:
        self.spec = spec
        self.signature = call
        self.input_arrow = input_arrow
        self.value_type = value_type
        self.with_error = options.on_error == "error_column"
        self.result_type: pa.StructType = (
            value_type.field("result").type if self.with_error else value_type
        )
        self.on_done = options.metrics._add if options.metrics is not None else None

    def __call__(self, args: Iterator[Any]) -> Iterator[pa.Array]:
        rows = 0

        def batches() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for given in args:
                batch = self._batch(given, rows)
                rows += batch.num_rows
                yield batch

        out = run_partition(self.spec, batches(), task_info(None), on_done=self.on_done)
        assembler = _InOrder(self)
        for batch in out:
            yield from assembler.add(batch)
        assembler.finish(rows)

    def _batch(self, given: Any, first: int) -> pa.RecordBatch:
        arrays = list(given) if isinstance(given, tuple | list) else [given]
        schema = self.input_arrow
        if len(arrays) != len(schema):
            raise ConfigurationError(
                f"the SQL function {self.signature} takes {len(schema)} argument(s), "
                f"called with {len(arrays)}"
            )
        columns = [cast_argument(array, field, self.signature)
                   for array, field in zip(arrays, schema, strict=True)]  # fmt: skip
        n = len(columns[0])
        columns.append(pa.array(np.arange(first, first + n, dtype=np.int64)))
        return pa.RecordBatch.from_arrays(columns, [*schema.names, POSITION_COLUMN])


class _InOrder:
    """The runtime's output rows (ordered, each input row at least once with on_empty
    "keep") as one value per input row, in input order: a row is emitted once every row
    before it has been (rows of a chunk may leave in any order within it)."""

    def __init__(self, evaluate: _Evaluate) -> None:
        self.e = evaluate
        self.next = 0
        self.pending: list[pa.RecordBatch] = []
        self.result_names = [f.name for f in evaluate.result_type]

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.Array]:
        if batch.num_rows == 0:
            return
        positions = batch.column(POSITION_COLUMN).to_numpy()
        n = len(positions)
        if (
            not self.pending
            and positions[0] == self.next
            and positions[-1] == self.next + n - 1
            and (n == 1 or bool((np.diff(positions) == 1).all()))
        ):  # the common case: in order, one row each
            self.next += n
            yield self._values(batch)
            return
        self.pending.append(batch)
        table = pa.Table.from_batches(self.pending).sort_by(POSITION_COLUMN)
        positions = table.column(POSITION_COLUMN).to_numpy()
        self._check_single(table, positions)
        off = np.flatnonzero(positions != np.arange(self.next, self.next + len(positions)))
        ready = int(off[0]) if len(off) else len(positions)
        if ready:
            self.next += ready
            yield self._values(table.slice(0, ready).combine_chunks().to_batches()[0])
        rest = table.slice(ready)
        self.pending = rest.combine_chunks().to_batches() if rest.num_rows else []

    def finish(self, rows: int) -> None:
        if self.pending or self.next != rows:
            raise AsyncOperatorError(
                f"the SQL function {self.e.signature} answered {self.next} of its partition's "
                f"{rows} rows in order ({sum(b.num_rows for b in self.pending)} held back)"
            )

    def _check_single(self, table: pa.Table, positions: Any) -> None:
        twice = np.flatnonzero(np.diff(positions) == 0)
        if len(positions) and positions[0] < self.next:
            twice = np.array([0])
        if len(twice):
            at = int(twice[0])
            row = {n: table.column(n)[at].as_py() for n in self.e.input_arrow.names}
            raise OutputSchemaError(
                f"the SQL function {self.e.signature} got more than one result for the row "
                f"{row!r:.300}: a scalar function answers one value per row (a one-to-many "
                "lookup runs as a table function, register_table, or with ordered_wait or "
                "unordered_wait)"
            )

    def _values(self, batch: pa.RecordBatch) -> pa.Array:
        columns = [batch.column(n) for n in self.result_names]
        empty = None
        for c in columns:
            missing = c.is_null()
            empty = missing if empty is None else pc.and_(empty, missing)
        result = pa.StructArray.from_arrays(columns, fields=list(self.e.result_type), mask=empty)
        if not self.e.with_error:
            return result
        error = batch.column(ERROR_COLUMN)
        return pa.StructArray.from_arrays([result, error], fields=list(self.e.value_type))


# what help() and inspect show: the SQL options with ordered_wait's defaults
def signature_of(allowed: frozenset[str]) -> inspect.Signature:
    """The signature of ``register`` (``register_table``) with its ``allowed`` options."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("spark", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("timeout", keyword),
        inspect.Parameter("output_schema", keyword),
        inspect.Parameter("input_schema", keyword, default=None),
    ]
    params += [inspect.Parameter(f.name, keyword, default=f.default)
               for f in fields(WaitOptions) if f.name in allowed]  # fmt: skip
    return inspect.Signature(params)


register.__signature__ = signature_of(SQL_OPTIONS)  # type: ignore[attr-defined]
