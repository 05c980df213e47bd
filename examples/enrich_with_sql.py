"""Enrich orders with customers from PostgreSQL in Spark SQL: a lookup registered as a function.

    python examples/enrich_with_sql.py            # throwaway Postgres, 100k orders
    python examples/enrich_with_sql.py --dsn postgresql://postgres:postgres@127.0.0.1:5432/asyncio_ops

``register(spark, "lookup_customer", PostgresLookup(...), ...)`` runs the
lookup's preflight (connects, prepares its query against the argument and the
output columns) and registers ``lookup_customer(customer_id)``; the query is
plain SQL::

    SELECT o.*, lookup_customer(o.customer_id) AS c FROM orders o

and each ``c`` is the customer's ``<name, tier, country>``, NULL for an order
whose customer does not exist (``--missing`` of them: ids beyond the table),
or, with ``--errors``, ``<result, error>`` where a failed lookup leaves its
``error`` and the others ``error IS NULL``. The lookups run columnar, as under
``ordered_wait``: chunks of orders answered by ``WHERE id = ANY($1)``, several
chunks in flight per partition.

The DSN is ``--dsn``, else ``ASYNCIO_OPS_PG_DSN``, else a throwaway server
started from the local PostgreSQL binaries and seeded with ``--customers``
customers (``--seed`` creates and fills ``--table`` on a given DSN). Prints a
sample, the counts and rows/s; ``--json`` adds one ``RESULT {...}`` line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncio_ops.connectors import is_retryable
from asyncio_ops.connectors._redact import redact_dsn
from asyncio_ops.connectors.postgres import PostgresLookup
from pyspark.sql import functions as F

from asyncio_ops import AsyncRetryStrategy
from asyncio_ops.spark import AsyncMetrics, register
from examples import _pg
from examples._common import add_batch_options, orders, report, spark_session, stop_session, timed
from examples.enrich_orders_postgres import check_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="PostgreSQL DSN (default: $ASYNCIO_OPS_PG_DSN, else throwaway)")
    add_batch_options(p, orders=100_000, capacity=8, capacity_help="chunks in flight per partition")
    p.add_argument("--table", default="customers", help="customers table")
    p.add_argument("--seed", action="store_true", help="create/fill --table on a given DSN")
    p.add_argument("--missing", type=int, default=100, help="orders of customers not in the table")
    p.add_argument("--errors", action="store_true", help='on_error="error_column": <result, error>')
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    try:
        dsn, throwaway = _pg.resolve_dsn(args.dsn)
    except _pg.NoPostgres as exc:
        raise SystemExit(str(exc)) from None
    if throwaway or args.seed:
        count = _pg.run(_pg.seed(dsn, args.table, args.customers))
        print(f"table {args.table}: {count} customers")
    else:
        check_table(dsn, args.table)

    spark = spark_session(args.master, "enrich_with_sql", args.partitions)
    partitions = args.partitions or spark.sparkContext.defaultParallelism
    lookup = PostgresLookup(
        dsn,
        f"SELECT id, name, tier, country FROM {_pg.quote_ident(args.table)} WHERE id = ANY($1)",
        key="customer_id",
        on="id",
        columns=("name", "tier", "country"),
    )
    metrics = AsyncMetrics(spark)
    register(
        spark, "lookup_customer", lookup,
        input_schema="customer_id long",
        output_schema="name string, tier string, country string",
        timeout=30.0,
        capacity=args.capacity,
        retry=AsyncRetryStrategy.exponential_backoff(
            3, 50, 2000, 2.0, exception_predicate=is_retryable
        ),
        on_error="error_column" if args.errors else "fail",
        metrics=metrics,
    )  # fmt: skip
    # the last --missing orders name customers beyond the table: their c is NULL
    base = orders(spark, args.orders, args.customers, partitions)
    shifted = F.when(
        F.col("order_id") >= args.orders - args.missing, F.col("customer_id") + args.customers
    ).otherwise(F.col("customer_id"))
    base.withColumn("customer_id", shifted).createOrReplaceTempView("orders")

    customer = "c.result" if args.errors else "c"
    enriched = spark.sql(
        "SELECT o.*, lookup_customer(o.customer_id) AS c FROM orders o"
    ).persist()  # the lookups run once; the queries below read the cache
    enriched.createOrReplaceTempView("enriched")
    with timed() as elapsed:
        rows = enriched.count()
    counts = spark.sql(f"""
        SELECT count_if({customer} IS NULL) AS missing,
               count_if({customer}.name <> concat('customer-', customer_id)) AS mismatches
               {", count_if(c.error IS NOT NULL) AS failed" if args.errors else ""}
        FROM enriched""").first()  # fmt: skip
    assert counts is not None
    sample = [r.asDict(recursive=True) for r in spark.sql(
        f"SELECT order_id, customer_id, {customer}.name, {customer}.tier FROM enriched "
        f"ORDER BY order_id LIMIT {args.sample}").collect()]  # fmt: skip
    seconds = elapsed[0]
    result: dict[str, object] = {
        "dsn": redact_dsn(dsn),
        "throwaway": throwaway,
        "partitions": partitions,
        "input_rows": args.orders,
        "rows": rows,
        "missing": counts.missing,
        "mismatches": counts.mismatches,
        "failed": counts.failed if args.errors else 0,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds) if seconds > 0 else None,
        "sample": sample,
        "metrics": metrics.summary(),
    }
    report(result, as_json=args.json)
    enriched.unpersist()
    stop_session(spark)
    return result


if __name__ == "__main__":
    main()
