"""An enrichment with its checkpoint on S3 under speculative execution (run by
spark-submit on the test's two-worker standalone cluster).

    spark-submit --master spark://HOST:PORT --py-files asyncio_ops.zip \
        speculation_job.py LOCATION WORK OUT

Partition 0's first attempt is slow (each of its lookups waits, long after every
other task has finished), so Spark launches a speculative copy of it on the other
executor; the copy answers at once, wins, and the slow attempt is killed. Every
lookup appends ``<partition> <attempt> <id>`` to a log in ``WORK``. ``OUT`` gets the
output rows and that log.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from asyncio_ops.spark import ordered_wait, session

ROWS = 400


def make_enrich(log: str) -> Any:
    async def enrich(row: dict[str, Any]) -> list[dict[str, Any]]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part, attempt = ctx.partitionId(), ctx.attemptNumber()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{part} {attempt} {row['id']}\n".encode())
        finally:
            os.close(fd)
        if part == 0 and attempt == 0:
            await asyncio.sleep(30)  # the straggler: its speculative copy wins
        return [{"doubled": row["id"] * 2}]

    return enrich


def main() -> None:
    location, work, out = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "lookups.log")
    spark = session(app_name="asyncio_ops-cluster-speculation")
    df = spark.range(ROWS, numPartitions=4)
    enriched = ordered_wait(
        df, make_enrich(log), timeout=120, capacity=8, output_schema="doubled long",
        checkpoint_location=location, uid="speculated",
    )  # fmt: skip
    rows = [r.asDict() for r in enriched.collect()]
    Path(out).write_text(json.dumps({"rows": rows, "log": Path(log).read_text()}))
    spark.stop()


if __name__ == "__main__":
    main()
