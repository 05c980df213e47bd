"""RedisLookup: rows by key from Redis (strings, JSON documents or hashes), batched.

Written as the walk-through of docs/writing-a-connector.md: it uses
only the public connector base (:class:`asyncio_ops.connectors.BaseLookup`) and
the abilities the operator looks for (``asyncio_ops.SupportsInvokeArrow``,
``PrefersChunks``, ``SupportsOutputColumns``, ``SupportsPreflight``).

Call order (the base's lifecycle)::

    RedisLookup(url, key=...)     on the driver: checks options, connects to nothing
    preflight(context)            on the driver, before any Spark job: PING, key columns
    open(ctx)                     on a worker: the process's client for this URL
    async_invoke_arrow(batch)     a chunk of rows (the base's NULL-key rule, then
                                  lookup_many): one round trip per batch_size keys
    async_invoke(row)             or row by row (the rule, then lookup): rows of
                                  concurrent calls share batches
    close()                       releases the client (closed with its last user)

Semantics: a row's key is ``key_prefix`` followed by its key field values (joined
by ``key_separator`` for a tuple of fields). ``kind="string"``: ``GET``, one row
``{value_field: value}``; ``kind="json"``: ``GET``, the value parsed as JSON, an
object one row and an array of objects one row each; ``kind="hash"``:
``HGETALL`` (or ``HMGET`` of the declared output columns), one row of its
fields. A missing key (or an empty hash) gives no rows. Values are strings as
Redis stores them (JSON documents keep their JSON types). Keys of a chunk, or
of rows looked up concurrently, go out ``batch_size`` at a time: one ``MGET``
(strings, JSON) or one pipeline of ``HGETALL``/``HMGET`` (hashes), never a
transaction. A key null in the row never reaches Redis: no rows.

Errors: an unreachable server :class:`LookupConnectionError`, refused
credentials :class:`LookupAuthError`, a timeout :class:`LookupTimeout`, a key
of another type (``WRONGTYPE``) :class:`LookupQueryError` naming the Redis key,
a value that is not the JSON asked for :class:`LookupDecodeError` naming it; the
URL is shown without its password.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from asyncio_ops import ConfigurationError, PreflightContext
from asyncio_ops.options import positive_int, seconds, seconds_or_zero

from .. import (
    BaseLookup,
    BatchStatistics,
    ConnectorError,
    KeyBatcher,
    KeyFields,
    LookupAuthError,
    LookupCache,
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupQueryError,
    LookupTimeout,
    RateLimit,
    Row,
    SharedResources,
)
from .._rate_limit import rate_limit_option
from .._redact import redact_dsn  # the connectors' shared masking of passwords in URLs

if TYPE_CHECKING:
    import pyarrow as pa
    import redis.asyncio as aioredis

__all__ = ["RedisLookup"]

Kind = Literal["string", "json", "hash"]
_KINDS: Final = ("string", "json", "hash")
Rows = tuple[Row, ...]
_EMPTY: Final[Rows] = ()


async def _create_client(settings: Hashable) -> aioredis.Redis:
    import redis.asyncio as aioredis

    assert isinstance(settings, tuple)
    url, max_connections, timeout = settings
    return aioredis.Redis.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )


async def _close_client(client: aioredis.Redis) -> None:
    await client.aclose()


def _abandon_client(client: aioredis.Redis) -> None:
    """The loop is gone: drop the sockets without awaiting (the process is exiting)."""
    pool = client.connection_pool
    for connection in [*pool._available_connections, *pool._in_use_connections]:
        transport = getattr(getattr(connection, "_writer", None), "transport", None)
        if transport is not None:
            transport.abort()


_CLIENTS: Final[SharedResources[aioredis.Redis]] = SharedResources(
    "redis client", create=_create_client, aclose=_close_client, terminate=_abandon_client
)


@dataclass
class _Runtime:
    client: aioredis.Redis
    batcher: KeyBatcher[Hashable, Rows]


class RedisLookup(BaseLookup[_Runtime]):
    """Look rows up in Redis by key (see the module docstring).

    ``url``: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS);
    ``key``: the input field (or tuple of fields) holding the key; ``kind``:
    ``"string"``, ``"json"`` or ``"hash"``; ``key_prefix``/``key_separator``: how
    the Redis key is formed; ``value_field``: the output field of a string value;
    ``batch_size``: keys per round trip; ``max_batch_delay``: how long a row
    waits for others to share its round trip (row-by-row path);
    ``max_connections``: the process's pool for this URL; ``timeout``: seconds
    per call; ``cache``: a :class:`LookupCache` in front of Redis; ``rate_limit``:
    round trips per second of this worker process and URL (``rate_burst`` at
    once), or a :class:`RateLimit` (per process, or shared through Redis by every
    executor): each round trip (``MGET`` or pipeline) takes one request permit.

    Example::

        from asyncio_ops.connectors.redis import RedisLookup
        from asyncio_ops.spark import unordered_wait

        # HGETALL customer:<customer_id>, one pipeline per chunk of rows
        users = RedisLookup("redis://127.0.0.1:6379/0", key="customer_id", kind="hash",
                            key_prefix="customer:")
        profiles = unordered_wait(orders, users, timeout=5.0,
                                  output_schema="name string, tier string")
    """

    def __init__(
        self,
        url: str,
        *,
        key: str | Sequence[str],
        kind: Kind = "string",
        key_prefix: str = "",
        key_separator: str = ":",
        value_field: str = "value",
        batch_size: int = 500,
        max_batch_delay: float = 0.002,
        max_connections: int = 16,
        timeout: float = 5.0,
        cache: LookupCache[Any] | None = None,
        rate_limit: float | RateLimit | None = None,
        rate_burst: int = 1,
    ) -> None:
        super().__init__(cache=cache)
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"url must be a redis://, rediss:// or unix:// URL, got {redact_dsn(str(url))!r}"
            )
        if kind not in _KINDS:
            raise ConfigurationError(f"kind must be one of {_KINDS}, got {kind!r}")
        for name, text in (("key_prefix", key_prefix), ("key_separator", key_separator),
                           ("value_field", value_field)):  # fmt: skip
            if not isinstance(text, str):
                raise ConfigurationError(f"{name} must be a string, got {text!r}")
        self.url = url
        self.key = KeyFields(key, option="key")
        self.kind: Kind = kind
        self.key_prefix = key_prefix
        self.key_separator = key_separator
        self.value_field = value_field
        self.batch_size = positive_int(batch_size, "batch_size")
        self.max_batch_delay = seconds_or_zero(max_batch_delay, "max_batch_delay")
        self.max_connections = positive_int(max_connections, "max_connections")
        # Not ``self.timeout``: that name is AsyncFunction.timeout(), the operator's hook.
        self.request_timeout = seconds(timeout, "timeout")
        self.output_columns: tuple[str, ...] | None = None
        self._shown = redact_dsn(url)
        # a RateLimit (per process, or shared through Redis), or round trips per second of
        # this process and URL, rate_burst at once: one permit per round trip
        self.rate_burst = positive_int(rate_burst, "rate_burst")
        self.rate_limit = rate_limit_option(
            rate_limit, burst=self.rate_burst, name=f"redis:{self._shown}"
        )

    @property
    def _settings(self) -> tuple[str, int, float]:
        return (self.url, self.max_connections, self.request_timeout)

    # -- the base's hooks: the process-wide client, and a batcher of this lookup ----------
    async def _open_runtime(self) -> _Runtime:
        client = await _CLIENTS.acquire(self._settings)
        batcher = KeyBatcher(
            self._fetch, max_size=self.batch_size, max_delay=self.max_batch_delay,
            missing=lambda: _EMPTY,
        )  # fmt: skip
        return _Runtime(client, batcher)

    async def _close_runtime(self, runtime: _Runtime) -> None:
        try:
            await runtime.batcher.aclose()
        finally:
            await _CLIENTS.release(self._settings)

    def _runtime_batch_statistics(self, runtime: _Runtime) -> BatchStatistics:
        return runtime.batcher.statistics()

    # -- lookups -----------------------------------------------------------------------
    def request_fields(self) -> tuple[str, ...]:
        """The key fields: a NULL in any of them reads nothing."""
        return self.key.names

    def service_endpoint(self) -> str:
        """The server and database (the URL without its password)."""
        return f"redis {self._shown}"

    def cache_identity(self) -> dict[str, Any]:
        """What decides an answer besides the key: the server and database (the URL
        without its password), how keys are made, the kind, the fields read."""
        return {"url": self._shown, "kind": self.kind, "key_prefix": self.key_prefix,
                "key_separator": self.key_separator, "value_field": self.value_field,
                "fields": self.output_columns}  # fmt: skip

    async def lookup(self, value: Mapping[str, Any]) -> list[Row]:
        """The rows stored under ``value``'s key; rows of concurrent calls share round
        trips (``batch_size`` keys, waiting at most ``max_batch_delay``)."""
        runtime = self._require_runtime()
        key = self.key.of(value)
        assert key is not None  # the base's NULL-key rule ran

        async def fetch() -> Rows:
            return await runtime.batcher.load(key)

        rows: Rows = await self._cached(key, fetch)
        return [dict(row) for row in rows]

    def preferred_chunk_rows(self) -> int:
        """Rows per chunk of the columnar path: one round trip's keys."""
        return self.batch_size

    def preferred_capacity(self) -> int:
        """Chunks in flight by default: one per connection of the pool."""
        return self.max_connections

    async def lookup_many(self, batch: pa.RecordBatch) -> tuple[list[int], dict[str, Any]]:
        """A chunk's answers as columns: ``(row_index, columns)``; a row whose key holds
        several rows (a JSON array) repeats, one without any drops out."""
        self._require_runtime()
        keys = self.key.of_batch(batch)
        known = await self._matches_of(keys, self._fetch, self.batch_size)
        return self._columns_of(keys, known, self.output_columns)

    def bind_output_columns(self, columns: Sequence[str]) -> None:
        """Answer only the declared output columns (a hash is then read with ``HMGET``
        of them); a field a value lacks is null."""
        self.output_columns = tuple(columns)

    async def preflight(self, context: PreflightContext) -> None:
        """On the driver, before any job: the input has the key fields (LookupKeyError
        naming the missing one) and the server answers ``PING`` with these
        credentials, within ``timeout`` (on a client of its own, closed after)."""
        present = context.input_schema.names
        for name in self.key.names:
            if name not in present:
                raise LookupKeyError(
                    f"input has no key field {name!r} (key={self.key.spec()!r}); fields "
                    f"present: {sorted(present)!r}"
                )
        client = await _create_client(self._settings)
        try:
            await client.ping()
        except Exception as exc:
            raise self._mapped(exc, "PING") from exc
        finally:
            await _close_client(client)

    # -- one round trip ------------------------------------------------------------------
    def redis_key(self, key: Hashable) -> str:
        """The Redis key of a lookup key (a value, or a tuple of values)."""
        parts = key if isinstance(key, tuple) else (key,)
        return self.key_prefix + self.key_separator.join(str(p) for p in parts)

    async def _fetch(self, keys: Sequence[Hashable]) -> dict[Hashable, Rows]:
        """The rows of ``keys`` in one round trip (``MGET``, or a pipeline of hashes)."""
        runtime = self._require_runtime()
        names = [self.redis_key(k) for k in keys]
        try:
            async with self._limited(self.rate_limit):
                answers = await self._round_trip(runtime, names)
        except Exception as exc:
            raise self._mapped(exc, "HGETALL" if self.kind == "hash" else "MGET") from exc
        out: dict[Hashable, Rows] = {}
        for key, name, answer in zip(keys, names, answers, strict=True):
            if isinstance(answer, Exception):
                raise self._mapped(answer, "HGETALL", name) from answer
            out[key] = self._rows_of(name, answer)
        return out

    async def _round_trip(self, runtime: _Runtime, names: list[str]) -> list[Any]:
        if self.kind == "hash":
            fields = self.output_columns
            async with runtime.client.pipeline(transaction=False) as pipe:
                for name in names:
                    if fields:
                        pipe.hmget(name, list(fields))
                    else:
                        pipe.hgetall(name)
                answers: list[Any] = await pipe.execute(raise_on_error=False)
                return answers
        return list(await runtime.client.mget(names))

    def _rows_of(self, name: str, answer: Any) -> Rows:
        if answer is None:
            return _EMPTY
        if self.kind == "string":
            return ({self.value_field: answer},)
        if self.kind == "hash":
            if isinstance(answer, list):  # HMGET of the declared fields
                if all(v is None for v in answer):
                    return _EMPTY
                assert self.output_columns is not None
                return (dict(zip(self.output_columns, answer, strict=True)),)
            return (dict(answer),) if answer else _EMPTY
        try:
            document = json.loads(answer)
        except ValueError as exc:
            raise LookupDecodeError(
                f"Redis key {name!r} at {self._shown} holds no JSON: {exc}"
            ) from exc
        items = document if isinstance(document, list) else [document]
        if not all(isinstance(item, dict) for item in items):
            raise LookupDecodeError(
                f"Redis key {name!r} at {self._shown} holds JSON that is not an object or an "
                f"array of objects ({type(document).__name__})"
            )
        return tuple(items)

    def _mapped(self, exc: BaseException, command: str, name: str | None = None) -> Exception:
        """The connector's exception for a client error, naming the URL (no password)."""
        from redis import exceptions as rx

        where = f"Redis {command} at {self._shown}" + (f", key {name!r}" if name else "")
        if isinstance(exc, ConnectorError):
            return exc
        if isinstance(exc, rx.AuthenticationError | rx.AuthenticationWrongNumberOfArgsError):
            return LookupAuthError(f"{where}: credentials refused: {exc}")
        if isinstance(exc, rx.TimeoutError | TimeoutError):
            return LookupTimeout(f"{where}: no answer within {self.request_timeout} s")
        if isinstance(exc, rx.ConnectionError | OSError):
            return LookupConnectionError(f"{where}: {exc}")
        if isinstance(exc, rx.ResponseError):
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                return LookupAuthError(f"{where}: credentials refused: {exc}")
            return LookupQueryError(f"{where}: {exc}")
        return LookupQueryError(f"{where}: {type(exc).__name__}: {exc}")

    def __repr__(self) -> str:
        return (
            f"RedisLookup({self._shown!r}, key={self.key.spec()!r}, kind={self.kind!r}, "
            f"key_prefix={self.key_prefix!r})"
        )
