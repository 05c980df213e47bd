"""An enrichment job as docs/quickstart.md submits it to a cluster (run by spark-submit).

    spark-submit --master spark://HOST:PORT --py-files asyncio_ops.zip cluster_job.py OUT ROWS

``session()`` is called without a master, so spark-submit's must win. Each
output row says where it was computed: the Python worker's working directory
(an executor's lies under the standalone worker's work directory) and the file
``asyncio_ops`` was imported from there (the shipped archive). It also tries a
plain checkpoint path (refused on a cluster) and runs with a ``file://`` one.

The test suite gives eight more arguments: the streaming jobs of stream_kill_job.py and
stream_lose_worker_job.py then run in this application too (see ``_with_streams``), one
application for the three instead of one each.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from typing import Any

from pyspark.sql import SparkSession

import asyncio_ops
from asyncio_ops import ConfigurationError
from asyncio_ops.spark import ordered_wait, session


async def enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{"doubled": row["id"] * 2, "cwd": os.getcwd(), "module": asyncio_ops.__file__}]


def run(spark: SparkSession, out: str, rows: int) -> None:
    df = spark.range(rows, numPartitions=2)
    enriched = ordered_wait(
        df, enrich, timeout=30, capacity=16,
        output_schema="doubled long, cwd string, module string",
    )  # fmt: skip
    result = [r.asDict() for r in enriched.orderBy("id").collect()]
    # a plain checkpoint path is refused on a cluster; file:// says it is shared (it is:
    # the test's workers run on this machine)
    checkpoints = os.path.join(os.path.dirname(os.path.abspath(out)), "ckpt")
    refused = None
    try:
        ordered_wait(df, enrich, timeout=30, output_schema="doubled long, cwd string, "
                     "module string", checkpoint_location=checkpoints)  # fmt: skip
    except ConfigurationError as exc:
        refused = str(exc)
    shared = ordered_wait(
        df, enrich, timeout=30, output_schema="doubled long, cwd string, module string",
        checkpoint_location=f"file://{checkpoints}", uid="shared",
    ).count()  # fmt: skip
    with open(out, "w") as f:
        json.dump(
            {"master": spark.sparkContext.master, "rows": result, "refused": refused,
             "checkpointed_rows": shared},
            f,
        )  # fmt: skip


def _with_streams(spark: SparkSession, out: str, rows: int, streams: list[str]) -> bool:
    """This job, then the streaming jobs of stream_kill_job.py and stream_lose_worker_job.py
    in turn (``LOCATION INPUT WORK OUT`` each), in this one application: the test suite's
    (tests/cluster/test_standalone.py), which checks each job's output as from its own
    application. A job that raises writes ``{"error": traceback}`` to its OUT, and the
    next one runs."""
    import stream_kill_job
    import stream_lose_worker_job
    from pyspark import cloudpickle

    # their functions travel to the executors as this script's do, by value (the
    # executors have no copy of these files)
    cloudpickle.register_pickle_by_value(stream_kill_job)
    cloudpickle.register_pickle_by_value(stream_lose_worker_job)
    ok = True
    for job, args in [(run, [out, rows]), (stream_kill_job.run, streams[:4]),
                      (stream_lose_worker_job.run, streams[4:8])]:  # fmt: skip
        try:
            job(spark, *args)
        except Exception:
            ok = False
            with open(str(args[0] if job is run else args[3]), "w") as f:
                json.dump({"error": traceback.format_exc()}, f)
    return ok


def main() -> None:
    out, rows = sys.argv[1], int(sys.argv[2])
    spark = session(app_name="asyncio_ops-cluster-test")
    if len(sys.argv) > 3:
        ok = _with_streams(spark, out, rows, sys.argv[3:11])
    else:
        run(spark, out, rows)
        ok = True
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
