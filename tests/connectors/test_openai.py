"""ChatLookup and EmbeddingLookup against a real OpenAI-compatible server on 127.0.0.1
(examples/services/models.py: deterministic answers, token counting, a quota with 429s)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from asyncio_ops.connectors import (
    LookupDecodeError,
    LookupKeyError,
    LookupResponseError,
    RateLimit,
)
from asyncio_ops.connectors.openai import ChatLookup, EmbeddingLookup
from asyncio_ops.services.models import OpenAIServiceThread, embedding
from pyspark.sql import SparkSession

from asyncio_ops.spark import AsyncMetrics, unordered_wait
from tests.spark.conftest import spark

__all__ = ["spark"]

KEY = "sk-test-secret-value"


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServiceThread]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAIServiceThread(api_key=KEY) as s:
        yield s


@pytest.mark.asyncio
async def test_a_chat_answers_each_row_from_its_prompt(service: OpenAIServiceThread) -> None:
    lookup = ChatLookup(service.url, "local", prompt="Review: {text}")
    async with lookup:
        good = await lookup.async_invoke({"text": "a great film"})
        bad = await lookup.async_invoke({"text": "dull"})
        with pytest.raises(LookupKeyError, match="no key field 'text'"):
            await lookup.async_invoke({"body": "x"})
    assert (good, bad) == ([{"answer": "positive"}], [{"answer": "negative"}])
    usage = lookup.usage()
    assert usage.requests == 2 and usage.prompt_tokens == 6 and usage.completion_tokens == 2
    assert KEY not in repr(lookup) and KEY not in str(pickle.dumps(lookup))


@pytest.mark.asyncio
async def test_declared_columns_are_asked_for_as_json_and_checked(
    service: OpenAIServiceThread,
) -> None:
    lookup = ChatLookup(service.url, "local", prompt="{text}", prices=(0.5, 1.5))
    lookup.bind_output_columns(["label", "score"])
    async with lookup:
        assert await lookup.async_invoke({"text": "I love it"}) == [
            {"label": "positive", "score": 0.9}
        ]
        lookup.bind_output_columns(["label", "reason"])
        with pytest.raises(LookupDecodeError, match="lacks the column 'reason'"):
            await lookup.async_invoke({"text": "meh"})
    assert lookup.usage().cost is not None and lookup.usage().cost > 0


@pytest.mark.asyncio
async def test_embeddings_go_batch_size_inputs_a_request(service: OpenAIServiceThread) -> None:
    lookup = EmbeddingLookup(service.url, "local", input="{title}", batch_size=4)
    titles = [f"item {i}" for i in range(10)] + ["item 0"]  # a repeat: asked once
    batch = pa.record_batch({"title": titles})
    async with lookup:
        index, columns = await lookup.async_invoke_arrow(batch)
        one = await lookup.async_invoke({"title": "single"})
    assert index == list(range(11))
    assert columns == {"embedding": [embedding(t) for t in titles]}
    assert one == [{"embedding": embedding("single")}]
    assert service.stats["batches"] == [4, 4, 2, 1]


@pytest.mark.asyncio
async def test_a_429_is_waited_out_through_the_rate_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quota of 2 requests a minute on the server: the third request is answered 429
    Retry-After; a 429 means "slow down", never a failed row: the lookup pauses its
    RateLimit and sends the request again, for as long as its caller gives it (the
    operator's timeout; here 2 s), whatever max_retries says; a wrong key is a 401
    raised as it is."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with OpenAIServiceThread(requests_per_minute=2, api_key=KEY) as service:
        limit = RateLimit(requests_per_second=100)
        lookup = ChatLookup(service.url, "local", prompt="{text}", rate_limit=limit,
                            max_retries=0, max_retry_after=0.2)  # fmt: skip
        async with lookup:
            for text in ("a", "b"):
                await lookup.async_invoke({"text": text})
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(lookup.async_invoke({"text": "c"}), 2.0)
        retried, throttled, _ = lookup.service_retries()
        assert service.stats["rejected"] == throttled == retried >= 2  # asked again, 429s
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-xyz")
        async with ChatLookup(service.url, "local", prompt="{text}") as wrong:
            with pytest.raises(LookupResponseError, match="answered 401") as denied:
                await wrong.async_invoke({"text": "d"})
        assert "sk-wrong-key-xyz" not in str(denied.value)


@pytest.mark.spark
def test_an_enrichment_in_spark_types_its_columns(spark: SparkSession) -> None:
    """(A server without a key: the Python workers were started before any test set one
    in this process's environment; on a cluster it is spark.executorEnv's.)"""
    with OpenAIServiceThread() as service:
        _enrich(spark, service)


def _enrich(spark: SparkSession, service: OpenAIServiceThread) -> None:
    reviews = spark.createDataFrame(
        [(1, "good value"), (2, "broken on arrival"), (3, "excellent")], "id long, text string"
    )
    chat = ChatLookup(service.url, "local", prompt="Review: {text}", prices=(1.0, 2.0))
    metrics = AsyncMetrics(spark)
    labelled = unordered_wait(reviews, chat, timeout=30, metrics=metrics,
                              output_schema="label string, score double")  # fmt: skip
    got = sorted((r.id, r.label, r.score) for r in labelled.collect())
    assert got == [(1, "positive", 0.9), (2, "negative", 0.1), (3, "positive", 0.9)]
    # the tokens the server counted reach the job's metrics, with their cost
    summary = metrics.summary()
    assert summary["prompt_tokens"] == service.stats["tokens"] - 3 * 256  # its max_tokens
    assert summary["completion_tokens"] > 0
    assert summary["cost"] == pytest.approx(
        (summary["prompt_tokens"] * 1.0 + summary["completion_tokens"] * 2.0) / 1000
    )
    embed = EmbeddingLookup(service.url, "local", input="{text}", batch_size=2)
    vectors = unordered_wait(reviews, embed, timeout=30, output_schema="embedding array<float>")
    rows: list[Any] = sorted(vectors.collect())
    assert [len(r.embedding) for r in rows] == [8, 8, 8]
    assert rows[0].embedding == pytest.approx(embedding("good value"), abs=1e-6)
