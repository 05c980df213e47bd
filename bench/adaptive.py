"""``capacity="auto"`` against fixed capacities, on Spark, against the local HTTP service.

    python -m bench.adaptive            # ~4 minutes
    python -m bench.adaptive --quick    # ~1 minute, smaller runs

Run it as a module from the repository root. The example customer service
(``examples/services/customers.py``) runs as its own process, answering each
request after 20 ms plus up to 10 ms of jitter, in two modes:

- ``scales``: every request waits its own latency, however many are in flight
  (until the service's one CPU is the bound);
- ``saturates``: ``--servers`` (default 64) requests wait at once, the others
  queue first come, first served: beyond that many in flight the throughput
  stops growing and the latency grows instead.

In each mode ``unordered_wait`` + ``HttpLookup`` (``max_connections`` 1,024, so
that the connector's own pool never bounds it) enriches ``spark.range(n)`` on
``local[2]`` with capacities 16, 64, 256, 1,024 per partition and with
``"auto"`` (``max_capacity`` 1,024); each run's rows are sized to last a few
seconds at that capacity's bound. ``unloaded`` is the latency at capacity 1.
Runs are interleaved over ``--rounds`` rounds (default 2), the best round kept.
Each row: rows/s, p50 and p99 latency from ``AsyncMetrics`` (first attempt to
completion), and for ``auto`` each partition's final limit.

Targets (checked at the end, PASS/MISS; a benchmark never fails the build):
``auto`` within 10% of the best fixed capacity's rows/s in both modes, and when
the service saturates its p99 latency at most 2x the unloaded p99.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from asyncio_ops.connectors.http import HttpLookup
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from asyncio_ops.spark import AsyncMetrics, session, unordered_wait
from bench._service import start_service, stop_service

PARTITIONS = 2
LATENCY_MS = 20.0
JITTER_MS = 10.0
FIXED = (16, 64, 256, 1024)


@dataclass
class Run:
    label: str
    rows: int
    seconds: float
    p50_ms: float
    p99_ms: float
    limits: list[int]

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def orders(spark: SparkSession, n: int) -> DataFrame:
    return spark.range(0, n, 1, PARTITIONS).select((F.col("id") % 100_000 + 1).alias("customer_id"))


def run(spark: SparkSession, url: str, label: str, capacity: int | str, n: int) -> Run:
    metrics = AsyncMetrics(spark)
    lookup = HttpLookup(f"{url}/customers/{{customer_id}}", max_connections=1024, timeout=30.0)
    out = unordered_wait(orders(spark, n), lookup, timeout=60.0, capacity=capacity,
                         output_schema="name string", metrics=metrics)  # fmt: skip
    start = time.perf_counter()
    out.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    s = metrics.summary()
    if s["emitted"] != n:
        raise RuntimeError(f"{label}: expected {n} rows, got {s['emitted']}")
    return Run(label, n, seconds, s["latency_p50_ms"], s["latency_p99_ms"], s["capacity_limits"])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, one round")
    parser.add_argument("--servers", type=int, default=64, help="saturating mode's workers")
    parser.add_argument("--seconds", type=float, default=4.0, help="target length of a run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.5, 1
    spark = session(f"local[{PARTITIONS}]", app_name="bench-adaptive",
                    conf={"spark.default.parallelism": str(PARTITIONS)})  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    print(
        f"local[{PARTITIONS}] cores={os.cpu_count()} python={sys.version.split()[0]} "
        f"pyspark={spark.version} service latency {LATENCY_MS:g} ms + up to {JITTER_MS:g} ms"
    )
    mean = (LATENCY_MS + JITTER_MS / 2) / 1000
    checks: list[tuple[str, bool, str]] = []
    for mode, servers in (("scales", 0), ("saturates", args.servers)):
        proc, url = start_service(latency_ms=LATENCY_MS, jitter_ms=JITTER_MS,
                                  max_concurrent=servers)  # fmt: skip
        try:
            run(spark, url, "warm-up", 64, 4_000)
            plan: list[tuple[str, int | str, int]] = [("unloaded (capacity 1)", 1, 200)]
            for c in FIXED:
                bound = min(c * PARTITIONS, servers or c * PARTITIONS) / mean  # rows/s
                plan.append((f"capacity {c}", c, max(2_000, int(bound * args.seconds))))
            best_n = max(n for _, _, n in plan)
            plan.append(("auto", "auto", best_n))
            results: dict[str, list[Run]] = {label: [] for label, _, _ in plan}
            for _ in range(args.rounds):
                for label, capacity, n in plan:
                    results[label].append(run(spark, url, label, capacity, n))
        finally:
            stop_service(proc)
        best = {label: max(rs, key=lambda r: r.rate) for label, rs in results.items()}
        print()
        print(f"service {mode}" + (f" beyond {servers} at once" if servers else ""))
        print(f"  {'capacity':<24}{'rows':>8}{'rows/s':>10}{'p50 ms':>9}{'p99 ms':>9}  limits")
        for label, r in best.items():
            limits = ", ".join(map(str, r.limits))
            print(f"  {label:<24}{r.rows:>8,}{r.rate:>10,.0f}{r.p50_ms:>9.1f}{r.p99_ms:>9.1f}"
                  f"  {limits}")  # fmt: skip
        fixed = [best[f"capacity {c}"] for c in FIXED]
        top = max(fixed, key=lambda r: r.rate)
        auto = best["auto"]
        checks.append((f"{mode}: auto >= 90% of the best fixed ({top.label})",
                       auto.rate >= 0.9 * top.rate, f"{auto.rate / top.rate:.1%}"))  # fmt: skip
        if servers:
            unloaded = best["unloaded (capacity 1)"].p99_ms
            ratio = auto.p99_ms / unloaded
            checks.append((f"{mode}: auto p99 <= 2x unloaded p99 ({unloaded:.1f} ms)",
                           ratio <= 2, f"{ratio:.2f}x"))  # fmt: skip
    spark.stop()
    print()
    for name, ok, figure in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name:<58}{figure:>10}")


if __name__ == "__main__":
    main()
