"""PostgreSQL lookups for asyncio_ops: :class:`PostgresLookup` (asyncpg, batched).

See ``docs/connectors.md`` for usage and semantics.
"""

from ._postgres_lookup import PostgresLookup, active_pools

__all__ = ["PostgresLookup", "active_pools"]
