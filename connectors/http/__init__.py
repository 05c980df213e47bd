"""HTTP lookups for asyncio_ops: :class:`HttpLookup` (aiohttp, rate limited, batched).

See ``docs/connectors.md`` for usage and semantics.
"""

from ._http_lookup import HttpBatch, HttpLookup, active_sessions, parse_retry_after

__all__ = ["HttpBatch", "HttpLookup", "active_sessions", "parse_retry_after"]
