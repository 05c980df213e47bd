"""What users implement: :class:`AsyncFunction`.

Compatible with PyFlink's ``pyflink.datastream.functions.AsyncFunction``: a
function written for PyFlink ports by changing its import.

Call order, per operator instance::

    open(runtime_context)        once, before any element (may be async)
    async_invoke(value)          per element attempt (a retry calls it again)
    timeout(value)               only for an element whose budget ran out before
                                 it completed (plain or async)
    close()                      once, after the last element or on failure (may be async)

``async_invoke`` returns a sequence (list or tuple) of results: empty emits
nothing, several fan out. ``None`` is an error.

Optional abilities are declared as protocols, never probed by name:

- :class:`CheckpointedFunction` (like Flink's ``CheckpointedFunction``):
  ``snapshot_function_state() -> pyarrow.Table | None`` is written with each
  checkpoint version by the partition runtime (as Arrow IPC, never pickle) and
  every partition's tables of the previous version are offered back, before
  the first element, to ``initialize_function_state(tables)`` (the
  connectors' lookup cache uses this).
- :class:`SupportsInvokeChunk` / :class:`SupportsInvokeArrow`: whole chunks of
  rows per call, as dicts or as an Arrow batch (``chunk_size=``). A columnar
  function runs columnar by default (``chunk_size="auto"``), each chunk as many
  rows as :class:`PrefersChunks` says (one request's worth), or one input
  Arrow batch; ``async_invoke_arrow`` may answer an :class:`ArrowResult` that
  fails single rows of the chunk on their own.
- :class:`SupportsOutputColumns` / :class:`SupportsOutputSchema`: the declared
  output columns' names, or their Arrow schema, before the first element.
- :class:`SupportsTokenUsage`: tokens a model call was billed, summed in the metrics
- :class:`SupportsRateLimitUsage`: permits and tokens taken from a rate limit and
  the time spent waiting for them, summed in the metrics
- :class:`SupportsCacheStatistics`: cache counters that reach the operator
  metrics.
- :class:`SupportsPreflight`: ``async preflight(context)`` runs once on the
  driver before any Spark job (``preflight=True``, the default, of the Spark
  functions) and checks what it can without the data: a connector connects
  and authenticates, prepares its query, reaches its endpoint. It raises
  asyncio_ops' exceptions (a connector's ``ConnectorError``, a
  ``ConfigurationError``) naming the option, address or column at fault; it
  must leave nothing open, and must not change the function (the object is
  pickled to the executors afterwards). :class:`PreflightContext` says what
  the function will be given and asked for.

Clients, pools and sessions belong in ``open``: the function object is
pickled to Spark executors, and ``__init__`` runs on the driver.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    NamedTuple,
    Protocol,
    TypeVar,
    runtime_checkable,
)

from ._exceptions import AsyncTimeoutError, ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa

IN = TypeVar("IN")
OUT = TypeVar("OUT")


@dataclass(frozen=True)
class RuntimeContext:
    """What a function learns about where it runs (PyFlink's RuntimeContext, trimmed).

    Example:

    >>> from asyncio_ops import AsyncFunction, RuntimeContext
    >>> class Lookup(AsyncFunction):
    ...     def open(self, runtime_context):
    ...         self.region = runtime_context.get_job_parameter("region", "eu")
    ...     async def async_invoke(self, value):
    ...         return [(self.region, value)]
    >>> lookup = Lookup()
    >>> lookup.open(RuntimeContext(job_parameters={"region": "us"}))
    >>> lookup.region
    'us'
    """

    task_name: str = "async-wait"
    index_of_this_subtask: int = 0
    number_of_parallel_subtasks: int = 1
    attempt_number: int = 0
    job_parameters: dict[str, str] = field(default_factory=dict)

    def get_task_name(self) -> str:
        return self.task_name

    def get_index_of_this_subtask(self) -> int:
        return self.index_of_this_subtask

    def get_number_of_parallel_subtasks(self) -> int:
        return self.number_of_parallel_subtasks

    def get_attempt_number(self) -> int:
        return self.attempt_number

    def get_job_parameter(self, key: str, default_value: str | None = None) -> str | None:
        return self.job_parameters.get(key, default_value)


class AsyncFunction(ABC, Generic[IN, OUT]):
    """Base class of async lookups; subclass and implement :meth:`async_invoke`.

    ``default_on_empty``: what the Spark API does with a row this function answers
    with no result when ``on_empty`` is not given: ``"drop"`` (Flink's semantics, an
    inner join), or ``"keep"`` (a left join: the lookup connectors enrich, and a row
    they cannot enrich is kept with NULL output columns).

    Example:

    >>> import asyncio
    >>> from asyncio_ops import AsyncFunction, run_async_wait
    >>> class Lookup(AsyncFunction):
    ...     async def async_invoke(self, value):
    ...         await asyncio.sleep(0.01)  # a call to a slow system
    ...         return [{"id": value, "name": f"customer-{value}"}]
    ...     def timeout(self, value):  # optional: the default fails the operator
    ...         return [{"id": value, "name": None}]
    >>> [r.value["name"] for r in asyncio.run(run_async_wait(Lookup(), [1, 2], timeout=2.0))]
    ['customer-1', 'customer-2']
    """

    default_on_empty: ClassVar[str] = "drop"

    def open(self, runtime_context: RuntimeContext) -> Awaitable[None] | None:
        """Create clients and pools here (runs on the worker). May be ``async``."""

    @abstractmethod
    async def async_invoke(self, value: IN) -> Sequence[OUT]:
        """Look ``value`` up; return the results (possibly empty), never None."""

    def timeout(self, value: IN) -> Sequence[OUT] | Awaitable[Sequence[OUT]]:
        """Called when ``value`` ran out of time. Default: raise, failing the operator."""
        raise AsyncTimeoutError(f"Async function call has timed out for input: {value!r}", value)

    def close(self) -> Awaitable[None] | None:
        """Release what :meth:`open` created. May be ``async``."""


class CoroutineFunction(AsyncFunction[Any, Any]):
    """Adapts a bare ``async def f(value) -> list`` to :class:`AsyncFunction`."""

    def __init__(self, fn: Callable[[Any], Awaitable[Sequence[Any]]]) -> None:
        self.fn = fn

    async def async_invoke(self, value: Any) -> Sequence[Any]:
        return await self.fn(value)

    def __repr__(self) -> str:
        return f"CoroutineFunction({getattr(self.fn, '__qualname__', self.fn)!r})"


def as_async_function(fn: object) -> AsyncFunction[Any, Any]:
    """Accept an :class:`AsyncFunction` or an ``async def``; reject anything else clearly."""
    if isinstance(fn, AsyncFunction):
        return fn
    if callable(fn) and (
        inspect.iscoroutinefunction(fn)
        or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
    ):
        return CoroutineFunction(fn)
    if hasattr(fn, "async_invoke"):
        raise ConfigurationError(
            f"{fn!r} has async_invoke but does not subclass asyncio_ops.AsyncFunction; "
            "subclass it (for a PyFlink function, change the import)"
        )
    raise ConfigurationError(
        f"function must be an asyncio_ops.AsyncFunction or an 'async def f(value)', got {fn!r}"
    )


async def maybe_await(value: object) -> Any:
    """Await ``value`` if it is awaitable (for ``open``/``close``/``timeout``)."""
    if inspect.isawaitable(value):
        return await value
    return value


# -- optional abilities ---------------------------------------------------------------------
@runtime_checkable
class SupportsInvokeChunk(Protocol):
    """Answers a chunk of rows in one call: one result list per row, in order.

    Example:

    >>> from asyncio_ops import AsyncFunction, SupportsInvokeChunk
    >>> class Names(AsyncFunction):
    ...     async def async_invoke(self, row):
    ...         return [{"name": f"customer-{row['id']}"}]
    ...     async def async_invoke_chunk(self, rows):  # one call for chunk_size rows
    ...         return [[{"name": f"customer-{row['id']}"}] for row in rows]
    >>> isinstance(Names(), SupportsInvokeChunk)
    True
    """

    async def async_invoke_chunk(self, rows: list[dict[str, Any]]) -> Sequence[Sequence[Any]]: ...


@runtime_checkable
class SupportsInvokeArrow(Protocol):
    """Answers a chunk as an Arrow batch: ``(row_index, columns)`` (see docs/spark.md).

    Example:

    >>> import asyncio
    >>> import pyarrow as pa
    >>> import pyarrow.compute as pc
    >>> from asyncio_ops import AsyncFunction, SupportsInvokeArrow
    >>> class Double(AsyncFunction):
    ...     async def async_invoke(self, row):
    ...         return [{"twice": row["n"] * 2}]
    ...     async def async_invoke_arrow(self, batch):  # None: every row once, in order
    ...         return None, {"twice": pc.multiply(batch.column("n"), 2)}
    >>> isinstance(Double(), SupportsInvokeArrow)
    True
    >>> batch = pa.record_batch({"n": [1, 2]})
    >>> row_index, columns = asyncio.run(Double().async_invoke_arrow(batch))
    >>> columns["twice"].to_pylist()
    [2, 4]
    """

    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> tuple[Any, Any] | ArrowResult: ...


class ArrowResult(NamedTuple):
    """What ``async_invoke_arrow`` returns when some rows of the chunk failed on their own.

    ``row_index`` and ``columns`` as in the ``(row_index, columns)`` form (see
    docs/spark.md); ``errors`` maps a row of the chunk (0-based) to the exception
    that failed it alone (e.g. a key that matched several rows of a one-to-one
    lookup). A failed row must not appear in ``row_index``; it becomes an error
    row with ``on_error="error_column"``, or fails the partition naming it.

    Example:

    >>> from asyncio_ops import ArrowResult
    >>> from asyncio_ops.connectors import LookupAmbiguousError
    >>> result = ArrowResult([0, 2], {"name": ["ada", "bob"]},  # rows 0 and 2 answered
    ...                      {1: LookupAmbiguousError("key 7 matched 2 rows")})  # row 1 failed
    >>> sorted(result.errors)
    [1]
    """

    row_index: Any
    columns: Any
    errors: Mapping[int, BaseException] = MappingProxyType({})


@runtime_checkable
class PrefersChunks(Protocol):
    """A columnar function that says how it is best called in chunks.

    ``chunk_size="auto"`` (the default) cuts chunks of ``preferred_chunk_rows()``
    rows: one request's worth (a connector's keys per query, or per pool
    round), so that a chunk fails, times out and is retried as the request it
    is; None: in its current configuration the function answers rows one at a
    time (the per-row path is used). ``preferred_capacity()``: the chunks to keep
    in flight when ``capacity`` is not given (what keeps the service busy without
    queueing chunks behind each other: a pool answers a few, an HTTP client as
    many as it has connections).

    Example:

    >>> from asyncio_ops import AsyncFunction, PrefersChunks
    >>> class Batched(AsyncFunction):
    ...     async def async_invoke(self, row):
    ...         return [row]
    ...     async def async_invoke_arrow(self, batch):
    ...         return None, {}
    ...     def preferred_chunk_rows(self):
    ...         return 500  # one request's worth of rows
    ...     def preferred_capacity(self):
    ...         return 8  # requests the service takes at once
    >>> isinstance(Batched(), PrefersChunks)
    True
    """

    def preferred_chunk_rows(self) -> int | None: ...

    def preferred_capacity(self) -> int: ...


@runtime_checkable
class SupportsOutputColumns(Protocol):
    """A function that returns only the output columns it is told, as Spark's
    ``from_json`` keeps only the declared fields (a connector answering with more
    columns than ``output_schema`` declares). The runtime calls
    ``bind_output_columns`` with the declared columns before the first element.

    Example:

    >>> from asyncio_ops import AsyncFunction, SupportsOutputColumns
    >>> class Profile(AsyncFunction):
    ...     columns = None
    ...     def bind_output_columns(self, columns):  # output_schema's names, before any row
    ...         self.columns = list(columns)
    ...     async def async_invoke(self, row):
    ...         answer = {"name": "ada", "tier": "gold", "internal_id": 17}
    ...         return [{c: answer.get(c) for c in self.columns}]
    >>> isinstance(Profile(), SupportsOutputColumns)
    True
    """

    def bind_output_columns(self, columns: Sequence[str]) -> None: ...


@runtime_checkable
class SupportsOutputSchema(Protocol):
    """A function that types its answers by the declared output columns (a model asked
    for JSON of that shape). The runtime calls ``bind_output_schema`` with the Arrow
    schema of the columns the function adds (``output_schema``'s, in its order,
    with their nullability) before the first element, after
    ``bind_output_columns``.

    Example:

    >>> import pyarrow as pa
    >>> from asyncio_ops import AsyncFunction, SupportsOutputSchema
    >>> class Typed(AsyncFunction):
    ...     def bind_output_schema(self, schema):  # the declared columns, as Arrow types
    ...         self.schema = schema
    ...     async def async_invoke(self, row):
    ...         return [{f.name: None for f in self.schema}]
    >>> typed = Typed()
    >>> typed.bind_output_schema(pa.schema([("score", pa.float64())]))
    >>> isinstance(typed, SupportsOutputSchema), typed.schema.names
    (True, ['score'])
    """

    def bind_output_schema(self, schema: pa.Schema) -> None: ...


@runtime_checkable
class CheckpointedFunction(Protocol):
    """A function with state of its own that checkpoints write and restore.

    ``snapshot_function_state`` returns an Arrow table (or None for nothing);
    ``initialize_function_state`` receives the tables every partition wrote in
    the previous version, before the first element (a worker-wide function
    sees every partition's: merge, and drop what is stale).

    Example:

    >>> import pyarrow as pa
    >>> from asyncio_ops import AsyncFunction, CheckpointedFunction
    >>> class Remembering(AsyncFunction):
    ...     def __init__(self):
    ...         self.seen = {}
    ...     async def async_invoke(self, row):
    ...         self.seen[row["id"]] = f"customer-{row['id']}"
    ...         return [{"name": self.seen[row["id"]]}]
    ...     def snapshot_function_state(self):  # written with each checkpoint version
    ...         return pa.table({"id": list(self.seen), "name": list(self.seen.values())})
    ...     def initialize_function_state(self, tables):  # every partition's, before any row
    ...         for table in tables:
    ...             self.seen.update(zip(table["id"].to_pylist(), table["name"].to_pylist()))
    >>> isinstance(Remembering(), CheckpointedFunction)
    True
    """

    def snapshot_function_state(self) -> pa.Table | None: ...

    def initialize_function_state(self, tables: Sequence[pa.Table]) -> None: ...


@dataclass(frozen=True)
class PreflightContext:
    """What a function's :meth:`SupportsPreflight.preflight` may check itself against.

    ``input_schema``: the Arrow schema of the rows the function will receive
    (every input column); ``output_schema``: the Arrow schema of the columns
    it is declared to return (``output_schema=`` of the Spark function).

    Example:

    >>> import asyncio
    >>> import pyarrow as pa
    >>> from asyncio_ops import ConfigurationError, PreflightContext
    >>> async def preflight(context):  # what a function's preflight receives
    ...     if "customer_id" not in context.input_schema.names:
    ...         raise ConfigurationError("needs the input column 'customer_id'")
    >>> context = PreflightContext(pa.schema([("id", pa.int64())]),
    ...                            pa.schema([("name", pa.string())]))
    >>> asyncio.run(preflight(context))
    Traceback (most recent call last):
    asyncio_ops.ConfigurationError: needs the input column 'customer_id'
    """

    input_schema: pa.Schema
    output_schema: pa.Schema


@runtime_checkable
class SupportsPreflight(Protocol):
    """A function that checks, once on the driver before any Spark job, what it can
    without the data (see the module docstring); plain functions have no preflight.

    Example::

        from asyncio_ops import AsyncFunction, ConfigurationError, PreflightContext

        class Tiers(AsyncFunction):
            async def preflight(self, context: PreflightContext) -> None:
                if "customer_id" not in context.input_schema.names:
                    raise ConfigurationError("Tiers needs the input column 'customer_id'")

            async def async_invoke(self, row):
                return [{"tier": "gold"}]

        ordered_wait(people, Tiers(), timeout=2, output_schema="tier string")  # raises, no job
    """

    async def preflight(self, context: PreflightContext) -> None: ...


class CacheCounters(Protocol):
    """Counters of a cache, monotonic over the function's life.

    Example:

    >>> from asyncio_ops import CacheCounters
    >>> from asyncio_ops.connectors import LookupCache
    >>> counters = LookupCache(ttl=60).statistics()  # a CacheCounters
    >>> counters.hits, counters.misses, counters.evictions, counters.expirations
    (0, 0, 0, 0)
    """

    @property
    def hits(self) -> int: ...

    @property
    def misses(self) -> int: ...

    @property
    def evictions(self) -> int: ...

    @property
    def expirations(self) -> int: ...


@runtime_checkable
class SupportsTokenUsage(Protocol):
    """A function that calls a model and counts what it was billed, monotonic over its
    life: ``(prompt_tokens, completion_tokens, cost)``, the cost None without prices.
    The runtime adds each partition's share to the metrics (``prompt_tokens``,
    ``completion_tokens``, ``cost``).

    Example:

    >>> from asyncio_ops import SupportsTokenUsage
    >>> from asyncio_ops.connectors.openai import ChatLookup
    >>> chat = ChatLookup("http://127.0.0.1:8090/v1", "local", prompt="{text}")
    >>> isinstance(chat, SupportsTokenUsage), chat.token_usage()  # (prompt, completion, cost)
    (True, (0, 0, None))
    """

    def token_usage(self) -> tuple[int, int, float | None]: ...


@runtime_checkable
class SupportsRateLimitUsage(Protocol):
    """A function that waits on a rate limit and counts it, monotonic over its life:
    ``(permits, tokens, seconds_waited)``: request permits and tokens it took from the
    limit, and the seconds its calls spent waiting for them (summed over calls, so
    concurrent waits add up). The runtime adds each partition's share to the metrics
    (``rate_limit_permits``, ``rate_limit_tokens``, ``rate_limit_wait_seconds``).

    Example:

    >>> from asyncio_ops import SupportsRateLimitUsage
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> lookup = HttpLookup("http://api/customers/{id}", rate_limit=50)
    >>> isinstance(lookup, SupportsRateLimitUsage), lookup.rate_limit_usage()
    (True, (0, 0, 0.0))
    """

    def rate_limit_usage(self) -> tuple[int, int, float]: ...


@runtime_checkable
class SupportsServiceRetries(Protocol):
    """A function that retries a service's answers itself, inside one attempt, and counts
    it, monotonic over its life: ``(retried, throttled, throttle_wait_seconds)``: the
    requests it sent again, the answers that said "slow down" (429, 503), and the
    seconds it waited before sending again (summed over calls). The runtime adds each
    partition's share to the metrics (``connector_retried``, ``throttled``,
    ``throttle_wait_seconds``).

    Example:

    >>> from asyncio_ops import SupportsServiceRetries
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> lookup = HttpLookup("http://api/customers/{id}")
    >>> isinstance(lookup, SupportsServiceRetries), lookup.service_retries()
    (True, (0, 0, 0.0))
    """

    def service_retries(self) -> tuple[int, int, float]: ...


@runtime_checkable
class SupportsNullKeyCount(Protocol):
    """A function that answers a row whose key is NULL without a request, and counts
    those rows, monotonic over its life. The runtime adds each partition's share to
    the metrics (``skipped_null_keys``).

    Example:

    >>> import asyncio
    >>> from asyncio_ops import SupportsNullKeyCount
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> lookup = HttpLookup("http://api/customers/{id}")
    >>> async def main():
    ...     async with lookup:
    ...         return await lookup.async_invoke({"id": None})  # NULL: no request at all
    >>> asyncio.run(main()), isinstance(lookup, SupportsNullKeyCount), lookup.null_key_count()
    ([], True, 1)
    """

    def null_key_count(self) -> int: ...


@runtime_checkable
class SupportsCacheStatistics(Protocol):
    """A function whose cache counters reach the operator metrics (None: no cache).

    Example:

    >>> from asyncio_ops import SupportsCacheStatistics
    >>> from asyncio_ops.connectors import LookupCache
    >>> from asyncio_ops.connectors.http import HttpLookup
    >>> lookup = HttpLookup("http://api/customers/{id}", cache=LookupCache(ttl=60))
    >>> isinstance(lookup, SupportsCacheStatistics), lookup.cache_statistics().hits
    (True, 0)
    """

    def cache_statistics(self) -> CacheCounters | None: ...
