"""``read_state`` over a large ``keyed_process`` state, both backends.

Per backend, with the count's state untyped (pickled values) and typed
(``"long"``, an Arrow column): a streaming ``keyed_process`` query (a count per
key, value state) is seeded from ``spark.range(keys)`` with ``initial_state`` and runs one
micro-batch of one event, so version 0 holds every key's full state; then
``read_state(..., state="n")`` is written to Spark's ``noop`` sink (every row built, none
kept) and timed, once after a warm-up read of a small state. Prints one line
per backend and kind: keys, rows read, seconds, rows per second, and the checkpoint's
bytes on disk.

Command: ``python -m bench.read_state --keys 1000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncio_ops.spark import keyed_process, read_state, session
from asyncio_ops.state import (
    Collector,
    KeyedProcessContext,
    KeyedProcessFunction,
    KeyedRuntimeContext,
    ValueStateDescriptor,
)

Row = dict[str, Any]


class Count(KeyedProcessFunction[int, Row, Row]):
    def __init__(self, typed: bool) -> None:
        self.typed = typed

    def open(self, runtime_context: KeyedRuntimeContext) -> None:
        # typed: an Arrow column of longs; untyped: each value its pickle's bytes
        descriptor = ValueStateDescriptor[int]("n", "long" if self.typed else None)
        self.n = runtime_context.get_state(descriptor)

    def process_element(self, value: Row, ctx: KeyedProcessContext, out: Collector[Row]) -> None:
        self.n.update((self.n.value() or 0) + 1)
        out.collect({"k": value["k"], "n": self.n.value()})

    def handle_initial_state(self, key: int, rows: list[Row], ctx: KeyedProcessContext) -> None:
        self.n.update(rows[0]["n"])


def _build(spark: Any, root: Path, keys: int, backend: str, typed: bool = False) -> str:
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.json").write_text(json.dumps({"k": 0}))
    stream = spark.readStream.schema("k long").json(str(root / "in"))
    seed = spark.range(keys).selectExpr("id as k", "id % 97 as n")
    out = keyed_process(
        stream, Count(typed), key="k", output_schema="k long, n long", uid="count",
        checkpoint_location=str(root / "state"), state_backend=backend, initial_state=seed,
    )  # fmt: skip
    query = (
        out.writeStream.format("noop").option("checkpointLocation", str(root / "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    return str(root / "state")


def _size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    spark = session(
        "local[2]",
        app_name="bench-read-state",
        conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        warm = _build(spark, Path(tmp) / "warm", 1000, "heap")
        read_state(spark, warm, uid="count").write.format("noop").mode("overwrite").save()
        for backend in ("heap", "rocksdb"):
            for typed in (False, True):
                kind = "typed (long)" if typed else "pickled"
                t0 = time.perf_counter()
                location = _build(spark, Path(tmp) / f"{backend}-{typed}", args.keys, backend,
                                  typed)  # fmt: skip
                built = time.perf_counter() - t0
                df = read_state(spark, location, uid="count", state="n")
                t0 = time.perf_counter()
                df.write.format("noop").mode("overwrite").save()
                seconds = time.perf_counter() - t0
                rows = read_state(spark, location, uid="count", state="n").count()
                print(
                    f"{backend}, {kind}: {args.keys:,} keys seeded in {built:.1f} s; "
                    f"read_state: {rows:,} rows in {seconds:.1f} s ({rows / seconds:,.0f} "
                    f"rows/s); checkpoint {_size(location) / 1e6:.1f} MB",
                    flush=True,
                )
    spark.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
