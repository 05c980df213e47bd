"""Throughput of ``unordered_wait``/``ordered_wait`` on Spark beside hand-written mapInArrow.

    python -m bench.spark            # full sizes (each timed run lasts >= 5 s), ~10 minutes
    python -m bench.spark --quick    # small sizes, a smoke run (~2 minutes)
    python -m bench.spark --rows-20ms 100000 --rows-1ms 300000 --rss-rows 1000000,4000000
    python -m bench.spark --chart docs/bench-spark.png   # also the chart (the bench extra)

Run it as a module from the repository root. Everything runs in one process on
``local[2]`` (``asyncio_ops.spark.session``): two partitions, two Python workers.

Workloads, all over ``spark.range(n, numPartitions=2)`` with a ``latency``
column: a log-normal latency per row (``median * exp(sigma * z)``, ``z`` from
Box-Muller on two ``xxhash64`` hashes of the row id, computed in the JVM), so
every variant sees the same latency for the same row. The lookup is
``await asyncio.sleep(row["latency"])`` returning one output column.

- (a) median 20 ms, sigma 0.5, capacity 256: ``unordered_wait``, ``ordered_wait``
  with its defaults (``output_buffer`` of 4 x capacity: 256 requests in
  flight, finished rows may wait behind a slower one in 1,024 more slots),
  ``ordered_wait output_buffer=0`` (Flink's capacity: at most 256 rows between
  input and emission) and the hand-written version, against the ceiling
  ``capacity x partitions / mean latency`` (mean = median * exp(sigma^2 / 2)).
- (b) the same at median 1 ms: per-element overhead decides.
- (c) a plain Python UDF (``pyspark.sql.functions.udf``, not Arrow) that calls
  ``time.sleep(latency)`` at 20 ms, on fewer rows; compared by rows/s.
- Peak RSS of the Python workers for two sizes through ``unordered_wait``
  (default 1M and 4M rows, lookup ``--rss-median-ms``, default 1 ms). Each
  size runs in a fresh SparkSession, so its workers are fresh processes (they
  are reused across tasks within a session); the figure is ``VmHWM`` from
  ``/proc/<pid>/status`` of every Python worker descending from this driver's
  JVM (the processes forked by ``pyspark.daemon``), read right after the job.
- Rows without a target, for context (``--skip-extra`` leaves them out):
  ``ordered_wait`` at 4x the capacity (20 ms), an instant lookup (no
  sleep) through ``unordered_wait`` and the hand-written version, and the
  1 ms lookup through ``unordered_wait`` with a ``checkpoint_location``
  (the replay log flushed by its defaults, and only at the end: the cost of
  flushing apart from that of logging), and ``unordered_wait`` beside the
  hand-written version at 20 ms for capacities 16 to 1,024 (each run about 3 s
  at the ceiling): throughput against capacity, the chart's right panel.

``--only 1ms`` runs just the workloads whose names start with ``1ms`` (no
checks, no RSS): a quick way to compare two commits, each from its own
worktree, one after the other.

The hand-written version is what a competent user writes without the library:
``mapInArrow``; one uvloop event loop per call (per partition); per Arrow
batch ``to_pylist()``, one ``asyncio.Semaphore(capacity)``, ``asyncio.gather``
of one coroutine per row, and an output batch built with
``RecordBatch.from_pylist`` from the input rows merged with the results.

Timing: one ``df.write.format("noop")`` per run, after a warm-up of every
variant (JVM, Python workers, imports); the variants run interleaved for
``--repeat`` rounds (default 2) and the best round of each is reported, since
other processes on a shared machine slow whichever run they overlap. Targets
(docs/benchmarks.md) are checked at the end (PASS/MISS). This is a benchmark, not a
test: it never fails the build.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from asyncio_ops.spark import AsyncMetrics, ordered_wait, session, unordered_wait
from bench._cpu import cmdline

SIGMA = 0.5
PARTITIONS = 2
OUTPUT_SCHEMA = "value bigint"
Lookup = Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]


# -- the workload ---------------------------------------------------------------------------
def lognormal_latency(median_s: float, sigma: float = SIGMA, seed: int = 7) -> Column:
    """Seconds, per row, from its id only: the same latency in every variant and run."""
    two52 = float(1 << 52)

    def uniform(salt: int) -> Column:
        h = F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(salt)), F.lit(1 << 52))
        return (h.cast("double") + 0.5) / F.lit(two52)

    z = F.sqrt(F.lit(-2.0) * F.log(uniform(1))) * F.cos(F.lit(2 * math.pi) * uniform(2))
    return F.lit(median_s) * F.exp(F.lit(sigma) * z)


def source(spark: SparkSession, n: int, median_s: float) -> DataFrame:
    df = spark.range(0, n, 1, PARTITIONS)
    if median_s <= 0:
        return df.withColumn("latency", F.lit(0.0))
    return df.withColumn("latency", lognormal_latency(median_s))


def mean_latency(median_s: float, sigma: float = SIGMA) -> float:
    return median_s * math.exp(sigma * sigma / 2)


async def lookup(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The synthetic async lookup: wait the row's latency, return one column."""
    latency = row["latency"]
    if latency > 0:
        await asyncio.sleep(latency)
    return [{"value": row["id"] * 2}]


def blocking_lookup(row_id: int, latency: float) -> int:
    """The same lookup as a plain Python UDF would do it: blocking."""
    time.sleep(latency)
    return row_id * 2


# -- the hand-written version -------------------------------------------------------------------
def handwritten(
    fn: Lookup, capacity: int, schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow + asyncio.gather + Semaphore(capacity) per Arrow batch."""

    async def gather(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        sem = asyncio.Semaphore(capacity)

        async def one(row: dict[str, Any]) -> list[dict[str, Any]]:
            async with sem:
                return await fn(row)

        return await asyncio.gather(*(one(r) for r in rows))

    def partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import uvloop

        loop = uvloop.new_event_loop()
        try:
            for batch in batches:
                rows = batch.to_pylist()
                results = loop.run_until_complete(gather(rows))
                out = [{**row, **r} for row, rs in zip(rows, results, strict=True) for r in rs]
                yield pa.RecordBatch.from_pylist(out, schema=schema)
        finally:
            loop.close()

    return partition


def handwritten_df(df: DataFrame, capacity: int) -> DataFrame:
    spark_schema = StructType([*df.schema.fields, StructField("value", LongType(), True)])
    arrow_schema = to_arrow_schema(spark_schema)
    return df.mapInArrow(handwritten(lookup, capacity, arrow_schema), spark_schema)


# -- running and measuring ------------------------------------------------------------------------
@dataclass
class Result:
    label: str
    rows: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


# ordered_wait with Flink's meaning of capacity (output_buffer=0: finished rows waiting
# behind a slower one hold their slots); "ordered_wait" is the defaults (a buffer of 4x)
FLINK = "ordered_wait output_buffer=0"
# unordered_wait with a checkpoint location: the replay log flushed by its defaults
# (every 1,000 lookups or 1 s), and flushed only at the end (the cost of flushing apart)
CHECKPOINTED = "unordered_wait+checkpoint"
CHECKPOINTED_AT_END = "unordered_wait+checkpoint, flush at end"
CHECKPOINT_DIR = tempfile.mkdtemp(prefix="bench-spark-ckpt-")


def timed_noop(df: DataFrame) -> float:
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def run_variant(
    spark: SparkSession, variant: str, n: int, median_s: float, capacity: int
) -> Result:
    df = source(spark, n, median_s)
    note = ""
    metrics: AsyncMetrics | None = None
    if variant in ("unordered_wait", "ordered_wait", FLINK, CHECKPOINTED, CHECKPOINTED_AT_END):
        wait = ordered_wait if variant in ("ordered_wait", FLINK) else unordered_wait
        metrics = AsyncMetrics(spark)
        checkpoint: dict[str, Any] = {}
        if variant == FLINK:
            checkpoint["output_buffer"] = 0
        if variant in (CHECKPOINTED, CHECKPOINTED_AT_END):
            checkpoint["checkpoint_location"] = CHECKPOINT_DIR
        if variant == CHECKPOINTED_AT_END:
            checkpoint.update(checkpoint_flush_rows=1 << 40, checkpoint_flush_interval=86_400)
        out = wait(
            df, lookup, timeout=60.0, capacity=capacity, output_schema=OUTPUT_SCHEMA,
            metrics=metrics, **checkpoint,
        )  # fmt: skip
    elif variant == "hand-written":
        out = handwritten_df(df, capacity)
    elif variant == "python udf":
        udf = F.udf(blocking_lookup, LongType(), useArrow=False)
        out = df.withColumn("value", udf(F.col("id"), F.col("latency")))
    else:  # pragma: no cover
        raise ValueError(variant)
    seconds = timed_noop(out)
    if metrics is not None:
        s = metrics.summary()
        if s["emitted"] != n:
            raise RuntimeError(f"{variant}: expected {n} rows, emitted {s['emitted']}")
        note = f"p50 {s['latency_p50_ms']} ms, p99 {s['latency_p99_ms']} ms"
    return Result(variant, n, seconds, note)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f if ":" in line)


def python_worker_peaks() -> dict[int, int]:
    """VmHWM (KiB) of every Python worker under this driver: children of pyspark.daemon."""
    kids = _children()
    todo, descendants = [os.getpid()], []
    while todo:
        pid = todo.pop()
        for child in kids.get(pid, []):
            descendants.append(child)
            todo.append(child)
    peaks: dict[int, int] = {}
    for pid in descendants:
        try:
            if "pyspark.daemon" not in cmdline(pid):
                continue
            for worker in kids.get(pid, []):  # forked by the daemon: the Python workers
                peaks[worker] = int(_status(worker)["VmHWM"].split()[0])
        except (OSError, KeyError, ValueError):
            continue
    return peaks


def measure_rss(n: int, median_s: float, capacity: int, conf: dict[str, str]) -> tuple[int, float]:
    """Peak worker RSS (KiB, max over workers) of one unordered_wait run in a fresh session."""
    spark = session(f"local[{PARTITIONS}]", app_name="bench-spark-rss", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        seconds = run_variant(spark, "unordered_wait", n, median_s, capacity).seconds
        peaks = python_worker_peaks()
    finally:
        spark.stop()
    if not peaks:
        raise RuntimeError("found no Python worker process under this driver")
    return max(peaks.values()), seconds


# -- main ---------------------------------------------------------------------------------------
SWEEP = (16, 64, 256, 1024)
SWEEP_PREFIX = "20ms sweep cap "


def _chart(path: Path, results: dict[str, Result], version: str) -> None:
    """The chart of this run (see bench/_chart.py); the sweep needs the extra rows."""
    from bench._chart import write_chart

    contenders = {key.removeprefix("20ms "): r.rate for key, r in results.items()
                  if key.startswith("20ms ") and not key.startswith(SWEEP_PREFIX)}  # fmt: skip
    sweep: dict[str, list[tuple[int, float]]] = {}
    for key, r in results.items():
        if key.startswith(SWEEP_PREFIX):
            capacity, variant = key.removeprefix(SWEEP_PREFIX).split(" ", 1)
            sweep.setdefault(variant, []).append((int(capacity), r.rate))
    title = (f"python -m bench.spark, {time.strftime('%Y-%m-%d')}, local[{PARTITIONS}], "
             f"{os.cpu_count()} CPUs, pyspark {version}")  # fmt: skip
    write_chart(path, title, contenders, sweep, PARTITIONS / mean_latency(0.020))
    print(f"chart: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--rows-20ms", type=int, default=150_000, help="rows for (a)")
    parser.add_argument("--rows-1ms", type=int, default=600_000, help="rows for (b)")
    parser.add_argument("--rows-udf", type=int, default=600, help="rows for the UDF in (c)")
    parser.add_argument(
        "--rss-rows", default="1000000,4000000", help="comma-separated sizes for peak RSS"
    )
    parser.add_argument("--rss-median-ms", type=float, default=1.0, help="0 = instant lookup")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the best is kept")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--skip-extra", action="store_true", help="skip the rows without a target")
    parser.add_argument(
        "--only", default="", help="comma-separated workload prefixes to run (e.g. '1ms'); "
        "the checks need every workload",
    )  # fmt: skip
    parser.add_argument(
        "--chart", help="write a PNG here: rows/s of each contender, and throughput against "
        "capacity (needs the bench extra: matplotlib)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.rows_20ms, args.rows_1ms, args.rows_udf, args.repeat = 10_000, 40_000, 60, 1
        args.rss_rows = "100000,400000"
    cap = args.capacity
    rss_sizes = [int(s) for s in args.rss_rows.split(",") if s]
    conf = {"spark.sql.session.timeZone": "UTC", "spark.default.parallelism": str(PARTITIONS)}

    spark = session(f"local[{PARTITIONS}]", app_name="bench-spark", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    print(
        f"local[{PARTITIONS}] capacity={cap} sigma={SIGMA} cores={os.cpu_count()} "
        f"python={sys.version.split()[0]} pyspark={spark.version} "
        f"batch={spark.conf.get('spark.sql.execution.arrow.maxRecordsPerBatch')} "
        f"loadavg={os.getloadavg()[0]:.1f}"
    )
    # warm-up: JVM code paths, Python workers, imports, for every variant
    for variant in (
        "unordered_wait",
        "ordered_wait",
        FLINK,
        "hand-written",
        "python udf",
        CHECKPOINTED,
    ):
        run_variant(spark, variant, 4_000 if variant != "python udf" else 20, 0.001, cap)

    # Variants run interleaved, round after round, and each figure is the best
    # round: other processes on the machine slow whichever run they overlap.
    jobs: list[tuple[str, str, int, float, int]] = []
    for label, median, n in (("20ms", 0.020, args.rows_20ms), ("1ms", 0.001, args.rows_1ms)):
        for variant in ("unordered_wait", "ordered_wait", FLINK, "hand-written"):
            jobs.append((f"{label} {variant}", variant, n, median, cap))
    jobs.append(("20ms python udf", "python udf", args.rows_udf, 0.020, cap))
    if not args.skip_extra:  # context for the figures above; no target
        jobs.append((f"20ms ordered_wait cap {4 * cap}", "ordered_wait", args.rows_20ms, 0.020,
                     4 * cap))  # fmt: skip
        for variant in ("unordered_wait", "hand-written"):
            jobs.append((f"instant {variant}", variant, args.rows_1ms, 0.0, cap))
        for variant in (CHECKPOINTED, CHECKPOINTED_AT_END):
            jobs.append((f"1ms {variant}", variant, args.rows_1ms, 0.001, cap))
        # throughput against capacity at 20 ms (the chart's right panel): each run
        # lasts about 3 s at the ceiling, so that small capacities stay short
        for c in SWEEP:
            n = max(4_000, int(c * PARTITIONS / mean_latency(0.020) * 3))
            for variant in ("unordered_wait", "hand-written"):
                jobs.append((f"{SWEEP_PREFIX}{c} {variant}", variant, n, 0.020, c))
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(",") if p.strip())
        jobs = [job for job in jobs if job[0].startswith(prefixes)]
    runs: dict[str, list[Result]] = {key: [] for key, *_ in jobs}
    for round_ in range(args.repeat):
        print(f"round {round_ + 1}/{args.repeat} (loadavg {os.getloadavg()[0]:.1f})", flush=True)
        for key, variant, n, median, capacity in jobs:
            res = run_variant(spark, variant, n, median, capacity)
            runs[key].append(res)
            print(f"  {key:<30}{res.rate:>11,.0f} rows/s", flush=True)
    results = {key: max(rs, key=lambda r: r.rate) for key, rs in runs.items()}
    print()
    header = f"{'workload (best of rounds)':<30}{'rows':>10}{'seconds':>9}{'rows/s':>11}  notes"
    print(header)
    print("-" * len(header))
    for key, res in results.items():
        others = ", ".join(f"{r.rate:,.0f}" for r in runs[key] if r is not res)
        note = "; ".join(x for x in (res.note, others and f"other rounds {others}") if x)
        print(f"{key:<30}{res.rows:>10,}{res.seconds:>9.2f}{res.rate:>11,.0f}  {note}")
    version = spark.version
    spark.stop()
    if args.chart:
        _chart(Path(args.chart), results, version)

    shutil.rmtree(CHECKPOINT_DIR, ignore_errors=True)
    if args.only:
        return  # the checks below need every workload
    rss: dict[int, tuple[int, float]] = {}
    if not args.skip_rss:
        print()
        print(f"peak Python worker RSS, unordered_wait, lookup median {args.rss_median_ms} ms")
        for n in rss_sizes:
            rss[n] = measure_rss(n, args.rss_median_ms / 1000, cap, conf)
            print(f"  {n:>10,} rows  {rss[n][0] / 1024:>8.1f} MiB  ({rss[n][1]:.1f} s)")

    ceiling = cap * PARTITIONS / mean_latency(0.020)
    checks: list[tuple[str, bool, str]] = []
    for mode in ("unordered_wait", "ordered_wait"):
        got = results[f"20ms {mode}"].rate
        hand = results["20ms hand-written"].rate
        checks.append(
            (f"(a) 20ms {mode} >= 90% of ceiling {ceiling:,.0f}/s", got >= 0.9 * ceiling,
             f"{got / ceiling:.1%}")
        )  # fmt: skip
        checks.append((f"(a) 20ms {mode} >= 0.95x hand-written", got >= 0.95 * hand,
                       f"{got / hand:.2f}x"))  # fmt: skip
    for mode in ("unordered_wait", "ordered_wait"):
        got, hand = results[f"1ms {mode}"].rate, results["1ms hand-written"].rate
        checks.append((f"(b) 1ms {mode} >= 1.5x hand-written", got >= 1.5 * hand,
                       f"{got / hand:.2f}x"))  # fmt: skip
    for mode in ("unordered_wait", "ordered_wait"):
        got, udf_rate = results[f"20ms {mode}"].rate, results["20ms python udf"].rate
        checks.append((f"(c) 20ms {mode} >= 100x python udf", got >= 100 * udf_rate,
                       f"{got / udf_rate:.0f}x"))  # fmt: skip
    if len(rss) >= 2:
        small, large = min(rss), max(rss)
        ratio = rss[large][0] / rss[small][0]
        checks.append(
            (f"peak worker RSS {large:,} vs {small:,} rows within 15%", abs(ratio - 1) <= 0.15,
             f"{ratio:.3f}")
        )  # fmt: skip
    print()
    ceiling_b = cap * PARTITIONS / mean_latency(0.001)
    print(
        f"ceiling (a): {cap} x {PARTITIONS} / {mean_latency(0.020) * 1000:.2f} ms = "
        f"{ceiling:,.0f} rows/s; (b): {ceiling_b:,.0f} rows/s"
    )
    print(f"loadavg at the end: {os.getloadavg()[0]:.1f} (other processes share the cores)")
    for name, ok, figure in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name:<58}{figure:>10}")


if __name__ == "__main__":
    main()
