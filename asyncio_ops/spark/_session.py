"""A SparkSession that works out of the box for asyncio_ops."""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession


def session(
    master: str = "local[*]",
    app_name: str = "asyncio_ops",
    conf: dict[str, Any] | None = None,
) -> SparkSession:
    """Get or create a SparkSession whose Python workers run this interpreter.

    Workers must import asyncio_ops and the user's function: they run
    ``sys.executable`` (``PYSPARK_PYTHON`` and ``spark.pyspark.python``) unless
    the caller's ``conf`` says otherwise. The UI is off and shuffle partitions
    are few on a local master, as suits a laptop or CI.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions", "4")
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return builder.getOrCreate()
