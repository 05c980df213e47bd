"""A batch job under ``session()``'s default master whose Python worker is killed in its
first task attempt; run as its own process by ``test_session_master.py``.

    python -m tests.spark.killed_worker_job MARKERS

Prints the number of rows the job wrote; exits non-zero if the job failed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from asyncio_ops.spark import ordered_wait, session
from tests.cross_process import first_time


def main() -> None:
    markers = sys.argv[1]

    async def dies_once(row: dict[str, Any]) -> list[dict[str, Any]]:
        if row["id"] == 7 and first_time(markers, 7):
            os._exit(1)  # the Python worker dies, as an OOM kill would
        return [{"v": row["id"] * 2}]

    spark = session(app_name="killed-worker", conf={"spark.ui.enabled": "false"})
    df = spark.range(20, numPartitions=2)
    out = ordered_wait(df, dies_once, timeout=30, output_schema="v long").collect()
    print(sorted(r.v for r in out) == [2 * i for i in range(20)], len(out))
    spark.stop()


if __name__ == "__main__":
    main()
