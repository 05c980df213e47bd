"""Enrich orders generated in Spark with customers from PostgreSQL, in input order.

    python examples/enrich_orders_postgres.py            # throwaway Postgres, 100k orders
    python examples/enrich_orders_postgres.py --dsn postgresql://postgres:postgres@127.0.0.1:5432/asyncio_ops

``PostgresLookup`` runs columnar (its default): each chunk of
``--batch-size`` x 4 (its pool) orders is answered by concurrent
``SELECT ... WHERE id = ANY($1)`` queries of up to ``--batch-size`` distinct
ids, up to ``--capacity`` chunks in flight per partition, and ``ordered_wait``
emits the rows in their input order.

The DSN is ``--dsn``, else ``ASYNCIO_OPS_PG_DSN``, else a throwaway server
started from the local PostgreSQL binaries and seeded with ``--customers``
customers. On a given DSN the ``--table`` must exist (``docker compose up -d``
creates it) unless ``--seed`` is passed, which creates and fills it.

Prints a sample, the row count, the operator's metrics and rows/s; ``--json``
adds one ``RESULT {...}`` line for programs. Orders whose customer does not
exist are dropped (reported as ``missing``).
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
from asyncio_ops.spark import AsyncMetrics, ordered_wait
from examples import _pg
from examples._common import add_batch_options, orders, report, spark_session, stop_session, timed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="PostgreSQL DSN (default: $ASYNCIO_OPS_PG_DSN, else throwaway)")
    add_batch_options(p, orders=100_000, capacity=8, capacity_help="chunks in flight per partition")
    p.add_argument("--table", default="customers", help="customers table")
    p.add_argument("--seed", action="store_true", help="create/fill --table on a given DSN")
    p.add_argument("--batch-size", type=int, default=500, help="ids per query (1 = per row)")
    p.add_argument("--output", help="also write the enriched orders as Parquet here")
    return p.parse_args(argv)


def check_table(dsn: str, table: str) -> None:
    async def exists() -> bool:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        connection = await asyncpg.connect(dsn, timeout=10)
        try:
            found = await connection.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
            return bool(found)
        finally:
            await connection.close(timeout=5)

    if not _pg.run(exists()):
        raise SystemExit(
            f"table {table!r} does not exist at {redact_dsn(dsn)}: start the project's Postgres "
            "(docker compose up -d), or pass --seed to create and fill it"
        )


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

    spark = spark_session(args.master, "enrich_orders_postgres", args.partitions)
    partitions = args.partitions or spark.sparkContext.defaultParallelism
    lookup = PostgresLookup(
        dsn,
        f"SELECT id, name, tier, country FROM {_pg.quote_ident(args.table)} WHERE id = ANY($1)",
        key="customer_id",
        on="id",
        columns=("name", "tier", "country"),
        batch_size=args.batch_size,
        pool_size=4,
    )
    metrics = AsyncMetrics(spark)
    enriched = ordered_wait(
        orders(spark, args.orders, args.customers, partitions),
        lookup,
        timeout=30.0,
        capacity=args.capacity,
        output_schema="name string, tier string, country string",
        retry=AsyncRetryStrategy.exponential_backoff(
            3, 50, 2000, 2.0, exception_predicate=is_retryable
        ),
        metrics=metrics,
    ).persist()

    with timed() as elapsed:
        rows = enriched.count()  # runs the lookups once; the rest reads the cache
    mismatches = enriched.where(
        F.col("name") != F.concat(F.lit("customer-"), F.col("customer_id").cast("string"))
    ).count()
    sample = [r.asDict() for r in enriched.orderBy("order_id").limit(args.sample).collect()]
    if args.output:
        enriched.write.mode("overwrite").parquet(args.output)
        print(f"wrote {args.output}")
    seconds = elapsed[0]
    result: dict[str, object] = {
        "dsn": redact_dsn(dsn),
        "throwaway": throwaway,
        "partitions": partitions,
        "batch_size": args.batch_size,
        "input_rows": args.orders,
        "rows": rows,
        "missing": args.orders - rows,
        "mismatches": mismatches,
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
