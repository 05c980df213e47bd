"""``lookup_join``'s strategies against each other and against Spark's own JDBC join, one sitting.

    python -m bench.lookup_join            # the full run: about 6 minutes on 2 busy cores
    python -m bench.lookup_join --quick    # a tenth of the rows, a 1M-row large table

Run it as a module from the repository root, with a PostgreSQL at
``ASYNCIO_OPS_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
and, for the JDBC baseline, the driver jar ``/usr/share/java/postgresql.jar``
(``apt-get install libpostgresql-jdbc-java``; the row says so when it is
missing). ``local[2]``; every DataFrame is written to Spark's ``noop`` sink;
the orders are ``bench.connectors.orders_df`` (``customer_id = order * 7919 %
keys + 1``: every key equally often). Three cases:

1. HTTP: ``--rows`` (1,000,000) orders over ``--keys`` (10,000) customers,
   ``HttpLookup(url + "/customers/{customer_id}")`` against the example
   customer service in a process of its own answering after 20 ms, capacity
   100 (the default) per partition, 2 partitions: ``distinct``, ``auto`` and
   ``rows``, the last on ``--rows-slice`` (200,000) orders of the same keys and
   extrapolated to all, saying so (all of them take about 10 minutes on 2
   busy cores; ``--rows-slice 0`` runs them); the calls each made, from the service's ``/stats``.
   Target: ``distinct`` at least 20x faster than ``rows``; ``auto`` chooses
   ``distinct``.
2. Postgres, a ``--customers`` (100,000) row table, ``--rows`` orders over all
   its keys: ``auto`` (its estimates included in its time) against Spark's JDBC
   read of the table (2 partitions) plus a broadcast join, each after a warm-up,
   alternating, the median of ``--rounds`` (3); ``bulk``, ``distinct`` and
   ``rows`` once, for reference. Target: ``auto`` chooses ``bulk`` and reaches at
   least 0.8 of the JDBC join's rows/s.
3. Postgres, a ``--large`` (10,000,000) row table (one INSERT of
   ``generate_series``, dropped at the end), ``--rows`` orders over
   ``--large-keys`` (100,000) keys: ``auto``. Target: it does not read the
   table (its choice is not ``bulk``).

Targets are printed PASS/MISS: a benchmark never fails the build.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import urllib.request
import uuid
from contextlib import redirect_stdout
from statistics import median
from typing import Any

from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import lookup_join, session
from bench._service import start_service, stop_service
from bench.connectors import JDBC_JAR, orders_df, run_noop
from examples import _pg

DSN = os.environ.get("ASYNCIO_OPS_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "name string, tier string, country string"


def answered(url: str) -> int:
    """Lookups the customer service has served since it started."""
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
        return int(sum(json.load(response)["answered"]))


def joined(
    orders: DataFrame, lookup: Any, strategy: str, **options: Any
) -> tuple[float, str, str]:
    """Seconds to plan and write ``lookup_join(orders, lookup, strategy=...)``, the strategy
    it ran, and its explanation."""
    out = io.StringIO()
    t0 = time.perf_counter()
    with redirect_stdout(out):
        df = lookup_join(orders, lookup, timeout=600, output_schema=SCHEMA, strategy=strategy,
                         explain=True, **options)  # fmt: skip
    run_noop(df)
    seconds = time.perf_counter() - t0
    text = out.getvalue()
    chosen = text.split("strategy '", 1)[1].split("'", 1)[0]
    return seconds, chosen, text


def jdbc_join(spark: SparkSession, orders: DataFrame, table: str, customers: int) -> float | None:
    """Seconds of Spark's own best: a JDBC read of the whole table (2 partitions over the
    id range) broadcast and joined (None without the driver jar)."""
    if not JDBC_JAR.exists():
        return None
    from urllib.parse import urlsplit

    u = urlsplit(DSN)
    props = {"user": u.username or "postgres", "driver": "org.postgresql.Driver",
             "fetchsize": "10000", **({"password": u.password} if u.password else {})}  # fmt: skip
    t0 = time.perf_counter()
    table_df = spark.read.jdbc(
        f"jdbc:postgresql://{u.hostname}:{u.port or 5432}{u.path}", f'"{table}"', column="id",
        lowerBound=1, upperBound=customers + 1, numPartitions=2, properties=props,
    ).select("id", "name", "tier", "country")  # fmt: skip
    df = orders.join(F.broadcast(table_df), F.col("customer_id") == F.col("id"), "left")
    run_noop(df.drop("id"))
    return time.perf_counter() - t0


def pg_lookup(table: str) -> PostgresLookup:
    return PostgresLookup(DSN, f'SELECT id, name, tier, country FROM "{table}" WHERE id = ANY($1)',
                          key="customer_id", on="id", table=table)  # fmt: skip


def line(case: str, strategy: str, rows: int, seconds: float, calls: str, note: str = "") -> None:
    print(f"| {case} | {strategy} | {rows:,} | {seconds:.2f} | {rows / seconds:,.0f} | "
          f"{calls} | {note} |", flush=True)  # fmt: skip


def verdict(label: str, ok: bool) -> None:
    print(f"{label}: {'PASS' if ok else 'MISS'}", flush=True)


def http_case(spark: SparkSession, args: argparse.Namespace) -> None:
    proc, url = start_service(latency_ms=args.latency_ms, customers=max(args.keys, 100_000))
    try:
        orders = orders_df(spark, args.rows, args.keys).cache()
        orders.count()
        lookup = HttpLookup(url + "/customers/{customer_id}")
        joined(orders_df(spark, 20_000, 200), lookup, "distinct")  # warm-up: workers started
        case = f"HTTP {args.latency_ms:g} ms, {args.keys:,} keys"
        before = answered(url)
        distinct, _, _ = joined(orders, lookup, "distinct")
        line(case, "distinct", args.rows, distinct, f"{answered(url) - before:,}")
        before = answered(url)
        auto, chosen, text = joined(orders, lookup, "auto")
        line(case, f"auto: {chosen}", args.rows, auto, f"{answered(url) - before:,}",
             "its decision included")  # fmt: skip
        print(text)
        part = min(args.rows_slice or args.rows, args.rows)
        sliced = orders_df(spark, part, args.keys) if part < args.rows else orders
        before = answered(url)
        seconds, _, _ = joined(sliced, lookup, "rows")
        calls = answered(url) - before
        if part < args.rows:
            rows_seconds = seconds * args.rows / part
            line(case, "rows", args.rows, rows_seconds, f"{calls * args.rows // part:,} (est.)",
                 f"measured on {part:,} rows ({seconds:.1f} s), extrapolated")  # fmt: skip
        else:
            rows_seconds = seconds
            line(case, "rows", args.rows, seconds, f"{calls:,}")
        print(f"distinct / rows speed-up: {rows_seconds / distinct:.1f}x")
        verdict("distinct >= 20x rows", rows_seconds / distinct >= 20)
        verdict("auto chooses distinct", chosen == "distinct")
        orders.unpersist()
    finally:
        stop_service(proc)


def seeded(table: str, customers: int) -> None:
    t0 = time.perf_counter()
    _pg.run(_pg.drop(DSN, table))
    _pg.run(_pg.seed(DSN, table, customers))
    print(f"seeded {table}: {customers:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)


def pg_case(spark: SparkSession, args: argparse.Namespace, table: str) -> None:
    seeded(table, args.customers)
    orders = orders_df(spark, args.rows, args.customers)
    case = f"Postgres, {args.customers:,}-row table"
    warm = orders_df(spark, 20_000, args.customers)  # warm-up: workers, JIT, JDBC driver
    jdbc_join(spark, warm, table, args.customers)
    joined(warm, pg_lookup(table), "auto")
    jdbc: list[float] = []
    auto: list[float] = []
    for _ in range(args.rounds):  # alternating, the median of each
        seconds = jdbc_join(spark, orders, table, args.customers)
        if seconds is not None:
            jdbc.append(seconds)
        seconds, chosen, text = joined(orders, pg_lookup(table), "auto")
        auto.append(seconds)
    rounds = f"median of {args.rounds}"
    if not jdbc:
        print(f"| {case} | JDBC read + broadcast join | - | - | - | - | skipped: {JDBC_JAR} "
              "missing (apt-get install libpostgresql-jdbc-java) |")  # fmt: skip
    else:
        line(case, "JDBC read + broadcast join", args.rows, median(jdbc), "-",
             f"Spark alone, {rounds} ({', '.join(f'{s:.2f}' for s in jdbc)})")  # fmt: skip
    line(case, f"auto: {chosen}", args.rows, median(auto), "-",
         f"its decision included, {rounds} ({', '.join(f'{s:.2f}' for s in auto)})")  # fmt: skip
    print(text)
    for strategy in ("bulk", "distinct", "rows"):
        seconds, _, _ = joined(orders, pg_lookup(table), strategy)
        line(case, strategy, args.rows, seconds, "-", "once")
    verdict("auto chooses bulk", chosen == "bulk")
    if jdbc:
        print(f"auto / JDBC join (rows/s): {median(jdbc) / median(auto):.2f}")
        verdict("auto >= 0.8 of the JDBC join", median(jdbc) / median(auto) >= 0.8)


def large_case(spark: SparkSession, args: argparse.Namespace, table: str) -> None:
    seeded(table, args.large)
    orders = orders_df(spark, args.rows, args.large_keys)
    case = f"Postgres, {args.large:,}-row table, {args.large_keys:,} keys"
    auto, chosen, text = joined(orders, pg_lookup(table), "auto")
    line(case, f"auto: {chosen}", args.rows, auto, "-", "its decision included")
    print(text)
    verdict("auto does not read the large table", chosen != "bulk")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the rows, a 1M-row table")
    p.add_argument("--rows", type=int, default=None, help="input rows (1,000,000)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys of the HTTP case")
    p.add_argument("--rows-slice", type=int, default=200_000,
                   help="the HTTP rows strategy on this many rows, extrapolated (0: all)")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--customers", type=int, default=100_000, help="rows of the small table")
    p.add_argument("--large", type=int, default=None, help="rows of the large table (10M)")
    p.add_argument("--large-keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3, help="rounds of auto and the JDBC join")
    p.add_argument("--skip", action="append", default=[], choices=["http", "pg", "large"])
    args = p.parse_args(argv)
    args.rows = args.rows or (100_000 if args.quick else 1_000_000)
    args.large = args.large or (1_000_000 if args.quick else 10_000_000)
    conf = {"spark.sql.session.timeZone": "UTC", "spark.default.parallelism": "2",
            "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "4g"}
    if JDBC_JAR.exists():
        conf["spark.jars"] = str(JDBC_JAR)
    spark = session("local[2]", app_name="bench.lookup_join", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    suffix = uuid.uuid4().hex[:8]
    small, large = f"bench_lj_customers_{suffix}", f"bench_lj_large_{suffix}"
    print(f"# bench.lookup_join  python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"local[2], {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print("| case | strategy | rows | seconds | rows/s | calls | note |")
    print("|---|---|---:|---:|---:|---:|---|", flush=True)
    try:
        if "http" not in args.skip:
            http_case(spark, args)
        if "pg" not in args.skip:
            pg_case(spark, args, small)
        if "large" not in args.skip:
            large_case(spark, args, large)
    finally:
        for table in (small, large):
            _pg.run(_pg.drop(DSN, table))
        spark.stop()


if __name__ == "__main__":
    main()
