"""Model endpoints for asyncio_ops: :class:`ChatLookup` and :class:`EmbeddingLookup` for
any OpenAI-compatible server (aiohttp; with a shared RateLimit and LookupCache).

See ``docs/enrich-models.md``.
"""

from ._model_lookup import ChatLookup, EmbeddingLookup, Usage

__all__ = ["ChatLookup", "EmbeddingLookup", "Usage"]
