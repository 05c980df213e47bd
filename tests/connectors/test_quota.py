"""Quotas beyond the rate: what a rate limit cost (permits, tokens, seconds waited) in a
lookup's counters and in AsyncMetrics; every connector's ``rate_limit=``; a model
lookup's ``max_total_tokens``. Against the real Redis, PostgreSQL and the example
OpenAI-compatible server on 127.0.0.1; waits on a manual clock."""

from __future__ import annotations

import asyncio
import pickle
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import LookupBudgetExceeded, LookupCache, RateLimit
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from asyncio_ops.connectors.redis import RedisLookup
from asyncio_ops.services.models import OpenAIServiceThread
from pyspark.sql import SparkSession

from asyncio_ops import ConfigurationError
from asyncio_ops.spark import AsyncMetrics, unordered_wait
from asyncio_ops.testing import ManualClock
from tests.spark.conftest import spark

from .conftest import REDIS_URL
from .support import PgTables

__all__ = ["spark"]


async def _until_done(clock: ManualClock, task: asyncio.Future[Any], step: float) -> Any:
    """Advance the manual clock by ``step`` whenever every coroutine waits, until ``task``
    is done."""
    for _ in range(10_000):
        for _ in range(50):
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        clock.advance(step)
    raise AssertionError("the task did not finish")


@pytest.mark.asyncio
async def test_a_permit_says_how_long_it_waited() -> None:
    clock = ManualClock()
    limit = RateLimit(requests_per_second=2, clock=clock)
    waits: list[float] = []

    async def one() -> None:
        async with limit.acquire() as permit:
            waits.append(permit.waited)

    done = asyncio.gather(*(one() for _ in range(3)))
    await _until_done(clock, done, 0.25)
    assert waits == pytest.approx([0.0, 0.5, 1.0])


@pytest.mark.asyncio
async def test_a_redis_lookup_takes_a_permit_per_round_trip_and_waits_for_them(
    redis_url: str,
) -> None:
    """35 keys, 10 per MGET: 4 round trips at 1 per second on the manual clock wait
    0 + 1 + 2 + 3 seconds in all; a number is a per-process limit; others are refused."""
    clock = ManualClock()
    limit = RateLimit(requests_per_second=1, clock=clock)
    lookup = RedisLookup(REDIS_URL, key="id", key_prefix=f"aops-{uuid.uuid4().hex}:",
                         batch_size=10, rate_limit=limit)  # fmt: skip
    async with lookup:
        batch = pa.record_batch({"id": list(range(35))})
        await _until_done(clock, asyncio.ensure_future(lookup.async_invoke_arrow(batch)), 0.5)
    assert lookup.rate_limit_usage() == (4, 0, pytest.approx(6.0))
    numbered = RedisLookup(REDIS_URL, key="id", rate_limit=50, rate_burst=2)
    assert isinstance(numbered.rate_limit, RateLimit)
    assert (numbered.rate_limit.requests_per_second, numbered.rate_limit.burst) == (50, 2)
    assert numbered.rate_limit.shared is None
    with pytest.raises(ConfigurationError, match=r"rate_limit must be .* got 'fast'"):
        RedisLookup(REDIS_URL, key="id", rate_limit="fast")  # type: ignore[arg-type]


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_a_postgres_lookup_takes_a_permit_per_query(pg_tables: PgTables, name: str) -> None:
    """A shared limit: each ANY($1) query of at most batch_size keys is one permit."""
    limit = RateLimit(requests_per_second=1000, burst=100, shared=REDIS_URL, name=name)
    lookup = PostgresLookup(
        pg_tables.dsn, f"SELECT id, name FROM {pg_tables.customers} WHERE id = ANY($1)",
        key="id", batch_size=10, rate_limit=limit,
    )  # fmt: skip
    async with lookup:
        _, columns = await lookup.async_invoke_arrow(pa.record_batch({"id": list(range(1, 36))}))
    assert sorted(pa.array(columns["name"]).to_pylist())[:2] == ["customer-1", "customer-10"]
    permits, tokens, _ = lookup.rate_limit_usage()
    assert (permits, tokens) == (4, 0)
    assert limit.statistics().round_trips >= 1  # the budget is kept on the Redis server
    with pytest.raises(ConfigurationError, match="rate_limit must be"):
        PostgresLookup(pg_tables.dsn, "SELECT 1 AS id WHERE 1 = ANY($1)", key="id",
                       rate_limit=[1])  # type: ignore[arg-type]  # fmt: skip


@pytest.fixture
def service() -> Iterator[OpenAIServiceThread]:
    with OpenAIServiceThread() as s:
        yield s


@pytest.mark.asyncio
async def test_max_total_tokens_refuses_the_row_that_would_pass_it(
    service: OpenAIServiceThread,
) -> None:
    """Per process: rows one after another until the reserved estimate does not fit;
    what the server billed stays within the budget; a cached answer still comes."""
    lookup = ChatLookup(service.url, "local", prompt="Review {n}: {text}", max_tokens=8,
                        max_total_tokens=40, cache=LookupCache())  # fmt: skip
    answered = 0
    async with lookup:
        with pytest.raises(LookupBudgetExceeded) as info:
            for n in range(100):
                await lookup.async_invoke({"n": n, "text": "good"})
                answered += 1
        assert await lookup.async_invoke({"n": 0, "text": "good"}) == [{"answer": "positive"}]
    usage = lookup.usage()
    assert 1 <= answered == usage.requests == service.stats["requests"]
    assert usage.prompt_tokens + usage.completion_tokens <= 40
    message = str(info.value)
    assert "max_total_tokens=40" in message and "in this worker process" in message
    assert f"'Review {answered}: good'" in message


@pytest.mark.asyncio
async def test_a_shared_limit_keeps_one_budget_for_every_copy(
    service: OpenAIServiceThread, name: str
) -> None:
    """The copies Spark ships to tasks (pickles of one lookup) spend one total, kept on
    the Redis server under the limit's name."""
    import redis.asyncio as aioredis

    limit = RateLimit(requests_per_second=100, burst=10, shared=REDIS_URL, name=name)
    lookup = ChatLookup(service.url, "local", prompt="{text}", max_tokens=8,
                        max_total_tokens=30, rate_limit=limit)  # fmt: skip
    copies = [pickle.loads(pickle.dumps(lookup)) for _ in range(2)]
    billed = 0
    with pytest.raises(LookupBudgetExceeded, match="in the job \\(shared through Redis\\)"):
        for i in range(100):
            copy = copies[i % 2]
            async with copy:
                await copy.async_invoke({"text": f"row {i}"})
            billed = sum(c.usage().prompt_tokens + c.usage().completion_tokens for c in copies)
    assert 0 < billed <= 30
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        total = await client.get(f"asyncio_ops:rate:{name}:total:{lookup.budget_id}")
    finally:
        await client.aclose()
    # reservations settled to what was billed, and never below a request's estimate
    # ("row i": 5 characters // 4 + 1 + max_tokens 8 = 10 tokens, more than billed)
    requests = sum(c.usage().requests for c in copies)
    assert billed < int(total) == 10 * requests <= 30


@pytest.mark.asyncio
async def test_a_job_wide_budget_is_never_passed_when_its_redis_forgets(
    service: OpenAIServiceThread, own_redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``max_total_tokens=100`` shared through a Redis of the test's own, 10 tokens a
    request (each reserved at its estimate): the server flushed after 5 requests, 40
    asked for. The total restarts from what the process had spent, so 10 requests are
    answered and the rest refused, never 100 tokens more; a warning says what happened
    and what Redis settings avoid it."""
    limit = RateLimit(requests_per_second=1000, burst=10, shared=own_redis.url, name="bill")
    chat = ChatLookup(service.url, "local", prompt="{text}", max_tokens=8,
                      max_total_tokens=100, rate_limit=limit)  # fmt: skip
    answered = refused = 0
    with caplog.at_level("WARNING", logger="asyncio_ops.connectors"):
        async with chat:
            for i in range(40):
                if i == 5:
                    own_redis.flush()
                try:
                    await chat.async_invoke({"text": f"row {i}"})  # 5 chars: 2 + 8 tokens
                    answered += 1
                except LookupBudgetExceeded:
                    refused += 1
    usage = chat.usage()
    assert answered == 10 and refused == 30
    assert usage.prompt_tokens + usage.completion_tokens <= 100
    assert "had lost its running total" in caplog.text


@pytest.mark.spark
def test_the_limit_and_the_budget_reach_the_metrics_and_error_rows(
    spark: SparkSession, name: str
) -> None:
    """A Spark job of 12 rows through a shared limit with a token budget: AsyncMetrics
    holds the permits and tokens the limit gave (the requests and tokens the server
    counted) and the time waited for them; rows past the budget are error rows."""
    with OpenAIServiceThread() as service:
        limit = RateLimit(requests_per_second=4, tokens_per_minute=60_000, shared=REDIS_URL,
                          name=name)  # fmt: skip
        chat = ChatLookup(service.url, "local", prompt="Review {id}: {text}", max_tokens=8,
                          rate_limit=limit, max_total_tokens=60)  # fmt: skip
        reviews = spark.createDataFrame([(i, "good value") for i in range(12)],
                                        "id long, text string")  # fmt: skip
        metrics = AsyncMetrics(spark)
        rows = unordered_wait(reviews, chat, timeout=60, output_schema="answer string",
                              metrics=metrics, on_error="error_column").collect()  # fmt: skip
        served = service.stats["requests"]
        counted = service.stats["tokens"]
    answered = [r for r in rows if r._error is None]
    refused = [r for r in rows if r._error is not None]
    assert {r.answer for r in answered} == {"positive"}
    assert len(answered) == served >= 1 and refused
    assert {r._error.exception for r in refused} == {"LookupBudgetExceeded"}
    summary = metrics.summary()
    assert summary["prompt_tokens"] + summary["completion_tokens"] <= 60
    assert summary["rate_limit_permits"] == served
    assert summary["rate_limit_tokens"] == counted  # settled: prompt + max_tokens each
    assert summary["rate_limit_wait_seconds"] > 0  # 4 per second, asked for at once


@pytest.mark.asyncio
async def test_a_limit_of_requests_alone_takes_no_tokens() -> None:
    """rate_limit_tokens is what a limit counting tokens took, settled: a limit of requests
    alone takes none (it once reported the sum of the estimates)."""
    with OpenAIServiceThread() as service:
        chat = ChatLookup(service.url, "local", prompt="Review {id}", max_tokens=8,
                          rate_limit=RateLimit(requests_per_second=1000, burst=10))  # fmt: skip
        async with chat:
            for i in range(3):
                await chat.async_invoke({"id": i})
    assert chat.rate_limit_usage()[:2] == (3, 0)
