"""``AsyncDataStream``: PyFlink's names and argument order over DataFrames, for porting.

PyFlink::

    AsyncDataStream.unordered_wait(ds, AsyncFunctionImpl(), Time.seconds(5), 100, Types.ROW(...))

asyncio_ops, the same call with a DataFrame and a Spark schema as ``output_type``::

    AsyncDataStream.unordered_wait(df, AsyncFunctionImpl(), 5, 100, "id long, name string")

What a PyFlink function sees and returns is kept: each input row arrives as a
``pyspark.sql.Row`` (``value[0]``, ``value.name``), and the results may be
``Row``s, tuples or, with a one-column ``output_type``, bare values; the output
is only what the function returns (PyFlink's output stream), not the input
columns (an error row of ``on_error="error_column"`` carries them as
``_error.input``). The function subclasses ``asyncio_ops.AsyncFunction`` instead of
PyFlink's; ``open``, ``async_invoke``, ``timeout`` and ``close`` keep their
meaning. ``timeout`` is seconds, a ``timedelta``, an interval string, or
anything with PyFlink's ``Time.to_milliseconds()`` (``asyncio_ops.spark.Time``, or
PyFlink's own). Every other option of
:func:`ordered_wait` / :func:`unordered_wait` may follow as a keyword.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from .._engine._retry import AsyncRetryStrategy
from .._exceptions import ConfigurationError
from .._functions import AsyncFunction, as_async_function
from ..options import DEFAULT_CAPACITY

# aliased: inside the class body the names ordered_wait / unordered_wait are its methods
from ._api import ordered_wait as _ordered_wait
from ._api import unordered_wait as _unordered_wait
from ._frame import as_struct
from ._keywords import known_keywords


@runtime_checkable
class Milliseconds(Protocol):
    """PyFlink's ``Time`` (``Time.seconds(5)``), as far as a timeout needs it."""

    def to_milliseconds(self) -> int: ...


Timeout = float | timedelta | str | Milliseconds


def _seconds(timeout: Timeout) -> float | timedelta | str:
    if isinstance(timeout, Milliseconds):
        return timeout.to_milliseconds() / 1000
    return timeout


class AsyncDataStream:
    """PyFlink's ``AsyncDataStream`` over DataFrames (see the module docstring).

    Example::

        from asyncio_ops import AsyncFunction
        from asyncio_ops.spark import AsyncDataStream, Time, session

        class Names(AsyncFunction):  # a PyFlink function: a Row in, results out
            async def async_invoke(self, value):
                return [(value.id, f"customer-{value.id}")]

        spark = session()
        names = AsyncDataStream.unordered_wait(spark.range(100), Names(), Time.seconds(5), 100,
                                               "id long, name string")
    """

    @staticmethod
    def _apply(
        wait: Any,
        data_stream: DataFrame,
        async_function: AsyncFunction[Any, Any],
        timeout: Timeout,
        capacity: int | str,
        output_type: str | StructType | None,
        retry: AsyncRetryStrategy | None,
        options: dict[str, Any],
    ) -> DataFrame:
        if output_type is None:
            raise ConfigurationError(
                "output_type is required: the Spark schema of what the function returns "
                "(a DDL string such as 'id long, name string', or a StructType)"
            )
        as_struct(output_type, "output_type")  # named as PyFlink names it, if malformed
        options.setdefault("keep_input_columns", False)
        options.setdefault("rows_as", "row")
        return wait(  # type: ignore[no-any-return]
            data_stream, as_async_function(async_function), timeout=_seconds(timeout),
            capacity=capacity, output_schema=output_type, retry=retry, **options,
        )  # fmt: skip

    @staticmethod
    @known_keywords(forwards_to=_ordered_wait)
    def ordered_wait(
        data_stream: DataFrame,
        async_function: AsyncFunction[Any, Any],
        timeout: Timeout,
        capacity: int | str = DEFAULT_CAPACITY,
        output_type: str | StructType | None = None,
        **options: Any,
    ) -> DataFrame:
        """Results in input order (PyFlink's ``AsyncDataStream.ordered_wait``)."""
        return AsyncDataStream.ordered_wait_with_retry(
            data_stream, async_function, timeout, None, capacity, output_type, **options
        )

    @staticmethod
    @known_keywords(forwards_to=_unordered_wait)
    def unordered_wait(
        data_stream: DataFrame,
        async_function: AsyncFunction[Any, Any],
        timeout: Timeout,
        capacity: int | str = DEFAULT_CAPACITY,
        output_type: str | StructType | None = None,
        **options: Any,
    ) -> DataFrame:
        """Results as they complete (PyFlink's ``AsyncDataStream.unordered_wait``)."""
        return AsyncDataStream.unordered_wait_with_retry(
            data_stream, async_function, timeout, None, capacity, output_type, **options
        )

    @staticmethod
    @known_keywords(forwards_to=_ordered_wait)
    def ordered_wait_with_retry(
        data_stream: DataFrame,
        async_function: AsyncFunction[Any, Any],
        timeout: Timeout,
        async_retry_strategy: AsyncRetryStrategy | None,
        capacity: int | str = DEFAULT_CAPACITY,
        output_type: str | StructType | None = None,
        **options: Any,
    ) -> DataFrame:
        """:meth:`ordered_wait` with a retry strategy (PyFlink's argument order; None:
        no retries)."""
        return AsyncDataStream._apply(
            _ordered_wait, data_stream, async_function, timeout, capacity, output_type,
            async_retry_strategy, options,
        )  # fmt: skip

    @staticmethod
    @known_keywords(forwards_to=_unordered_wait)
    def unordered_wait_with_retry(
        data_stream: DataFrame,
        async_function: AsyncFunction[Any, Any],
        timeout: Timeout,
        async_retry_strategy: AsyncRetryStrategy | None,
        capacity: int | str = DEFAULT_CAPACITY,
        output_type: str | StructType | None = None,
        **options: Any,
    ) -> DataFrame:
        """:meth:`unordered_wait` with a retry strategy (PyFlink's argument order;
        None: no retries)."""
        return AsyncDataStream._apply(
            _unordered_wait, data_stream, async_function, timeout, capacity, output_type,
            async_retry_strategy, options,
        )  # fmt: skip
