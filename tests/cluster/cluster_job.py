"""An enrichment job as docs/quickstart.md submits it to a cluster (run by spark-submit).

    spark-submit --master spark://HOST:PORT --py-files asyncio_ops.zip cluster_job.py OUT ROWS

``session()`` is called without a master, so spark-submit's must win. Each
output row says where it was computed: the Python worker's working directory
(an executor's lies under the standalone worker's work directory) and the file
``asyncio_ops`` was imported from there (the shipped archive). It also tries a
plain checkpoint path (refused on a cluster) and runs with a ``file://`` one.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncio_ops
from asyncio_ops import ConfigurationError
from asyncio_ops.spark import ordered_wait, session


async def enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
    await asyncio.sleep(0.001)
    return [{"doubled": row["id"] * 2, "cwd": os.getcwd(), "module": asyncio_ops.__file__}]


def main() -> None:
    out, rows = sys.argv[1], int(sys.argv[2])
    spark = session(app_name="asyncio_ops-cluster-test")
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
    spark.stop()


if __name__ == "__main__":
    main()
