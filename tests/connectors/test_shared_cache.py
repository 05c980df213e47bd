"""A LookupCache shared through the real Redis on 127.0.0.1:6379: every worker, attempt and
rerun that names it reads what any of them fetched (skipped without Redis, failed under
CI=true); with a signing key, only what verifies. The source is a real HTTP server on
127.0.0.1 that counts what it is asked."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web
from asyncio_ops.connectors import LookupCache
from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from pyspark.sql import SparkSession

from asyncio_ops import SIGNING_KEY_ENV
from asyncio_ops.spark import unordered_wait
from tests.connectors.conftest import REDIS_URL as URL
from tests.spark.conftest import spark

__all__ = ["spark"]


class CountingServer:
    """``GET /items/{id}`` and ``GET /items?ids=1,2`` on a free port, from a thread;
    ``asked`` counts the ids requested."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def item(i: int) -> dict[str, Any]:
        return {"id": i, "name": f"item-{i}", "price": i / 4, "tags": [f"t{i % 3}"],
                "note": None if i % 2 else "even"}  # fmt: skip

    def _run(self) -> None:
        async def one(request: web.Request) -> web.Response:
            i = int(request.match_info["id"])
            self.asked.append(i)
            if i > 1000:
                return web.json_response({}, status=404)
            return web.json_response(self.item(i))

        async def many(request: web.Request) -> web.Response:
            ids = [int(x) for x in request.query["ids"].split(",")]
            self.asked.extend(ids)
            return web.json_response({"items": [self.item(i) for i in ids if i <= 1000]})

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/items/{id}", one)
            app.router.add_get("/items", many)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    def __enter__(self) -> CountingServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def server(redis_url: str) -> Iterator[CountingServer]:
    with CountingServer() as s:
        yield s


@pytest.mark.asyncio
async def test_a_second_worker_reads_what_the_first_fetched(
    server: CountingServer, name: str
) -> None:
    """Two lookups with caches of their own (two workers) naming one shared cache: the
    second asks the server nothing, and gets the same typed rows (a missing id too)."""

    def lookup() -> HttpLookup:
        return HttpLookup(server.url + "/items/{id}", cache=LookupCache(
            ttl=60, shared=URL, name=name))  # fmt: skip

    ids = [1, 2, 3, 2, 1001]
    async with lookup() as first:
        before = [await first.async_invoke({"id": i}) for i in ids]
    assert sorted(server.asked) == [1, 2, 3, 1001]  # 2 again: the local layer
    async with lookup() as second:
        after = [await second.async_invoke({"id": i}) for i in ids]
        stats = second.cache.layer  # type: ignore[union-attr]
        assert stats is not None and (stats.hits, stats.errors) == (4, 0)
    assert after == before and before[0] == [CountingServer.item(1)] and before[4] == []
    assert sorted(server.asked) == [1, 2, 3, 1001]  # nothing more


@pytest.mark.asyncio
async def test_redis_down_is_a_miss_never_a_failure(server: CountingServer) -> None:
    cache: LookupCache[Any] = LookupCache(
        ttl=60, shared="redis://user:pw-x@127.0.0.1:1/0", name="down", shared_timeout=1
    )
    async with HttpLookup(server.url + "/items/{id}", cache=cache) as lookup:
        assert await lookup.async_invoke({"id": 5}) == [CountingServer.item(5)]
    assert cache.layer is not None and cache.layer.errors == 2  # the read, the write
    assert "pw-x" not in repr(cache)


def test_options_are_checked() -> None:
    from asyncio_ops import ConfigurationError

    with pytest.raises(ConfigurationError, match="needs name="):
        LookupCache(shared=URL)
    with pytest.raises(ConfigurationError, match="redis://"):
        LookupCache(shared="http://x", name="n")


@pytest.mark.spark
def test_a_second_action_in_spark_makes_no_call(
    spark: SparkSession, server: CountingServer, name: str
) -> None:
    """unordered_wait over 2 partitions, columnar (the batch endpoint), a shared cache:
    the first action asks each id once; a second action over the same rows, in tasks
    whose own caches start empty, asks nothing."""
    df = spark.range(1, 301, numPartitions=2).withColumnRenamed("id", "item_id")

    def enrich() -> list[Any]:
        lookup = HttpLookup(
            server.url + "/items", result_path="items",
            batch=HttpBatch(key="item_id", result_key="id", param="ids",
                                                   max_size=50),
            cache=LookupCache(ttl=300, shared=URL, name=name),
        )  # fmt: skip
        out = unordered_wait(df, lookup, timeout=30, output_schema="name string, price double")
        return sorted((r.item_id, r.name, r.price) for r in out.collect())

    first = enrich()
    assert first == [(i, f"item-{i}", i / 4) for i in range(1, 301)]
    assert sorted(server.asked) == list(range(1, 301))
    assert enrich() == first
    assert len(server.asked) == 300  # the second action read every answer from Redis


# -- signed entries (a key in ASYNCIO_OPS_STATE_SIGNING_KEY) -----------------------------------
def forged(row: dict[str, Any]) -> bytes:
    """What anyone who can write to the Redis can write: an answer in the shared layer's
    unsigned format (one byte, then the rows as an Arrow IPC stream)."""
    table = pa.Table.from_pylist([row])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    rows: bytes = sink.getvalue().to_pybytes()
    return b"\x01" + rows


class Questions:
    """Lookups of ``/items/{id}`` whose caches (one per lookup: one worker each) share
    ``name``, and the Redis keys of their questions, learnt by asking."""

    def __init__(self, server: CountingServer, name: str) -> None:
        self.server = server
        self.name = name
        self.redis = aioredis.Redis.from_url(URL)

    def lookup(self) -> HttpLookup:
        return HttpLookup(self.server.url + "/items/{id}", cache=LookupCache(
            ttl=60, shared=URL, name=self.name))  # fmt: skip

    async def keys(self) -> set[bytes]:
        return {k async for k in self.redis.scan_iter(f"asyncio_ops:cache:{self.name}:*")}

    async def ask(self, i: int) -> tuple[list[dict[str, Any]], LookupCache[Any]]:
        """Item ``i`` as a new worker gets it (its own cache empty), and that cache."""
        async with self.lookup() as lookup:
            answer = await lookup.async_invoke({"id": i})
        assert lookup.cache is not None
        return answer, lookup.cache

    async def key_of(self, i: int) -> bytes:
        """The Redis key of item ``i``'s question: the one asking it adds."""
        before = await self.keys()
        await self.ask(i)
        (key,) = await self.keys() - before
        return key


@pytest_asyncio.fixture
async def questions(server: CountingServer, name: str) -> AsyncIterator[Questions]:
    q = Questions(server, name)
    yield q
    await q.redis.aclose()


@pytest.mark.asyncio
async def test_a_forged_entry_is_refused_under_a_signing_key(
    questions: Questions, server: CountingServer, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A correctly encoded answer written straight into Redis under a question's key is
    refused (a miss: the service is asked), counted and logged naming the cache; the
    answer the lookup then writes verifies and serves the next worker."""
    monkeypatch.setenv(SIGNING_KEY_ENV, "k-1")
    key = await questions.key_of(1)
    assert (await questions.ask(1))[0] == [CountingServer.item(1)]  # genuine: served
    assert server.asked == [1]
    await questions.redis.set(key, forged({**CountingServer.item(1), "name": "forged"}))

    with caplog.at_level("WARNING", logger="asyncio_ops.connectors"):
        answer, cache = await questions.ask(1)
    assert answer == [CountingServer.item(1)]
    assert server.asked == [1, 1]  # refused: the service answered
    assert cache.statistics().refused == 1
    assert cache.layer is not None and (cache.layer.hits, cache.layer.refused) == (0, 1)
    (warning,) = [r for r in caplog.records if "failed verification" in r.getMessage()]
    assert repr(questions.name) in warning.getMessage() and SIGNING_KEY_ENV in warning.getMessage()
    cache.reset_statistics()
    assert cache.statistics().refused == 0

    answer, cache = await questions.ask(1)  # what the lookup wrote back verifies
    assert answer == [CountingServer.item(1)] and server.asked == [1, 1]
    assert cache.statistics().refused == 0


@pytest.mark.asyncio
async def test_an_entry_signed_with_another_key_or_copied_from_another_question_is_refused(
    questions: Questions, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, "another key")
    key = await questions.key_of(1)  # written signed, with a key that is not the job's
    monkeypatch.setenv(SIGNING_KEY_ENV, "k-1")
    answer, cache = await questions.ask(1)
    assert answer == [CountingServer.item(1)] and server.asked == [1, 1]
    assert cache.statistics().refused == 1

    other = await questions.key_of(2)  # a genuine answer, to another question
    copied = await questions.redis.get(other)
    assert isinstance(copied, bytes)
    await questions.redis.set(key, copied)
    answer, cache = await questions.ask(1)
    assert answer == [CountingServer.item(1)]  # not item 2's
    assert server.asked == [1, 1, 2, 1] and cache.statistics().refused == 1


@pytest.mark.asyncio
async def test_a_flood_of_refused_entries_is_logged_once_then_counted(
    questions: Questions, server: CountingServer, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Unsigned entries under every question (a Redis filled before the key was set, or
    forged): the first refusal is logged, the others counted, and closing the lookup logs
    how many more there were."""
    keys = {i: await questions.key_of(i) for i in range(1, 6)}  # no key: written unsigned
    monkeypatch.setenv(SIGNING_KEY_ENV, "k-1")
    with caplog.at_level("WARNING", logger="asyncio_ops.connectors"):
        async with questions.lookup() as lookup:
            for i in keys:
                assert await lookup.async_invoke({"id": i}) == [CountingServer.item(i)]
    assert lookup.cache is not None and lookup.cache.statistics().refused == 5
    assert server.asked == [1, 2, 3, 4, 5] * 2
    logged = [r.getMessage() for r in caplog.records if repr(questions.name) in r.getMessage()]
    assert len(logged) == 2, logged
    assert "failed verification" in logged[0] and "4 more" in logged[1]


@pytest.mark.asyncio
async def test_without_a_key_entries_are_not_verified_signed_or_not(
    questions: Questions, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process without the key reads what a signed job wrote (its signature is not
    checked), and what anyone wrote: a shared Redis is then trusted with the answers."""
    monkeypatch.setenv(SIGNING_KEY_ENV, "k-1")
    key = await questions.key_of(1)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    answer, cache = await questions.ask(1)
    assert answer == [CountingServer.item(1)] and server.asked == [1]
    assert cache.layer is not None and cache.layer.hits == 1

    await questions.redis.set(key, forged({**CountingServer.item(1), "name": "forged"}))
    answer, cache = await questions.ask(1)
    assert answer == [{**CountingServer.item(1), "name": "forged"}] and server.asked == [1]
    assert cache.statistics().refused == 0
