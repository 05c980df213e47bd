"""Redis lookups for asyncio_ops: :class:`RedisLookup` (redis-py's asyncio client, batched).

See ``docs/connectors.md`` ("Writing a connector" walks through it).
"""

from ._lookup import RedisLookup

__all__ = ["RedisLookup"]
