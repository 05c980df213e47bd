"""PostgresLookup: batched key lookups against PostgreSQL through an asyncpg pool.

The query is the user's, parameterised by arrays of keys (never by string
formatting of values):

- one key field: ``$1`` is an array of distinct keys::

      SELECT id, name, tier FROM customers WHERE id = ANY($1)

- a composite key of n fields: ``$1 .. $n`` are parallel arrays, one per key
  field in the order given by ``key``; join them back into tuples with
  ``unnest`` (the casts give the arrays their element types)::

      SELECT c.region, c.id, c.name
      FROM customers c
      JOIN unnest($1::text[], $2::int[]) AS k(region, id)
        ON c.region = k.region AND c.id = k.id

The query must return the ``on`` column(s) (default: the ``key`` names) so each
result row can be given back to the input rows whose key equals it. Matching is
by Python equality of the row's key value and the returned column value, so
both must decode to the same type (cast in SQL, e.g. ``id::text``, if the input
column is a string).

One class with one job, :class:`PostgresLookup` (with its pool settings and the
Arrow conversion of its answers).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import asyncpg  # type: ignore[import-untyped,unused-ignore]

from asyncio_ops import ArrowResult, ConfigurationError, PreflightContext
from asyncio_ops.options import at_least, int_between, seconds

from .._base import BaseLookup, Row, TableStatistics
from .._batching import BatchStatistics, KeyBatcher
from .._cache import LookupCache
from .._exceptions import LookupAmbiguousError, LookupKeyError, LookupQueryError
from .._keys import KeyFields
from .._rate_limit import RateLimit, rate_limit_option
from .._redact import Scrubber, redact_dsn, url_secrets
from .._resources import SharedResources
from . import _bulk
from ._asyncpg_errors import is_query_error, map_asyncpg_errors
from ._columnar import ARRAY_OIDS, TEXT_OIDS, Columnar, decode
from ._matching import (
    arrow_kind,
    foreign_column,
    foreign_kind,
    not_asked,
    postgres_kind,
    python_kind,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PostgresLookup", "active_pools"]

_PARAM: Final = re.compile(r"\$(\d+)")
PREFERRED_CHUNKS_IN_FLIGHT: Final = 4
# Graceful pool close waits for connections in use; past this it terminates them.
_POOL_CLOSE_TIMEOUT: Final = 10.0

# The matches of one key, shared by every row with that key: immutable asyncpg
# Records, or dicts when a cache keeps them (a cache is checkpointed, i.e. pickled,
# and Records cannot be). Each output row gets its own dict made from a match.
Match = Mapping[str, Any]  # an asyncpg.Record or a dict: read by name, items()
Rows = tuple[Match, ...]
_EMPTY: Final[Rows] = ()


@dataclass(frozen=True)
class _PoolSettings:
    """Everything that makes two pools different; the key of the per-process registry."""

    dsn: str
    min_size: int
    max_size: int
    connect_timeout: float
    command_timeout: float
    server_settings: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        # The registry may log this key: never show the password.
        return f"_PoolSettings(dsn={redact_dsn(self.dsn)!r}, max_size={self.max_size})"


async def _create_pool(key: Hashable) -> asyncpg.Pool:
    assert isinstance(key, _PoolSettings)
    return await asyncpg.create_pool(
        key.dsn,
        min_size=key.min_size,
        max_size=key.max_size,
        timeout=key.connect_timeout,  # per connection attempt
        # The default timeout of every protocol operation we do not time ourselves: the
        # reset when a connection goes back to the pool, and the cancellation of a query
        # whose task was cancelled. Without it (asyncpg's default is None) a stalled network
        # hangs both, and close() with them, forever; with it asyncpg terminates the
        # connection when the bound runs out.
        command_timeout=key.command_timeout,
        server_settings=dict(key.server_settings),
        reset=_keep_session,
    )


async def _keep_session(connection: asyncpg.Connection) -> None:
    """What the pool runs when a connection comes back: nothing beyond asyncpg's own
    rollback of an open transaction. asyncpg's default sends a reset query (advisory
    unlock, CLOSE ALL, UNLISTEN, RESET ALL) on every release: a second round trip per
    lookup. These pools run only the lookups' own queries, which change no session
    state (a query that did, e.g. with ``set_config``, would keep it on that
    connection)."""


async def _close_pool(pool: asyncpg.Pool) -> None:
    try:
        await asyncio.wait_for(pool.close(), _POOL_CLOSE_TIMEOUT)
    except asyncio.CancelledError:
        pool.terminate()
        raise
    except Exception:
        # Timed out or broke while closing: connections are cut instead. Nothing
        # the caller could do differently, so it is not an error of close().
        pool.terminate()


_POOLS: Final[SharedResources[asyncpg.Pool]] = SharedResources(
    "asyncpg pools", create=_create_pool, aclose=_close_pool, terminate=lambda p: p.terminate()
)


def active_pools() -> int:
    """How many asyncpg pools this process holds open (for tests and metrics).

    Example::

        from asyncio_ops.connectors.postgres import PostgresLookup, active_pools

        async with PostgresLookup(dsn, "SELECT id, name FROM customers WHERE id = ANY($1)",
                                  key="customer_id", on="id") as customers:
            assert active_pools() >= 1  # the pool its open() created, or shared
    """
    return _POOLS.active()


def _to_arrow(values: Any, type_: pa.DataType | None = None) -> pa.Array:
    """A result column (a list, or an Arrow array: a text column of the columnar form)
    as an Arrow array, of ``type_`` when given (a key column's type)."""
    import pyarrow as pa

    if isinstance(values, pa.Array):
        return values if type_ is None or values.type == type_ else values.cast(type_)
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        if type_ is None:
            raise
        return pa.array(values).cast(type_)


@dataclass
class _Runtime:
    pool: asyncpg.Pool
    batcher: KeyBatcher[Hashable, Rows]
    # The columnar path's probe (:meth:`PostgresLookup._columnar`), started by the first
    # chunk and shared by the chunks that arrive while it runs; its result is None
    # when the result cannot be aggregated (records are used).
    columnar_probe: asyncio.Future[Columnar | None] | None = None


class PostgresLookup(BaseLookup[_Runtime]):
    """Look rows up in PostgreSQL by key, many keys per query.

    ``async_invoke(row)`` returns, for the key ``row[key]``:

    - ``many=False`` (one-to-one): ``[match]``, or ``[]`` when nothing matched;
      more than one match raises :class:`~asyncio_ops.connectors.LookupAmbiguousError`.
    - ``many=True`` (one-to-many): one dict per matching row, in the query's order.
    - a key with a ``None`` component: ``[]`` without a query.

    Each result is a fresh dict of the query's columns (all of them, or only
    ``columns``); the input row's fields are not included unless
    ``include_input=True`` (the Spark layer keeps input columns itself).

    Options: ``batch_size`` distinct keys per query at most, ``max_batch_delay``
    seconds a key may wait for others to join its batch; ``pool_size`` connections
    per worker process (``min_pool_size`` opened eagerly, so ``open()`` fails fast
    on a wrong DSN); ``statement_timeout`` seconds, enforced by the server
    (None: the server's default); ``query_timeout`` seconds for acquiring a
    connection and for the query, enforced by the client, and the bound of
    every other protocol step (cancelling a query, resetting a connection for
    the pool), so that ``close()`` returns even on a stalled network; ``connect_timeout``
    seconds per connection attempt; ``server_settings`` extra session settings;
    ``cache`` a :class:`~asyncio_ops.connectors.LookupCache` consulted before querying;
    ``rate_limit`` queries per second of this worker process and DSN (at most
    ``rate_burst`` at once), or a :class:`~asyncio_ops.connectors.RateLimit`
    (per process, or shared through Redis by every executor): each query (one
    batch of keys) takes one request permit. ``table``: the table whose ``on``
    column(s) hold every key the query answers; ``asyncio_ops.spark.lookup_join`` may
    then read it in bulk (its keys, part by part, looked up by this query:
    :mod:`._bulk`) and weighs its size from the server's statistics.

    Raises (from ``open`` and ``async_invoke``): ``LookupConnectionError`` and
    ``LookupTimeout`` (retryable: see :func:`asyncio_ops.connectors.is_retryable`),
    ``LookupAuthError``, ``LookupQueryError``, ``LookupKeyError``.

    One asyncpg pool is shared by every PostgresLookup in the worker process
    with the same DSN and pool settings (and the same event loop); it is created
    by the first ``open`` and closed by the last ``close`` (or at exit). After a
    broken connection the pool replaces it on the next acquire, so a retried
    lookup succeeds once the server is back.

    Example::

        from asyncio_ops.connectors.postgres import PostgresLookup
        from asyncio_ops.spark import ordered_wait

        customers = PostgresLookup(
            "postgresql://app@db:5432/shop",
            "SELECT id, name, tier FROM customers WHERE id = ANY($1::bigint[])",
            key="customer_id", on="id", columns=["name", "tier"])
        async with customers:  # outside Spark: open() ... close()
            print(await customers.async_invoke({"customer_id": 42}))  # [{'name': ...}]
        enriched = ordered_wait(orders, customers, timeout=10.0,
                                output_schema="name string, tier string")
    """

    def __init__(
        self,
        dsn: str,
        query: str,
        *,
        key: str | Sequence[str],
        on: str | Sequence[str] | None = None,
        many: bool = False,
        columns: Sequence[str] | None = None,
        include_input: bool = False,
        batch_size: int = 500,
        max_batch_delay: float = 0.002,
        pool_size: int = 10,
        min_pool_size: int = 1,
        statement_timeout: float | None = 30.0,
        query_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        server_settings: Mapping[str, str] | None = None,
        cache: LookupCache[Any] | None = None,
        rate_limit: float | RateLimit | None = None,
        rate_burst: int = 1,
        table: str | None = None,
    ) -> None:
        super().__init__(cache=cache)
        if not isinstance(dsn, str) or not dsn:
            raise ConfigurationError("dsn must be a non-empty connection string")
        if not isinstance(query, str) or not query.strip():
            raise ConfigurationError("query must be a non-empty SQL string")
        self.dsn = dsn
        self.query = query
        self.key = KeyFields(key, option="key")
        self.on = KeyFields(key if on is None else on, option="on")
        if len(self.on) != len(self.key) or self.on.composite != self.key.composite:
            raise ConfigurationError(
                f"on={self.on!r} must name as many columns as key={self.key!r}"
            )
        used = {int(n) for n in _PARAM.findall(query)}
        expected = set(range(1, len(self.key) + 1))
        if used != expected:
            raise ConfigurationError(
                f"query must use exactly the parameters "
                f"{', '.join(f'${n}' for n in sorted(expected))} (one array per key field), "
                f"found {', '.join(f'${n}' for n in sorted(used)) or 'none'}"
            )
        self.many = bool(many)
        self.columns = tuple(columns) if columns is not None else None
        self._columns_declared = False  # columns from output_schema, not from columns=
        self.include_input = bool(include_input)
        self.batch_size = at_least(batch_size, "batch_size", 1)
        self.max_batch_delay = seconds(max_batch_delay, "max_batch_delay", high=60, low_ok=True)
        self.pool_size = at_least(pool_size, "pool_size", 1)
        self.min_pool_size = int_between(min_pool_size, "min_pool_size", 0, pool_size)
        if statement_timeout is not None:
            seconds(statement_timeout, "statement_timeout")
        seconds(query_timeout, "query_timeout")
        seconds(connect_timeout, "connect_timeout")
        self.statement_timeout = statement_timeout
        self.query_timeout = float(query_timeout)
        self.connect_timeout = float(connect_timeout)
        settings = {"application_name": "asyncio_ops"}
        if statement_timeout is not None:
            settings["statement_timeout"] = str(max(1, round(statement_timeout * 1000)))
        settings.update(server_settings or {})
        self._pool_settings = _PoolSettings(
            dsn=dsn,
            min_size=min_pool_size,
            max_size=pool_size,
            connect_timeout=self.connect_timeout,
            command_timeout=self.query_timeout,
            server_settings=tuple(sorted(settings.items())),
        )
        self._where = redact_dsn(dsn)
        self._scrub = Scrubber(url_secrets(dsn))
        # a RateLimit (per process, or shared through Redis), or queries per second of
        # this process and DSN, rate_burst at once: one permit per query
        self.rate_burst = at_least(rate_burst, "rate_burst", 1)
        self.rate_limit = rate_limit_option(
            rate_limit, burst=self.rate_burst, name=f"postgres:{self._where}"
        )
        if table is not None and (not isinstance(table, str) or not table.strip()):
            raise ConfigurationError(f"table must be a table's name or None, got {table!r}")
        self.table = table

    # -- lifecycle ---------------------------------------------------------------------
    async def _open_runtime(self) -> _Runtime:
        with map_asyncpg_errors("connect", self._where, self._scrub):
            pool = await _POOLS.acquire(self._pool_settings)
        batcher: KeyBatcher[Hashable, Rows] = KeyBatcher(
            self._fetch,
            max_size=self.batch_size,
            max_delay=self.max_batch_delay,
            missing=lambda: _EMPTY,
        )
        return _Runtime(pool=pool, batcher=batcher)

    async def _close_runtime(self, runtime: _Runtime) -> None:
        try:
            await runtime.batcher.aclose()
        finally:
            with map_asyncpg_errors("close pool", self._where, self._scrub):
                await _POOLS.release(self._pool_settings)

    def _runtime_batch_statistics(self, runtime: _Runtime) -> BatchStatistics:
        return runtime.batcher.statistics()

    # -- lookups -----------------------------------------------------------------------
    def request_fields(self) -> tuple[str, ...]:
        """The key fields: a NULL in any of them matches nothing (SQL equality)."""
        return self.key.names

    def service_endpoint(self) -> str:
        """The database: the DSN without its password."""
        return f"postgres {self._where}"

    def cache_identity(self) -> dict[str, Any]:
        """What decides an answer besides the key: the database (the DSN without its
        password), the query, the columns matched and answered, one or many."""
        return {"dsn": self._where, "query": self.query, "on": self.on.spec(),
                "many": self.many, "columns": self.columns}  # fmt: skip

    def join_strategies(self) -> tuple[str, ...]:
        """The base's, and ``"bulk"`` with ``table=`` (see the class docstring)."""
        strategies = super().join_strategies()
        if self.table is not None and "distinct" in strategies:
            return (*strategies, "bulk")
        return strategies

    async def table_statistics(self) -> TableStatistics:
        """``table``'s rows and bytes from the server's statistics (:mod:`._bulk`)."""
        if self.table is None:
            raise self._no_table()
        runtime = self._require_runtime()
        with map_asyncpg_errors("read the table's statistics", self._where, self._scrub):
            async with runtime.pool.acquire(timeout=self.query_timeout) as connection:
                return await _bulk.table_statistics(connection, self.table, self.query_timeout)

    async def bulk_keys(self, part: int, parts: int, schema: pa.Schema) -> pa.Table:
        """Part ``part`` of ``parts`` of ``table``'s distinct keys (:mod:`._bulk`)."""
        if self.table is None:
            raise self._no_table()
        runtime = self._require_runtime()
        with map_asyncpg_errors("read the table's keys", self._where, self._scrub):
            async with runtime.pool.acquire(timeout=self.query_timeout) as connection:
                return await _bulk.table_keys(connection, self.table, self.on.names, part,
                                              parts, schema, self.query_timeout)  # fmt: skip

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        """The matches of ``value``'s key (see the class docstring for the shape)."""
        runtime = self._runtime
        if runtime is None:
            runtime = self._require_runtime()
        key = self.key.of(value)
        assert key is not None  # the base's NULL-key rule ran
        if self.cache is None:
            matches: Rows = await runtime.batcher.submit(key)
        else:

            async def fetch() -> Rows:
                return await runtime.batcher.submit(key)

            matches = await self._cached(key, fetch)
        if not matches:
            return []
        if len(matches) == 1:
            return [self._output(value, matches[0])]
        if not self.many:
            raise LookupAmbiguousError(
                f"key {key!r} matched {len(matches)} rows of a one-to-one lookup; "
                "pass many=True for one output per match"
            )
        return [self._output(value, match) for match in matches]

    async def async_invoke_chunk(self, values: Sequence[Mapping[str, Any]]) -> list[list[Row]]:
        """The matches of many rows at once: one result list per row, in order.

        The distinct keys not in the cache go out as ``ANY($1)`` queries of at
        most ``batch_size`` keys each (concurrently), without the per-row
        batcher: this is the vectorised path (``chunk_size=`` in the Spark API).
        A key matching several rows of a one-to-one lookup fails the chunk.
        """
        self._require_runtime()
        self._rows += len(values)
        key_of = self.key.of
        keys = [key_of(v) for v in values]
        known = await self._matches(keys)
        out: list[list[Row]] = []
        output = self._output
        for value, key in zip(values, keys, strict=True):
            matches = known.get(key, _EMPTY) if key is not None else _EMPTY
            if not matches:
                out.append([])
            elif len(matches) == 1:
                out.append([output(value, matches[0])])
            elif not self.many:
                raise self._ambiguous(key, len(matches))
            else:
                out.append([output(value, match) for match in matches])
        return out

    async def lookup_many(self, batch: pa.RecordBatch) -> tuple[Any, dict[str, Any]] | ArrowResult:
        """The matches of a chunk of rows as Arrow, for the columnar path.

        Returns ``(row_index, columns)``: for each output row, the input row it
        belongs to (a row without a match is absent; ``many=True`` repeats a row
        once per match; None: every row once, in order) and the output columns
        (the query's columns, or ``columns``) as Arrow arrays or lists. The key
        columns are the only input read: no row becomes a dict. Queries, cache
        and errors are those of :meth:`async_invoke_chunk`.
        """
        self._require_runtime()
        if not self.key.composite and not self.many and self.cache is None:
            return await self._arrow_one_to_one(batch)
        keys = self.key.of_batch(batch)
        known = await self._matches(keys)
        index: list[int] = []
        matched: list[Match] = []
        errors: dict[int, BaseException] = {}
        get = known.get
        many = self.many
        for i, key in enumerate(keys):
            matches = get(key)
            if not matches:
                continue
            if len(matches) == 1:
                index.append(i)
                matched.append(matches[0])
            elif not many:  # this row fails alone, as it would one row at a time
                errors[i] = self._ambiguous(key, len(matches))
            else:
                index.extend([i] * len(matches))
                matched.extend(matches)
        names = self.columns if self.columns is not None else ()
        if not names and matched:
            names = tuple(matched[0].keys())
        columns = {name: [m[name] for m in matched] for name in names}
        if errors:
            return ArrowResult(index, columns, errors)
        return index, columns

    def preferred_chunk_rows(self) -> int:
        """Rows per chunk of the columnar path by default: one query per pooled
        connection (``batch_size * pool_size``), so that a chunk is one round of the
        pool and Spark's Arrow batches are answered a few chunks at a time."""
        return self.batch_size * self.pool_size

    def preferred_capacity(self) -> int:
        """Chunks in flight by default: a chunk already fills the pool, so a few keep it
        busy while others are cut and merged; more would only queue for connections
        (and wait out their timeouts there). In bench.connectors 4 ran as fast as 100."""
        return PREFERRED_CHUNKS_IN_FLIGHT

    async def _arrow_one_to_one(
        self, batch: pa.RecordBatch
    ) -> tuple[Any, dict[str, Any]] | ArrowResult:
        """The columnar path of the common case (one key column, one-to-one, no cache).

        Deduplication, matching and fan-out are Arrow compute kernels; Python
        touches each distinct key once. The query's result comes back as one row
        (:mod:`._columnar`): an array per column, and text columns as bytes that
        become Arrow strings with no Python object per value; a query whose
        columns cannot be aggregated is answered as records, transposed once
        into columns.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        runtime = self._require_runtime()
        column = self.key.column_of(batch, self.key.names[0])
        distinct = pc.unique(column).to_pylist()  # no NULLs: the base's rule ran
        columnar = await self._columnar(runtime)
        size = self.batch_size
        chunks = [distinct[i : i + size] for i in range(0, len(distinct), size)]
        columns: Sequence[Sequence[Any]]
        if columnar is not None:
            present = list(columnar.names)
            columns = await self._query_columns(columnar, chunks)
        else:
            parts = await asyncio.gather(*(self._query(chunk) for chunk in chunks))
            records = [record for part in parts for record in part]
            present = list(records[0].keys()) if records else []
            columns = list(zip(*records, strict=True))
        if not columns or not len(columns[0]):
            return [], {}
        on = self.on.names[0]
        found = columns[present.index(on)]
        self._check_arrow_kind(found, column.type)
        try:
            value_set = _to_arrow(found, column.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise LookupQueryError(
                f"the query's column {on!r} cannot be matched to the key column "
                f"{self.key.names[0]!r} ({column.type}): {exc} (cast it in SQL to the key's type)"
            ) from exc
        # NULL keys of the result match nothing (index_in's skip_nulls below); every
        # other one must have been asked for (see ._matching).
        keys = value_set.drop_null() if value_set.null_count else value_set
        asked = pc.is_in(keys, value_set=column)
        if not pc.all(asked).as_py():
            stray = keys.filter(pc.invert(asked))[0].as_py()
            raise not_asked(on, stray, distinct)
        ambiguous: dict[Any, int] = {}
        if len(pc.unique(keys)) != len(keys):
            counts: dict[Any, int] = {}
            for key in keys.to_pylist():  # as matched: after the cast to the key's type
                counts[key] = counts.get(key, 0) + 1
            ambiguous = {k: c for k, c in counts.items() if c > 1}
            # the rows of an ambiguous key fail alone (ArrowResult.errors), as they would
            # one row at a time; the others are matched to the first of their key
        position = pc.index_in(column, value_set=value_set, skip_nulls=True)
        if position.null_count == 0:
            row_index: Any = None  # every row matched once, in order
            take = position
        else:
            matched = position.is_valid()
            row_index = pc.indices_nonzero(matched)
            take = position.filter(matched)
        names = self.columns if self.columns is not None else present
        out = {n: _to_arrow(columns[present.index(n)]).take(take) for n in names}
        if ambiguous:
            return self._without_ambiguous(column, row_index, out, ambiguous)
        return row_index, out

    def _check_arrow_kind(self, found: Any, key_type: pa.DataType) -> None:
        """The columnar form of :meth:`_check_kinds`: ``found`` (a result column: a list
        or an Arrow array) is of the kind of the key column's type ``key_type``."""
        import pyarrow as pa

        key_kind = arrow_kind(key_type)
        if isinstance(found, pa.Array):
            if found.null_count == len(found):
                return
            kind = arrow_kind(found.type)
            value = found.drop_null()[0].as_py()
        else:
            value = next((v for v in found if v is not None), None)
            if value is None:
                return
            kind = python_kind(value)
        if kind != key_kind:
            raise foreign_kind(self.on.names[0], value, kind, key_kind)

    def _without_ambiguous(
        self, column: pa.Array, row_index: Any, columns: dict[str, Any], ambiguous: dict[Any, int]
    ) -> ArrowResult:
        """The rows whose key matched several rows fail alone; the others keep their match."""
        import pyarrow as pa
        import pyarrow.compute as pc

        keys = pa.array(list(ambiguous), column.type)
        failing = pc.is_in(column, value_set=keys).fill_null(False)
        if row_index is None:
            row_index = pa.array(range(len(column)), pa.int64())
        keep = pc.invert(pc.array_take(failing, row_index))
        rows = pc.indices_nonzero(failing).to_pylist()
        errors = {
            i: self._ambiguous(key, ambiguous[key])
            for i, key in zip(rows, column.take(rows).to_pylist(), strict=True)
        }
        return ArrowResult(
            row_index.filter(keep), {n: c.filter(keep) for n, c in columns.items()}, errors
        )

    async def _columnar(self, runtime: _Runtime) -> Columnar | None:
        """The query's columnar form for this runtime (None: use records), probed once.

        Chunks arriving while the probe runs await the same probe (shielded: one
        chunk's cancellation does not abort it); a probe that failed is run
        again by the next chunk.
        """
        probe = runtime.columnar_probe
        if probe is None or (probe.done() and (probe.cancelled() or probe.exception())):
            probe = runtime.columnar_probe = asyncio.ensure_future(self._probe_columnar(runtime))
        return await asyncio.shield(probe)

    async def _probe_columnar(self, runtime: _Runtime) -> Columnar | None:
        """Whether the query's result can come back as one row, and the query that does it.

        Prepares the query (no rows are read) and reads its result columns: each
        must be of a type in :data:`._columnar.ARRAY_OIDS` (never an array:
        ``array_agg`` of arrays makes one multi-dimensional array, and fails on NULL
        or ragged ones; never a type asyncpg reads through its text form) and their
        names must be distinct.
        ``text`` and ``varchar`` columns travel as bytes when the server's encoding
        is UTF-8 (see :mod:`._columnar`). The wrapped query is prepared too. A
        query the server rejects gives None here: the records path then runs it
        and raises its error as every lookup does.
        """
        with map_asyncpg_errors("lookup query", self._where, self._scrub):
            async with runtime.pool.acquire(timeout=self.query_timeout) as connection:
                try:
                    statement = await connection.prepare(self.query, timeout=self.query_timeout)
                    attributes = statement.get_attributes()
                    names = tuple(attribute.name for attribute in attributes)
                    if len(set(names)) != len(names) or any(
                        attribute.type.oid not in ARRAY_OIDS for attribute in attributes
                    ):
                        return None
                    text: frozenset[str] = frozenset()
                    if connection.get_settings().server_encoding == "UTF8":
                        text = frozenset(a.name for a in attributes if a.type.oid in TEXT_OIDS)
                    columnar = Columnar.of(self.query, names, text)
                    await connection.prepare(columnar.sql, timeout=self.query_timeout)
                except asyncpg.PostgresError as exc:
                    if not is_query_error(exc):
                        raise
                    return None
        return columnar

    async def _query_columns(
        self, columnar: Columnar, chunks: Sequence[Sequence[Hashable]]
    ) -> list[Any]:
        """The rows matching ``chunks`` of distinct keys (one query each, concurrently)
        as one column each (a list, or an Arrow string array for a text column), in
        ``columnar.names`` order; the columns are checked as :meth:`_query` checks
        records, when any row matched."""
        parts = await asyncio.gather(*(self._query(chunk, columnar.sql) for chunk in chunks))
        columns = decode(columnar, [records[0] for records in parts if records])
        if len(columns[0]):
            self._check_columns(list(columnar.names))
        return columns

    @staticmethod
    def _ambiguous(key: Hashable, matches: int) -> LookupAmbiguousError:
        return LookupAmbiguousError(
            f"key {key!r} matched {matches} rows of a one-to-one lookup; "
            "pass many=True for one output per match"
        )

    async def _matches(self, keys: Sequence[Hashable | None]) -> dict[Hashable, Rows]:
        """The matches of every distinct non-null key in ``keys``: cache first, then
        ``ANY($1)`` queries of at most ``batch_size`` keys each, concurrently."""
        return await self._matches_of(keys, self._fetch, self.batch_size)

    def _output(self, value: Mapping[str, Any], match: Match) -> Row:
        # ``match`` is shared by every row with its key (and by the cache): each
        # output row is the one fresh dict made from it.
        columns = self.columns
        out = dict(match.items()) if columns is None else {c: match[c] for c in columns}
        if self.include_input:
            return {**value, **out}
        return out

    async def _fetch(self, keys: Sequence[Hashable]) -> dict[Hashable, Rows]:
        """One query for ``keys`` (distinct); returns the matching records grouped by key.

        O(records): each record is placed once, as the asyncpg Record itself
        (copied into a dict per output row by :meth:`_output`), or as a dict when
        a cache will keep it.
        """
        records = await self._query(keys)
        if not records:
            return {}
        names = self.on.names
        grouped: dict[Hashable, Rows] = {}
        # Keys with several matches (one-to-many) collect them in a list first.
        several: dict[Hashable, list[Match]] = {}
        composite = self.on.composite
        name = names[0]
        as_dicts = self.cache is not None
        asked = set(keys)
        kinds_checked = False
        for record in records:
            found = tuple([record[n] for n in names]) if composite else record[name]
            if found is None or (composite and None in found):
                continue  # a NULL key matches nothing (see ._matching)
            if not kinds_checked:  # one SQL column, one type: its first value tells
                self._check_kinds(found, keys[0])
                kinds_checked = True
            if found not in asked:
                raise not_asked(", ".join(names), found, keys)
            match: Match = dict(record.items()) if as_dicts else record
            earlier = grouped.get(found)
            if earlier is None:
                grouped[found] = (match,)
            elif found in several:
                several[found].append(match)
            else:
                several[found] = [*earlier, match]
        for found, matches in several.items():
            grouped[found] = tuple(matches)
        return grouped

    def _check_kinds(self, found: Any, key: Any) -> None:
        """A result's ``on`` value ``found`` is of the kind of the keys (``key``, one of
        them), part by part for a composite key; else a LookupQueryError."""
        pairs = zip(found, key, strict=True) if self.on.composite else [(found, key)]
        for column, (value, part) in zip(self.on.names, pairs, strict=True):
            kind, key_kind = python_kind(value), python_kind(part)
            if kind != key_kind:
                raise foreign_kind(column, value, kind, key_kind)

    async def _query(
        self, keys: Sequence[Hashable], sql: str | None = None
    ) -> list[asyncpg.Record]:
        """One query for ``keys`` (distinct), its errors mapped. ``sql``: the lookup
        query (default; the result's columns are checked) or its columnar form (one
        row of arrays, checked by :meth:`_query_columns`)."""
        runtime = self._require_runtime()
        if self.key.composite:
            # Parallel arrays, one per key field, in the order of ``key``.
            args: list[list[Any]] = [list(column) for column in zip(*keys, strict=True)]  # type: ignore[call-overload,unused-ignore]
        else:
            args = [keys if type(keys) is list else list(keys)]
        async with self._limited(self.rate_limit):
            records = await self._query_now(runtime, sql, args)
        if sql is None and records:
            self._check_columns(list(records[0].keys()))
        return records

    async def _query_now(
        self, runtime: _Runtime, sql: str | None, args: list[list[Any]]
    ) -> list[asyncpg.Record]:
        with map_asyncpg_errors("lookup query", self._where, self._scrub):
            async with runtime.pool.acquire(timeout=self.query_timeout) as connection:
                try:
                    records = await self._send(connection, sql or self.query, args)
                except asyncpg.InternalClientError:
                    # asyncpg's protocol state machine is broken, as happens when the
                    # server terminates the connection mid-statement (MagicStack/asyncpg
                    # #784, #1069). The connection must not be reused: drop it, and the
                    # pool opens a fresh one on the next acquire.
                    connection.terminate()
                    raise
        return records

    def _check_columns(self, present: list[str]) -> None:
        self._check_result(present, self.columns, self._columns_declared)

    def _check_result(
        self, present: Sequence[str], columns: Sequence[str] | None, declared: bool
    ) -> None:
        """The query's result columns ``present`` hold the ``on`` column(s) and every
        output column (``columns``: from output_schema when ``declared``, else from
        ``columns=``); else a LookupQueryError naming the missing ones."""
        if not set(self.on.names) <= set(present):
            raise LookupQueryError(
                f"the query's result has no column {self.on.spec()!r} to match keys on; "
                f"it returned {list(present)!r} (select it, or set on=)"
            )
        if columns is not None and not set(columns) <= set(present):
            missing = sorted(set(columns) - set(present))
            what = "output_schema column(s)" if declared else "columns="
            raise LookupQueryError(
                f"{what} {missing!r} are not in the query's result (it returned {list(present)!r})"
            )

    def _columns_for(self, declared: Sequence[str]) -> tuple[tuple[str, ...], bool]:
        """The columns answered when output_schema declares ``declared``, and whether
        they come from it (True) or from ``columns=`` (False)."""
        if self.columns is None or self._columns_declared:
            return tuple(declared), True
        return self.columns, False

    def bind_output_columns(self, columns: Sequence[str]) -> None:
        """Answer only the declared output columns (unless ``columns=`` chose them): the
        query's other columns are left out, and a declared column the query does not
        return is an error naming it."""
        self.columns, self._columns_declared = self._columns_for(columns)

    async def preflight(self, context: PreflightContext) -> None:
        """Check on the driver, before any Spark job, what needs no data
        (:class:`asyncio_ops.SupportsPreflight`): the input has the key column(s)
        (else LookupKeyError); the DSN connects and authenticates, on one connection
        of its own, closed afterwards (LookupConnectionError, LookupAuthError,
        LookupTimeout, naming the DSN without its password); the server prepares the
        query, which parses and plans it without running it (LookupQueryError); the
        prepared statement's result columns hold the ``on`` column(s), of the kind of
        their key column (for PostgreSQL's built-in types), and every output column
        (LookupQueryError naming the column)."""
        names = context.input_schema.names
        for name in self.key.names:
            if name not in names:
                raise LookupKeyError(
                    f"input has no key column {name!r} (key={self.key.spec()!r}); "
                    f"columns present: {sorted(names)!r}"
                )
        with map_asyncpg_errors("connect", self._where, self._scrub):
            connection = await asyncpg.connect(
                self.dsn,
                timeout=self.connect_timeout,
                command_timeout=self.query_timeout,
                server_settings=dict(self._pool_settings.server_settings),
            )
        try:
            with map_asyncpg_errors("prepare the lookup query", self._where, self._scrub):
                statement = await connection.prepare(self.query, timeout=self.query_timeout)
                attributes = {a.name: a.type.name for a in statement.get_attributes()}
        finally:
            try:
                await connection.close(timeout=self.query_timeout)
            except Exception:  # the check is done; a slow goodbye is not its failure
                connection.terminate()
        self._check_result(list(attributes), *self._columns_for(context.output_schema.names))
        for on, key in zip(self.on.names, self.key.names, strict=True):
            kind = postgres_kind(attributes[on])
            key_type = context.input_schema.field(key).type
            key_kind = arrow_kind(key_type)
            if kind is not None and kind != key_kind:
                raise foreign_column(on, attributes[on], kind, key, key_type, key_kind)

    async def _send(
        self, connection: asyncpg.Connection, sql: str, args: Sequence[Sequence[Any]]
    ) -> list[asyncpg.Record]:
        """Run ``sql`` (the lookup query or its columnar form) once with ``args`` (one
        array of keys per key field). The single point where lookup SQL is sent (a
        hook for instrumentation in tests and subclasses)."""
        records: list[asyncpg.Record] = await connection.fetch(
            sql, *args, timeout=self.query_timeout
        )
        return records

    def __repr__(self) -> str:
        return (
            f"PostgresLookup(dsn={self._where!r}, query={self.query!r}, key={self.key!r}, "
            f"on={self.on!r}, many={self.many!r}, batch_size={self.batch_size!r})"
        )
