"""The public names of the connector packages, pinned."""

from __future__ import annotations

from asyncio_ops.connectors import http, postgres, redis

from asyncio_ops import connectors


def test_connectors_facade() -> None:
    assert sorted(connectors.__all__) == sorted(
        [
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
    )
    for name in connectors.__all__:
        assert getattr(connectors, name) is not None


def test_subpackages() -> None:
    assert sorted(postgres.__all__) == ["PostgresLookup", "active_pools"]
    assert sorted(redis.__all__) == ["RedisLookup"]
    assert sorted(http.__all__) == [
        "HttpBatch",
        "HttpLookup",
        "active_sessions",
        "parse_retry_after",
    ]


def test_exception_tree() -> None:
    from asyncio_ops import AsyncOpsError

    assert issubclass(connectors.ConnectorError, AsyncOpsError)
    assert issubclass(connectors.LookupConnectionError, ConnectionError)
    assert issubclass(connectors.LookupTimeout, TimeoutError)
    assert issubclass(connectors.LookupAuthError, PermissionError)
    assert issubclass(connectors.LookupDecodeError, connectors.LookupResponseError)
    assert connectors.is_retryable(connectors.LookupConnectionError("x"))
    assert not connectors.is_retryable(connectors.LookupQueryError("x"))
    assert not connectors.is_retryable(ConnectionError("not ours"))
