"""A streaming ``keyed_process`` job whose state lives on S3, and a worker machine lost
between two micro-batches (run by spark-submit on the test's two-worker standalone
cluster).

    spark-submit --master spark://HOST:PORT --py-files asyncio_ops.zip \
        stream_lose_worker_job.py LOCATION INPUT WORK OUT

``LOCATION`` is the ``checkpoint_location`` (an ``s3://`` URI of the test's S3 server).
The input holds one JSON file per micro-batch, events ``{"key", "seq"}``; a running
count per key is emitted per event, with the working directory of the executor that
computed it. Each micro-batch's rows are written to ``WORK/out/batch=<id>``. Once
micro-batch 1's rows are written, the job creates ``WORK/markers/batch-1-written`` and
waits (up to 240 s) for ``WORK/markers/worker-lost``: the test kills a worker there,
with its executor and the Python workers that held partitions' state warm. The next
micro-batch runs on the worker left, which reads from S3 the state of the partitions it
never held. ``OUT`` gets every row written. ``run`` is the job on a given session:
cluster_job.py runs it in its application, after its own job and stream_kill_job.py's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from asyncio_ops.spark import keyed_process, session
from asyncio_ops.state import KeyedProcessFunction, ValueStateDescriptor


class Count(KeyedProcessFunction[Any, dict[str, Any], dict[str, Any]]):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor[int]("count"))

    def process_element(self, value: dict[str, Any], ctx: Any, out: Any) -> None:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        # an executor's Python workers run in <worker work dir>/<app id>/<executor id>
        out.collect({"key": value["key"], "seq": value["seq"], "n": n, "executor": os.getcwd()})


def run(spark: SparkSession, location: str, source: str, work: str, out: str) -> None:
    """The streaming job on ``spark`` (also called by cluster_job.py, in its application)."""
    markers = Path(work) / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    sink = Path(work) / "out"
    events = (
        spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
        .json(source)
    )  # fmt: skip
    counted = keyed_process(
        events, Count(), key="key",
        output_schema="key string, seq long, n long, executor string",
        checkpoint_location=location, uid="counts", num_partitions=2,
    )  # fmt: skip

    def each(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(str(sink / f"batch={batch_id}"))
        if batch_id != 1:
            return
        (markers / "batch-1-written").touch()
        deadline = time.monotonic() + 240
        while not (markers / "worker-lost").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no worker was lost within 240 s")
            time.sleep(0.2)

    query = (
        counted.writeStream.foreachBatch(each)
        .option("checkpointLocation", os.path.join(work, "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(600)
    rows = [r.asDict() for r in spark.read.parquet(str(sink)).collect()]
    Path(out).write_text(json.dumps({"rows": rows}))


def main() -> None:
    spark = session(app_name="asyncio_ops-cluster-lose-worker")
    run(spark, *sys.argv[1:5])
    spark.stop()


if __name__ == "__main__":
    main()
