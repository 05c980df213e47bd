"""A lookup as a Spark SQL function (``register``) against ``ordered_wait``, same lookup.

    python -m bench.sql            # ~3 minutes: 3 rounds
    python -m bench.sql --quick    # ~1 minute: 1 round, smaller inputs

Run it as a module from the repository root, with a PostgreSQL at
``ASYNCIO_OPS_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``;
the benchmark creates, fills and drops a table of ``--customers`` customers).
Two lookups, each run both ways on ``local[2]`` over the same orders (2
partitions), written to Spark's ``noop`` sink:

- HTTP: ``HttpLookup(url + "/customers/{customer_id}")`` against the example
  customer service in a process of its own answering after ``--latency-ms``
  (20), capacity ``--capacity`` (256), rows one at a time;
- Postgres: ``PostgresLookup`` with its defaults (columnar chunks of
  ``WHERE id = ANY($1)``).

``ordered_wait`` is ``ordered_wait(orders, lookup, ...)``; ``SQL function`` is
``SELECT order_id, customer_id, f(customer_id) AS c FROM orders`` after
``register(spark, "f", lookup, ...)`` with the same options. Each round runs
both, which one first alternating (after one warm-up round of a tenth of the
size, not kept); the table
gives each case's median rows/s and the ratio SQL / ``ordered_wait`` of the
medians. Target (printed PASS/MISS; a benchmark never fails the build): at
least 0.9 for each lookup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import ordered_wait, register, session
from bench._service import start_service, stop_service
from examples import _pg

SCHEMA = "name string, tier string, country string"
DSN = os.environ.get("ASYNCIO_OPS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def execute(sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    async def go() -> None:
        connection = await asyncpg.connect(DSN, timeout=10)
        try:
            await connection.execute(sql, timeout=300)
        finally:
            await connection.close(timeout=5)

    _pg.run(go())


def orders(spark: SparkSession, n: int, customers: int) -> DataFrame:
    return spark.range(0, n, numPartitions=2).select(
        F.col("id").alias("order_id"),
        ((F.col("id") * 7919) % customers + 1).cast("int").alias("customer_id"),
    )


def timed(df: DataFrame, rows: int) -> float:
    """Rows per second of one ``write.format("noop")``."""
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return rows / (time.perf_counter() - started)


def both(
    spark: SparkSession, label: str, make: Callable[[], Any], options: dict[str, Any],
    n: int, customers: int, sql_first: bool = False,
) -> dict[str, float]:  # fmt: skip
    """rows/s of ``ordered_wait`` and of the SQL function, the same lookup and options."""
    df = orders(spark, n, customers).cache()
    df.count()
    df.createOrReplaceTempView("bench_sql_orders")
    name = f"bench_{label}"
    register(spark, name, make(), input_schema="customer_id int", output_schema=SCHEMA,
             **options)  # fmt: skip
    runs = {
        "ordered_wait": lambda: ordered_wait(df, make(), output_schema=SCHEMA, **options),
        "SQL function": lambda: spark.sql(
            f"SELECT order_id, customer_id, {name}(customer_id) AS c FROM bench_sql_orders"
        ),
    }
    order = list(runs) if not sql_first else list(reversed(runs))
    out = {way: timed(runs[way](), n) for way in order}
    df.unpersist()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, a quarter of the rows")
    p.add_argument("--http-rows", type=int, default=40_000)
    p.add_argument("--pg-rows", type=int, default=1_000_000)
    p.add_argument("--customers", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 --quick)")
    p.add_argument("--capacity", type=int, default=256, help="HTTP lookups in flight")
    p.add_argument("--latency-ms", type=float, default=20.0)
    args = p.parse_args()
    scale = 4 if args.quick else 1
    http_rows, pg_rows = args.http_rows // scale, args.pg_rows // scale
    rounds = args.rounds or (1 if args.quick else 3)
    table = f"bench_sql_customers_{uuid.uuid4().hex[:8]}"
    execute(_pg.seed_sql(table, args.customers))
    proc, url = start_service(latency_ms=args.latency_ms, customers=args.customers)
    spark = session(master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    cases: dict[str, tuple[Callable[[], Any], dict[str, Any], int]] = {
        "HTTP, 20 ms": (
            lambda: HttpLookup(url + "/customers/{customer_id}"),
            {"timeout": 60, "capacity": args.capacity},
            http_rows,
        ),
        "Postgres, columnar": (
            lambda: PostgresLookup(
                DSN,
                f'SELECT id, name, tier, country FROM "{table}" WHERE id = ANY($1)',
                key="customer_id",
                on="id",
                columns=("name", "tier", "country"),
            ),
            {"timeout": 120},
            pg_rows,
        ),
    }
    rates: dict[str, dict[str, list[float]]] = {c: {} for c in cases}
    try:
        for label, (make, options, n) in cases.items():
            key = "http" if label.startswith("HTTP") else "pg"
            both(spark, key, make, options, max(1000, n // 10), args.customers)  # warm-up
            for r in range(rounds):  # alternating which runs first
                got = both(spark, key, make, options, n, args.customers, sql_first=r % 2 == 1)
                for way, rate in got.items():
                    rates[label].setdefault(way, []).append(rate)
    finally:
        spark.stop()
        stop_service(proc)
        execute(f'DROP TABLE IF EXISTS "{table}"')
    print(f"\nlocal[2], 2 partitions, {rounds} round(s), HTTP {http_rows:,} rows "
          f"({args.latency_ms:g} ms service, capacity {args.capacity}), Postgres "
          f"{pg_rows:,} rows ({args.customers:,} customers)\n")  # fmt: skip
    print("| lookup | `ordered_wait` rows/s | SQL function rows/s | SQL / `ordered_wait` |")
    print("| --- | ---: | ---: | ---: |")
    verdicts = []
    for label, got in rates.items():
        a = statistics.median(got["ordered_wait"])
        b = statistics.median(got["SQL function"])
        verdicts.append(b / a >= 0.9)
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {b / a:.2f} |")
    print(f"\ntarget SQL / ordered_wait >= 0.9 for each: {'PASS' if all(verdicts) else 'MISS'}")


if __name__ == "__main__":
    main()
