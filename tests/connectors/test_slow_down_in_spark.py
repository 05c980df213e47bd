""" "Slow down" never fails a job: a service that takes 8 requests a second and answers 429
with ``Retry-After: 1`` beyond that, a job of 120 rows with 64 in flight and no
``RateLimit``: every row is answered, none is an error row; each connector (HTTP, chat,
embeddings) slows its pace to the service's and sends the refused requests again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from asyncio_ops.connectors import BaseLookup
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import SparkSession

from asyncio_ops.spark import AsyncMetrics, unordered_wait
from tests.spark.conftest import spark

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROWS, RATE = 120, 8.0


class _Quota(ServiceThread):
    """Every route takes at most RATE requests a second (a token bucket of RATE, full at
    the start); beyond, 429 with ``Retry-After: 1``. ``answered``/``refused`` count."""

    def __init__(self) -> None:
        super().__init__(customers=0)
        self.answered = 0
        self.refused = 0
        self._tokens = RATE
        self._at = time.monotonic()
        self._lock = threading.Lock()
        app = web.Application()
        app.router.add_get("/item/{id}", self._item)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._app = app

    def _take(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(RATE, self._tokens + (now - self._at) * RATE)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                self.answered += 1
                return True
            self.refused += 1
            return False

    @staticmethod
    def _refused() -> web.Response:
        return web.json_response({"error": "slow down"}, status=429,
                                 headers={"Retry-After": "1"})  # fmt: skip

    async def _item(self, request: web.Request) -> web.Response:
        if not self._take():
            return self._refused()
        return web.json_response({"name": f"item-{request.match_info['id']}"})

    async def _chat(self, request: web.Request) -> web.Response:
        if not self._take():
            return self._refused()
        body = await request.json()
        said = body["messages"][-1]["content"]
        usage = {"prompt_tokens": 2, "completion_tokens": 2}
        return web.json_response({"choices": [{"message": {"content": f"re {said}"}}],
                                  "usage": usage})  # fmt: skip

    async def _embeddings(self, request: web.Request) -> web.Response:
        if not self._take():
            return self._refused()
        inputs = (await request.json())["input"]
        return web.json_response({
            "data": [{"index": i, "embedding": [float(len(t))]} for i, t in enumerate(inputs)],
            "usage": {"prompt_tokens": len(inputs)},
        })  # fmt: skip


@pytest.fixture
def quota() -> Iterator[_Quota]:
    with _Quota() as service:
        yield service


def _lookups(url: str) -> dict[str, tuple[BaseLookup[Any], str]]:
    return {
        "http": (HttpLookup(url + "/item/{id}"), "name string"),
        "chat": (ChatLookup(url, "m", prompt="row {id}"), "answer string"),
        "embeddings": (EmbeddingLookup(url, "e", input="row {id}", batch_size=4),
                       "embedding array<float>"),
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["http", "chat", "embeddings"])
def test_a_429_storm_slows_the_job_and_fails_no_row(
    spark: SparkSession, quota: _Quota, kind: str
) -> None:
    lookup, schema = _lookups(quota.url)[kind]
    df = spark.range(ROWS, numPartitions=2).selectExpr("cast(id as int) as id")
    metrics = AsyncMetrics(spark)
    rows = unordered_wait(df, lookup, timeout=120, capacity=64, output_schema=schema,
                          on_error="error_column", metrics=metrics).collect()  # fmt: skip
    assert sorted(r.id for r in rows) == list(range(ROWS))
    assert [r for r in rows if r._error is not None] == []
    summary = metrics.summary()
    assert quota.refused > 0 and summary["throttled"] == quota.refused  # each sent again
    assert summary["failed"] == 0 and summary["retried"] == 0
