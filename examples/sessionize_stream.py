"""Structured Streaming: enrich page views over HTTP, then cut them into sessions per customer.

    python examples/sessionize_stream.py

Page views arrive as JSON files, one micro-batch each (``--files`` files of
10 s of event time; customer ``c`` is active in file ``f`` unless ``(c + f) %
3 == 0``, with a view every 2.5 s, so everyone has idle stretches of more than
the gap, and views of consecutive active files are closer than it). ``unordered_wait`` looks each
view's customer up in the customer service over HTTP (started here), and
``keyed_process`` cuts the enriched views into sessions per customer: a
:class:`KeyedProcessFunction` keeps the open session in keyed state and an
event-time timer ``--gap`` seconds after its last view; when the watermark
(``--watermark-delay`` behind the latest view) passes the timer, the session
is emitted with its customer's tier.

The query runs twice: it stops after the first half of the files and is
started again from its checkpoints (Spark's, and the keyed state's under
``checkpoint_location``) with the rest, at another number of partitions
(``--partitions``, then one more): state and timers follow their key groups.
At the end the sessions are read back and checked against the sessions
computed here from the same views: each closed session exactly once, with all
its views, including the sessions that span the restart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncio_ops.connectors.http import HttpLookup
from asyncio_ops.services.customers import ServiceThread
from pyspark.sql import DataFrame, SparkSession

from asyncio_ops.spark import keyed_process, unordered_wait
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ValueStateDescriptor,
)
from examples._common import report, spark_session, stop_session

SECONDS_PER_FILE = 10.0
VIEWS_PER_ACTIVE_FILE = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--customers", type=int, default=30)
    p.add_argument("--files", type=int, default=8, help="micro-batches of views (even)")
    p.add_argument("--gap", type=float, default=5.0, help="session gap, seconds")
    p.add_argument("--watermark-delay", type=float, default=2.0, help="seconds")
    p.add_argument("--partitions", type=int, default=2, help="first run; the second adds one")
    p.add_argument("--latency-ms", type=float, default=2.0, help="latency of the local service")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--output", help="output + checkpoint directory (default: temporary)")
    p.add_argument("--sample", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one RESULT {...} line")
    return p.parse_args(argv)


class Sessionize(KeyedProcessFunction[int, dict[str, Any], dict[str, Any]]):
    """Views of one customer into sessions closed ``gap`` seconds after the last view."""

    def __init__(self, gap: float) -> None:
        self.gap = gap

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        get = runtime_context.get_state
        self.start = get(ValueStateDescriptor[float]("start"))
        self.last = get(ValueStateDescriptor[float]("last"))
        self.views = get(ValueStateDescriptor[int]("views"))
        self.tier = get(ValueStateDescriptor[str]("tier"))

    def process_element(
        self, value: dict[str, Any], ctx: KeyedProcessContext, out: Collector[dict[str, Any]]
    ) -> None:
        ts = ctx.timestamp()  # the view's event time, in seconds
        assert ts is not None
        timers = ctx.timer_service()
        last = self.last.value()
        if last is None:  # a new session
            start, end = ts, ts
        else:  # views come in completion order of their lookups: widen the session
            timers.delete_event_time_timer(last + self.gap)
            first = self.start.value()
            start, end = min(ts, ts if first is None else first), max(ts, last)
        self.start.update(start)
        self.last.update(end)
        self.views.update((self.views.value() or 0) + 1)
        self.tier.update(value["tier"])
        timers.register_event_time_timer(end + self.gap)

    def on_timer(
        self, timestamp: float, ctx: KeyedProcessContext, out: Collector[dict[str, Any]]
    ) -> None:
        out.collect(
            {
                "customer_id": ctx.get_current_key(),
                "tier": self.tier.value(),
                "session_start": self.start.value(),
                "session_end": self.last.value(),
                "views": self.views.value(),
            }
        )
        for state in (self.start, self.last, self.views, self.tier):
            state.clear()


def views(customers: int, f: int) -> list[dict[str, Any]]:
    """The page views of file ``f`` (deterministic)."""
    out = []
    for c in range(1, customers + 1):
        if (c + f) % 3 == 0:
            continue  # idle in this file
        for k in range(VIEWS_PER_ACTIVE_FILE):
            ts = f * SECONDS_PER_FILE + (c % 5) * 0.5 + k * 2.5  # within [f*10, f*10+9.5]
            out.append({"view_id": f * 100_000 + c * 10 + k, "customer_id": c, "ts": ts})
    return out


def write_file(src: Path, f: int, customers: int) -> None:
    """One file, one micro-batch; Spark takes files in modification-time order."""
    path = src / f"views-{f:04d}.json"
    path.write_text("\n".join(json.dumps(v) for v in views(customers, f)))
    stamp = 1_700_000_000 + f * 10
    os.utime(path, (stamp, stamp))


def expected_sessions(
    customers: int, files: int, gap: float
) -> list[tuple[int, float, float, int]]:
    """Sessions per customer from every view: a gap of ``gap`` seconds or more starts one."""
    by_customer: dict[int, list[float]] = {}
    for f in range(files):
        for v in views(customers, f):
            by_customer.setdefault(v["customer_id"], []).append(v["ts"])
    out = []
    for c, stamps in by_customer.items():
        stamps.sort()
        start = prev = stamps[0]
        n = 0
        for ts in stamps:
            if ts - prev >= gap:
                out.append((c, start, prev, n))
                start, n = ts, 0
            prev = ts
            n += 1
        out.append((c, start, prev, n))
    return sorted(out)


def pipeline(spark: SparkSession, src: Path, root: Path, base: str, args: argparse.Namespace,
             partitions: int) -> DataFrame:  # fmt: skip
    stream = (
        spark.readStream.schema("view_id long, customer_id long, ts double")
        .option("maxFilesPerTrigger", 1).json(str(src))
        .selectExpr("view_id", "customer_id", "timestamp_seconds(ts) AS event_time")
    )  # fmt: skip
    enriched = unordered_wait(
        stream,
        HttpLookup(f"{base}/customers/{{customer_id}}", max_connections=50, timeout=10.0),
        timeout=30.0, capacity=50,
        output_schema="id bigint, name string, tier string, country string",
    )  # fmt: skip
    return keyed_process(
        enriched, Sessionize(args.gap), key="customer_id", event_time="event_time",
        watermark_delay=args.watermark_delay, num_partitions=partitions,
        output_schema="customer_id long, tier string, session_start double, "
        "session_end double, views long",
        checkpoint_location=str(root / "state"),
    )  # fmt: skip


def run(sessions: DataFrame, root: Path) -> None:
    query = (
        sessions.writeStream.format("parquet").option("path", str(root / "sessions"))
        .option("checkpointLocation", str(root / "spark")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(300)
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    keep = args.output is not None
    root = Path(args.output or tempfile.mkdtemp(prefix="asyncio_ops_sessions_"))
    src = root / "views"
    src.mkdir(parents=True, exist_ok=True)
    service = ServiceThread(customers=max(args.customers, 1), latency=args.latency_ms / 1000)
    base = service.start()
    spark = spark_session(args.master, "sessionize_stream", args.partitions)

    half = args.files // 2
    for f in range(half):
        write_file(src, f, args.customers)
    run(pipeline(spark, src, root, base, args, args.partitions), root)
    first_run = spark.read.parquet(str(root / "sessions")).count()
    print(f"run 1: {half} files at {args.partitions} partitions, {first_run} sessions closed")
    for f in range(half, args.files):
        write_file(src, f, args.customers)
    run(pipeline(spark, src, root, base, args, args.partitions + 1), root)

    rows = spark.read.parquet(str(root / "sessions")).collect()
    got = sorted((r.customer_id, r.session_start, r.session_end, r.views) for r in rows)
    expected = expected_sessions(args.customers, args.files, args.gap)
    # every partition fires the timers behind the watermark the previous batch reached
    final_watermark = (args.files - 1) * SECONDS_PER_FILE + 9.5 - args.watermark_delay
    must_close = [s for s in expected if s[2] + args.gap + SECONDS_PER_FILE <= final_watermark]
    spanning = [s for s in got if s[1] < half * SECONDS_PER_FILE <= s[2]]
    tiers = {r.customer_id: r.tier for r in rows}
    result: dict[str, object] = {
        "sessions": len(got),
        "first_run_sessions": first_run,
        "duplicates": len(got) - len(set(got)),
        "not_expected": len(set(got) - set(expected)),
        "missing": len(set(must_close) - set(got)),
        "not_expected_sample": sorted(set(got) - set(expected))[:5],
        "missing_sample": sorted(set(must_close) - set(got))[:5],
        "spanning_restart": len(spanning),
        "tiers_missing": sum(1 for t in tiers.values() if t is None),
        "sample": [
            dict(zip(("customer_id", "start", "end", "views"), s, strict=True))
            for s in got[: args.sample]
        ],
        "output": str(root) if keep else None,
    }
    report(result, as_json=args.json)
    print(
        f"\n{len(got)} sessions, {result['spanning_restart']} across the restart "
        f"(duplicates: {result['duplicates']}, unexpected: {result['not_expected']}, "
        f"missing: {result['missing']})"
    )
    stop_session(spark)
    service.stop()
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
