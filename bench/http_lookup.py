"""``HttpLookup`` against a plain ``async def`` with one aiohttp session, on Spark.

    python -m bench.http_lookup            # ~2 minutes: 60,000 rows, 3 rounds
    python -m bench.http_lookup --quick    # ~1 minute: 20,000 rows, 2 rounds

Run it as a module from the repository root. The example customer service
(``examples/services/customers.py``) runs as its own process and answers each
``GET /customers/{id}`` after ``--latency-ms`` (20). Both cases enrich
``spark.range(n)`` on ``local[2]`` through ``unordered_wait`` with the same
capacity (``--capacity``, 256) and output schema:

- ``HttpLookup``: ``HttpLookup(url + "/customers/{id}")`` with its defaults
  (``max_connections`` 100, its retries, pace and NULL gate);
- ``plain aiohttp``: an ``AsyncFunction`` whose ``open`` makes one
  ``aiohttp.ClientSession()`` (aiohttp's defaults: 100 connections) and whose
  ``async_invoke`` is ``GET`` + ``json()``, keeping the declared fields: what a
  user writes by hand.

Rounds alternate the two (the machine's noise hits both), after one warm-up
round of a tenth of the size that is not kept; the table gives each case's
median rows/s, every round's, and the ratio HttpLookup / plain round by round.
Target (printed PASS/MISS; a benchmark never fails the build): the median ratio
at least 0.95.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from asyncio_ops.connectors.http import HttpLookup
from pyspark.sql import DataFrame, SparkSession

from asyncio_ops import AsyncFunction
from asyncio_ops.spark import session, unordered_wait
from bench._service import start_service, stop_service

SCHEMA = "name string, tier string, country string"


class PlainAiohttp(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """What a user writes by hand: one aiohttp session, a GET and its JSON per row."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http: Any = None

    async def open(self, runtime_context: Any = None) -> None:
        import aiohttp

        self.http = aiohttp.ClientSession()

    async def async_invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.base}/customers/{value['id']}") as response:
            found = await response.json()
        return [{"name": found["name"], "tier": found["tier"], "country": found["country"]}]

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


def run(df: DataFrame, function: Any, capacity: int) -> float:
    """Rows per second of one ``write.format("noop")`` of the enrichment."""
    out = unordered_wait(df, function, timeout=60, capacity=capacity, output_schema=SCHEMA)
    started = time.perf_counter()
    out.write.format("noop").mode("overwrite").save()
    return df.count() / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000 rows, 2 rounds")
    p.add_argument("--rows", type=int, default=None, help="default 60,000 (20,000 --quick)")
    p.add_argument("--rounds", type=int, default=None, help="default 3 (2 --quick)")
    p.add_argument("--capacity", type=int, default=256)
    p.add_argument("--latency-ms", type=float, default=20.0)
    args = p.parse_args()
    rows = args.rows or (20_000 if args.quick else 60_000)
    rounds = args.rounds or (2 if args.quick else 3)
    proc, url = start_service(latency_ms=args.latency_ms, customers=100_000)
    spark: SparkSession = session(master="local[2]")
    try:
        cases = {"HttpLookup": HttpLookup(url + "/customers/{id}"),
                 "plain aiohttp": PlainAiohttp(url)}  # fmt: skip
        df = spark.range(1, rows + 1, numPartitions=2).cache()
        df.count()
        warm = spark.range(1, rows // 10 + 1, numPartitions=2)
        for function in cases.values():
            run(warm, function, args.capacity)
        rates: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                rates[name].append(run(df, cases[name], args.capacity))
    finally:
        spark.stop()
        stop_service(proc)
    ratios = [a / b for a, b in zip(rates["HttpLookup"], rates["plain aiohttp"], strict=True)]
    print(f"\n{rows:,} rows, capacity {args.capacity}, {args.latency_ms:g} ms service, "
          f"local[2], {rounds} rounds\n")  # fmt: skip
    print("| case | rows/s (median) | rounds |")
    print("| --- | ---: | --- |")
    for name, got in rates.items():
        print(f"| {name} | {statistics.median(got):,.0f} | "
              f"{', '.join(f'{g:,.0f}' for g in got)} |")  # fmt: skip
    median = statistics.median(ratios)
    print(f"\nHttpLookup / plain aiohttp: median {median:.2f} (rounds: "
          f"{', '.join(f'{x:.2f}' for x in ratios)})")  # fmt: skip
    print(f"target >= 0.95: {'PASS' if median >= 0.95 else 'MISS'}")


if __name__ == "__main__":
    main()
