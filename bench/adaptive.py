"""``capacity="auto"`` against fixed capacities, on Spark, against the local HTTP service.

    python -m bench.adaptive            # ~5 minutes
    python -m bench.adaptive --quick    # ~2 minutes, smaller runs, one round

Run it as a module from the repository root. The example customer service
(``python -m asyncio_ops.services.customers``) runs as its own process and
``unordered_wait`` + ``HttpLookup`` (``max_connections`` 1,024, so that the
connector's own pool never bounds it) enriches ``spark.range(n)`` on ``local[2]``.
Three scenarios, each with the best fixed capacity found by a sweep in the same run:

- ``scales``: each lookup takes 20 ms plus up to 10 ms of jitter, however many are
  in flight. Capacities 16, 64, 256, 1,024 per partition and ``"auto"``
  (``max_capacity`` 1,024), each run sized to a few seconds at its bound, interleaved
  over ``--rounds`` rounds (best kept). ``auto, first job``: the first job on the
  service (each worker learns from nothing); ``auto, next jobs``: the jobs after it
  (a worker starts where its last partition on the service ended).
- ``fails fast``: 20 ms, but a lookup arriving while 16 are being served is answered
  500 at once; no retries (``max_retries=0``), ``on_error="error_column"``. 8,000
  rows; capacities 4, 8, 16 per partition and ``"auto"``, its first job on the
  service and the next one: rows/s of answered rows and the share of error rows.
- ``gets slower``: ``"auto"`` on a service at 5 ms that takes 100 ms from 5 s after
  its first lookup on, against ``"auto"`` on a service at 100 ms from the start:
  answers per second counted by the service (``/stats``), from 6 to 10 s after the
  jump, against the same seconds of the steady run.
- ``postgres``: ``ordered_wait`` + the columnar ``PostgresLookup`` (chunks of its
  own size; ``capacity`` counts chunks) on a 100,000-row table of the local
  Postgres (``--dsn``, default ``$ASYNCIO_OPS_PG_DSN`` or the ``test`` database on
  127.0.0.1), 1,000,000 rows; capacities 1, 2, 4 (its default), 8, 16 and ``"auto"``.
- ``model``: ``unordered_wait`` + ``ChatLookup`` against the example
  OpenAI-compatible service (``python -m asyncio_ops.services.models``, 50 ms per
  request), capacities 16, 64, 256 and ``"auto"``.

Targets (checked at the end, PASS/MISS; a benchmark never fails the build): ``auto``
within 5% of the best fixed capacity's rows/s where the service scales (first job
and next jobs), on Postgres and on the model endpoint; at most 1% error rows where
it fails fast; within 10 s of the jump at least 90% of the steady run's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.openai import ChatLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, ordered_wait, session, unordered_wait
from bench._service import start_process, start_service, stop_service

PARTITIONS = 2
LATENCY_MS = 20.0
JITTER_MS = 10.0
FIXED = (16, 64, 256, 1024)
FAST_FAIL_AT = 16  # lookups served at once before the service answers 500
FAST_FAIL_FIXED = (4, 8, 16)
JUMP_AT = 5.0  # seconds after the first lookup
JUMP_WINDOW = (6.0, 10.0)  # seconds after the jump


@dataclass
class Run:
    label: str
    rows: int
    seconds: float
    p50_ms: float
    p99_ms: float
    limits: list[int]
    errors: int = 0
    answered: list[int] = field(default_factory=list)  # per second, from the service

    @property
    def rate(self) -> float:
        """Answered rows (not error rows) per second."""
        return (self.rows - self.errors) / self.seconds


def orders(spark: SparkSession, n: int) -> DataFrame:
    return spark.range(0, n, 1, PARTITIONS).select((F.col("id") % 100_000 + 1).alias("customer_id"))


def run(spark: SparkSession, url: str, label: str, capacity: int | str, n: int,
        **options: object) -> Run:  # fmt: skip
    metrics = AsyncMetrics(spark)
    lookup = HttpLookup(f"{url}/customers/{{customer_id}}", max_connections=1024, timeout=30.0,
                        max_retries=0)  # fmt: skip
    out = unordered_wait(orders(spark, n), lookup, timeout=60.0, capacity=capacity,
                         output_schema="name string", metrics=metrics, **options)  # fmt: skip
    return measured(label, n, out, metrics)


def answered(url: str) -> list[int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as r:
        return list(json.load(r)["answered"])


def table(title: str, runs: list[Run], errors: bool = False) -> None:
    print()
    print(title)
    extra = f"{'errors':>9}" if errors else ""
    print(f"  {'capacity':<24}{'rows':>8}{'rows/s':>10}{'p50 ms':>9}{'p99 ms':>9}{extra}  limits")
    for r in runs:
        limits = ", ".join(map(str, r.limits))
        extra = f"{r.errors / r.rows:>9.2%}" if errors else ""
        print(f"  {r.label:<24}{r.rows:>8,}{r.rate:>10,.0f}{r.p50_ms:>9.1f}{r.p99_ms:>9.1f}"
              f"{extra}  {limits}")  # fmt: skip


def scales(spark: SparkSession, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    proc, url = start_service(latency_ms=LATENCY_MS, jitter_ms=JITTER_MS)
    mean = (LATENCY_MS + JITTER_MS / 2) / 1000
    try:
        run(spark, url, "warm-up", 64, 4_000)
        plan = [(f"capacity {c}", c, max(2_000, int(c * PARTITIONS / mean * args.seconds)))
                for c in FIXED]  # fmt: skip
        n = max(rows for _, _, rows in plan)
        results: dict[str, list[Run]] = {label: [] for label, _, _ in plan}
        results["auto, first job"], results["auto, next jobs"] = [], []
        for _ in range(args.rounds):
            for label, capacity, rows in plan:
                results[label].append(run(spark, url, label, capacity, rows))
            first = "auto, first job" if not results["auto, first job"] else "auto, next jobs"
            results[first].append(run(spark, url, first, "auto", n))
            results["auto, next jobs"].append(run(spark, url, "auto, next jobs", "auto", n))
    finally:
        stop_service(proc)
    best = {label: max(rs, key=lambda r: r.rate) for label, rs in results.items()}
    table("service scales (20 ms + up to 10 ms)", list(best.values()))
    top = max((best[f"capacity {c}"] for c in FIXED), key=lambda r: r.rate)
    return [(f"scales: {label} >= 95% of the best fixed ({top.label})",
             best[label].rate >= 0.95 * top.rate, f"{best[label].rate / top.rate:.1%}")
            for label in ("auto, first job", "auto, next jobs")]  # fmt: skip


def fails_fast(spark: SparkSession, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    runs: list[Run] = []
    # a fresh service per fixed capacity; auto twice on one: its first job, then the
    # next one (whose workers start where their last partition on the service ended)
    plan: list[list[tuple[str, int | str]]] = [[(f"capacity {c}", c)] for c in FAST_FAIL_FIXED]
    plan.append([("auto, first job", "auto"), ("auto, next job", "auto")])
    for jobs in plan:
        proc, url = start_service(latency_ms=LATENCY_MS, reject_above=FAST_FAIL_AT)
        try:
            for label, capacity in jobs:
                runs.append(run(spark, url, label, capacity, args.fast_fail_rows,
                                on_error="error_column"))  # fmt: skip
        finally:
            stop_service(proc)
    table(f"service fails fast beyond {FAST_FAIL_AT} at once (500 at once, no retries)",
          runs, errors=True)  # fmt: skip
    top = max(runs[:-2], key=lambda r: r.rate)
    checks = []
    for auto in runs[-2:]:
        checks += [
            (f"fails fast: {auto.label} error rows <= 1%", auto.errors <= 0.01 * auto.rows,
             f"{auto.errors / auto.rows:.2%}"),
            (f"fails fast: {auto.label} >= 95% of the best fixed ({top.label})",
             auto.rate >= 0.95 * top.rate, f"{auto.rate / top.rate:.1%}"),
        ]  # fmt: skip
    return checks


def gets_slower(spark: SparkSession, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    start, end = (JUMP_AT + JUMP_WINDOW[0], JUMP_AT + JUMP_WINDOW[1])
    runs: list[Run] = []
    for label, latency, after in (("auto at 100 ms", 100.0, None),
                                  ("auto, 5 ms then 100 ms", 5.0, f"{JUMP_AT}:100")):  # fmt: skip
        proc, url = start_service(latency_ms=latency, latency_after=after)
        try:
            r = run(spark, url, label, "auto", args.jump_rows)
            r.answered = answered(url)
        finally:
            stop_service(proc)
        if len(r.answered) < end:
            raise RuntimeError(f"{label}: the run ended after {len(r.answered)} s; more rows")
        runs.append(r)
    table(f"service gets slower ({JUMP_AT:g} s after its first lookup)", runs)
    steady, jumped = (sum(r.answered[int(start):int(end)]) / (end - start) for r in runs)
    print(f"  answers/s from {JUMP_WINDOW[0]:g} to {JUMP_WINDOW[1]:g} s after the jump: "
          f"{jumped:,.0f} against {steady:,.0f} for the run at 100 ms from the start")  # fmt: skip
    return [(f"gets slower: auto >= 90% of steady {JUMP_WINDOW[1]:g} s after the jump",
             jumped >= 0.9 * steady, f"{jumped / steady:.1%}")]  # fmt: skip


def sweep(title: str, make: Callable[[int | str], Run], fixed: tuple[int, ...],
          rounds: int) -> list[tuple[str, bool, str]]:  # fmt: skip
    """Fixed capacities and auto, interleaved over ``rounds``, the best of each kept."""
    labels = [*(f"capacity {c}" for c in fixed), "auto"]
    results: dict[str, list[Run]] = {label: [] for label in labels}
    for _ in range(rounds):
        for capacity in (*fixed, "auto"):
            r = make(capacity)
            results[r.label].append(r)
    best = {label: max(rs, key=lambda r: r.rate) for label, rs in results.items()}
    table(title, list(best.values()))
    top = max((best[f"capacity {c}"] for c in fixed), key=lambda r: r.rate)
    auto = best["auto"]
    name = title.split(" (")[0]
    return [(f"{name}: auto >= 95% of the best fixed ({top.label})",
             auto.rate >= 0.95 * top.rate, f"{auto.rate / top.rate:.1%}")]  # fmt: skip


def measured(label: str, n: int, out: DataFrame, metrics: AsyncMetrics) -> Run:
    start = time.perf_counter()
    out.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    s = metrics.summary()
    if s["emitted"] != n:
        raise RuntimeError(f"{label}: expected {n} rows, got {s['emitted']}")
    return Run(label, n, seconds, s["latency_p50_ms"], s["latency_p99_ms"],
               s["capacity_limits"], s["error_rows"])  # fmt: skip


PG_TABLE = "bench_adaptive_customers"


def postgres(spark: SparkSession, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    async def create() -> None:
        conn = await asyncpg.connect(args.dsn)
        try:
            await conn.execute(f"DROP TABLE IF EXISTS {PG_TABLE}")
            await conn.execute(f"CREATE TABLE {PG_TABLE} AS SELECT i AS id, 'customer ' || i "
                               "AS name FROM generate_series(1, 100000) i")  # fmt: skip
            await conn.execute(f"ALTER TABLE {PG_TABLE} ADD PRIMARY KEY (id)")
            await conn.execute(f"ANALYZE {PG_TABLE}")
        finally:
            await conn.close()

    asyncio.run(create())
    n = args.pg_rows

    def make(capacity: int | str) -> Run:
        metrics = AsyncMetrics(spark)
        lookup = PostgresLookup(args.dsn, f"SELECT id, name FROM {PG_TABLE} WHERE id = ANY($1)",
                                key="customer_id", on="id")  # fmt: skip
        out = ordered_wait(orders(spark, n), lookup, timeout=60.0, capacity=capacity,
                           output_schema="name string", metrics=metrics)  # fmt: skip
        return measured("auto" if capacity == "auto" else f"capacity {capacity}", n, out, metrics)

    make(4)  # warm-up
    return sweep(f"postgres (columnar PostgresLookup, {n:,} rows; capacity in chunks)", make,
                 (1, 2, 4, 8, 16), args.rounds)  # fmt: skip


def model(spark: SparkSession, args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    proc, url = start_process("models", "/stats", "--latency-ms", "50")
    base = f"{url}/v1"
    n = args.model_rows
    reviews = spark.range(0, n, 1, PARTITIONS).select(
        F.concat(F.lit("a great product, order "), F.col("id").cast("string")).alias("text")
    )

    def make(capacity: int | str) -> Run:
        metrics = AsyncMetrics(spark)
        chat = ChatLookup(base, "local", prompt="Is this review positive? {text}",
                          max_connections=1024)  # fmt: skip
        out = unordered_wait(reviews, chat, timeout=60.0, capacity=capacity,
                             output_schema="answer string", metrics=metrics)  # fmt: skip
        return measured("auto" if capacity == "auto" else f"capacity {capacity}", n, out, metrics)

    try:
        make(16)  # warm-up
        return sweep(f"model (ChatLookup, 50 ms a request, {n:,} rows)", make, (16, 64, 256),
                     args.rounds)  # fmt: skip
    finally:
        stop_service(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, one round")
    parser.add_argument("--seconds", type=float, default=4.0, help="target length of a run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fast-fail-rows", type=int, default=8_000)
    parser.add_argument("--jump-rows", type=int, default=100_000)
    parser.add_argument("--pg-rows", type=int, default=1_000_000)
    parser.add_argument("--model-rows", type=int, default=20_000)
    parser.add_argument("--dsn", default=os.environ.get(
        "ASYNCIO_OPS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))  # fmt: skip
    parser.add_argument("--only", choices=("scales", "fails-fast", "gets-slower", "postgres",
                                           "model"))  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.5, 1
        args.pg_rows, args.model_rows = 300_000, 8_000
    spark = session(f"local[{PARTITIONS}]", app_name="bench-adaptive",
                    conf={"spark.default.parallelism": str(PARTITIONS)})  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    print(f"local[{PARTITIONS}] cores={os.cpu_count()} python={sys.version.split()[0]} "
          f"pyspark={spark.version}")  # fmt: skip
    checks: list[tuple[str, bool, str]] = []
    scenarios = {"scales": scales, "fails-fast": fails_fast, "gets-slower": gets_slower,
                 "postgres": postgres, "model": model}  # fmt: skip
    for name, scenario in scenarios.items():
        if args.only in (None, name):
            checks += scenario(spark, args)
    spark.stop()
    print()
    for name, ok, figure in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name:<62}{figure:>8}")


if __name__ == "__main__":
    main()
