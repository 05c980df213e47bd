"""Benchmark: a model endpoint at its quota, ChatLookup with a shared RateLimit against a
hand-written mapInArrow client.

Run: ``python -m bench.llm`` (``--rows 600 --tpm 30000 --burst 2 --concurrency 16
--redis redis://127.0.0.1:6379/0``; needs the Redis the tests use).

The server is ``examples/services/models.py`` on 127.0.0.1 with a quota of ``--tpm``
tokens per minute, of which ``--burst`` seconds' worth may go at once (a
request costs its prompt's words plus ``max_tokens``, 16 here, about 22
tokens), answering 429 with ``Retry-After`` beyond it. Both sides label the
same ``--rows`` reviews on ``local[2]`` over 2 partitions:

- ``ChatLookup`` through ``unordered_wait`` (capacity ``--concurrency``), with a
  ``RateLimit`` of 95% of the quota shared by both partitions through Redis;
- the same requests written by hand: ``mapInArrow``, one aiohttp session per
  partition, an ``asyncio.Semaphore(--concurrency)``, and on a 429 a sleep of
  its ``Retry-After`` and a retry (what a careful user writes without a shared
  limit).

Printed per side: seconds, rows/s, requests the server saw, and how many it
refused (429). One run; the machine's noise matters less than the quota here.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from asyncio_ops.connectors import RateLimit
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.services.models import OpenAIServiceThread

from asyncio_ops.spark import session, unordered_wait

PROMPT = "Is this review positive? {text}"
WORDS = ("good", "broken", "great", "late", "excellent", "noisy", "love", "cheap")


def _hand_written(base: str, concurrency: int) -> Any:
    """The mapInArrow function a user writes: a semaphore, Retry-After on 429."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import aiohttp

        async def one(session: aiohttp.ClientSession, gate: asyncio.Semaphore,
                      text: str) -> str:  # fmt: skip
            message = {"role": "user", "content": PROMPT.format(text=text)}
            body = {"model": "local", "max_tokens": 16, "messages": [message]}
            while True:
                async with gate, session.post(f"{base}/v1/chat/completions", json=body) as r:
                    if r.status == 429:
                        wait = float(r.headers.get("Retry-After", "1"))
                    else:
                        answer = await r.json()
                        return str(answer["choices"][0]["message"]["content"])
                await asyncio.sleep(wait)

        async def label(texts: list[str]) -> list[str]:
            gate = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession() as session:
                return list(await asyncio.gather(*(one(session, gate, t) for t in texts)))

        for batch in batches:
            texts = batch.column("text").to_pylist()
            labels = asyncio.run(label(texts))
            yield pa.record_batch({"id": batch.column("id"), "answer": pa.array(labels)})

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=600)
    p.add_argument("--tpm", type=int, default=30_000, help="the server's tokens per minute")
    p.add_argument("--burst", type=float, default=2.0, help="seconds of quota at once")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = p.parse_args()
    spark = session("local[2]", app_name="bench-llm", conf={"spark.sql.shuffle.partitions": "2"})
    words = ", ".join(f"'{w}'" for w in WORDS)
    reviews = spark.range(0, args.rows, numPartitions=2).selectExpr(
        "id", f"concat('the product was ', element_at(array({words}), "
        f"cast(id % {len(WORDS)} + 1 AS int))) AS text",
    ).cache()  # fmt: skip
    reviews.count()
    print(f"{args.rows} reviews, quota {args.tpm:,} tokens/min ({args.burst:g} s burst), "
          f"2 partitions, {args.concurrency} in flight each")  # fmt: skip
    print(f"{'side':<28} {'seconds':>8} {'rows/s':>8} {'requests':>9} {'429s':>6}")
    for side in ("ChatLookup + shared RateLimit", "hand-written mapInArrow"):
        with OpenAIServiceThread(tokens_per_minute=args.tpm, burst_seconds=args.burst) as server:
            started = time.perf_counter()
            if side.startswith("ChatLookup"):
                limit = RateLimit(
                    tokens_per_minute=args.tpm * 0.95,
                    token_burst=args.tpm / 60 * args.burst * 0.95,
                    shared=args.redis, name=f"bench-llm-{uuid.uuid4().hex[:8]}",
                )  # fmt: skip
                chat = ChatLookup(server.url, "local", prompt=PROMPT, max_tokens=16,
                                  rate_limit=limit)  # fmt: skip
                out = unordered_wait(reviews, chat, timeout=600, capacity=args.concurrency,
                                     output_schema="answer string")  # fmt: skip
            else:
                out = reviews.mapInArrow(_hand_written(server.url, args.concurrency),
                                         "id long, answer string")  # fmt: skip
            rows = out.count()
            seconds = time.perf_counter() - started
            stats = dict(server.stats)
        if rows != args.rows:
            raise SystemExit(f"{side}: {rows} rows, expected {args.rows}")
        sent = stats["requests"] + stats["rejected"]
        print(f"{side:<28} {seconds:8.2f} {rows / seconds:8.1f} {sent:9,} "
              f"{stats['rejected']:6,}")  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
