"""A cache never answers another question: a cached answer belongs to everything that
decides it (the query and its columns, the database; the URL, method, body and headers; the
model, system message, prompt, sampling settings), never to the key alone and never to a
credential. Against the real Redis (a ``LookupCache`` shared by name), the real Postgres
and real HTTP servers on 127.0.0.1 that count what they are asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asyncio_ops.connectors import BaseLookup, BatchStatistics, LookupCache
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.redis import RedisLookup
from asyncio_ops.services.models import OpenAIServiceThread

from asyncio_ops import ConfigurationError
from tests.connectors.test_shared_cache import CountingServer

from .support import PgTables


def _shared(name: str, redis_url: str, **options: Any) -> LookupCache[Any]:
    return LookupCache(ttl=60, shared=redis_url, name=name, **options)


@pytest.fixture
def model_server(redis_url: str) -> Iterator[OpenAIServiceThread]:
    with OpenAIServiceThread() as service:
        yield service


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_two_queries_naming_one_shared_cache_get_their_own_answers(
    pg_tables: PgTables, name: str, redis_url: str
) -> None:
    plain = f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)"
    shouted = f"SELECT id, upper(name) AS name FROM {pg_tables.customers} WHERE id = ANY($1)"
    async with PostgresLookup(pg_tables.dsn, plain, key="k", on="id",
                              cache=_shared(name, redis_url)) as first:  # fmt: skip
        assert await first.async_invoke({"k": 7}) == [{"id": 7, "name": "customer-7"}]
    async with PostgresLookup(pg_tables.dsn, shouted, key="k", on="id",
                              cache=_shared(name, redis_url)) as second:  # fmt: skip
        assert await second.async_invoke({"k": 7}) == [{"id": 7, "name": "CUSTOMER-7"}]
        layer = second.cache.layer  # type: ignore[union-attr]
        assert layer is not None and layer.hits == 0
    async with PostgresLookup(pg_tables.dsn, plain, key="k", on="id",
                              cache=_shared(name, redis_url)) as again:  # fmt: skip
        assert await again.async_invoke({"k": 7}) == [{"id": 7, "name": "customer-7"}]
        layer = again.cache.layer  # type: ignore[union-attr]
        assert layer is not None and layer.hits == 1  # the same question: paid once


def test_the_database_decides_and_the_password_never_does() -> None:
    query = "SELECT id, name FROM t WHERE id = ANY($1)"

    def scope(dsn: str) -> str:
        lookup = PostgresLookup(dsn, query, key="k", on="id", cache=LookupCache())
        identity = json.dumps(lookup.cache_identity())
        assert "s3cret" not in identity and "0ther" not in identity
        return lookup._cache_scope()

    assert scope("postgresql://u:s3cret@h/sales") == scope("postgresql://u:0ther@h/sales")
    assert scope("postgresql://u:s3cret@h/sales") != scope("postgresql://u:s3cret@h/hr")
    assert scope("host=h dbname=sales password=s3cret") == scope(
        "host=h dbname=sales password=0ther"
    )


@pytest.mark.asyncio
async def test_another_model_or_system_message_asks_the_model_again(
    model_server: OpenAIServiceThread, name: str, redis_url: str
) -> None:
    def chat(model: str, system: str | None, **cache: Any) -> ChatLookup:
        return ChatLookup(model_server.url, model, prompt="Classify: {text}", system=system,
                          cache=_shared(name, redis_url, **cache))  # fmt: skip

    row = {"text": "a great day"}
    for lookup in (chat("m1", None), chat("m2", None), chat("m1", "Be terse."),
                   chat("m1", None)):  # fmt: skip
        async with lookup:
            assert await lookup.async_invoke(row) == [{"answer": "positive"}]
    bodies = model_server.stats["bodies"]
    assert [(b["model"], len(b["messages"])) for b in bodies] == [("m1", 1), ("m2", 1), ("m1", 2)]
    # sharing on purpose: cache_key= names the question
    for model in ("m3", "m4"):
        async with chat(model, None, cache_key="any-model") as lookup:
            await lookup.async_invoke(row)
    assert [b["model"] for b in bodies[3:]] == ["m3"]


@pytest.mark.asyncio
async def test_another_embedding_model_is_asked_again(
    model_server: OpenAIServiceThread, name: str, redis_url: str
) -> None:
    for model in ("e1", "e2", "e1"):
        async with EmbeddingLookup(model_server.url, model, input="{text}",
                                   cache=_shared(name, redis_url)) as lookup:  # fmt: skip
            assert len((await lookup.async_invoke({"text": "hello"}))[0]["embedding"]) > 0
    assert model_server.stats["batches"] == [1, 1]  # e1, e2; the second e1 from Redis


@pytest.mark.asyncio
async def test_http_headers_decide_but_a_rotated_token_does_not(name: str, redis_url: str) -> None:
    with CountingServer() as server:

        def lookup(**headers: str) -> HttpLookup:
            return HttpLookup(server.url + "/items/{id}", headers=headers,
                              cache=_shared(name, redis_url))  # fmt: skip

        for headers in ({"Authorization": "Bearer tok-1"}, {"Authorization": "Bearer tok-2"},
                        {"Authorization": "Bearer tok-1", "Accept-Language": "fr"}):  # fmt: skip
            async with lookup(**headers) as http:
                assert await http.async_invoke({"id": 3}) == [CountingServer.item(3)]
                scope = http._cache_scope()
                assert "tok-" not in json.dumps(http.cache_identity())
        assert server.asked == [3, 3]  # the token rotated: the same question
        assert scope != lookup(Authorization="x")._cache_scope()  # the language decides


@pytest.mark.asyncio
async def test_a_redis_lookup_of_another_prefix_is_another_question(
    name: str, redis_url: str
) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.mset({f"{name}-a:1": "from a", f"{name}-b:1": "from b"})
        for prefix in ("a", "b"):
            async with RedisLookup(redis_url, key="k", key_prefix=f"{name}-{prefix}:",
                                   cache=_shared(name, redis_url)) as lookup:  # fmt: skip
                assert await lookup.async_invoke({"k": 1}) == [{"value": f"from {prefix}"}]
    finally:
        await client.delete(f"{name}-a:1", f"{name}-b:1")
        await client.aclose()


def test_a_checkpointed_cache_of_another_question_is_not_restored() -> None:
    def lookup(query: str) -> PostgresLookup:
        return PostgresLookup("postgresql://h/db", query, key="k", on="id",
                              cache=LookupCache(ttl=60))  # fmt: skip

    asked = "SELECT id, name FROM a WHERE id = ANY($1)"
    written = lookup(asked)
    assert written.cache is not None
    written.cache.put(1, ({"id": 1, "name": "n1"},))
    table = written.snapshot_function_state()
    assert table is not None
    same, other = lookup(asked), lookup("SELECT id, name FROM b WHERE id = ANY($1)")
    same.initialize_function_state([table])
    other.initialize_function_state([table])
    assert len(same.cache) == 1 and len(other.cache) == 0  # type: ignore[arg-type]


class _Plain(BaseLookup[None]):
    """A connector of one's own that does not say what decides its answers."""

    def request_fields(self) -> tuple[str, ...]:
        return ("k",)

    async def _open_runtime(self) -> None:
        return None

    async def _close_runtime(self, runtime: None) -> None:
        return None

    def _runtime_batch_statistics(self, runtime: None) -> BatchStatistics:
        return BatchStatistics(0, 0, 0, 0, 0)

    async def lookup(self, value: Any) -> list[dict[str, Any]]:
        return []


def test_a_cache_belongs_to_one_lookup_and_a_shared_one_to_a_known_question() -> None:
    cache: LookupCache[Any] = LookupCache()
    HttpLookup("http://h/{id}", cache=cache)
    with pytest.raises(ConfigurationError, match="belongs to another lookup"):
        HttpLookup("http://h/{id}", cache=cache)
    shared = "redis://127.0.0.1:6379/0"
    with pytest.raises(ConfigurationError, match=r"_Plain's answers: implement cache_identity"):
        _Plain(cache=LookupCache(shared=shared, name="n"))
    _Plain(cache=LookupCache(shared=shared, name="n", cache_key="mine"))
    _Plain(cache=LookupCache())  # a cache of this worker alone: one lookup's answers
