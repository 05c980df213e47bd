"""What every lookup shares: the NULL-key rule, lifecycle, cache identity, pickling, statistics.

A lookup's life (the :class:`asyncio_ops.AsyncFunction` call order)::

    __init__              on the driver: validates options, opens nothing
    (pickled to each worker; the copy carries configuration only)
    open(ctx)             on the worker: acquires the process-wide client, creates
                          the batcher; idempotent while open
    async_invoke(row)     per row attempt, concurrently: the NULL-key rule, then the
                          connector's ``lookup(row)``; ConnectorError subclasses
    async_invoke_arrow(b) per chunk (columnar path): the rule, then ``lookup_many(b)``
                          with the chunk's rows whose request fields are all set
    close()               cancels batches in flight, releases the client (closed with
                          its last user), keeps the statistics

The NULL-key rule, in one place for every connector: a row whose value is NULL
in any field a request is made of (``request_fields()``: a key, a URL template's
fields, a prompt's) matches nothing and sends nothing. The row gets no result
(the operator drops it, or keeps it with NULL output columns, as ``on_empty``
says) and is counted in ``statistics().null_keys`` and the operator metrics'
``skipped_null_keys``. A field the row does not have at all is a
:class:`LookupKeyError` naming it (a schema mistake, not a missing value). A
connector that wants NULLs says so by returning ``()`` from ``request_fields()``.
Subclasses implement ``lookup`` and ``lookup_many``, never ``async_invoke`` or
``async_invoke_arrow`` themselves (refused when the class is defined).

It is also an async context manager (``async with lookup: ...``) for use outside
the operator.

What ``asyncio_ops.spark.lookup_join`` may do with a lookup, the lookup declares
(:meth:`BaseLookup.join_strategies`): ``"rows"`` always; ``"distinct"`` (each
distinct key looked up once, joined back) when its answer is decided by its
request fields alone; ``"bulk"`` when it can list every key it answers, part by
part (:meth:`BaseLookup.bulk_keys`, with :meth:`BaseLookup.table_statistics`
for the cost model): a ``PostgresLookup`` given ``table=``.

One class with one job, :class:`BaseLookup`, the connectors' base (with the records
of its counters and of a table's statistics).
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from asyncio_ops import (
    ArrowResult,
    AsyncFunction,
    ConfigurationError,
    RuntimeContext,
    UnsupportedKeyError,
)

from ._batching import BatchStatistics
from ._cache import CacheStatistics, LookupCache
from ._exceptions import ConnectorError, LookupKeyError
from ._keys import KeyFields
from ._rate_limit import RateLimit
from ._slow_down import Pace, clipped

if TYPE_CHECKING:  # pyarrow is needed only by the columnar path (the spark extra)
    import pyarrow as pa

__all__ = ["BaseLookup", "LookupStatistics", "Row", "TableStatistics"]

log = logging.getLogger("asyncio_ops.connectors")

Row = dict[str, Any]
R = TypeVar("R")
L = TypeVar("L", bound="BaseLookup[Any]")


@dataclass(frozen=True)
class LookupStatistics:
    """Counters of one lookup since construction (summed over open/close cycles).

    ``rows``: input rows (one at a time and in chunks); ``null_keys``: rows answered
    empty without a request because a request field was NULL; ``batching``: requests
    actually sent (see :class:`~connectors._batching.BatchStatistics`); ``cache``: None
    without a cache.

    Example::

        stats = lookup.statistics()  # rows, null_keys, batching.batches (requests), cache
    """

    rows: int
    null_keys: int
    batching: BatchStatistics
    cache: CacheStatistics | None


@dataclass(frozen=True)
class TableStatistics:
    """The table a lookup reads its answers from, as the database estimates it: its name,
    its rows and its size in bytes, and where the figures come from (``source``)."""

    table: str
    rows: int
    bytes: int
    source: str


_NO_BATCHES = BatchStatistics(0, 0, 0, 0, 0)


def add_batch_statistics(a: BatchStatistics, b: BatchStatistics) -> BatchStatistics:
    return BatchStatistics(
        loads=a.loads + b.loads,
        batches=a.batches + b.batches,
        keys_fetched=a.keys_fetched + b.keys_fetched,
        deduplicated=a.deduplicated + b.deduplicated,
        failed_batches=a.failed_batches + b.failed_batches,
    )


_SEALED: Final = ("async_invoke", "async_invoke_arrow")
# the row being looked up, in the task that looks it up (for _before_retry's record)
_ROW: Final[contextvars.ContextVar[int | None]] = contextvars.ContextVar(
    "asyncio_ops_lookup_row", default=None
)
# the schema metadata of a checkpointed cache: the fingerprint of what its answers answer
_SCOPE: Final = "asyncio_ops.cache_scope"


class BaseLookup(AsyncFunction[Mapping[str, Any], Row], Generic[R]):
    """Lifecycle, the NULL-key rule, pickling, cache and statistics of a lookup whose
    runtime is ``R`` (see the module docstring).

    Subclasses implement :meth:`request_fields`, :meth:`_open_runtime`,
    :meth:`_close_runtime`, :meth:`_runtime_batch_statistics` and :meth:`lookup`;
    a columnar one also :meth:`lookup_many`, :meth:`preferred_chunk_rows` and
    :meth:`preferred_capacity`. Everything bound to a process or loop lives in
    ``self._runtime`` and is never pickled.

    Example (docs/writing-a-connector.md has it whole)::

        class RedisGet(BaseLookup[Runtime]):
            def request_fields(self) -> tuple[str, ...]:
                return ("id",)  # a row whose id is NULL is answered empty, never sent

            async def lookup(self, value):
                value = await self._require_runtime().client.get(f"user:{value['id']}")
                return [] if value is None else [{"value": value}]
    """

    _runtime: R | None
    cache: LookupCache[Any] | None
    # a row the lookup cannot enrich is kept with NULL output columns unless the
    # user says on_empty="drop" (a left join, as Beam's Enrichment)
    default_on_empty = "keep"
    # the answers carry the input row's fields (a connector's include_input=True): they
    # then depend on the whole row, not only on its request fields
    include_input = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _SEALED:
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__qualname__} overrides {name}(), which BaseLookup keeps: it "
                    "applies the NULL-key rule before the connector's own lookup(row) / "
                    "lookup_many(batch); implement those instead"
                )

    def __init__(self, *, cache: LookupCache[Any] | None) -> None:
        if cache is not None:
            if not isinstance(cache, LookupCache):
                raise ConfigurationError(
                    f"cache must be an asyncio_ops.connectors.LookupCache, got {cache!r}"
                )
            if cache.bound:
                raise ConfigurationError(
                    f"{cache!r} belongs to another lookup already: give each lookup a "
                    "LookupCache of its own (lookups share answers through shared= and "
                    "name=, when they ask the same question, or with cache_key=)"
                )
            if (cache.shared is not None and cache.cache_key is None
                    and type(self).cache_identity is BaseLookup.cache_identity):  # fmt: skip
                raise ConfigurationError(
                    f"a shared LookupCache needs to know what decides {type(self).__name__}'s "
                    "answers: implement cache_identity(), or give the cache cache_key= "
                    "(every lookup naming that cache and key shares its answers)"
                )
            cache.bound = True
        self.cache = cache
        self._runtime = None
        self._gate: tuple[str, ...] = ()  # request_fields(), taken by open()
        self._rows = 0
        self._null_keys = 0
        self._closed_batches = _NO_BATCHES
        # what this lookup took from its rate limit (asyncio_ops.SupportsRateLimitUsage)
        self._limit_permits = 0
        self._limit_tokens = 0
        self._limit_waited = 0.0
        # the last "slow down" answered for each row still waiting (id of the row), for
        # the row's timeout to raise
        self._refusals: dict[int, BaseException] = {}
        # the service's answers this lookup retried itself (asyncio_ops.SupportsServiceRetries)
        self._retried = 0
        self._throttled = 0
        self._throttle_waited = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self, runtime_context: RuntimeContext | None = None) -> None:
        """Acquire the worker's shared client. Idempotent while open.

        Raises the connector's mapped errors (e.g. LookupConnectionError,
        LookupAuthError) when the server cannot be reached.
        """
        if self._runtime is None:
            self._gate = tuple(self.request_fields())
            self._runtime = await self._open_runtime()

    async def close(self) -> None:
        """Cancel requests in flight and release the shared client (and the shared
        cache's connection). Idempotent."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            self._closed_batches = add_batch_statistics(
                self._closed_batches, self._runtime_batch_statistics(runtime)
            )
            try:
                await self._close_runtime(runtime)
            finally:
                if self.cache is not None and self.cache.layer is not None:
                    await self.cache.layer.aclose()

    async def __aenter__(self: L) -> L:
        await self.open(RuntimeContext())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the NULL-key rule -------------------------------------------------------------
    @abc.abstractmethod
    def request_fields(self) -> Sequence[str]:
        """The input fields a request is made of: a NULL in any of them sends nothing
        and gives the row no result. ``()``: the connector receives every row."""

    async def async_invoke(self, value: Mapping[str, Any]) -> list[Row]:
        """The rows ``lookup(value)`` answers; ``[]`` without calling it when a request
        field of ``value`` is NULL (counted in ``null_keys``)."""
        self._rows += 1
        for name in self._gate:
            try:
                missing = value[name] is None
            except KeyError:
                raise LookupKeyError(
                    f"input row has no key field {name!r} ({type(self).__name__}'s requests "
                    f"are made of {list(self._gate)!r}); fields present: {sorted(value)!r}"
                ) from None
            except TypeError:
                raise KeyFields._not_a_mapping(value) from None
            if missing:
                self._null_keys += 1
                return []
        token = _ROW.set(id(value))
        cancelled = False
        try:
            return await self.lookup(value)
        except asyncio.CancelledError:
            cancelled = True  # a timeout: timeout(value) names the row's last "slow down"
            raise
        finally:
            _ROW.reset(token)
            if self._refusals and not cancelled:
                self._refusals.pop(id(value), None)

    def timeout(self, value: Mapping[str, Any]) -> list[Row]:
        """The operator's timeout of ``value``: the last "slow down" (429, 503) the service
        answered for it, when it was still asking the row to wait (so a service that
        answers 503 for good fails a job naming the status and the URL), else
        :class:`asyncio_ops.AsyncTimeoutError`."""
        refused = self._refusals.pop(id(value), None)
        if refused is not None:
            raise refused
        return list(super().timeout(value))  # type: ignore[arg-type]

    async def async_invoke_arrow(self, batch: pa.RecordBatch) -> tuple[Any, Any] | ArrowResult:
        """``lookup_many`` of the chunk's rows whose request fields are all set, its row
        indexes mapped back to the whole chunk; the other rows get no result (counted
        in ``null_keys``). A chunk without NULLs is handed over as it is."""
        self._require_runtime()
        rows = batch.num_rows
        self._rows += rows
        valid = None
        for name in self._gate:
            index = batch.schema.get_field_index(name)
            if index < 0:
                raise LookupKeyError(
                    f"input has no key column {name!r} ({type(self).__name__}'s requests "
                    f"are made of {list(self._gate)!r}); columns present: "
                    f"{sorted(batch.schema.names)!r}"
                )
            column = batch.column(index)
            if column.null_count:
                import pyarrow.compute as pc

                present = pc.is_valid(column)
                valid = present if valid is None else pc.and_(valid, present)
        if valid is None:
            return await self.lookup_many(batch)
        import pyarrow as pa
        import pyarrow.compute as pc

        kept = pc.indices_nonzero(valid).cast(pa.int64())
        self._null_keys += rows - len(kept)
        if not len(kept):
            return [], {}
        answer = await self.lookup_many(batch.take(kept))
        errors: Mapping[int, BaseException] = {}
        if isinstance(answer, ArrowResult):
            index, columns, errors = answer
        else:
            index, columns = answer
        at = kept.to_pylist()
        if index is None:  # every row once, in order
            whole = at
        else:
            positions = index.to_pylist() if isinstance(index, pa.Array) else index
            whole = [at[i] for i in positions]
        if errors:
            return ArrowResult(whole, columns, {at[i]: e for i, e in errors.items()})
        return whole, columns

    @abc.abstractmethod
    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        """The rows matching one input row, whose request fields are all set."""

    async def lookup_many(self, batch: pa.RecordBatch) -> tuple[Any, Any] | ArrowResult:
        """A chunk's answers as Arrow (``SupportsInvokeArrow``'s ``(row_index, columns)``
        or an :class:`~asyncio_ops.ArrowResult`); every row's request fields are set.
        Only columnar connectors implement it (with ``preferred_chunk_rows``)."""
        raise ConfigurationError(
            f"{type(self).__name__} answers rows one at a time (no lookup_many): leave "
            "chunk_size at 'auto'"
        )

    def preferred_chunk_rows(self) -> int | None:
        """``asyncio_ops.PrefersChunks``: rows per chunk of the columnar path; None (this
        default): rows one at a time, through :meth:`lookup`."""
        return None

    def preferred_capacity(self) -> int:
        """``asyncio_ops.PrefersChunks``: chunks in flight by default (with chunks)."""
        return 1

    # -- what lookup_join may do (asyncio_ops.spark.lookup_join) -------------------------
    def join_strategies(self) -> tuple[str, ...]:
        """How ``lookup_join`` may join this lookup: ``"rows"`` (every row looked up)
        always; ``"distinct"`` (each distinct key once, joined back) when the answer is
        decided by :meth:`request_fields` alone (there are some, and the answers do not
        carry the input row: no ``include_input``); ``"bulk"`` when the lookup can list
        every key it answers (:meth:`bulk_keys`), which only connectors that read a table
        add."""
        if not tuple(self.request_fields()) or self.include_input:
            return ("rows",)
        return ("rows", "distinct")

    async def table_statistics(self) -> TableStatistics:
        """The table the lookup reads, as the database estimates it (for the ``"bulk"``
        strategy's cost); on an open lookup. Only lookups with ``"bulk"`` in
        :meth:`join_strategies` answer it."""
        raise self._no_table()

    async def bulk_keys(self, part: int, parts: int, schema: pa.Schema) -> pa.Table:
        """Every key this lookup answers whose hash falls in ``part`` of ``parts`` (each key
        in exactly one part), distinct and without NULLs, as columns of ``schema`` (the
        input's key columns, named as :meth:`request_fields`); on an open lookup. Looking
        each up answers what the lookup answers for every key: a key not listed has no
        answer. Only lookups with ``"bulk"`` in :meth:`join_strategies` answer it."""
        raise self._no_table()

    def _no_table(self) -> ConfigurationError:
        return ConfigurationError(
            f"{type(self).__name__} reads no table it could list (its join strategies: "
            f"{list(self.join_strategies())}): use strategy='rows' or 'distinct'"
        )

    def _require_runtime(self) -> R:
        runtime = self._runtime
        if runtime is None:
            raise ConnectorError(f"{type(self).__name__} is not open; call open() first")
        return runtime

    def service_endpoint(self) -> str | None:
        """``asyncio_ops.CallsService``: the service this lookup calls, without
        credentials (``capacity="auto"`` starts a worker's next partition calling it
        where the last one's limit ended); None (this default): not known."""
        return None

    # -- the cache: whose answers --------------------------------------------------------
    def cache_identity(self) -> Mapping[str, Any] | None:
        """Everything besides the key that decides this lookup's answers (its query, URL,
        model, prompt ...), as JSON-able values, never a credential: a cache entry is
        an answer to that question only (the shared layer's keys and the checkpointed
        cache carry its fingerprint). None (this default): not known, and a shared
        cache then needs ``cache_key=``."""
        return None

    def _cache(self) -> LookupCache[Any]:
        """The cache, bound to this lookup's question before its first read."""
        cache = self.cache
        assert cache is not None
        if cache.scope is None:
            cache.bind(self._cache_scope())
        return cache

    def _cache_scope(self) -> str:
        """The fingerprint of :meth:`cache_identity` (``cache_key`` when given)."""
        cache = self.cache
        if cache is not None and cache.cache_key is not None:
            return cache.cache_key
        identity = self.cache_identity()
        # the class that says what decides its answers (a subclass that only adds
        # behaviour around the same question shares them; one that changes the question
        # overrides cache_identity)
        owner = next(c for c in type(self).__mro__ if "cache_identity" in c.__dict__)
        text = json.dumps(
            {"connector": owner.__qualname__, "identity": identity},
            sort_keys=True, default=repr, separators=(",", ":"),
        )  # fmt: skip
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]

    async def _matches_of(
        self,
        keys: Sequence[Hashable | None],
        fetch: Callable[[Sequence[Hashable]], Awaitable[Mapping[Hashable, Any]]],
        size: int,
    ) -> dict[Hashable, Any]:
        """The answers of every distinct non-null key in ``keys`` (a chunk's): the cache
        first (its shared layer too), then ``fetch`` of at most ``size`` keys per call,
        concurrently; a key ``fetch`` does not answer gets ``()``. Counts null keys;
        fills the cache."""
        cache = self.cache
        known: dict[Hashable, Any] = {}
        for key in keys:
            if key is None:
                self._null_keys += 1
            elif key not in known:
                known[key] = ()
        wanted = list(known)
        if cache is not None:  # this process's layer, then a shared one's
            cache = self._cache()
            found = await cache.get_through(wanted)
            known.update(found)
            wanted = [key for key in wanted if key not in found]
        if wanted:
            parts = await asyncio.gather(
                *(fetch(wanted[i : i + size]) for i in range(0, len(wanted), size))
            )
            for part in parts:
                known.update(part)
            if cache is not None:
                await cache.put_through([(key, known[key]) for key in wanted])
        return known

    @staticmethod
    def _columns_of(
        keys: Sequence[Hashable | None],
        known: Mapping[Hashable, Sequence[Row]],
        names: Sequence[str] | None,
    ) -> tuple[list[int], dict[str, list[Any]]]:
        """A chunk's answers (``known``, from :meth:`_matches_of`) as columns,
        ``(row_index, columns)``: a row repeats once per match of its key, and one
        without a match (a NULL key among them) drops out. The columns are ``names``
        (the bound output columns), else every name the matches hold, in the order met."""
        index: list[int] = []
        found: list[Row] = []
        for i, key in enumerate(keys):
            rows = known.get(key, ()) if key is not None else ()
            index.extend([i] * len(rows))
            found.extend(rows)
        if names is None:
            names = tuple(dict.fromkeys(name for row in found for name in row))
        return index, {name: [row.get(name) for row in found] for name in names}

    async def _cached(self, key: Hashable, fetch: Callable[[], Awaitable[Any]]) -> Any:
        """One key's answer: from the cache (its shared layer too), else ``fetch()``,
        then kept in the cache."""
        if self.cache is None:
            return await fetch()
        cache = self._cache()
        found = await cache.get_through([key])
        if key in found:
            return found[key]
        answer = await fetch()
        await cache.put_through([(key, answer)])
        return answer

    # -- rate limit ------------------------------------------------------------------
    @asynccontextmanager
    async def _limited(self, limit: RateLimit | None, tokens: int = 0) -> AsyncIterator[None]:
        """Run the block once ``limit`` (if any) gave one request permit and ``tokens``;
        counted in :meth:`rate_limit_usage` (the tokens only when the limit counts tokens:
        a limit of requests alone takes none)."""
        if limit is None:
            yield
            return
        async with limit.acquire(tokens=tokens) as permit:
            self._limit_permits += 1
            if limit.tokens_per_minute is not None:  # taken only by a limit that counts them
                self._limit_tokens += tokens
            self._limit_waited += permit.waited
            yield

    async def _settle(self, limit: RateLimit, reserved: int, used: int) -> None:
        """A call that reserved ``reserved`` tokens was billed ``used``: the limit (and
        this lookup's count of tokens) follows what was billed."""
        await limit.settle(reserved, used)
        if limit.tokens_per_minute is not None:
            self._limit_tokens += used - reserved

    def rate_limit_usage(self) -> tuple[int, int, float]:
        """``asyncio_ops.SupportsRateLimitUsage``: request permits and tokens this lookup
        took from its rate limit, and the seconds its calls waited for them (summed over
        calls), since construction; zeros without a limit."""
        return self._limit_permits, self._limit_tokens, self._limit_waited

    @abc.abstractmethod
    async def _open_runtime(self) -> R: ...

    @abc.abstractmethod
    async def _close_runtime(self, runtime: R) -> None: ...

    @abc.abstractmethod
    def _runtime_batch_statistics(self, runtime: R) -> BatchStatistics: ...

    # -- pickling: configuration only -------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- checkpointing (asyncio_ops calls these when checkpoint_location is set) ----------
    def snapshot_function_state(self) -> pa.Table | None:
        """The cache's live entries as Arrow, written with each checkpoint version.

        Columns: ``key`` (the key's canonical bytes, see
        :func:`asyncio_ops.state.canonical_bytes`), ``written_at`` (seconds) and
        ``rows`` (the cached matches, typed by Arrow from their values). Entries
        whose values Arrow cannot type together are not written (the cache is
        an optimisation: the next run looks them up again), with a warning.
        """
        if self.cache is None:
            return None
        entries = self.cache.snapshot()
        if not entries:
            return None
        import pyarrow as pa

        from asyncio_ops import canonical_bytes

        try:
            rows = pa.array([[dict(m.items()) for m in value] for _, (_, value) in entries])
            return pa.table(
                {
                    "key": pa.array([canonical_bytes(k) for k, _ in entries], pa.binary()),
                    "written_at": pa.array([w for _, (w, _) in entries], pa.float64()),
                    "rows": rows,
                },
                metadata={_SCOPE: self._cache_scope()},
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnsupportedKeyError) as exc:
            log.warning("%s: the cache is not checkpointed: %s", type(self).__name__, exc)
            return None

    def initialize_function_state(self, tables: Sequence[pa.Table]) -> None:
        """Warm the cache from the previous checkpoint version (unexpired entries only):
        the tables written by a lookup asking the same question (the fingerprint of
        :meth:`cache_identity` in their metadata); others are skipped, with a note."""
        if self.cache is None:
            return
        from asyncio_ops import decode_canonical

        scope = self._cache_scope().encode()
        for table in tables:
            if (table.schema.metadata or {}).get(_SCOPE.encode()) != scope:
                log.info(
                    "%s: a checkpointed cache of another question (its query, URL, "
                    "model or prompt changed) is not restored",
                    type(self).__name__,
                )
                continue
            keys = table.column("key").to_pylist()
            written = table.column("written_at").to_pylist()
            rows = table.column("rows").to_pylist()
            self.cache.restore(
                (decode_canonical(k), (w, tuple(r)))
                for k, w, r in zip(keys, written, rows, strict=True)
            )

    async def _before_retry(
        self, delay: float, status: int | None, error: BaseException | None = None
    ) -> None:
        """Wait ``delay`` seconds before sending a request again, counted: a retry, and a
        throttle when the service answered ``status`` 429 or 503 ("slow down"), whose
        ``error`` the row's timeout then raises (:meth:`timeout`)."""
        self._retried += 1
        if status in (429, 503):
            self._throttled += 1
            row = _ROW.get()
            if error is not None and row is not None:
                self._refusals[row] = error
        self._throttle_waited += delay
        await asyncio.sleep(delay)

    async def _slowed_down(
        self, pace: Pace | None, limit: RateLimit | None, status: int, error: BaseException,
        retry_after: float | None, max_retry_after: float, fallback: float,
    ) -> None:  # fmt: skip
        """The service answered "slow down" (``status`` 429 or 503, ``error``) to a request
        about to be sent again (not counted against ``max_retries``): without a rate
        limit the process's ``pace`` slows down and holds every request (this one waits
        in ``pace.wait()``); with one, the ``limit`` is paused for every process
        sharing it for the ``retry_after`` (clipped to ``max_retry_after``), or this
        request waits ``fallback`` seconds."""
        if pace is not None:
            pace.slow_down(retry_after, max_retry_after)
            await self._before_retry(0.0, status, error)
            return
        held = None
        if retry_after is not None:
            held = clipped(retry_after, max_retry_after, repr(self), "max_retry_after")
            if limit is not None:
                await limit.pause(held)
        await self._before_retry(held if held is not None else fallback, status, error)

    def service_retries(self) -> tuple[int, int, float]:
        """``asyncio_ops.SupportsServiceRetries``: requests this lookup sent again inside
        one attempt, the 429/503 answers among the reasons, and the seconds it waited
        before sending again, since construction."""
        return self._retried, self._throttled, self._throttle_waited

    def null_key_count(self) -> int:
        """``asyncio_ops.SupportsNullKeyCount``: rows answered without a request because a
        request field was NULL, since construction (the metrics' ``skipped_null_keys``)."""
        return self._null_keys

    def cache_statistics(self) -> CacheStatistics | None:
        """The cache's counters (None without a cache): they reach the operator metrics."""
        return self.cache.statistics() if self.cache is not None else None

    # -- statistics ------------------------------------------------------------------
    def statistics(self) -> LookupStatistics:
        """Counters since construction; safe to call open or closed."""
        batches = self._closed_batches
        if self._runtime is not None:
            batches = add_batch_statistics(batches, self._runtime_batch_statistics(self._runtime))
        return LookupStatistics(
            rows=self._rows,
            null_keys=self._null_keys,
            batching=batches,
            cache=self.cache.statistics() if self.cache is not None else None,
        )
