"""A lookup as a Spark SQL function (``register``) against ``ordered_wait``, same lookup.

    python -m bench.sql            # ~4 minutes: 5 rounds
    python -m bench.sql --quick    # ~1 minute: 2 rounds, smaller inputs

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
both back to back, which one first alternating (after one warm-up round of a
tenth of the size, not kept): on a machine that other jobs share, the two runs
of a round meet about the same load, so the ratio SQL / ``ordered_wait`` is
taken per round and the table gives its median, with each way's median rows/s.
It also gives the CPU each way spent per 1,000 rows, in this session's JVM and
in its Python workers (``/proc``, summed over the rounds; other processes of
the machine are not counted), which a shared machine's load does not change.
Target (printed PASS/MISS; a benchmark never fails the build): at least 0.9
for each lookup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import ordered_wait, register, session
from bench import _cpu
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


def session_pids(jvm: int) -> set[int]:
    """This session's JVM and every process under it (its Python daemon and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [jvm]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


class Run:
    """rows/s of one ``write.format("noop")``, and the CPU seconds it took in this
    session's JVM and Python workers."""

    def __init__(self, df: DataFrame, rows: int, jvm: int) -> None:
        own = session_pids(jvm)
        before = {p: v for p, v in _cpu.snapshot().items() if p in own}
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        self.rate = rows / (time.perf_counter() - started)
        own = session_pids(jvm)
        used = _cpu.usage(before, {p: v for p, v in _cpu.snapshot().items() if p in own})
        self.jvm = used.get("spark jvm", 0.0)
        self.python = used.get("spark python", 0.0)


def both(
    spark: SparkSession, label: str, make: Callable[[], Any], options: dict[str, Any],
    n: int, customers: int, sql_first: bool = False,
) -> dict[str, Run]:  # fmt: skip
    """Each way's run, the same lookup and options."""
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
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    order = list(runs) if not sql_first else list(reversed(runs))
    out = {way: Run(runs[way](), n, jvm) for way in order}
    df.unpersist()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 rounds, a quarter of the rows")
    p.add_argument("--http-rows", type=int, default=20_000)
    p.add_argument("--pg-rows", type=int, default=1_000_000)
    p.add_argument("--customers", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=None, help="default 5 (2 --quick)")
    p.add_argument("--capacity", type=int, default=256, help="HTTP lookups in flight")
    p.add_argument("--latency-ms", type=float, default=20.0)
    args = p.parse_args()
    scale = 4 if args.quick else 1
    http_rows, pg_rows = args.http_rows // scale, args.pg_rows // scale
    rounds = args.rounds or (2 if args.quick else 5)
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
    runs: dict[str, list[dict[str, Run]]] = {c: [] for c in cases}
    try:
        for label, (make, options, n) in cases.items():
            key = "http" if label.startswith("HTTP") else "pg"
            both(spark, key, make, options, max(1000, n // 10), args.customers)  # warm-up
            for r in range(rounds):  # alternating which runs first
                runs[label].append(
                    both(spark, key, make, options, n, args.customers, sql_first=r % 2 == 1)
                )
    finally:
        spark.stop()
        stop_service(proc)
        execute(f'DROP TABLE IF EXISTS "{table}"')
    print(f"\nlocal[2], 2 partitions, {rounds} round(s), HTTP {http_rows:,} rows "
          f"({args.latency_ms:g} ms service, capacity {args.capacity}), Postgres "
          f"{pg_rows:,} rows ({args.customers:,} customers)\n")  # fmt: skip
    print("| lookup | `ordered_wait` rows/s | SQL function rows/s | SQL / `ordered_wait` "
          "| CPU ms per 1,000 rows, `ordered_wait`: JVM + Python | SQL function: JVM + Python |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    verdicts = []
    for label, got in runs.items():
        thousands = cases[label][2] * len(got) / 1000
        rate = {w: statistics.median(r[w].rate for r in got) for w in ("ordered_wait",
                                                                       "SQL function")}
        ratio = statistics.median(r["SQL function"].rate / r["ordered_wait"].rate for r in got)
        cpu = {w: (sum(r[w].jvm for r in got) / thousands * 1000,
                   sum(r[w].python for r in got) / thousands * 1000) for w in rate}  # fmt: skip
        verdicts.append(ratio >= 0.9)
        a, b = cpu["ordered_wait"], cpu["SQL function"]
        print(f"| {label} | {rate['ordered_wait']:,.0f} | {rate['SQL function']:,.0f} "
              f"| {ratio:.2f} | {a[0]:.3g} + {a[1]:.3g} | {b[0]:.3g} + {b[1]:.3g} |")  # fmt: skip
    print(f"\ntarget SQL / ordered_wait >= 0.9 for each: {'PASS' if all(verdicts) else 'MISS'}")


if __name__ == "__main__":
    main()
