"""A NULL never leaves the process: a row NULL in a field its request is made of sends
nothing (no HTTP request, no prompt, no Redis read, no query) and gets no result: it is
dropped, or kept once with NULL output columns with ``on_empty="keep"``; the metrics
count it in ``skipped_null_keys``. Against real servers that record every request, in
Spark, on the per-row and the batched (columnar) paths."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from aiohttp import web
from asyncio_ops.connectors import BaseLookup, BatchStatistics
from asyncio_ops.connectors.http import HttpBatch, HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.redis import RedisLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import DataFrame, SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops.spark import AsyncMetrics, ordered_wait
from tests.spark.conftest import spark

from .support import PgTables

__all__ = ["spark"]

pytestmark = [pytest.mark.spark]

# ids 1..6; 2 and 5 are NULL, and 4 has a NULL note
ROWS = [(1, 1, "a"), (2, None, "b"), (3, 3, "c"), (4, 4, None), (5, None, None), (6, 6, "f")]
PATHS = {None: "per-row", "auto": "batched"}


def _orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(ROWS, "id int, customer_id int, note string").repartition(2)


class _Recorder(ServiceThread):
    """A service on a free local port that records every request it receives and answers:
    ``GET /customer/{id}`` one customer, ``GET /customer/`` (the list endpoint a NULL id
    would reach) two, ``GET /customers?ids=..`` a batch, and the two OpenAI routes."""

    def __init__(self) -> None:
        super().__init__(customers=0)
        self.seen: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        app = web.Application()
        app.router.add_get("/customer/", self._everyone)
        app.router.add_get("/customer/{cid}", self._one)
        app.router.add_get("/customers", self._batch)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._app = app

    async def _record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        if request.method != "HEAD":  # the driver's preflight asks the URL's prefix
            with self._lock:
                self.seen.append((request.method, request.path_qs, body))
        return body

    async def _everyone(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response([{"name": "everyone"}, {"name": "else"}])

    async def _one(self, request: web.Request) -> web.Response:
        await self._record(request)
        cid = request.match_info["cid"]
        return web.json_response({"name": f"n{cid}"})

    async def _batch(self, request: web.Request) -> web.Response:
        await self._record(request)
        ids = [i for i in request.query.get("ids", "").split(",")]
        return web.json_response({"items": [{"cid": i, "name": f"n{i}"} for i in ids]})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        said = body["messages"][-1]["content"]
        return web.json_response({
            "choices": [{"message": {"role": "assistant", "content": f"re {said}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        })  # fmt: skip

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        inputs = body["input"]
        return web.json_response({
            "data": [{"index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(inputs)],
            "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
        })  # fmt: skip


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    with _Recorder() as service:
        yield service


def _run(
    spark: SparkSession, lookup: AsyncFunction[Any, Any], output_schema: str, on_empty: str,
    chunk_size: str | None, df: DataFrame | None = None,
) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:  # fmt: skip
    metrics = AsyncMetrics(spark)
    out = ordered_wait(_orders(spark) if df is None else df, lookup, timeout=30,
                       output_schema=output_schema, on_empty=on_empty, chunk_size=chunk_size,
                       metrics=metrics)  # fmt: skip
    rows = sorted((tuple(r) for r in out.collect()), key=repr)
    return rows, metrics.summary()


@pytest.mark.parametrize("on_empty", ["drop", "keep"])
def test_http_sends_no_request_for_a_null_url_or_query_field(
    spark: SparkSession, recorder: _Recorder, on_empty: str
) -> None:
    lookup = HttpLookup(recorder.url + "/customer/{customer_id}", params={"note": "{note}"})
    rows, summary = _run(spark, lookup, "name string", on_empty, None)
    want = [(i, c, n, f"n{c}") for i, c, n in ROWS if c is not None and n is not None]
    if on_empty == "keep":
        want += [(i, c, n, None) for i, c, n in ROWS if c is None or n is None]
    assert rows == sorted(want, key=repr)
    assert sorted(path for _, path, _ in recorder.seen) == [
        "/customer/1?note=a",
        "/customer/3?note=c",
        "/customer/6?note=f",
    ]  # never /customer/ (the list endpoint), never a request without its note
    assert summary["skipped_null_keys"] == 3
    assert summary["received"] == len(ROWS)


@pytest.mark.parametrize("chunk_size", list(PATHS), ids=list(PATHS.values()))
def test_http_batch_endpoint_leaves_null_keys_out_of_the_batch(
    spark: SparkSession, recorder: _Recorder, chunk_size: str | None
) -> None:
    batch = HttpBatch(key="customer_id", result_key="cid", param="ids")
    lookup = HttpLookup(recorder.url + "/customers", result_path="items", batch=batch)
    rows, summary = _run(spark, lookup, "name string", "keep", chunk_size)
    assert rows == sorted([(i, c, n, None if c is None else f"n{c}") for i, c, n in ROWS], key=repr)
    asked = sorted(k for _, path, _ in recorder.seen
                   for k in parse_qs(urlsplit(path).query, keep_blank_values=True)["ids"][0]
                   .split(","))  # fmt: skip
    assert asked == ["1", "3", "4", "6"]  # no empty id, no "None"
    assert summary["skipped_null_keys"] == 2


@pytest.mark.parametrize("on_empty", ["drop", "keep"])
def test_chat_sends_no_prompt_with_a_null_field(
    spark: SparkSession, recorder: _Recorder, on_empty: str
) -> None:
    chat = ChatLookup(recorder.url, "m", prompt="Classify {note} of {customer_id}")
    rows, summary = _run(spark, chat, "answer string", on_empty, None)
    want = [(i, c, n, f"re Classify {n} of {c}") for i, c, n in ROWS if c and n]
    if on_empty == "keep":
        want += [(i, c, n, None) for i, c, n in ROWS if c is None or n is None]
    assert rows == sorted(want, key=repr)
    prompts = sorted(body["messages"][-1]["content"] for _, _, body in recorder.seen)
    assert prompts == ["Classify a of 1", "Classify c of 3", "Classify f of 6"]  # no "None"
    assert summary["skipped_null_keys"] == 3
    assert summary["prompt_tokens"] == 9  # three prompts paid for, not six


@pytest.mark.parametrize("chunk_size", list(PATHS), ids=list(PATHS.values()))
def test_embeddings_send_no_null_input(
    spark: SparkSession, recorder: _Recorder, chunk_size: str | None
) -> None:
    embed = EmbeddingLookup(recorder.url, "e", input="{note}", batch_size=4)
    rows, summary = _run(spark, embed, "embedding array<float>", "keep", chunk_size)
    assert rows == sorted(
        [(i, c, n, None if n is None else [1.0, 1.0]) for i, c, n in ROWS], key=repr
    )
    sent = sorted(t for _, _, body in recorder.seen for t in body["input"])
    assert sent == ["a", "b", "c", "f"]
    assert summary["skipped_null_keys"] == 2


@pytest.fixture
def monitor(redis_url: str) -> Iterator[list[str]]:
    """Every command the Redis server receives while the test runs (MONITOR)."""
    seen: list[str] = []
    client = redis.Redis.from_url(redis_url)
    started = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        with client.monitor() as m:
            started.set()
            while not stop.is_set():
                command = m.next_command()["command"]
                if command != "PING":
                    seen.append(command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(10)
    yield seen
    stop.set()
    client.ping()  # wakes the monitor's read once more, so that it sees the stop
    thread.join(10)


@pytest.mark.parametrize("chunk_size", list(PATHS), ids=list(PATHS.values()))
def test_redis_reads_nothing_for_a_null_key(
    spark: SparkSession, redis_url: str, name: str, monitor: list[str], chunk_size: str | None
) -> None:
    client = redis.Redis.from_url(redis_url)
    prefix = f"{name}:"
    # a trap: the key a NULL would make if it were sent as text
    client.mset({f"{prefix}1": "one", f"{prefix}3": "three", f"{prefix}None": "trap",
                 f"{prefix}": "trap"})  # fmt: skip
    lookup = RedisLookup(redis_url, key="customer_id", key_prefix=prefix)
    rows, summary = _run(spark, lookup, "value string", "keep", chunk_size)
    found = {1: "one", 3: "three"}
    assert rows == sorted([(i, c, n, found.get(c)) for i, c, n in ROWS], key=repr)
    reads = [c for c in monitor if prefix in c and not c.startswith('"MSET"')]
    assert reads and not any(f'"{prefix}None"' in c or f'"{prefix}"' in c for c in reads)
    assert summary["skipped_null_keys"] == 2


@pytest.mark.postgres
@pytest.mark.parametrize("chunk_size", list(PATHS), ids=list(PATHS.values()))
def test_postgres_queries_no_null_key(
    spark: SparkSession, pg_tables: PgTables, chunk_size: str | None
) -> None:
    query = f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)"
    lookup = PostgresLookup(pg_tables.dsn, query, key="customer_id", on="id")
    rows, summary = _run(spark, lookup, "name string", "keep", chunk_size)
    assert rows == sorted(
        [(i, c, n, None if c is None else f"customer-{c}") for i, c, n in ROWS], key=repr
    )
    assert summary["skipped_null_keys"] == 2


class _Echo(BaseLookup[list[object]]):
    """A connector of one's own: answers every row it is asked for, and keeps them."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        super().__init__(cache=None)
        self.fields = fields

    def request_fields(self) -> tuple[str, ...]:
        return self.fields

    async def _open_runtime(self) -> list[object]:
        return []

    async def _close_runtime(self, runtime: list[object]) -> None:
        return None

    def _runtime_batch_statistics(self, runtime: list[object]) -> BatchStatistics:
        return BatchStatistics(0, 0, 0, 0, 0)

    async def lookup(self, value: Any) -> list[dict[str, Any]]:
        return [{"seen": json.dumps(value.get("customer_id"))}]


@pytest.mark.parametrize(("fields", "skipped"), [(("customer_id",), 2), ((), 0)],
                         ids=["key", "wants-nulls"])  # fmt: skip
def test_a_connector_of_ones_own_gets_null_keys_only_when_it_says_so(
    spark: SparkSession, fields: tuple[str, ...], skipped: int
) -> None:
    rows, summary = _run(spark, _Echo(fields), "seen string", "keep", None)
    seen = {i: s for i, _, _, s in rows}
    assert seen[2] == (None if fields else "null") and seen[1] == "1"
    assert summary["skipped_null_keys"] == skipped


def test_a_connector_may_not_bypass_the_rule() -> None:
    with pytest.raises(TypeError, match=r"overrides async_invoke\(\).*lookup\(row\)"):

        class Bypass(_Echo):
            async def async_invoke(self, value: Any) -> list[dict[str, Any]]:
                return []
