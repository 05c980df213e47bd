"""Label product reviews with a model endpoint, at its quota, from Spark.

    python examples/enrich_with_llm.py                     # starts a local model server
    python examples/enrich_with_llm.py --base-url https://api.openai.com \\
        --model gpt-4o-mini --tpm 200000                   # a real endpoint (OPENAI_API_KEY)

Without ``--base-url`` an OpenAI-compatible server (``examples/services/models.py``:
deterministic sentiment answers, token counting, a quota that answers 429) is
started in this process on a free 127.0.0.1 port, with a quota of ``--tpm``
tokens per minute. Each review row becomes a chat completion through
``ChatLookup``: the prompt is a template over the row, the answer is asked for
as JSON with the declared columns (``label``, ``score``) and parsed into typed
columns. A ``RateLimit`` of ``--tpm`` tokens per minute (shared through
``--redis`` by every executor when given) keeps the requests within the quota,
so the server answers no 429. Prints a sample, the counts and the tokens used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncio_ops.connectors import RateLimit
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.services.models import OpenAIServiceThread
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, unordered_wait
from examples._common import report, spark_session, stop_session, timed

WORDS = ("good", "broken", "great", "late", "excellent", "noisy", "love", "cheap")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: start one here)")
    p.add_argument("--model", default="local-sentiment")
    p.add_argument("--reviews", type=int, default=400)
    p.add_argument("--tpm", type=int, default=60_000, help="tokens per minute (the quota)")
    p.add_argument("--redis", help="redis:// URL: share the limit with every executor")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default=None)
    p.add_argument("--sample", type=int, default=5)
    p.add_argument("--json", action="store_true", help="also print one RESULT {...} line")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    service = None
    base = (args.base_url or "").rstrip("/")
    if not base:
        service = OpenAIServiceThread(tokens_per_minute=args.tpm)
        base = service.start()
        print(f"model server at {base} (quota {args.tpm} tokens/min)")
    spark = spark_session(args.master, "enrich_with_llm", args.partitions)
    reviews = spark.range(0, args.reviews, numPartitions=args.partitions).select(
        F.col("id").alias("review_id"),
        F.concat_ws(" ", F.lit("the product was"),
                    F.element_at(F.array(*[F.lit(w) for w in WORDS]),
                                 (F.col("id") % len(WORDS) + 1).cast("int"))).alias("text"),
    )  # fmt: skip
    # Below the quota, as a limit: every request reserves its estimated tokens first.
    # Shared through Redis, one budget for all; without it each Python worker holds its
    # own, so each gets its partition's share.
    share = 1 if args.redis else args.partitions
    limit = RateLimit(
        tokens_per_minute=args.tpm * 0.9 / share, token_burst=args.tpm / 60 / share,
        shared=args.redis, name="enrich-with-llm" if args.redis else None,
    )  # fmt: skip
    chat = ChatLookup(base, args.model, prompt="Is this review positive? {text}",
                      max_tokens=16, rate_limit=limit)  # fmt: skip
    metrics = AsyncMetrics(spark)
    labelled = unordered_wait(
        reviews, chat, timeout=120, capacity=16, metrics=metrics,
        output_schema="label string, score double",
    ).persist()  # fmt: skip
    with timed() as elapsed:
        rows = labelled.count()
    positive = labelled.where(F.col("label") == "positive").count()
    result: dict[str, object] = {
        "base_url": base,
        "local_service": service is not None,
        "input_rows": args.reviews,
        "rows": rows,
        "positive": positive,
        "seconds": round(elapsed[0], 2),
        "rows_per_s": round(rows / elapsed[0], 1) if elapsed[0] else None,
        "sample": [r.asDict() for r in labelled.orderBy("review_id").limit(args.sample).collect()],
        "metrics": metrics.summary(),
    }
    if service is not None:
        result["server"] = {k: v for k, v in service.stats.items() if k != "batches"}
        service.stop()
    stop_session(spark)
    report(result, as_json=args.json)
    if "server" in result:
        print("      server:", result["server"])
    return result


if __name__ == "__main__":
    main()
