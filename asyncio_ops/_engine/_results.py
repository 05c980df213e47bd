"""How an element's outcome is judged: results that are not results, and the error that
fails the operator for an element (the operator's messages, in one place)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._elements import Record
from .._exceptions import (
    AsyncOperatorError,
    AsyncOpsError,
    AsyncTimeoutError,
    InvalidResultError,
    OutputSchemaError,
)


def describe_record(record: Record[Any]) -> str:
    text = repr(record.value)
    if len(text) > 300:
        text = text[:300] + "..."
    if record.timestamp is not None:
        return f"{text} (timestamp {record.timestamp!r})"
    return text


def one_result(results: Any) -> bool:
    """A tuple subclass that is a row (a ``pyspark.sql.Row``, a namedtuple) is one result
    where a list of results belongs: iterating it would take its fields for results.
    (The operator itself passes such tuples on: a chunk's ``ArrowResult`` is one; the
    row-producing adapters judge with this.)"""
    return isinstance(results, tuple) and type(results) is not tuple


def bad_results(results: Any) -> InvalidResultError | None:
    """Why ``results`` of an attempt are not a sequence of results, or None if they are."""
    if (
        results is None
        or isinstance(results, str | bytes | dict)
        or not isinstance(results, Sequence)
    ):
        return InvalidResultError(
            f"async_invoke must return a list of results (empty to emit nothing), "
            f"got {type(results).__name__}: {results!r:.200}"
        )
    return None


def bad_timeout_results(results: Any) -> InvalidResultError | None:
    """Why what ``timeout()`` returned is not a list of results, or None if it is."""
    if results is None or not isinstance(results, list | tuple):
        return InvalidResultError(
            f"timeout() must return a list of results, got {type(results).__name__}"
        )
    return None


def element_failure(
    exc: BaseException,
    value: Any,
    attempts: int,
    last: BaseException | None,
    describe: Callable[[], str],
) -> AsyncOpsError:
    """The error that fails the operator for ``value``.

    A timeout that ends a run of retries names the last attempt's error; an
    operator error about this very element is kept; results that do not fit
    the output schema stay an :class:`OutputSchemaError` (the lookup worked: no
    "lookup failed"), naming the input; anything else is wrapped, naming the
    input (``describe()``) and the attempts, with ``exc`` as cause.

    ``attempts`` are the operator's own (its retry strategy's): a connector
    that reconnects and retries inside one attempt counts as one, so the
    message says "operator attempt(s)".
    """
    error: AsyncOpsError
    if isinstance(exc, AsyncTimeoutError) and last is not None:
        # the budget ran out between retries: say why the attempts failed
        error = AsyncTimeoutError(
            f"{exc}; {attempts} operator attempt(s) made, the last failed with "
            f"{type(last).__name__}: {last}",
            value,
        )
        error.__cause__ = last
    elif isinstance(exc, AsyncOperatorError) and exc.element is value:
        error = exc
    elif isinstance(exc, OutputSchemaError):
        error = OutputSchemaError(
            f"a result does not fit the output schema, for input {describe()}: {exc}"
        )
        error.__cause__ = exc
    else:
        error = AsyncOperatorError(
            f"async lookup failed for input {describe()} after "
            f"{attempts} operator attempt(s): {type(exc).__name__}: {exc}",
            value,
        )
        error.__cause__ = exc
    return error
