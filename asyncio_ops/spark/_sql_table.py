"""``register_table``: an async lookup as a table function of Spark SQL.

Contract. ``register_table(spark, name, fn, timeout=..., output_schema=...,
input_schema=..., **options)`` registers ``name`` as a table function of
``spark``'s session (the classic one or a Spark Connect client's) that takes
one table argument: ``SELECT * FROM name(TABLE(orders))``. Its rows are those
``unordered_wait`` gives over a DataFrame of the table's rows: the columns of
``input_schema`` (the table's columns, matched by name, each cast safely to its
declared type), then ``output_schema``'s, then ``_error`` with
``on_error="error_column"``; zero or more rows per input row (one per result;
a row without results dropped or kept with NULLs as ``on_empty`` says, a lookup
connector's default keeping it), in completion order.

Call order on the worker. The function is a PyArrow UDTF (``arrow_udtf``):
Spark creates one handler per partition (per value, with ``PARTITION BY``),
calls ``eval`` with each Arrow batch of the table, then ``terminate``, then
``cleanup``. The first ``eval`` starts :func:`asyncio_ops._runtime.run_partition`
(unordered mode, the worker's one event loop, the function opened once per
worker, ``capacity`` lookups in flight) on a thread of its own
(:class:`_Pump`), fed one batch at a time: each ``eval`` hands its batch over,
first waiting while the runner still holds the previous one (memory stays
bounded by ``capacity`` and two batches), and yields the rows completed
meanwhile; lookups stay in flight while Spark reads the next batch.
``terminate`` ends the input and yields the rest as the lookups complete; a
failure of the runner is raised by the next ``eval`` or by ``terminate``.
``cleanup`` after a failure or an early end (``LIMIT``) stops the runner: it
takes no more input and closes the operator, cancelling what is in flight.

- Columns. A table column that ``input_schema`` does not declare, or a declared
  one the table lacks, fails the query naming them (Spark fixes a Python table
  function's columns when it is registered).
- ``PARTITION BY expr``: Spark shuffles the table's rows by ``expr``, sorts them
  by it within each task and gives each value a handler of its own; each value's
  lookups end (``terminate``) before the next value's begin, so ``capacity``
  lookups are in flight within one value's rows only.
- Options. :data:`TABLE_OPTIONS`: those of ``register`` (:data:`SQL_OPTIONS`)
  but ``output_buffer`` (unordered), and ``on_empty``. The driver checks them,
  resolves the defaults and runs the preflight as ``register`` does.
- Not available: what ``register`` lacks (checkpoints: a retried task or
  micro-batch looks its rows up again; event time; keys), and ``LATERAL``: the
  function is non-deterministic, which Spark refuses in a lateral join.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Final

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.functions import arrow_udtf
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from .._exceptions import ConfigurationError
from .._functions import AsyncFunction
from .._runtime import ERROR_COLUMN, PartitionSpec, RunMetrics, run_partition
from ..options import OutputMode
from ._api import ERROR_STRUCT, _default_on_empty, row_of
from ._frame import task_info
from ._sql import SQL_OPTIONS, cast_argument, prepare, signature_of

__all__ = ["TABLE_OPTIONS", "register_table"]

TABLE_OPTIONS: Final = (SQL_OPTIONS - {"output_buffer"}) | {"on_empty"}
"""The options of ``unordered_wait`` that a SQL table function takes."""


def register_table(
    spark: SparkSession,
    name: str,
    fn: AsyncFunction[Any, Any] | Callable[[Any], Any],
    *,
    timeout: Any,
    output_schema: str | StructType,
    input_schema: str | StructType | None = None,
    **options: Any,
) -> Any:
    """Register ``fn`` as the SQL table function ``name`` of ``spark`` and return it (a
    ``UserDefinedTableFunction``: ``f(df.asTable())`` from the DataFrame API). See the
    module docstring; every option as ``unordered_wait``'s (docs/sql.md).

    Example::

        from asyncio_ops.spark import register_table, session

        async def order_lines(row):  # one row of the table in, any number of rows out
            return [{"line": i, "sku": f"sku-{row['order_id']}-{i}"} for i in range(2)]

        spark = session()
        register_table(spark, "order_lines", order_lines, timeout=5.0,
                       input_schema="order_id long", output_schema="line int, sku string")
        spark.sql("SELECT * FROM order_lines(TABLE(SELECT id AS order_id FROM range(10)))")
    """
    sql = prepare("register_table", spark, name, fn, timeout, output_schema, input_schema,
                  options, TABLE_OPTIONS)  # fmt: skip
    opts = sql.options
    columns = [*sql.inputs.fields, *sql.added.fields]
    spec = sql.spec(
        OutputMode.UNORDERED,
        columns,
        on_empty=opts.on_empty or _default_on_empty(sql.function),
        row_factory=row_of if opts.rows_as == "row" else None,
    )
    if opts.on_error == "error_column":
        columns.append(StructField(ERROR_COLUMN, ERROR_STRUCT, True))
    feed = _Feed(
        spec,
        sql.call_of(table=True),
        to_arrow_schema(sql.inputs, timezone=sql.timezone),
        opts.metrics._add if opts.metrics is not None else None,
    )
    handler = type(name, (_TableFunction,), {"feed": feed, "__qualname__": name})
    udtf: Any = arrow_udtf(handler, returnType=StructType(columns))  # classic or Connect's
    return spark.udtf.register(name, udtf)


register_table.__signature__ = signature_of(TABLE_OPTIONS)  # type: ignore[attr-defined]


class _Feed:
    """What every handler of one registered function shares (pickled to the workers):
    the runtime's spec, and the table's batches made into the runner's input."""

    def __init__(
        self,
        spec: PartitionSpec,
        call: str,
        input_arrow: pa.Schema,
        on_done: Callable[[RunMetrics], None] | None,
    ) -> None:
        self.spec = spec
        self.call = call
        self.input_arrow = input_arrow
        self.on_done = on_done

    def batch(self, args: list[Any]) -> pa.RecordBatch:
        """The one table argument's batch: ``input_schema``'s columns, by name, cast."""
        if len(args) != 1 or not isinstance(args[0], pa.RecordBatch):
            name = self.call.split("(", 1)[0]
            raise ConfigurationError(
                f"the SQL table function {self.call} takes one table argument, e.g. "
                f"SELECT * FROM {name}(TABLE(orders)); it was called with {len(args)} "
                f"argument(s) ({', '.join(type(a).__name__ for a in args)})"
            )
        table: pa.RecordBatch = args[0]
        declared = self.input_arrow.names
        missing = [n for n in declared if n not in table.schema.names]
        extra = [n for n in table.schema.names if n not in declared]
        if missing or extra:
            raise ConfigurationError(
                f"the table argument of the SQL table function {self.call} has the columns "
                f"{table.schema.names}: "
                + (f"it lacks {missing}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"{extra} are not declared in input_schema" if extra else "")
                + " (the function returns input_schema's columns: declare them, or select "
                "the table's columns, TABLE(SELECT ... FROM t))"
            )
        columns = [cast_argument(table.column(f.name), f, self.call) for f in self.input_arrow]
        return pa.RecordBatch.from_arrays(columns, schema=self.input_arrow)


class _TableFunction:
    """The UDTF's handler: Spark makes one per partition (per ``PARTITION BY`` value)."""

    feed: ClassVar[_Feed]

    def __init__(self) -> None:
        self._pump: _Pump | None = None

    def eval(self, *args: Any, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        batch = self.feed.batch([*args, *kwargs.values()])
        if self._pump is None:
            self._pump = _Pump(self.feed.spec, self.feed.on_done)
        yield from self._pump.put(batch)

    def terminate(self) -> Iterator[pa.RecordBatch]:
        if self._pump is not None:
            yield from self._pump.finish()

    def cleanup(self) -> None:
        if self._pump is not None:
            self._pump.stop()


class _Stopped(Exception):
    """The runner's input was abandoned (a failure or an early end elsewhere)."""


class _Pump:
    """``run_partition`` on a thread of its own, fed one batch at a time by the handler
    (on the worker's main thread), its output handed back as it comes. The runner's
    input waits for the next batch; ``put`` waits while the runner holds one."""

    def __init__(self, spec: PartitionSpec, on_done: Callable[[RunMetrics], None] | None):
        self._cond = threading.Condition()
        self._inbox: pa.RecordBatch | None = None
        self._outbox: list[pa.RecordBatch] = []
        self._ended = False  # no more input
        self._stopped = False  # the input abandoned
        self._done = False  # the runner returned or raised
        self._error: BaseException | None = None
        self._timeout = spec.options.timeout
        self._thread = threading.Thread(
            target=self._run,
            args=(spec, task_info(None), on_done),  # the task's context: read on Spark's thread
            name=f"asyncio_ops {spec.uid}",
            daemon=True,
        )
        self._thread.start()

    def put(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Hand the runner ``batch``; the output completed so far."""
        with self._cond:
            self._cond.wait_for(lambda: self._inbox is None or self._done)
            self._raise_failure()
            self._inbox = batch
            self._cond.notify_all()
            ready, self._outbox = self._outbox, []
        return ready

    def finish(self) -> Iterator[pa.RecordBatch]:
        """End the input; the rest of the output as it completes."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        done = False
        while not done:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._outbox) or self._done)
                ready, self._outbox, done = self._outbox, [], self._done
            yield from ready
        self._thread.join()
        self._raise_failure()

    def stop(self) -> None:
        """Abandon the input (cleanup): the runner closes the operator when it next asks
        for a batch. Waits at most ``timeout`` for it: a worker that failed exits."""
        with self._cond:
            if not self._done:
                self._ended = self._stopped = True
                self._cond.notify_all()
        self._thread.join(self._timeout)

    def _raise_failure(self) -> None:
        if self._error is not None and not isinstance(self._error, _Stopped):
            raise self._error

    def _input(self) -> Iterator[pa.RecordBatch]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._inbox is not None or self._ended)
                if self._stopped:
                    raise _Stopped
                batch, self._inbox = self._inbox, None
                self._cond.notify_all()
            if batch is None:
                return
            yield batch

    def _run(
        self, spec: PartitionSpec, task: Any, on_done: Callable[[RunMetrics], None] | None
    ) -> None:
        error: BaseException | None = None
        try:
            for out in run_partition(spec, self._input(), task, on_done=on_done):
                with self._cond:
                    self._outbox.append(out)
                    self._cond.notify_all()
        except BaseException as exc:  # raised on the main thread by put or finish
            error = exc
        with self._cond:
            self._error, self._done = error, True
            self._cond.notify_all()
