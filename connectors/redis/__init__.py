"""Redis lookups for asyncio_ops: :class:`RedisLookup` (redis-py's asyncio client, batched).

See ``docs/connectors.md`` (its options) and ``docs/writing-a-connector.md`` (a walk-through).
"""

from ._redis_lookup import RedisLookup

__all__ = ["RedisLookup"]
