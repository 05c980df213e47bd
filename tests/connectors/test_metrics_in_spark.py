"""What a connector does against a service reaches the metrics: its own retries of 429 and
5xx answers (``connector_retried``), the "slow down" answers among them (``throttled``)
and the seconds it waited (``throttle_wait_seconds``), apart from the operator's
``retried``; against a real HTTP server on 127.0.0.1 that counts what it answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import SparkSession

from asyncio_ops.spark import AsyncMetrics, ordered_wait
from tests.spark.conftest import spark

__all__ = ["spark"]

pytestmark = [pytest.mark.spark]

ROWS = 40


class _Flaky(ServiceThread):
    """``GET /item/{id}``: each id's first request answers 429 (``Retry-After: 0``), an
    even id's second 500, then the item; ``answers`` counts each status sent."""

    def __init__(self) -> None:
        super().__init__(customers=0)
        self.answers: dict[int, int] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        app = web.Application()
        app.router.add_get("/item/{id}", self._item)
        self._app = app

    async def _item(self, request: web.Request) -> web.Response:
        key = request.match_info["id"]
        with self._lock:
            seen = self._seen[key] = self._seen.get(key, 0) + 1
            status = 429 if seen == 1 else 500 if seen == 2 and int(key) % 2 == 0 else 200
            self.answers[status] = self.answers.get(status, 0) + 1
        if status == 429:
            return web.json_response({}, status=429, headers={"Retry-After": "0"})
        if status == 500:
            return web.json_response({}, status=500)
        return web.json_response({"name": f"item-{key}"})


@pytest.fixture
def flaky() -> Iterator[_Flaky]:
    with _Flaky() as service:
        yield service


def test_a_connectors_retries_and_throttles_are_counted(spark: SparkSession, flaky: _Flaky) -> None:
    df = spark.range(ROWS, numPartitions=2).selectExpr("cast(id as int) as id")
    lookup = HttpLookup(flaky.url + "/item/{id}", backoff=0.001, max_backoff=0.001)
    metrics = AsyncMetrics(spark)
    rows = ordered_wait(df, lookup, timeout=30, output_schema="name string",
                        metrics=metrics).collect()  # fmt: skip
    assert sorted(r.name for r in rows) == sorted(f"item-{i}" for i in range(ROWS))
    summary: dict[str, Any] = metrics.summary()
    assert flaky.answers == {429: ROWS, 500: ROWS // 2, 200: ROWS}
    assert summary["connector_retried"] == ROWS + ROWS // 2  # every 429 and 500 sent again
    assert summary["throttled"] == ROWS  # the 429s
    assert summary["throttle_wait_seconds"] >= 0 and summary["retried"] == 0
    assert summary["failed"] == 0 and summary["completed"] == ROWS
