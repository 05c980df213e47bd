"""LookupCache on a manual clock: TTL, LRU eviction, counters, pickling."""

from __future__ import annotations

import math
import pickle

import pytest
from asyncio_ops.connectors import MISS, LookupCache
from hypothesis import given
from hypothesis import strategies as st

from asyncio_ops import ConfigurationError
from asyncio_ops.testing import ManualClock


def make(ttl: float = 10.0, max_size: int = 3, **kw: bool) -> tuple[LookupCache[str], ManualClock]:
    clock = ManualClock(100.0)
    return LookupCache(ttl, max_size=max_size, clock=clock, **kw), clock


def test_hit_and_miss_are_counted() -> None:
    cache, _ = make()
    assert cache.get("a") is MISS
    cache.put("a", "A")
    assert cache.get("a") == "A"
    assert cache.get("a") == "A"
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.size) == (2, 1, 1)
    assert stats.hit_ratio == pytest.approx(2 / 3)


def test_entries_expire_ttl_after_the_write() -> None:
    cache, clock = make(ttl=10.0)
    cache.put("a", "A")
    clock.advance(9.999)
    assert cache.get("a") == "A"  # a hit does not extend the life of the entry
    clock.advance(0.001)
    assert cache.get("a") is MISS
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.expirations, stats.size) == (1, 1, 1, 0)


def test_rewrite_restarts_the_ttl() -> None:
    cache, clock = make(ttl=10.0)
    cache.put("a", "A")
    clock.advance(8)
    cache.put("a", "A2")
    clock.advance(8)
    assert cache.get("a") == "A2"


def test_least_recently_used_is_evicted() -> None:
    cache, _ = make(max_size=3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # "b" is now the least recently used
    cache.put("d", "D")
    assert "b" not in cache
    assert all(k in cache for k in "acd")
    assert cache.statistics().evictions == 1


def test_an_expired_lru_entry_counts_as_an_expiration_not_an_eviction() -> None:
    cache, clock = make(ttl=5.0, max_size=2)
    cache.put("a", "A")
    clock.advance(6)
    cache.put("b", "B")
    cache.put("c", "C")
    stats = cache.statistics()
    assert (stats.evictions, stats.expirations, stats.size) == (0, 1, 2)


def test_empty_results_can_be_left_out() -> None:
    cache, _ = make(cache_empty=False)
    cache.put("none", "", empty=True)
    assert "none" not in cache
    cache2, _ = make()
    cache2.put("none", "", empty=True)
    assert cache2.get("none") == ""


def test_pickle_keeps_configuration_not_entries() -> None:
    cache: LookupCache[str] = LookupCache(30.0, max_size=7, cache_empty=False)
    cache.put("a", "A")
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.ttl, copy.max_size, copy.cache_empty, len(copy)) == (30.0, 7, False, 0)
    assert copy.statistics().hits == 0


def test_invalidate_clear_and_reset() -> None:
    cache, _ = make()
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.invalidate("a") and not cache.invalidate("a")
    cache.get("b")
    cache.clear()
    assert len(cache) == 0 and cache.statistics().hits == 1
    cache.reset_statistics()
    assert cache.statistics().hits == 0


def test_infinite_ttl() -> None:
    cache, clock = make(ttl=math.inf)
    cache.put("a", "A")
    clock.advance(1e12)
    assert cache.get("a") == "A"


@pytest.mark.parametrize(
    ("ttl", "max_size"), [(0, 1), (-1, 1), (math.nan, 1), (1, 0), (1, 1.5), (1, True)]
)
def test_bad_configuration(ttl: float, max_size: int) -> None:
    with pytest.raises(ConfigurationError):
        LookupCache(ttl, max_size=max_size)


@given(
    st.lists(st.tuples(st.sampled_from(["get", "put", "tick"]), st.integers(0, 6)), max_size=200),
    st.integers(1, 4),
)
def test_size_bound_and_counters_hold(ops: list[tuple[str, int]], max_size: int) -> None:
    cache, clock = make(ttl=3.0, max_size=max_size)
    gets = 0
    written: dict[int, float] = {}
    for op, k in ops:
        if op == "put":
            cache.put(k, str(k))
            written[k] = clock.now()
        elif op == "get":
            gets += 1
            value = cache.get(k)
            if value is not MISS:
                # Never older than ttl, and the value written for that key.
                assert value == str(k)
                assert clock.now() - written[k] < 3.0
        else:
            clock.advance(k / 2)
        assert len(cache) <= max_size
    stats = cache.statistics()
    assert stats.hits + stats.misses == gets


def test_snapshot_and_restore_keep_write_times_and_limits() -> None:
    clock = ManualClock(1000.0)
    cache: LookupCache[str] = LookupCache(10, max_size=3, clock=clock)
    cache.put("a", "A")
    clock.advance(4)
    cache.put("b", "B")
    snap = cache.snapshot()
    assert [k for k, _ in snap] == ["a", "b"]

    clock.advance(7)  # "a" is 11 s old now: expired; "b" is 7 s old
    warm: LookupCache[str] = LookupCache(10, max_size=3, clock=clock)
    warm.put("b", "fresh-B")
    assert warm.restore(snap) == 0  # "a" expired, "b" already present (this worker's wins)
    assert warm.get("b") == "fresh-B"

    other: LookupCache[str] = LookupCache(10, max_size=1, clock=clock)
    assert other.restore([("x", (clock.now(), "X")), ("y", (clock.now(), "Y"))]) == 2
    assert len(other) == 1 and other.get("y") == "Y"  # max_size holds on restore
    clock.advance(10)
    assert other.get("y") is MISS  # a restored entry keeps its original write time
