"""A streaming query for the kill/restart tests, run as its own process.

    python -m tests.reliability.stream_job SRC SINK WORKDIR (forever|available-now)

Reads JSON files one per micro-batch, enriches them with ``unordered_wait``
(event time, watermark-bounded, checkpointed, carry-over after 0.3 s) and
writes Parquet with Spark's own checkpoint. Rows with ``id % 11 == 0`` hang on
their first request (a marker file per row remembers it across processes), so
some are always in flight at the end of a micro-batch.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from asyncio_ops import AsyncFunction
from asyncio_ops.spark import session, unordered_wait
from tests.cross_process import first_time


class SlowOnce(AsyncFunction[dict[str, Any], dict[str, Any]]):
    def __init__(self, markers: str) -> None:
        self.markers = markers

    async def async_invoke(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        i = row["id"]
        if i % 11 == 0 and first_time(self.markers, i):
            await asyncio.sleep(3600)
        await asyncio.sleep(0.01)
        return [{"v": i * 7}]


def main() -> None:
    src, sink, work, how = sys.argv[1:5]
    spark = session(
        "local[2]", app_name="stream-job",
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    markers = Path(work) / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    stream = spark.readStream.schema("id long, ts double").option("maxFilesPerTrigger", 1).json(src)
    enriched = unordered_wait(
        stream, SlowOnce(str(markers)), timeout=600, capacity=16, output_schema="v long",
        event_time="ts", watermark_delay=5, checkpoint_location=f"{work}/aops",
        drain_timeout=0.3,
    )  # fmt: skip
    writer = (
        enriched.writeStream.format("parquet").option("path", sink)
        .option("checkpointLocation", f"{work}/spark")
    )  # fmt: skip
    if how == "available-now":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="100 milliseconds").start()
        print("STARTED", flush=True)
        query.awaitTermination()
    if query.exception() is not None:
        print(f"QUERY FAILED: {query.exception()}", file=sys.stderr, flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
