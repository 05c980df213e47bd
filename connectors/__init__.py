"""Connectors for asyncio_ops: lookups against external systems as AsyncFunctions.

Installed and imported as ``asyncio_ops.connectors`` (the repository keeps them
in the folder ``connectors/``):

- :mod:`asyncio_ops.connectors.postgres` — ``PostgresLookup`` (needs asyncpg)
- :mod:`asyncio_ops.connectors.http` — ``HttpLookup`` (needs aiohttp)
- :mod:`asyncio_ops.connectors.redis` — ``RedisLookup`` (needs redis-py)

This facade holds what they share and imports no client library: the
exceptions, :func:`is_retryable` (a retry predicate), :class:`LookupCache`,
:class:`RateLimit` (per process, or shared by every executor through Redis), and
the base a connector is written on (docs/connectors.md, "Writing a
connector"): :class:`BaseLookup` (lifecycle, pickling, cache, statistics),
:class:`KeyFields` (the key of a row or of an Arrow batch),
:class:`KeyBatcher` (concurrent lookups gathered into batches) and
:class:`SharedResources` (one client per worker process and event loop).
"""

from ._base import BaseLookup, LookupStatistics, Row
from ._batching import BatchStatistics, KeyBatcher
from ._cache import MISS, CacheStatistics, LookupCache
from ._exceptions import (
    ConnectorError,
    LookupAmbiguousError,
    LookupAuthError,
    LookupBudgetExceeded,
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupQueryError,
    LookupResponseError,
    LookupTimeout,
    LookupTLSError,
    is_retryable,
)
from ._keys import KeyFields
from ._rate_limit import Permit, RateLimit, RateLimitStatistics
from ._resources import SharedResources

__all__ = [
    "MISS",
    "BaseLookup",
    "BatchStatistics",
    "CacheStatistics",
    "ConnectorError",
    "KeyBatcher",
    "KeyFields",
    "LookupAmbiguousError",
    "LookupAuthError",
    "LookupBudgetExceeded",
    "LookupCache",
    "LookupConnectionError",
    "LookupDecodeError",
    "LookupKeyError",
    "LookupQueryError",
    "LookupResponseError",
    "LookupStatistics",
    "LookupTLSError",
    "LookupTimeout",
    "Permit",
    "RateLimit",
    "RateLimitStatistics",
    "Row",
    "SharedResources",
    "is_retryable",
]
