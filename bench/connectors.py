"""Connector benchmark: lookups in Spark against their ceilings outside Spark, and a JDBC join.

    python -m bench.connectors --quick          # ~2 min: 100k customers, 200k orders
    python -m bench.connectors                  # 100k customers, 1M orders
    python -m bench.connectors --large          # + 10M customers, 100k distinct keys

Rows of the table (every Spark figure is a ``write.format("noop")`` action on
``local[2]``, after a warm-up job, so every output column is materialised):

- ``pg per-row``: ``ordered_wait`` + ``PostgresLookup(batch_size=1)``, one query per row;
- ``pg batched``: the same with ``batch_size`` ids per ``WHERE id = ANY($1)`` query;
- ``pg chunked``: the same lookup with ``chunk_size=--chunk-size`` (default
  10,000: Spark's Arrow batch, ``spark.sql.execution.arrow.maxRecordsPerBatch``,
  so one chunk per batch; the columnar path, ``async_invoke_arrow``), each chunk
  answered by concurrent ``ANY($1)`` queries of ``batch_size`` distinct keys,
  ``--chunk-capacity`` chunks in flight per partition;
- ``pg asyncpg ceiling``: the same batched queries (same key sequence, same
  chunks, each key's row fanned back out to every order) from plain asyncpg in
  two processes outside Spark, the ceiling for two workers (one query in flight
  per process: 2, 4 or 8 measured no faster on 2 CPUs); once with the pool's
  defaults (asyncpg sends a reset query when a connection is released), once
  ``no reset`` (a ``reset=`` that sends nothing, as PostgresLookup's pools do),
  and once ``columnar``: no reset, and each query's result as one row (an
  array per column, text columns as bytes and lengths) made into Arrow columns,
  as the columnar path of PostgresLookup reads it;
- ``pg batched, 1 process, no Spark``: the same ``PostgresLookup`` and operator
  (``process_elements``, same capacity) in one plain uvloop process, rows from a
  generator: what the connector path costs without Spark and Arrow;
- ``pg JDBC + broadcast join``: ``spark.read.jdbc`` of the whole table (2
  partitions on ``id``) broadcast-joined to the orders (Debian's
  ``libpostgresql-jdbc-java`` jar; skipped, saying so, when it is missing);
- ``http per-row``: ``unordered_wait`` + ``HttpLookup`` against the customer
  service (a separate process, ``--http-latency-ms`` per request), and
  ``http aiohttp ceiling``: two aiohttp client processes with the same number of
  requests in flight against the same service; ``--http-rounds`` (default 3)
  interleaved rounds after ``--warmup-rounds`` rounds of a tenth of the size
  (the workers import aiohttp and open their sessions), the median kept, and
  the ratio also given round by round.

The chunked case and the ceilings run ``--rounds`` times, interleaved (they
last seconds, and a shared machine moves them by +-20 %), after
``--warmup-rounds`` (default 1) rounds that are not kept: Spark's JVM compiles
the chunked case's Arrow paths (JIT) during its first million rows, which used
1.8 CPU-s of JVM time against 0.7 once compiled. The table shows each
one's median run and notes every round's rate, and the chunked case's ratio to
a ceiling is also given round by round (each pair ran back to back).

A second table gives the CPU seconds each case used, by role (Postgres, Spark's
JVM, Spark's Python workers, the HTTP service, the ceiling's client processes;
from ``/proc``, so Linux): on a machine whose cores are all busy, throughput follows CPU per row,
and the ratio of the ceiling's CPU per row to the chunked case's is what their
rate ratio tends to.

Spark runs with ``spark.sql.execution.arrow.maxBytesPerBatch`` at INT_MAX
(``--arrow-max-bytes``; 0 keeps Spark's 64 MiB): Spark then skips a size check
it otherwise makes after every row it writes to the Python workers (see
docs/spark.md, "Arrow batches in bytes").

Targets: batched >= 10x per-row, batched >= 0.8 of the asyncpg
ceiling, HTTP >= 0.8 of its ceiling. Postgres is ``--dsn`` /
``ASYNCIO_OPS_PG_DSN`` or a throwaway server (the default: the bench then owns
the whole server).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from bench import _cpu as cpu
from bench._service import start_service, stop_service

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
STEP = 7919  # customer_id = (order * STEP) % customers + 1, as in examples/_common.orders


@dataclass
class Row:
    name: str
    rows: int
    seconds: float | None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return self.rows / self.seconds if self.seconds else None


def key_of(order: int, customers: int) -> int:
    return (order * STEP) % customers + 1


# -- ceilings outside Spark (run in child processes) ------------------------------------------
async def _no_reset(connection: Any) -> None:
    """A pool ``reset=`` that sends nothing (as PostgresLookup's pools)."""


def _pg_ceiling_worker(
    dsn: str, table: str, start: int, stop: int, customers: int, batch_size: int,
    concurrency: int, pool_size: int, reset: bool, columnar: bool, barrier: Any, out: Any,
) -> None:  # fmt: skip
    import asyncpg  # type: ignore[import-untyped,unused-ignore]
    import pyarrow as pa
    import uvloop
    from asyncio_ops.connectors.postgres._columnar import Columnar, decode

    async def main() -> None:
        extra: dict[str, Any] = {} if reset else {"reset": _no_reset}
        pool = await asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size, **extra)
        query = f'SELECT id, name, tier, country FROM "{table}" WHERE id = ANY($1)'
        form = Columnar.of(
            query, ("id", "name", "tier", "country"), frozenset({"name", "tier", "country"})
        )
        if columnar:
            query = form.sql
        keys = [key_of(i, customers) for i in range(start, stop)]
        chunks = [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
        sem = asyncio.Semaphore(concurrency)
        emitted = 0

        async def one(chunk: list[int]) -> None:
            nonlocal emitted
            async with sem:
                records = await pool.fetch(query, list(dict.fromkeys(chunk)))
            if columnar:  # one row: each column to Arrow, keys to positions
                ids, *rest = decode(form, [records[0]])
                _columns = [pa.array(ids), *rest]  # what a client uses
                by_id = dict(zip(ids, range(len(ids)), strict=True))
            else:  # records: a dict per record, as a plain client uses them
                by_id = {r["id"]: dict(r) for r in records}
            emitted += sum(1 for k in chunk if by_id.get(k) is not None)

        warm = await pool.fetch(query, [1])  # warm the connections and the statement cache
        # The first conversions import more of pyarrow and numpy: not in the timing.
        pa.array(["x"])
        if columnar:
            decode(form, [warm[0]])
        barrier.wait()
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(c) for c in chunks))
        out.put((emitted, time.perf_counter() - t0, time.process_time() - c0))
        await pool.close()

    uvloop.run(main())


def _pg_inprocess_worker(
    dsn: str, table: str, n: int, customers: int, batch_size: int, capacity: int,
    pool_size: int, out: Any,
) -> None:  # fmt: skip
    """The Spark case's lookup and operator in one plain process: no Spark, no Arrow."""
    import uvloop
    from asyncio_ops.connectors.postgres import PostgresLookup

    from asyncio_ops import AsyncWaitOperator

    async def main() -> None:
        lookup = PostgresLookup(
            dsn, f'SELECT id, name, tier, country FROM "{table}" WHERE id = ANY($1)',
            key="customer_id", on="id", columns=("name", "tier", "country"),
            batch_size=batch_size, pool_size=pool_size, min_pool_size=pool_size,
        )  # fmt: skip
        emitted = 0

        def count(_element: Any) -> None:
            nonlocal emitted
            emitted += 1

        async def run(count_rows: int) -> float:
            op = AsyncWaitOperator(
                lookup, output=count, timeout=120.0, capacity=capacity, manage_function=False
            )
            await op.open()
            try:
                t0 = time.perf_counter()
                await op.process_elements(
                    {"order_id": i, "customer_id": key_of(i, customers)} for i in range(count_rows)
                )
                await op.end_input()
                return time.perf_counter() - t0
            finally:
                await op.close()

        async with lookup:
            await run(2000)  # warm the pool and the statement cache
            emitted = 0
            seconds = await run(n)
        out.put((emitted, seconds))

    uvloop.run(main())


def one_process(target: Any, args: tuple[Any, ...]) -> tuple[int, float]:
    """Run ``target(*args, out)`` in a spawned process; (rows, seconds)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    result: tuple[int, float] = out.get(timeout=3600)
    proc.join(timeout=60)
    return result


def _http_ceiling_worker(
    base: str, start: int, stop: int, customers: int, concurrency: int, barrier: Any, out: Any
) -> None:
    import aiohttp
    import uvloop

    async def main() -> None:
        keys = iter([key_of(i, customers) for i in range(start, stop)])
        ok = 0
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                nonlocal ok
                for k in keys:
                    async with session.get(f"{base}/customers/{k}") as r:
                        await r.json()
                        ok += r.status == 200

            async with session.get(f"{base}/customers/1") as r:
                await r.read()
            barrier.wait()
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            out.put((ok, time.perf_counter() - t0, time.process_time() - c0))

    uvloop.run(main())


def two_processes(target: Any, args_for: Any, n: int) -> tuple[int, float, dict[str, float]]:
    """Run ``target`` in two spawned processes over halves of ``0..n``: (rows, slowest
    seconds, CPU seconds by role meanwhile, with both clients' own timed part as
    ``CLIENTS``)."""
    before = cpu.snapshot()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    half = n // 2
    procs = [
        ctx.Process(target=target, args=(*args_for(a, b), barrier, out))
        for a, b in ((0, half), (half, n))
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    used = {**cpu.usage(before, cpu.snapshot()), CLIENTS: sum(r[2] for r in results)}
    return sum(r[0] for r in results), max(r[1] for r in results), used


# -- Spark side --------------------------------------------------------------------------------
def run_noop(df: Any) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def run_noop_cpu(df: Any) -> tuple[float, dict[str, float]]:
    """:func:`run_noop`, and the CPU seconds by role it took."""
    before = cpu.snapshot()
    seconds = run_noop(df)
    return seconds, cpu.usage(before, cpu.snapshot())


def orders_df(spark: Any, n: int, customers: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=2).select(
        F.col("id").alias("order_id"),
        ((F.col("id") * STEP) % customers + 1).alias("customer_id"),
    )


def pg_lookup_row(
    spark: Any, name: str, dsn: str, table: str, n: int, customers: int, batch_size: int,
    capacity: int, pool_size: int, chunk_size: int | None = None,
) -> Row:  # fmt: skip
    from asyncio_ops.connectors.postgres import PostgresLookup

    from asyncio_ops.spark import AsyncMetrics, ordered_wait

    lookup = PostgresLookup(
        dsn,
        f'SELECT id, name, tier, country FROM "{table}" WHERE id = ANY($1)',
        key="customer_id",
        on="id",
        columns=("name", "tier", "country"),
        batch_size=batch_size,
        pool_size=pool_size,
        min_pool_size=pool_size,
    )
    metrics = AsyncMetrics(spark)
    df = ordered_wait(
        orders_df(spark, n, customers), lookup, timeout=120.0, capacity=capacity,
        output_schema="name string, tier string, country string", metrics=metrics,
        chunk_size=chunk_size,
    )  # fmt: skip
    seconds, used = run_noop_cpu(df)
    emitted = metrics.summary()["emitted"]
    note = f"batch_size={batch_size} capacity={capacity}"
    if chunk_size is not None:
        note = (f"chunk_size={chunk_size} (async_invoke_arrow) capacity={capacity} chunks "
                f"batch_size={batch_size}")  # fmt: skip
    return Row(name, emitted, seconds, note, {"cpu": used})


def pg_defaults_row(spark: Any, name: str, dsn: str, table: str, n: int, customers: int) -> Row:
    """PostgresLookup with nothing but the query, key and output schema (the README's first
    example): its defaults choose the path (columnar chunks) and the sizes."""
    from asyncio_ops.connectors.postgres import PostgresLookup

    from asyncio_ops.spark import AsyncMetrics, ordered_wait

    lookup = PostgresLookup(
        dsn,
        f'SELECT id AS customer_id, name, tier, country FROM "{table}" WHERE id = ANY($1)',
        key="customer_id",
    )
    metrics = AsyncMetrics(spark)
    df = ordered_wait(
        orders_df(spark, n, customers), lookup, timeout=120.0, metrics=metrics,
        output_schema="name string, tier string, country string",
    )  # fmt: skip
    seconds, used = run_noop_cpu(df)
    emitted = metrics.summary()["emitted"]
    note = (f"no options (chunks of {lookup.preferred_chunk_rows():,} rows, capacity "
            f"{lookup.preferred_capacity()})")  # fmt: skip
    return Row(name, emitted, seconds, note, {"cpu": used})


def pg_handwritten_row(
    spark: Any, name: str, dsn: str, table: str, n: int, customers: int, batch_size: int,
    pool_size: int,
) -> Row:  # fmt: skip
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from bench._pg_handwritten import handwritten_df

    schema = StructType(
        [StructField("order_id", LongType()), StructField("customer_id", LongType())]
        + [StructField(c, StringType()) for c in ("name", "tier", "country")]
    )
    df = handwritten_df(orders_df(spark, n, customers), dsn, table, batch_size, pool_size, schema)
    seconds, used = run_noop_cpu(df)
    emitted = n  # every order's customer exists (1..customers): one output row per order
    note = f"mapInArrow + asyncpg ANY($1) of {batch_size} keys, pool {pool_size}, per batch"
    return Row(name, emitted, seconds, note, {"cpu": used})


def jdbc_join_row(spark: Any, name: str, dsn: str, table: str, n: int, customers: int) -> Row:
    from pyspark.sql import functions as F

    if not JDBC_JAR.exists():
        return Row(name, 0, None, f"skipped: {JDBC_JAR} missing (apt-get install "
                   "libpostgresql-jdbc-java)")  # fmt: skip
    from urllib.parse import urlsplit

    u = urlsplit(dsn)
    url = f"jdbc:postgresql://{u.hostname}:{u.port or 5432}{u.path}"
    props = {"user": u.username or "postgres", "driver": "org.postgresql.Driver",
             "fetchsize": "10000"}  # fmt: skip
    if u.password:
        props["password"] = u.password
    table_df = spark.read.jdbc(
        url, f'"{table}"', column="id", lowerBound=1, upperBound=customers + 1,
        numPartitions=2, properties=props,
    ).select("id", "name", "tier", "country")  # fmt: skip
    joined = orders_df(spark, n, customers).join(
        F.broadcast(table_df), F.col("customer_id") == F.col("id")
    )
    # Every customer id in 1..customers exists, so the inner join keeps all n orders.
    seconds = run_noop(joined.drop("id"))
    return Row(name, n, seconds, f"reads all {customers:,} customers over JDBC")


def http_suite(
    spark: Any, n: int, customers: int, latency_ms: float, capacity: int, rounds: int,
    warmup: int,
) -> tuple[list[Row], dict[str, list[Row]]]:  # fmt: skip
    """The HTTP case and its ceiling in ``rounds`` interleaved rounds after ``warmup``
    smaller ones (not kept): their median rows, and every kept round by case."""
    from asyncio_ops.connectors.http import HttpBatch, HttpLookup

    from asyncio_ops.spark import AsyncMetrics, unordered_wait

    server, base = start_service(latency_ms=latency_ms, customers=customers)

    def in_spark(count: int) -> Row:
        metrics = AsyncMetrics(spark)
        df = unordered_wait(
            orders_df(spark, count, customers),
            HttpLookup(f"{base}/customers/{{customer_id}}", max_connections=capacity),
            timeout=60.0, capacity=capacity,
            output_schema="id bigint, name string, tier string, country string", metrics=metrics,
        )  # fmt: skip
        seconds, used = run_noop_cpu(df)
        note = f"capacity={capacity} latency={latency_ms}ms"
        return Row("http per-row (spark)", metrics.summary()["emitted"], seconds, note,
                   {"cpu": used})  # fmt: skip

    def batch_endpoint(count: int, chunk_size: str | None) -> Row:
        """The batch endpoint (``GET /customers?ids=``, 100 ids per request), with the
        defaults (columnar: a chunk of 100 rows per request) or row by row (the keys of
        concurrent rows gathered into requests by the lookup's batcher)."""
        metrics = AsyncMetrics(spark)
        lookup = HttpLookup(
            f"{base}/customers", result_path="items",
            batch=HttpBatch(key="customer_id", result_key="id", param="ids"),
        )  # fmt: skip
        df = unordered_wait(
            orders_df(spark, count, customers), lookup, timeout=60.0, chunk_size=chunk_size,
            output_schema="id bigint, name string, tier string, country string", metrics=metrics,
        )  # fmt: skip
        seconds, used = run_noop_cpu(df)
        name = "http batch, defaults (spark)" if chunk_size else "http batch, per-row (spark)"
        note = "chunks of 100 rows, capacity 100" if chunk_size else "chunk_size=None, capacity 100"
        return Row(name, metrics.summary()["emitted"], seconds, note, {"cpu": used})

    def ceiling(count: int) -> Row:
        rows, secs, used = two_processes(
            _http_ceiling_worker, lambda a, b: (base, a, b, customers, capacity), count
        )
        return Row("http aiohttp ceiling (2 procs)", rows, secs, f"{capacity} in flight each",
                   {"cpu": used})  # fmt: skip

    try:
        runs: dict[str, list[Row]] = {}
        # Warm-up rounds, a tenth of the size: the Python workers import aiohttp and
        # open their sessions, the service and the JVM warm up.
        small = max(2000, n // 10)
        for _ in range(max(0, warmup)):
            in_spark(small)
            ceiling(small)
        for _ in range(max(1, rounds)):
            for row in (in_spark(n), ceiling(n), batch_endpoint(n, "auto"),
                        batch_endpoint(n, None)):  # fmt: skip
                runs.setdefault(row.name, []).append(row)
        return [median_row(results) for results in runs.values()], runs
    finally:
        stop_service(server)


# -- orchestration -----------------------------------------------------------------------------
def fmt_rate(r: float | None) -> str:
    return "-" if r is None else f"{r:,.0f}"


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n## {title}\n")
    print(f"| {'case':<34} | {'rows':>9} | {'seconds':>8} | {'rows/s':>9} | note")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 10}|{'-' * 11}|------")
    for r in rows:
        secs = "-" if r.seconds is None else f"{r.seconds:.2f}"
        print(f"| {r.name:<34} | {r.rows:>9,} | {secs:>8} | {fmt_rate(r.rate):>9} | {r.note}")


def ratio_line(label: str, a: Row | None, b: Row | None, target: float | None) -> None:
    if a is None or b is None or a.rate is None or b.rate is None:
        print(f"- {label}: n/a")
        return
    ratio = a.rate / b.rate
    verdict = "" if target is None else (" PASS" if ratio >= target else " MISS")
    goal = "" if target is None else f" (target >= {target})"
    print(f"- {label}: {ratio:.2f}{goal}{verdict}")


CLIENTS = "ceiling clients"  # the ceiling's processes, as they measure themselves
CPU_COLUMNS = (*cpu.ROLES, CLIENTS)


def print_cpu(rows: list[Row]) -> None:
    """CPU seconds by role of the rows that measured them (Linux)."""
    measured = [r for r in rows if r.extra.get("cpu")]
    if not measured:
        return
    columns = [c for c in CPU_COLUMNS if any(c in r.extra["cpu"] for r in measured)]
    print(f"\nCPU seconds during each case's timed part (median run; {os.cpu_count()} CPUs):\n")
    print(f"| {'case':<34} | " + " | ".join(f"{c:>15}" for c in columns)
          + f" | {'total':>6} | {'us/row':>6}")  # fmt: skip
    print(f"|{'-' * 36}|" + "|".join("-" * 17 for _ in columns) + f"|{'-' * 8}|{'-' * 8}")
    for r in measured:
        used = r.extra["cpu"]
        total = sum(used.values())
        cells = " | ".join(f"{used[c]:>15.2f}" if c in used else f"{'-':>15}" for c in columns)
        per_row = f"{1e6 * total / r.rows:.2f}" if r.rows else "-"
        print(f"| {r.name:<34} | {cells} | {total:>6.2f} | {per_row:>6}")


def cpu_per_row(row: Row | None) -> float | None:
    if row is None or not row.rows or not row.extra.get("cpu"):
        return None
    return float(sum(row.extra["cpu"].values())) / row.rows


def cpu_line(label: str, a: Row | None, b: Row | None) -> None:
    """Where every core is busy, throughput follows CPU per row: this ratio is what
    the rate ratio of ``b`` to ``a`` tends to."""
    x, y = cpu_per_row(a), cpu_per_row(b)
    if x is None or y is None:
        print(f"- {label}: n/a (no /proc)")
        return
    print(f"- {label}: {x / y:.2f} (where every core is busy, what chunked / ceiling tends to)")


def paired_line(label: str, a: list[Row] | None, b: list[Row] | None) -> None:
    """Each round's ratio of ``a`` to ``b`` (run back to back) and their median."""
    if not a or not b:
        return
    ratios = sorted(x.rate / y.rate for x, y in zip(a, b, strict=False) if x.rate and y.rate)
    if ratios:
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"- {label}: median {median(ratios):.2f} of {len(ratios)} rounds ({listed})")


def median_row(results: list[Row]) -> Row:
    """The median run of ``results`` (by seconds), noting every round's rate."""
    ordered = sorted(results, key=lambda r: r.seconds or 0.0)
    row = ordered[len(ordered) // 2]
    if len(results) > 1:
        rates = ", ".join(fmt_rate(r.rate) for r in results)
        row = Row(row.name, row.rows, row.seconds, f"{row.note}; median of {rates}", row.extra)
    return row


def pg_suite(
    spark: Any, dsn: str, table: str, customers: int, orders: int, per_row_orders: int,
    args: argparse.Namespace, title: str,
) -> list[Row]:  # fmt: skip
    rows: list[Row] = []
    if per_row_orders:
        rows.append(pg_lookup_row(spark, "pg per-row (spark)", dsn, table, per_row_orders,
                                  customers, 1, args.capacity, args.pool_size))  # fmt: skip
    batched = pg_lookup_row(spark, "pg batched (spark)", dsn, table, orders, customers,
                            args.batch_size, args.capacity, args.pool_size)  # fmt: skip
    rows.append(batched)
    ceilings = (
        ("pg asyncpg ceiling (2 procs)", True, False, ""),
        ("pg asyncpg ceiling, no reset", False, False,
         ", pool reset= that sends nothing (as PostgresLookup)"),
        ("pg asyncpg ceiling, columnar", False, True,
         ", no reset, result as one row, text as bytes (as PostgresLookup's columnar path)"),
    )  # fmt: skip
    # The chunked case and the ceilings are short (seconds) and noisy on a shared
    # machine: run them in --rounds interleaved rounds and keep each one's median,
    # after --warmup-rounds rounds that are not kept (the JVM compiles the Arrow
    # paths of the chunked case while it runs them).
    runs: dict[str, list[Row]] = {}
    warmup = max(0, args.warmup_rounds)
    for round_ in range(warmup + max(1, args.rounds)):
        kept = runs if round_ >= warmup else {}
        defaults = pg_defaults_row(spark, "pg defaults (spark)", dsn, table, orders, customers)
        kept.setdefault(defaults.name, []).append(defaults)
        handwritten = pg_handwritten_row(
            spark, "pg hand-written mapInArrow", dsn, table, orders, customers, args.batch_size,
            args.pool_size,
        )  # fmt: skip
        kept.setdefault(handwritten.name, []).append(handwritten)
        chunked = pg_lookup_row(
            spark, "pg chunked (spark)", dsn, table, orders, customers, args.batch_size,
            args.chunk_capacity, args.pool_size, chunk_size=args.chunk_size,
        )  # fmt: skip
        kept.setdefault(chunked.name, []).append(chunked)
        for name, reset, columnar, more in ceilings:
            emitted, secs, used = two_processes(
                _pg_ceiling_worker,
                lambda a, b, reset=reset, columnar=columnar: (
                    dsn, table, a, b, customers, args.batch_size,
                    max(1, args.capacity // args.batch_size), args.pool_size, reset, columnar),
                orders,
            )  # fmt: skip
            note = f"same ANY($1) chunks of {args.batch_size}{more}"
            kept.setdefault(name, []).append(Row(name, emitted, secs, note, {"cpu": used}))
    for results in runs.values():
        rows.append(median_row(results))
    emitted, secs = one_process(
        _pg_inprocess_worker,
        (dsn, table, orders, customers, args.batch_size, args.capacity, args.pool_size),
    )
    rows.append(Row("pg batched, 1 process, no Spark", emitted, secs,
                    "the same lookup and operator, rows from a generator"))  # fmt: skip
    if not args.no_jdbc:
        rows.append(jdbc_join_row(spark, "pg JDBC + broadcast join", dsn, table, orders,
                                  customers))  # fmt: skip
    print_table(title, rows)
    print_cpu(rows)
    by = {r.name: r for r in rows}
    print()
    paired_line("defaults / asyncpg ceiling, round by round", runs.get("pg defaults (spark)"),
                runs.get("pg asyncpg ceiling (2 procs)"))  # fmt: skip
    paired_line("defaults / hand-written mapInArrow, round by round",
                runs.get("pg defaults (spark)"),
                runs.get("pg hand-written mapInArrow"))  # fmt: skip
    paired_line("chunked / asyncpg ceiling, round by round", runs.get("pg chunked (spark)"),
                runs.get("pg asyncpg ceiling (2 procs)"))  # fmt: skip
    paired_line("chunked / columnar asyncpg ceiling, round by round",
                runs.get("pg chunked (spark)"),
                runs.get("pg asyncpg ceiling, columnar"))  # fmt: skip
    cpu_line("CPU seconds per row, columnar ceiling / chunked",
             by.get("pg asyncpg ceiling, columnar"), by.get("pg chunked (spark)"))  # fmt: skip
    ratio_line("defaults / asyncpg ceiling", by.get("pg defaults (spark)"),
               by.get("pg asyncpg ceiling (2 procs)"), 0.85)  # fmt: skip
    ratio_line("defaults / hand-written mapInArrow", by.get("pg defaults (spark)"),
               by.get("pg hand-written mapInArrow"), 1.0)  # fmt: skip
    ratio_line("batched / per-row", by.get("pg batched (spark)"), by.get("pg per-row (spark)"), 10)
    ratio_line("batched / asyncpg ceiling", by.get("pg batched (spark)"),
               by.get("pg asyncpg ceiling (2 procs)"), 0.8)  # fmt: skip
    ratio_line("batched / JDBC join (>1: lookups win)", by.get("pg batched (spark)"),
               by.get("pg JDBC + broadcast join"), None)  # fmt: skip
    ratio_line("chunked / asyncpg ceiling", by.get("pg chunked (spark)"),
               by.get("pg asyncpg ceiling (2 procs)"), 0.8)  # fmt: skip
    ratio_line("chunked / asyncpg ceiling without the pool's reset", by.get("pg chunked (spark)"),
               by.get("pg asyncpg ceiling, no reset"), 0.8)  # fmt: skip
    ratio_line("chunked / columnar asyncpg ceiling", by.get("pg chunked (spark)"),
               by.get("pg asyncpg ceiling, columnar"), None)  # fmt: skip
    ratio_line("chunked / JDBC join (>1: lookups win)", by.get("pg chunked (spark)"),
               by.get("pg JDBC + broadcast join"), None)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (about 2 minutes)")
    p.add_argument("--large", action="store_true", help="also the 10M-customer case (slow)")
    p.add_argument("--dsn", help="PostgreSQL (default: $ASYNCIO_OPS_PG_DSN, else throwaway)")
    p.add_argument("--customers", type=int, default=100_000)
    p.add_argument("--orders", type=int, default=None, help="default 1M (200k with --quick)")
    p.add_argument("--per-row-orders", type=int, default=None,
                   help="orders for the per-row case (default orders/10)")  # fmt: skip
    p.add_argument("--large-customers", type=int, default=10_000_000)
    p.add_argument("--large-keys", type=int, default=100_000, help="distinct keys looked up")
    p.add_argument("--capacity", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--pool-size", type=int, default=8)
    p.add_argument(
        "--chunk-size",
        type=int,
        default=10_000,
        help="rows per chunk in the chunked case (queries stay batch_size keys)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds of the chunked case and the ceilings (median)",
    )
    p.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="rounds of the chunked case and the ceilings run first and not kept",
    )
    p.add_argument(
        "--arrow-max-bytes",
        type=int,
        default=2**31 - 1,
        help="spark.sql.execution.arrow.maxBytesPerBatch (default INT_MAX: no per-row size "
        "check; 0: Spark's default, 64 MiB)",
    )
    p.add_argument("--chunk-capacity", type=int, default=2,
                   help="chunks in flight per partition in the chunked case")  # fmt: skip
    p.add_argument(
        "--http-orders", type=int, default=None,
        help="default 200k (10k --quick): long enough that Spark's job start-up is amortised",
    )  # fmt: skip
    p.add_argument("--http-rounds", type=int, default=3,
                   help="interleaved rounds of the HTTP case and its ceiling (median)")  # fmt: skip
    p.add_argument("--http-latency-ms", type=float, default=20.0)
    p.add_argument("--http-capacity", type=int, default=200)
    p.add_argument("--no-jdbc", action="store_true")
    p.add_argument("--no-http", action="store_true")
    args = p.parse_args(argv)
    orders = args.orders or (200_000 if args.quick else 1_000_000)
    per_row = args.per_row_orders if args.per_row_orders is not None else orders // 10
    http_orders = args.http_orders or (10_000 if args.quick else 200_000)

    from asyncio_ops.spark import session
    from examples import _pg

    dsn, throwaway = _pg.resolve_dsn(args.dsn)
    table = "bench_customers"
    t0 = time.perf_counter()
    _pg.run(_pg.drop(dsn, table))
    _pg.run(_pg.seed(dsn, table, args.customers))
    print(f"seeded {args.customers:,} customers in {time.perf_counter() - t0:.1f} s")

    conf_jars = str(JDBC_JAR) if JDBC_JAR.exists() and not args.no_jdbc else None
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "4g",
        "spark.sql.autoBroadcastJoinThreshold": "-1",  # only the explicit broadcast
    }
    if args.arrow_max_bytes:  # see docs/spark.md, "Arrow batches in bytes"
        conf["spark.sql.execution.arrow.maxBytesPerBatch"] = str(args.arrow_max_bytes)
    if conf_jars:
        conf["spark.jars"] = conf_jars
    spark = session("local[2]", app_name="bench.connectors", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    if conf_jars is None and not args.no_jdbc:
        print(f"JDBC: {JDBC_JAR} missing; apt-get install -y libpostgresql-jdbc-java "
              "(the JDBC row is skipped)")  # fmt: skip
    # Warm-up: start the Python workers once so no figure pays for it.
    pg_lookup_row(spark, "warm-up", dsn, table, 2000, args.customers, args.batch_size,
                  args.capacity, args.pool_size)  # fmt: skip

    print(f"\n# bench.connectors  python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"local[2], postgres {'throwaway' if throwaway else 'given'}, "
          f"arrow maxBytesPerBatch {args.arrow_max_bytes or 'default'}")  # fmt: skip
    pg_suite(spark, dsn, table, args.customers, orders, per_row, args,
             f"Postgres: {args.customers:,} customers, {orders:,} orders")  # fmt: skip

    if args.large:
        big = "bench_customers_large"
        t0 = time.perf_counter()
        _pg.run(_pg.seed(dsn, big, args.large_customers))
        print(f"\nseeded {args.large_customers:,} customers in {time.perf_counter() - t0:.1f} s")
        # Distinct keys: orders 0..k-1 map to k distinct customers when k <= customers.
        pg_suite(spark, dsn, big, args.large_customers, args.large_keys, 0, args,
                 f"Postgres: {args.large_customers:,} customers, "
                 f"{args.large_keys:,} distinct keys looked up")  # fmt: skip

    if not args.no_http:
        rows, runs = http_suite(
            spark, http_orders, args.customers, args.http_latency_ms, args.http_capacity,
            args.http_rounds, args.warmup_rounds,
        )  # fmt: skip
        print_table(f"HTTP: {http_orders:,} lookups, {args.http_latency_ms} ms per request", rows)
        print_cpu(rows)
        print()
        paired_line(
            "http spark / aiohttp ceiling, round by round",
            runs.get("http per-row (spark)"), runs.get("http aiohttp ceiling (2 procs)"),
        )  # fmt: skip
        by = {r.name: r for r in rows}
        ratio_line("http spark / aiohttp ceiling", by.get("http per-row (spark)"),
                   by.get("http aiohttp ceiling (2 procs)"), 0.8)  # fmt: skip
        ratio_line("http batch endpoint, defaults / per-row",
                   by.get("http batch, defaults (spark)"),
                   by.get("http batch, per-row (spark)"), None)  # fmt: skip
    spark.stop()


if __name__ == "__main__":
    main()
