"""Connectors for asyncio_ops: lookups against external systems as AsyncFunctions.

Installed and imported as ``asyncio_ops.connectors`` (the repository keeps them
in the folder ``connectors/``):

- :mod:`asyncio_ops.connectors.postgres` — ``PostgresLookup`` (needs asyncpg)
- :mod:`asyncio_ops.connectors.http` — ``HttpLookup`` (needs aiohttp, aiolimiter)

This facade holds what both share and imports neither client library: the
exceptions, :func:`is_retryable` (a retry predicate), and :class:`LookupCache`.
"""

from ._batching import BatchStatistics
from ._cache import MISS, CacheStatistics, LookupCache
from ._exceptions import (
    ConnectorError,
    LookupAmbiguousError,
    LookupAuthError,
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupQueryError,
    LookupResponseError,
    LookupTimeout,
    LookupTLSError,
    is_retryable,
)
from ._lookup import LookupStatistics

__all__ = [
    "MISS",
    "BatchStatistics",
    "CacheStatistics",
    "ConnectorError",
    "LookupAmbiguousError",
    "LookupAuthError",
    "LookupCache",
    "LookupConnectionError",
    "LookupDecodeError",
    "LookupKeyError",
    "LookupQueryError",
    "LookupResponseError",
    "LookupStatistics",
    "LookupTLSError",
    "LookupTimeout",
    "is_retryable",
]
