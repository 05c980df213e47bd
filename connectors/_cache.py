"""A lookup cache: results by key, with a time to live and LRU eviction.

One :class:`LookupCache` belongs to one lookup (its keys are that lookup's
keys). It lives in the memory of one worker process: pickling a cache (as
happens when the lookup travels to a Spark executor) carries its configuration,
never its entries, so every worker starts empty.

Contract:

- ``get(key)`` returns the cached results, or :data:`MISS` when the key is
  absent or its entry is older than ``ttl`` (an expired entry is removed and
  counted in ``expirations``, and the lookup counts as a miss).
- ``put(key, results)`` stores (or refreshes) an entry, stamped with the clock's
  ``now()``; TTL runs from the write (expire-after-write: a hot key is still
  re-read from the source every ``ttl`` seconds, so the cache never serves data
  older than ``ttl``).
- When ``max_size`` entries are held, ``put`` of a new key evicts the least
  recently used entry (``get`` hits count as use) and counts an eviction.
- Results are stored as given; the connectors store tuples of dicts and copy
  them on the way out, so callers never share a mutable row.

With ``shared="redis://..."`` and a ``name``, a second layer behind this one
holds the answers for every worker and job that name the cache and ask the same
question: its keys hold the lookup's fingerprint of what decides an answer
(query, URL, model, prompt, ...: ``BaseLookup.cache_identity``), or
``cache_key`` when the user shares answers between lookups on purpose
(``get_through``/``put_through``; ``connectors/_shared_cache.py``): the
connectors read it for the keys this layer misses, before calling out. Redis
down is a miss there, never a failure. With a signing key in
``ASYNCIO_OPS_STATE_SIGNING_KEY`` its entries are signed over their bytes and
their Redis key, and one that does not verify (forged, altered, copied from
another question) is refused: a miss, counted in ``statistics().refused``.

Time comes from an injected clock (``asyncio_ops._clock.Clock``; the system
clock by default, ``asyncio_ops.testing.ManualClock`` in tests). Not
thread-safe: it is used from one event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from asyncio_ops import Clock, ConfigurationError, SystemClock
from asyncio_ops.options import positive_int, positive_seconds

from ._redact import redact_dsn
from ._shared_cache import SharedLayer

__all__ = ["MISS", "CacheStatistics", "LookupCache"]

V = TypeVar("V")


class _Miss:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"

    def __reduce__(self) -> str:
        return "MISS"


MISS: Final = _Miss()
"""Returned by :meth:`LookupCache.get` when there is no live entry (``None`` can be a value)."""


@dataclass(frozen=True)
class CacheStatistics:
    """A snapshot of a cache's counters (monotonic since creation or
    :meth:`LookupCache.reset_statistics`). ``refused``: entries of the shared layer that
    did not verify under the signing key (0 without a shared layer or a key).

    Example:

    >>> from asyncio_ops.connectors import LookupCache
    >>> cache = LookupCache(ttl=60)
    >>> cache.put(1, [{"name": "ada"}])
    >>> cache.get(1), cache.get(2)
    ([{'name': 'ada'}], MISS)
    >>> cache.statistics().hit_ratio
    0.5
    """

    hits: int
    misses: int
    evictions: int
    expirations: int
    size: int
    max_size: int
    refused: int = 0

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses), 0.0 before the first lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class LookupCache(Generic[V]):
    """In-memory TTL + LRU cache of lookup results for one worker.

    ``ttl`` seconds (> 0, ``math.inf`` for never), ``max_size`` entries (> 0),
    ``cache_empty``: whether empty results (a key with no match) are cached too.
    Caching them saves a query per repeated unknown key, at the price of not
    seeing a row inserted within ``ttl``.

    Example:

    >>> from asyncio_ops.connectors import LookupCache
    >>> cache = LookupCache(ttl=300, max_size=10_000)  # per worker; shared="redis://..." too
    >>> cache.put(42, [{"name": "ada", "tier": "gold"}])
    >>> cache.get(42)
    [{'name': 'ada', 'tier': 'gold'}]
    >>> # in a job: PostgresLookup(dsn, query, key="customer_id", cache=cache)
    """

    def __init__(
        self,
        ttl: float = 60.0,
        *,
        max_size: int = 100_000,
        cache_empty: bool = True,
        clock: Clock | None = None,
        shared: str | None = None,
        name: str | None = None,
        shared_timeout: float = 1.0,
        cache_key: str | None = None,
    ) -> None:
        self.ttl = positive_seconds(ttl, "cache ttl")  # math.inf: entries never expire
        positive_int(max_size, "cache max_size")
        self.max_size = max_size
        self.cache_empty = cache_empty
        self.clock: Clock = clock if clock is not None else SystemClock()
        if shared is not None:
            if not isinstance(shared, str) or not shared.startswith(("redis://", "rediss://")):
                raise ConfigurationError(
                    f"shared must be a redis:// or rediss:// URL, got {redact_dsn(str(shared))!r}"
                )
            if not isinstance(name, str) or not name:
                raise ConfigurationError(
                    "a shared LookupCache needs name= (the jobs that name it share its answers)"
                )
        if cache_key is not None and (not isinstance(cache_key, str) or not cache_key):
            raise ConfigurationError(f"cache_key must be a non-empty string, got {cache_key!r}")
        self.shared = shared
        self.name = name
        # the user's name of the question, which replaces the lookup's fingerprint of
        # what decides its answers (sharing on purpose; BaseLookup._cache_scope)
        self.cache_key = cache_key
        self.scope: str | None = None  # the question the answers answer: bind()
        self.bound = False  # given to a lookup (one cache belongs to one lookup)
        self.shared_timeout = positive_seconds(shared_timeout, "shared_timeout")
        # the Redis side (connectors/_shared_cache.py), made in the worker that uses it
        self.layer: SharedLayer | None = (
            SharedLayer(shared, name, self.ttl, self.shared_timeout)
            if shared is not None and name is not None
            else None
        )
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._expirations = 0
        self._refused_before = 0  # the shared layer's refusals at reset_statistics()

    # -- pickling: configuration only, entries are per process ----------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "ttl": self.ttl,
            "max_size": self.max_size,
            "cache_empty": self.cache_empty,
            "clock": self.clock,
            "shared": self.shared,
            "name": self.name,
            "shared_timeout": self.shared_timeout,
            "cache_key": self.cache_key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["ttl"],
            max_size=state["max_size"],
            cache_empty=state["cache_empty"],
            clock=state["clock"],
            shared=state.get("shared"),
            name=state.get("name"),
            shared_timeout=state.get("shared_timeout", 1.0),
            cache_key=state.get("cache_key"),
        )

    def bind(self, scope: str) -> None:
        """What this cache's answers answer (its lookup's ``cache_key`` or fingerprint of
        the settings that decide them), part of every shared key."""
        self.scope = scope
        if self.layer is not None:
            self.layer.scope = scope

    # -- operations ------------------------------------------------------------------
    def get(self, key: Hashable) -> V | _Miss:
        """The live entry for ``key`` (marking it recently used), or :data:`MISS`."""
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return MISS
        written, value = entry
        if self.clock.now() - written >= self.ttl:
            del self._entries[key]
            self._expirations += 1
            self._misses += 1
            return MISS
        self._entries.move_to_end(key)
        self._hits += 1
        return value

    def put(self, key: Hashable, value: V, *, empty: bool = False) -> None:
        """Store ``value`` for ``key``; ``empty=True`` marks a no-match result.

        An empty result is dropped when ``cache_empty`` is False.
        """
        if empty and not self.cache_empty:
            return
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
        elif len(entries) >= self.max_size:
            self._evict_one()
        entries[key] = (self.clock.now(), value)

    async def get_through(self, keys: Sequence[Hashable]) -> dict[Hashable, V]:
        """The live entries of ``keys``: this process's layer first, then, for what it
        misses, the shared layer (whose answers are kept locally too)."""
        found: dict[Hashable, V] = {}
        missed = []
        for key in keys:
            value = self.get(key)
            if isinstance(value, _Miss):
                missed.append(key)
            else:
                found[key] = value
        if missed and self.layer is not None:
            for key, rows in (await self.layer.get_many(missed)).items():
                shared: V = rows  # type: ignore[assignment]  # connectors cache row tuples
                self.put(key, shared, empty=not rows)
                found[key] = shared
        return found

    async def put_through(self, items: Sequence[tuple[Hashable, V]]) -> None:
        """Store answers in this process's layer and in the shared one."""
        for key, value in items:
            self.put(key, value, empty=not value)
        if self.layer is not None:
            kept: list[tuple[Hashable, Any]] = [(k, v) for k, v in items if self.cache_empty or v]
            await self.layer.put_many(kept)

    def _evict_one(self) -> None:
        # The least recently used entry goes. If it had expired already it is
        # counted as an expiration, not an eviction: size pressure did not kill it.
        key, (written, _) = next(iter(self._entries.items()))
        del self._entries[key]
        if self.clock.now() - written >= self.ttl:
            self._expirations += 1
        else:
            self._evictions += 1

    # -- checkpointing: entries written with the job's checkpoint -------------------------
    def snapshot(self) -> list[tuple[Hashable, tuple[float, V]]]:
        """Live entries as ``(key, (written_at, value))``, least recently used first."""
        now = self.clock.now()
        return [(k, e) for k, e in self._entries.items() if now - e[0] < self.ttl]

    def restore(self, entries: Iterable[tuple[Hashable, tuple[float, V]]]) -> int:
        """Take entries from a snapshot; returns how many were taken.

        An entry keeps its original write time, so a restore never makes a
        result fresher than it is: expired ones are skipped, and an entry
        already present (written by this worker) wins. ``max_size`` holds.
        """
        now = self.clock.now()
        taken = 0
        store = self._entries
        for key, (written, value) in entries:
            if key in store or now - written >= self.ttl:
                continue
            if len(store) >= self.max_size:
                self._evict_one()
            store[key] = (written, value)
            taken += 1
        return taken

    def invalidate(self, key: Hashable) -> bool:
        """Forget ``key``; True if it was present."""
        return self._entries.pop(key, None) is not None

    def clear(self) -> None:
        """Forget every entry (counters are kept)."""
        self._entries.clear()

    def reset_statistics(self) -> None:
        """Set hits, misses, evictions, expirations and refused back to zero."""
        self._hits = self._misses = self._evictions = self._expirations = 0
        self._refused_before = self.layer.refused if self.layer is not None else 0

    def statistics(self) -> CacheStatistics:
        """Current counters and size."""
        return CacheStatistics(
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            expirations=self._expirations,
            size=len(self._entries),
            max_size=self.max_size,
            refused=self.layer.refused - self._refused_before if self.layer is not None else 0,
        )

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        # Membership does not count as a lookup and does not check TTL.
        return key in self._entries

    def __repr__(self) -> str:
        shared = f", shared={redact_dsn(self.shared)!r}, name={self.name!r}" if self.shared else ""
        return (
            f"LookupCache(ttl={self.ttl!r}, max_size={self.max_size!r}, "
            f"cache_empty={self.cache_empty!r}, size={len(self._entries)}{shared})"
        )
