"""A streaming ``keyed_process`` job whose state lives on S3, and an executor that dies
mid-micro-batch (run by spark-submit on the test's two-worker standalone cluster).

    spark-submit --master spark://HOST:PORT --py-files asyncio_ops.zip \
        stream_kill_job.py LOCATION INPUT WORK OUT

``LOCATION`` is the ``checkpoint_location`` (an ``s3://`` URI of the test's S3 server).
The input holds one JSON file per micro-batch, events ``{"key", "seq"}``. A running
count per key is emitted per event. In micro-batch 1, the first time any process sees
the event ``KILL_SEQ``, the function SIGKILLs its executor's JVM (the Python worker's
daemon's parent): the executor is lost, Spark runs the micro-batch's tasks again on
an executor it has left or a new one, which restore the partition's state of version 0
from S3. ``OUT`` gets the output rows (the Parquet sink's committed files, read back),
the working directory of the executor that computed each row, and whether the kill
happened. ``run`` is the job on a given session: cluster_job.py runs it in its
application, after its own job.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from asyncio_ops.spark import keyed_process, session
from asyncio_ops.state import KeyedProcessFunction, ValueStateDescriptor

KILL_SEQ = 1_005  # an event of micro-batch 1


class CountOrDie(KeyedProcessFunction[Any, dict[str, Any], dict[str, Any]]):
    def __init__(self, markers: str) -> None:
        self.markers = markers

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor[int]("count"))

    def process_element(self, value: dict[str, Any], ctx: Any, out: Any) -> None:
        if value["seq"] == KILL_SEQ and _first_time(self.markers, "kill"):
            daemon = os.getppid()
            with open(f"/proc/{daemon}/stat") as f:
                executor_jvm = int(f.read().rsplit(")", 1)[1].split()[1])
            os.kill(executor_jvm, signal.SIGKILL)
            os._exit(1)  # never reached in practice: the JVM's death ends this worker
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        # an executor's Python workers run in <worker work dir>/<app id>/<executor id>
        out.collect({"key": value["key"], "seq": value["seq"], "n": n, "executor": os.getcwd()})


def _first_time(markers: str, name: str) -> bool:
    try:
        fd = os.open(os.path.join(markers, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def run(spark: SparkSession, location: str, source: str, work: str, out: str) -> None:
    """The streaming job on ``spark`` (also called by cluster_job.py, in its application)."""
    markers = os.path.join(work, "markers")
    os.makedirs(markers, exist_ok=True)
    events = (
        spark.readStream.schema("key string, seq long").option("maxFilesPerTrigger", 1)
        .json(source)
    )  # fmt: skip
    counted = keyed_process(
        events, CountOrDie(markers), key="key",
        output_schema="key string, seq long, n long, executor string",
        checkpoint_location=location, uid="counts", num_partitions=2,
    )  # fmt: skip
    sink = os.path.join(work, "out")
    query = (
        counted.writeStream.format("parquet").option("path", sink)
        .option("checkpointLocation", os.path.join(work, "spark"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(600)
    rows = [r.asDict() for r in spark.read.parquet(sink).collect()]
    Path(out).write_text(
        json.dumps({"rows": rows, "killed": os.path.exists(os.path.join(markers, "kill"))})
    )


def main() -> None:
    spark = session(app_name="asyncio_ops-cluster-kill")
    run(spark, *sys.argv[1:5])
    spark.stop()


if __name__ == "__main__":
    main()
