"""One local SparkSession for the whole test session (JVM start-up costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from pyspark.sql import SparkSession

from asyncio_ops.spark import session
from tests.helpers import JVM_OPTIONS


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # local[2, 4]: two threads, and up to 4 attempts per task, so that the
    # worker-crash tests see Spark retry the task as a cluster would.
    s = session(
        "local[2, 4]",
        app_name="asyncio_ops-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.sql.session.timeZone": "UTC",
            # session() leaves the UI on, as Spark does; the tests need none
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": JVM_OPTIONS,
        },
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@contextmanager
def arrow_batch_rows(spark: SparkSession, rows: int) -> Iterator[None]:
    """Spark hands Python ``rows`` rows per Arrow batch inside the block."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        spark.conf.set(key, old)
