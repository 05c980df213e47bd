"""RedisLookup against the real Redis on 127.0.0.1:6379 (``ASYNCIO_OPS_REDIS_URL``).

Without a reachable Redis these tests are skipped, except under ``CI=true``,
where they fail. Each test writes under a key prefix of its own and deletes it.
Round trips are counted from the server's own ``INFO commandstats``.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio
from asyncio_ops.connectors import (
    LookupAuthError,
    LookupCache,
    LookupConnectionError,
    LookupDecodeError,
    LookupKeyError,
    LookupQueryError,
)
from asyncio_ops.connectors.redis import RedisLookup

from asyncio_ops import PreflightContext
from tests.spark.conftest import spark

from .conftest import REDIS_URL

__all__ = ["spark"]  # the test session's one SparkSession

URL = REDIS_URL


async def _client() -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(URL, decode_responses=True, socket_connect_timeout=5)


@pytest_asyncio.fixture
async def store(redis_url: str) -> AsyncIterator[tuple[Any, str]]:
    """A client and a key prefix of this test's own; every key under it deleted after."""
    client = await _client()
    prefix = f"aops-test-{uuid.uuid4().hex[:8]}:"
    try:
        yield client, prefix
    finally:
        names = [name async for name in client.scan_iter(f"{prefix}*")]
        if names:
            await client.delete(*names)
        await client.aclose()


async def _calls(client: Any, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.asyncio
async def test_each_kind_answers_rows_and_a_missing_key_none(store: tuple[Any, str]) -> None:
    client, prefix = store
    await client.set(f"{prefix}s:1", "one")
    await client.set(f"{prefix}j:1", json.dumps({"name": "ann", "n": 3, "tags": ["a"]}))
    await client.set(f"{prefix}j:2", json.dumps([{"name": "bo"}, {"name": "cy"}]))
    await client.hset(f"{prefix}h:1", mapping={"name": "dee", "tier": "gold"})
    cases = [
        ("string", "s:", {1: [{"value": "one"}]}),
        ("json", "j:", {1: [{"name": "ann", "n": 3, "tags": ["a"]}],
                        2: [{"name": "bo"}, {"name": "cy"}]}),
        ("hash", "h:", {1: [{"name": "dee", "tier": "gold"}]}),
    ]  # fmt: skip
    for kind, part, expected in cases:
        async with RedisLookup(URL, key="id", kind=kind, key_prefix=prefix + part) as lookup:
            for k in (1, 2, 3):
                assert await lookup.async_invoke({"id": k}) == expected.get(k, []), (kind, k)
            assert await lookup.async_invoke({"id": None}) == []  # a null key: no request
            stats = lookup.statistics()
            assert (stats.rows, stats.null_keys) == (4, 1)


@pytest.mark.asyncio
async def test_concurrent_rows_share_round_trips(store: tuple[Any, str]) -> None:
    """300 rows looked up at once, 100 keys per round trip: 3 MGETs at the server."""
    client, prefix = store
    await client.mset({f"{prefix}{i}": f"v{i}" for i in range(300)})
    before = await _calls(client, "mget")
    async with RedisLookup(URL, key="id", key_prefix=prefix, batch_size=100,
                           max_batch_delay=0.05) as lookup:  # fmt: skip
        got = await asyncio.gather(*(lookup.async_invoke({"id": i}) for i in range(300)))
        assert lookup.statistics().batching.batches == 3
    assert got == [[{"value": f"v{i}"}] for i in range(300)]
    assert await _calls(client, "mget") - before == 3


@pytest.mark.asyncio
async def test_a_chunk_of_rows_answers_columns(store: tuple[Any, str]) -> None:
    """The columnar path: distinct keys once, a key's rows repeated per row asking, rows
    without a match (or with a null key) left out; declared fields of a hash by HMGET."""
    client, prefix = store
    await client.hset(f"{prefix}1", mapping={"name": "a", "tier": "gold", "extra": "x"})
    await client.hset(f"{prefix}2", mapping={"name": "b"})
    batch = pa.record_batch({"id": pa.array([1, 2, 1, None, 9], pa.int64())})
    before = await _calls(client, "hmget")
    async with RedisLookup(URL, key="id", kind="hash", key_prefix=prefix) as lookup:
        lookup.bind_output_columns(["name", "tier"])
        index, columns = await lookup.async_invoke_arrow(batch)
    assert index == [0, 1, 2]
    assert columns == {"name": ["a", "b", "a"], "tier": ["gold", None, "gold"]}
    assert await _calls(client, "hmget") - before == 3  # keys 1, 2 and 9, one pipeline


@pytest.mark.asyncio
async def test_composite_keys_and_a_cache_in_front(store: tuple[Any, str]) -> None:
    client, prefix = store
    await client.set(f"{prefix}eu/7", "seven")
    cache: LookupCache[Any] = LookupCache(max_size=100, ttl=60)
    async with RedisLookup(URL, key=("region", "id"), key_prefix=prefix, key_separator="/",
                           cache=cache) as lookup:  # fmt: skip
        before = await _calls(client, "mget")
        for _ in range(3):
            assert await lookup.async_invoke({"region": "eu", "id": 7}) == [{"value": "seven"}]
        assert await _calls(client, "mget") - before == 1  # then the cache answers
        assert lookup.redis_key(("eu", 7)) == f"{prefix}eu/7"


@pytest.mark.asyncio
async def test_errors_name_the_key_and_never_the_password(store: tuple[Any, str]) -> None:
    client, prefix = store
    await client.set(f"{prefix}bad", "{not json")
    await client.set(f"{prefix}scalar", "42")
    await client.set(f"{prefix}string", "x")
    async with RedisLookup(URL, key="id", kind="json", key_prefix=prefix) as lookup:
        with pytest.raises(LookupDecodeError, match=rf"key '{prefix}bad' .* holds no JSON"):
            await lookup.async_invoke({"id": "bad"})
        with pytest.raises(LookupDecodeError, match="not an object or an array of objects"):
            await lookup.async_invoke({"id": "scalar"})
    async with RedisLookup(URL, key="id", kind="hash", key_prefix=prefix) as lookup:
        with pytest.raises(LookupQueryError, match=rf"key '{prefix}string'.*WRONGTYPE"):
            await lookup.async_invoke({"id": "string"})
        with pytest.raises(LookupKeyError, match="no key field 'id'"):
            await lookup.async_invoke({"other": 1})
    context = PreflightContext(pa.schema([("id", pa.int64())]), pa.schema([("value", pa.string())]))
    secret = "s3cret-pw"
    # a user the server does not have (a password alone is ignored by a server without one)
    refused = RedisLookup(URL.replace("redis://", f"redis://nobody:{secret}@"), key="id")
    with pytest.raises(LookupAuthError) as info:
        await refused.preflight(context)
    assert secret not in str(info.value) and secret not in repr(refused)
    with pytest.raises(LookupConnectionError, match=r"127\.0\.0\.1:1"):
        await RedisLookup("redis://127.0.0.1:1/0", key="id", timeout=2).preflight(context)
    with pytest.raises(LookupKeyError, match="input has no key field 'user'"):
        await RedisLookup(URL, key="user").preflight(context)
    await RedisLookup(URL, key="id").preflight(context)  # reachable, key present


def test_options_are_checked_and_a_lookup_pickles_unopened() -> None:
    from asyncio_ops import ConfigurationError

    with pytest.raises(ConfigurationError, match="kind must be one of"):
        RedisLookup(URL, key="id", kind="list")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="url must be a redis://"):
        RedisLookup("http://127.0.0.1:6379", key="id")
    with pytest.raises(ConfigurationError, match="batch_size"):
        RedisLookup(URL, key="id", batch_size=0)
    lookup = RedisLookup(URL, key="id", kind="hash", key_prefix="u:")
    copy = pickle.loads(pickle.dumps(lookup))
    assert (copy.url, copy.kind, copy.key_prefix, copy.key.spec()) == (URL, "hash", "u:", "id")


@pytest.fixture
def seeded(redis_url: str) -> Iterator[str]:
    """Hashes user:<prefix><i> for i in 1..500 (name, tier); deleted after."""
    prefix = f"aops-spark-{uuid.uuid4().hex[:8]}:"

    async def run(delete: bool) -> None:
        client = await _client()
        try:
            if delete:
                names = [n async for n in client.scan_iter(f"{prefix}*")]
                if names:
                    await client.delete(*names)
                return
            async with client.pipeline(transaction=False) as pipe:
                for i in range(1, 501):
                    pipe.hset(
                        f"{prefix}{i}",
                        mapping={"name": f"user-{i}", "tier": "gold" if i % 5 == 0 else "basic"},
                    )
                await pipe.execute()
        finally:
            await client.aclose()

    asyncio.run(run(False))
    try:
        yield prefix
    finally:
        asyncio.run(run(True))


@pytest.mark.spark
def test_an_enrichment_in_spark_matches_what_redis_holds(spark: Any, seeded: str) -> None:
    """unordered_wait over 2 partitions, columnar by default (chunks of batch_size keys),
    the declared output columns read by HMGET; keys past 500 have no hash: dropped
    (on_empty="drop") or kept with nulls (a connector's default)."""
    from asyncio_ops.spark import unordered_wait

    df = spark.range(1, 601, numPartitions=2).withColumnRenamed("id", "user_id")
    lookup = RedisLookup(URL, key="user_id", kind="hash", key_prefix=seeded, batch_size=64)
    out = unordered_wait(df, lookup, timeout=30, output_schema="name string, tier string",
                         on_empty="drop")  # fmt: skip
    rows = sorted((r.user_id, r.name, r.tier) for r in out.collect())
    assert rows == [(i, f"user-{i}", "gold" if i % 5 == 0 else "basic") for i in range(1, 501)]
    kept = unordered_wait(df, lookup, timeout=30, output_schema="name string, tier string",
                          on_empty="keep")  # fmt: skip
    assert kept.count() == 600
    assert kept.filter("name IS NULL").count() == 100
